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
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers PING.
    /// Panics, saying how to install it, when `redis-server` is missing.
    pub fn start() -> RedisServer {
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        // A free port can be taken between our probe and the server's bind: try a few.
        for _ in 0..5 {
            let port = free_port();
            let child = Command::new(&binary)
                .args(["--port", &port.to_string(), "--bind", "127.0.0.1"])
                .args(["--save", "", "--appendonly", "no", "--daemonize", "no"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn();
            let child = match child {
                Ok(child) => child,
                Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                    panic!("{binary} was not found: {INSTALL_HINT}")
                }
                Err(e) => panic!("could not start {binary}: {e}"),
            };
            let mut server = RedisServer { child, port };
            if server.wait_until_ready() {
                return server;
            }
        }
        panic!("redis-server did not come up on a free port after 5 tries");
    }

    fn wait_until_ready(&mut self) -> bool {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return false; // exited: most likely the port was taken
            }
            if let Ok(mut con) = self.try_connection()
                && redis::cmd("PING").query::<String>(&mut con).is_ok()
            {
                return true;
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
        format!("redis://127.0.0.1:{}/", self.port)
    }

    fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let client = redis::Client::open(self.url())?;
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
        let _ = self.child.kill(); // SIGKILL also ends a paused server
        let _ = self.child.wait();
    }
}

/// A loopback port that nothing listened on a moment ago.
pub fn free_port() -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").expect("bind a free port");
    listener.local_addr().expect("local address").port()
}
