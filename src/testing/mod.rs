//! A private `redis-server` for tests (feature `testing`): test your own code against a
//! real server, as redguard's own tests do.
//!
//! ```no_run
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! use redguard::Locker;
//! use redguard::testing::Server;
//!
//! // In a #[test]: a server of this test's own, on a free loopback port, in memory only.
//! let server = Server::start()?;
//! let locker = Locker::connect(server.url())?;
//! let guard = locker.lock(&["report"])?;
//! assert!(locker.try_lock(&["report"])?.is_none(), "held once");
//! drop(guard);
//! // The server stops when `server` drops, and also if the test process dies.
//! # Ok(()) }
//! ```
//!
//! [`Replicated`] is a master with replicas and the sentinels that watch it, for testing
//! [`build_sentinel`](crate::LockerBuilder::build_sentinel) and failovers.
//!
//! `REDIS_SERVER` names the binary to run when `redis-server` is not on the PATH.

mod launch;
mod replicated;

pub use replicated::Replicated;

use launch::{Launch, free_port, password_in, private_dir, spawn, watchdog};

use std::io;
use std::process::{Child, ChildStdin, Command};
use std::thread;
use std::time::{Duration, Instant};

/// A `redis-server` of its own, on a free port of 127.0.0.1; stopped (SIGKILL) on drop.
/// On Unix a watchdog (`sh`, waiting on a pipe from this process) stops it too if this
/// process dies first, so a crashed test leaves no server behind.
pub struct Server {
    child: Child,
    /// The watchdog, and its end of the pipe: closed when this process dies.
    watchdog: Option<(Child, ChildStdin)>,
    port: u16,
    launch: Launch,
}

impl Server {
    /// Starts a server (no persistence) on a free port and waits until it answers.
    ///
    /// # Errors
    /// `NotFound`, saying how to install it, when there is no `redis-server` to run;
    /// another error when it does not come up.
    pub fn start() -> io::Result<Server> {
        Server::start_on_free_port(Launch::default())
    }

    /// The server that the environment variable `var` names (its URL), when it is set;
    /// otherwise one of this process's own, as [`start`](Self::start) gives, kept alive
    /// by the `Server` returned with its URL. For demos and tests that may also run
    /// against a server someone else runs.
    ///
    /// ```no_run
    /// # fn main() -> std::io::Result<()> {
    /// let (url, private) = redguard::testing::Server::from_env_or_start("REDIS_URL")?;
    /// if private.is_some() {
    ///     println!("REDIS_URL is not set: started a redis-server at {url}");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`start`](Self::start), when `var` is not set.
    pub fn from_env_or_start(var: &str) -> io::Result<(String, Option<Server>)> {
        if let Ok(url) = std::env::var(var) {
            return Ok((url, None));
        }
        let server = Server::start()?;
        Ok((server.url(), Some(server)))
    }

