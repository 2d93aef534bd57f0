//! A private `redis-server` on a free loopback port, stopped by its handle on drop.
//! Shared by the tests and `examples/quickstart.rs`.

use std::net::TcpListener;
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

const INSTALL_HINT: &str = "the tests and the demo start their own private redis-server. \
     Install it: `apt-get install -y redis-server` (Debian, Ubuntu), `brew install redis` \
     (macOS), or set REDIS_SERVER to its path";

pub struct RedisServer {
    child: Child,
    port: u16,
    /// Where a persistent server keeps its append-only file; removed on drop.
    dir: Option<std::path::PathBuf>,
    /// A TLS-only server's certificates: the directory, and the CA's certificate (PEM).
    tls: Option<(std::path::PathBuf, Vec<u8>)>,
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers PING.
    /// Panics, saying how to install it, when `redis-server` is missing.
    pub fn start() -> RedisServer {
        Self::start_on_free_port(None, None)
    }

    /// A server that speaks TLS only (`rediss://`), with the certificates in `certs`
    /// (`ca.crt`, `server.crt`, `server.key`); `ca` is the CA certificate (PEM).
    pub fn start_tls(certs: &std::path::Path, ca: Vec<u8>) -> RedisServer {
        Self::start_on_free_port(None, Some((certs.to_path_buf(), ca)))
    }

    /// Like [`start`](Self::start), with every write in an append-only file fsynced at
    /// once, so that a [`kill`](Self::kill) and [`restart`](Self::restart) lose nothing.
    pub fn start_persistent() -> RedisServer {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("redguard-test-{}-{n}", std::process::id()));
        // A killed earlier run with the same process id may have left an old file there.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the server's directory");
        Self::start_on_free_port(Some(dir), None)
    }

    fn start_on_free_port(
        dir: Option<std::path::PathBuf>,
        tls: Option<(std::path::PathBuf, Vec<u8>)>,
    ) -> RedisServer {
        // A free port can be taken between our probe and the server's bind: try a few.
        for _ in 0..5 {
            let port = free_port();
            let certs = tls.as_ref().map(|(certs, _)| certs.as_path());
            let mut server = RedisServer {
                child: spawn(port, dir.as_deref(), certs),
                port,
                dir: dir.clone(),
                tls: tls.clone(),
            };
            if server.wait_until_ready() {
                return server;
            }
            server.dir = None; // the next try uses the directory: keep it
        }
        panic!("redis-server did not come up on a free port after 5 tries");
    }

    /// Kills the server (SIGKILL: no shutdown, no save) and waits until it is gone.
    pub fn kill(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts the server again on the same port (and directory), after [`kill`](Self::kill).
    pub fn restart(&mut self) {
        for _ in 0..50 {
            self.kill(); // a try that did not come up must not linger
            let certs = self.tls.as_ref().map(|(certs, _)| certs.as_path());
            self.child = spawn(self.port, self.dir.as_deref(), certs);
            if self.wait_until_ready() {
                return;
            }
            thread::sleep(Duration::from_millis(100)); // the port may linger a moment
        }
        panic!("redis-server did not come back on port {}", self.port);
    }

    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: most likely the port was taken
            }
            // Ours, not a server of another test (or test run) that had the port first
            // while ours failed to bind it: two tests sharing a server see each other's
            // keys, restarts and pauses.
            if let Ok(mut con) = self.try_connection()
                && let Ok(info) = redis::cmd("INFO").arg("server").query::<String>(&mut con)
            {
                let pid = info
                    .lines()
                    .find_map(|line| line.strip_prefix("process_id:"))
                    .and_then(|pid| pid.trim().parse::<u32>().ok());
                return pid == Some(self.child.id());
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// The server's process id (the benchmark reads its CPU time).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn url(&self) -> String {
        let scheme = if self.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = match &self.tls {
            None => redis::Client::open(self.url())?,
            Some((_, ca)) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            )?,
        };
        let con = client.get_connection_with_timeout(Duration::from_secs(1))?;
        con.set_read_timeout(Some(Duration::from_secs(2)))?;
        con.set_write_timeout(Some(Duration::from_secs(2)))?;
        Ok(con)
    }

    /// A plain connection for looking at (and tampering with) the server behind the
    /// library's back. Every wait is bounded.
    pub fn connection(&self) -> redis::Connection {
        self.try_connection()
            .expect("connect to the test's redis-server")
    }

    /// Runs one command on a fresh plain connection.
    pub fn query<T: redis::FromRedisValue>(&self, args: &[&str]) -> T {
        let mut cmd = redis::cmd(args[0]);
        for arg in &args[1..] {
            cmd.arg(*arg);
        }
        cmd.query(&mut self.connection())
            .unwrap_or_else(|e| panic!("{args:?}: {e}"))
    }

    /// Subscribers to `channel`, as the server counts them (PUBSUB NUMSUB).
    pub fn subscribers(&self, channel: &str) -> u64 {
        let counts: Vec<redis::Value> = self.query(&["PUBSUB", "NUMSUB", channel]);
        counts
            .get(1)
            .and_then(|n| redis::from_redis_value_ref(n).ok())
            .unwrap_or(0)
    }

    /// How many times EVALSHA ran: one per lock-script round trip.
    pub fn evalsha_calls(&self) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]);
        info.lines()
            .find_map(|line| line.strip_prefix("cmdstat_evalsha:calls="))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a number of calls"))
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.signal("STOP");
    }

    /// Undoes [`pause`](Self::pause).
    pub fn resume(&self) {
        self.signal("CONT");
    }

    fn signal(&self, name: &str) {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("run kill");
        assert!(status.success(), "kill -{name} failed");
    }
}

impl Drop for RedisServer {
    fn drop(&mut self) {
        self.kill(); // SIGKILL also ends a paused server
        if let Some(dir) = &self.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

/// Starts `redis-server` on `port`: in memory only, or with every write fsynced to an
/// append-only file in `dir`; speaking TLS only when given `certs`.
fn spawn(port: u16, dir: Option<&std::path::Path>, certs: Option<&std::path::Path>) -> Child {
    let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut command = Command::new(&binary);
    command.args(["--bind", "127.0.0.1", "--save", "", "--daemonize", "no"]);
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
    match dir {
        None => command.args(["--appendonly", "no"]),
        Some(dir) => command
            .args(["--appendonly", "yes", "--appendfsync", "always", "--dir"])
            .arg(dir),
    };
    match command.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("{binary} was not found: {INSTALL_HINT}")
        }
        Err(e) => panic!("could not start {binary}: {e}"),
    }
}

/// For the demos: the server at `REDIS_URL` when set, else a throwaway one (said on stdout,
/// and kept alive as long as the returned handle).
#[allow(dead_code)] // for the demos, not the tests
pub fn url_or_throwaway() -> (String, Option<RedisServer>) {
    match std::env::var("REDIS_URL") {
        Ok(url) => (url, None),
        Err(_) => {
            let server = RedisServer::start();
            println!(
                "REDIS_URL is not set: started a throwaway redis-server at {}",
                server.url()
            );
            (server.url(), Some(server))
        }
    }
}

/// A loopback port that nothing listened on a moment ago.
/// The `n`th (0 to 9) of ten loopback URLs where nothing listens, and no test's server
/// ever will: ports 1 to 10 are far below the ephemeral range that `free_port` draws
/// from (a port free now may be a server's a moment later, in this test binary or in
/// another run beside it).
pub fn closed_url(n: u16) -> String {
    assert!(n < 10, "ten closed ports");
    format!("redis://127.0.0.1:{}/", n + 1)
}

pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}
