//! How a test server's process is started: its arguments (in memory, with an append-only
//! file, over TLS, as a sentinel), a free port and a directory of its own, and the
//! watchdog that kills it should the test process die first.

use std::io::{self, Write};
use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, ChildStdin, Command, Stdio};

const INSTALL_HINT: &str = "Install it: `apt-get install -y redis-server` (Debian, Ubuntu), \
     `brew install redis` (macOS), or set REDIS_SERVER to its path";

/// How a server is started (again, on restart).
#[derive(Clone, Default)]
pub(super) struct Launch {
    /// The server's own directory (its append-only file, a replica's copy of its master's
    /// data, a sentinel's configuration), so that none reads another's files; removed on
    /// drop.
    pub(super) dir: Option<PathBuf>,
    /// Every write in an append-only file, fsynced at once.
    pub(super) aof: bool,
    /// A TLS-only server's certificates: the directory, and the CA's certificate (PEM).
    pub(super) tls: Option<(PathBuf, Vec<u8>)>,
    /// More arguments (`--replicaof`, `--requirepass`, ...).
    pub(super) args: Vec<String>,
    /// A sentinel's configuration (without its port), written to `dir`.
    pub(super) sentinel: Option<String>,
    /// The password `INFO` needs to tell whether the server is ours.
    pub(super) password: Option<String>,
}

/// A shell that kills `pid` once its standard input closes: when this process exits or
/// dies, the kernel closes our end of the pipe. Best effort: without `sh`, none.
pub(super) fn watchdog(pid: u32) -> Option<(Child, ChildStdin)> {
    if !cfg!(unix) {
        return None;
    }
    let mut child = Command::new("sh")
        .args(["-c", &format!("read _; kill -9 {pid} 2>/dev/null")])
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .ok()?;
    let mut pipe = child.stdin.take()?;
    // Nothing to write: the pipe only has to stay open. (A flush checks it is.)
    pipe.flush().ok()?;
    Some((child, pipe))
}

/// A loopback port that nothing listened on a moment ago.
pub(super) fn free_port() -> io::Result<u16> {
    let listener = TcpListener::bind("127.0.0.1:0")?;
    Ok(listener.local_addr()?.port())
}

/// A new directory of this process's own, under the system's temporary one.
pub(super) fn private_dir() -> io::Result<PathBuf> {
    static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
    let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
    let name = format!("redguard-test-{}-{n}", std::process::id());
    let dir = std::env::temp_dir().join(name);
    // A killed earlier run with the same process id may have left an old file there.
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir)?;
    Ok(dir)
}

/// The password given with `--requirepass` in `args`, if any.
pub(super) fn password_in(args: &[&str]) -> Option<String> {
    let at = args.iter().position(|arg| *arg == "--requirepass")?;
    args.get(at + 1).map(|password| password.to_string())
}

/// Starts `redis-server` on `port` as `launch` says: in memory only, or with every write
/// fsynced to an append-only file in its `dir`; speaking TLS only when given
/// certificates; or as a sentinel.
pub(super) fn spawn(port: u16, launch: &Launch) -> io::Result<Child> {
    let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut command = Command::new(&binary);
    if let (Some(config), Some(dir)) = (&launch.sentinel, &launch.dir) {
        // A sentinel rewrites its configuration file: each start writes it afresh.
        let file = dir.join("sentinel.conf");
        let listen = match &launch.tls {
            None => format!("port {port}\n"),
            Some((certs, _)) => format!(
                "port 0\ntls-port {port}\ntls-auth-clients no\ntls-replication yes\n\
                 tls-cert-file {}\ntls-key-file {}\ntls-ca-cert-file {}\n",
                certs.join("server.crt").display(),
                certs.join("server.key").display(),
                certs.join("ca.crt").display()
            ),
        };
        std::fs::write(&file, format!("{listen}bind 127.0.0.1\n{config}\n"))?;
        command.arg(file).arg("--sentinel");
        return run(command, &binary);
    }
    command.args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"]);
    command.args(&launch.args);
    let certs = launch.tls.as_ref().map(|(certs, _)| certs.as_path());
    match certs {
        None => command.args(["--port", &port.to_string()]),
        Some(certs) => command
            .args(["--port", "0", "--tls-port", &port.to_string()])
            .args(["--tls-auth-clients", "no", "--tls-cert-file"])
            .arg(certs.join("server.crt"))
            .arg("--tls-key-file")
            .arg(certs.join("server.key"))
            .arg("--tls-ca-cert-file")
            .arg(certs.join("ca.crt")),
    };
    if let Some(dir) = &launch.dir {
        command.arg("--dir").arg(dir);
    }
    match launch.aof {
        false => command.args(["--appendonly", "no"]),
        true => command.args(["--appendonly", "yes", "--appendfsync", "always"]),
    };
    run(command, &binary)
}

fn run(mut command: Command, binary: &str) -> io::Result<Child> {
    command
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .map_err(|e| match e.kind() {
            io::ErrorKind::NotFound => io::Error::new(
                io::ErrorKind::NotFound,
                format!(
                    "{binary} was not found: tests need a redis-server of their own. {INSTALL_HINT}"
                ),
            ),
            _ => io::Error::new(e.kind(), format!("could not start {binary}: {e}")),
        })
}