    /// Like [`start`](Self::start), with more `redis-server` arguments (as
    /// `["--requirepass", "secret"]`).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with(args: &[&str]) -> io::Result<Server> {
        Server::start_on_free_port(Launch {
            password: password_in(args),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            ..Launch::default()
        })
    }

    /// Like [`start`](Self::start), with every write in an append-only file fsynced at
    /// once (in a directory of its own, removed on drop), so that a [`kill`](Self::kill)
    /// and [`restart`](Self::restart) lose nothing.
    ///
    /// # Errors
    /// As [`start`](Self::start), and when the directory cannot be made.
    pub fn start_persistent() -> io::Result<Server> {
        Server::start_on_free_port(Launch {
            aof: true,
            ..Launch::default()
        })
    }

    /// A Redis Sentinel (`redis-server --sentinel`) with `config` (its `sentinel monitor`
    /// and other lines; the port is added), in a directory of its own, removed on drop.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_sentinel(config: &str) -> io::Result<Server> {
        let password = config.lines().find_map(|line| {
            line.strip_prefix("requirepass ")
                .map(|password| password.trim().to_string())
        });
        Server::start_on_free_port(Launch {
            sentinel: Some(config.to_string()),
            password,
            ..Launch::default()
        })
    }

    /// A server that speaks TLS only (`rediss://`), with the certificates in `certs`
    /// (`ca.crt`, `server.crt`, `server.key`); `ca` is the CA certificate (PEM), which
    /// [`url`](Self::url)'s clients must trust. Needs a `redis-server` built with TLS.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    #[cfg(feature = "tls")]
    pub fn start_tls(certs: &std::path::Path, ca: Vec<u8>) -> io::Result<Server> {
        Server::start_on_free_port(Launch {
            tls: Some((certs.to_path_buf(), ca)),
            ..Launch::default()
        })
    }

    /// Like [`start_tls`](Self::start_tls), with more `redis-server` arguments (as
    /// `["--replicaof", "127.0.0.1", "7000", "--tls-replication", "yes"]`).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    #[cfg(feature = "tls")]
    pub fn start_tls_with(
        certs: &std::path::Path,
        ca: Vec<u8>,
        args: &[&str],
    ) -> io::Result<Server> {
        Server::start_on_free_port(Launch {
            tls: Some((certs.to_path_buf(), ca)),
            password: password_in(args),
            args: args.iter().map(|arg| arg.to_string()).collect(),
            ..Launch::default()
        })
    }

    /// Like [`start_sentinel`](Self::start_sentinel), speaking TLS only, and to the
    /// servers it watches too (`tls-replication yes`), with the certificates of
    /// [`start_tls`](Self::start_tls).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    #[cfg(feature = "tls")]
    pub fn start_sentinel_tls(
        config: &str,
        certs: &std::path::Path,
        ca: Vec<u8>,
    ) -> io::Result<Server> {
        Server::start_on_free_port(Launch {
            sentinel: Some(config.to_string()),
            tls: Some((certs.to_path_buf(), ca)),
            ..Launch::default()
        })
    }

    fn start_on_free_port(mut launch: Launch) -> io::Result<Server> {
        launch.dir = Some(private_dir()?);
        // A free port can be taken between our probe and the server's bind: try a few.
        for _ in 0..5 {
            let port = free_port()?;
            let child = spawn(port, &launch)?;
            let mut server = Server {
                watchdog: watchdog(child.id()),
                child,
                port,
                launch: launch.clone(),
            };
            if server.wait_until_ready() {
                return Ok(server);
            }
            server.launch.dir = None; // the next try uses the directory: keep it
        }
        Err(io::Error::other(
            "redis-server did not come up on a free port after 5 tries (a REDIS_SERVER \
             that is a script must exec redis-server: the server must be our child)",
        ))
    }

    /// Its URL: `redis://127.0.0.1:<port>/` (`rediss://` for a TLS server).
    pub fn url(&self) -> String {
        let scheme = if self.launch.tls.is_some() {
            "rediss"
        } else {
            "redis"
        };
        format!("{scheme}://127.0.0.1:{}/", self.port)
    }

    /// Its port on 127.0.0.1.
    pub fn port(&self) -> u16 {
        self.port
    }

    /// Its process id.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Freezes it (SIGSTOP): connections stay open, nothing answers; for testing what a
    /// frozen server does to your code.
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn pause(&self) -> io::Result<()> {
        self.signal("STOP")
    }

    /// Undoes [`pause`](Self::pause) (SIGCONT).
    ///
    /// # Errors
    /// When the signal cannot be sent.
    pub fn resume(&self) -> io::Result<()> {
        self.signal("CONT")
    }

    /// Kills it (SIGKILL: no shutdown, no save) and waits until it is gone.
    pub fn kill(&mut self) {
        self.stop_watchdog(); // first: it must never signal a process id reused after ours
        let _ = self.child.kill();
        let _ = self.child.wait();
    }

    /// Starts it again on the same port (and directory), after [`kill`](Self::kill).
    ///
    /// # Errors
    /// When it does not come back within about five seconds.
    pub fn restart(&mut self) -> io::Result<()> {
        for _ in 0..50 {
            self.kill(); // a try that did not come up must not linger
            self.child = spawn(self.port, &self.launch)?;
            self.watchdog = watchdog(self.child.id());
            if self.wait_until_ready() {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(100)); // the port may linger a moment
        }
        Err(io::Error::other(format!(
            "redis-server did not come back on port {}",
            self.port
        )))
    }

    /// Waits until the server answers, and is ours: not a server of another test that
    /// had the port first while ours failed to bind it.
    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: most likely the port was taken
            }
            if let Some(pid) = self.answering_pid() {
                return pid == self.child.id();
            }
            thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// A client for it (trusting its CA, for a TLS server): for looking at the server,
    /// or tampering with it, behind your locker's back.
    ///
    /// # Errors
    /// As `redis::Client::open`.
    pub fn client(&self) -> redis::RedisResult<redis::Client> {
        match &self.launch.tls {
            #[cfg(feature = "tls")]
            Some((_, ca)) => redis::Client::build_with_tls(
                self.url(),
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(ca.clone()),
                },
            ),
            _ => redis::Client::open(self.url()),
        }
    }

    /// The process id of whatever server answers on the port, if one does.
    fn answering_pid(&self) -> Option<u32> {
        let mut con = self
            .client()
            .ok()?
            .get_connection_with_timeout(Duration::from_secs(1))
            .ok()?;
        con.set_read_timeout(Some(Duration::from_secs(2))).ok()?;
        if let Some(password) = &self.launch.password {
            redis::cmd("AUTH")
                .arg(password)
                .query::<()>(&mut con)
                .ok()?;
        }
        let info: String = redis::cmd("INFO").arg("server").query(&mut con).ok()?;
        info.lines()
            .find_map(|line| line.strip_prefix("process_id:"))
            .and_then(|pid| pid.trim().parse().ok())
    }

    fn signal(&self, name: &str) -> io::Result<()> {
        let status = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()?;
        if status.success() {
            Ok(())
        } else {
            Err(io::Error::other(format!("kill -{name} failed")))
        }
    }

    /// Ends the watchdog first, so that it never signals a process id reused after ours.
    fn stop_watchdog(&mut self) {
        if let Some((mut watchdog, _pipe)) = self.watchdog.take() {
            let _ = watchdog.kill();
            let _ = watchdog.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.stop_watchdog();
        self.kill(); // SIGKILL also ends a paused server
        if let Some(dir) = &self.launch.dir {
            let _ = std::fs::remove_dir_all(dir);
        }
    }
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("url", &self.url())
            .field("pid", &self.child.id())
            .finish_non_exhaustive()
    }
}
