//! The tests' private `redis-server`: `redguard::testing::Server` (one harness for the
//! library's users and for us), with what only the tests need on top: panics instead of
//! errors, commands behind the library's back, and the server's own counters. Shared by
//! the tests and the benches (the examples use `redguard::testing::Server` itself).

use std::ops::{Deref, DerefMut};

use redguard::testing::Server;

pub struct RedisServer(Server);

impl Deref for RedisServer {
    type Target = Server;

    fn deref(&self) -> &Server {
        &self.0
    }
}

impl DerefMut for RedisServer {
    fn deref_mut(&mut self) -> &mut Server {
        &mut self.0
    }
}

impl RedisServer {
    /// Starts a server on a free port of 127.0.0.1 and waits until it answers. Panics,
    /// saying how to install it, when `redis-server` is missing.
    pub fn start() -> RedisServer {
        RedisServer(Server::start().unwrap_or_else(|e| panic!("{e}")))
    }

    /// A server that speaks TLS only (`rediss://`), with the certificates in `certs`.
    pub fn start_tls(certs: &std::path::Path, ca: Vec<u8>) -> RedisServer {
        RedisServer(Server::start_tls(certs, ca).unwrap_or_else(|e| panic!("{e}")))
    }

    /// A server whose writes are fsynced to an append-only file at once.
    pub fn start_persistent() -> RedisServer {
        RedisServer(Server::start_persistent().unwrap_or_else(|e| panic!("{e}")))
    }

    /// Its URL (also as a path: `servers.iter().map(RedisServer::url)`).
    pub fn url(&self) -> String {
        self.0.url()
    }

    /// Its process id (the benchmarks read its CPU time).
    #[allow(dead_code)]
    pub fn pid(&self) -> u32 {
        self.0.pid()
    }

    /// Starts the server again on the same port (and directory), after `kill`.
    pub fn restart(&mut self) {
        self.0.restart().unwrap_or_else(|e| panic!("{e}"));
    }

    /// Freezes the server (SIGSTOP): connections stay open, nothing answers.
    pub fn pause(&self) {
        self.0.pause().expect("SIGSTOP the server");
    }

    /// Undoes [`pause`](Self::pause).
    pub fn resume(&self) {
        self.0.resume().expect("SIGCONT the server");
    }

    fn try_connection(&self) -> redis::RedisResult<redis::Connection> {
        let con = self
            .client()?
            .get_connection_with_timeout(std::time::Duration::from_secs(1))?;
        con.set_read_timeout(Some(std::time::Duration::from_secs(2)))?;
        con.set_write_timeout(Some(std::time::Duration::from_secs(2)))?;
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

    /// How many waiters the server's queue of `key` holds (see `lua/queue/queue.lua`), for a
    /// locker without a prefix.
    pub fn queued(&self, key: &str) -> u64 {
        self.queued_at(&queue_of(key))
    }

    /// How many lockers listen on their own channel (where the queue's scripts tell their
    /// waiters they were served): one per locker whose subscriber is connected.
    pub fn lockers_listening(&self) -> usize {
        let channels: Vec<String> = self.query(&["PUBSUB", "CHANNELS", "*redguard:wake:*"]);
        channels.len()
    }

    /// How many waiters the queue at `queue` (its full Redis name) holds.
    pub fn queued_at(&self, queue: &str) -> u64 {
        self.query(&["ZCARD", queue])
    }

    /// How many times EVALSHA ran: one per lock-script round trip.
    pub fn evalsha_calls(&self) -> u64 {
        self.calls("evalsha")
    }

    /// How often the server ran `command` so far (INFO commandstats; calls made by
    /// scripts are counted too).
    pub fn calls(&self, command: &str) -> u64 {
        let info: String = self.query(&["INFO", "commandstats"]);
        info.lines()
            .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
            .and_then(|rest| rest.split(',').next())
            .map_or(0, |n| n.parse().expect("a number of calls"))
    }
}

/// The `n`th (0 to 9) of ten loopback URLs where nothing listens, and no test's server
/// ever will: ports 1 to 10 are far below the ephemeral range that `free_port` draws
/// from (a port free now may be a server's a moment later, in this test binary or in
/// another run beside it).
pub fn closed_url(n: u16) -> String {
    assert!(n < 10, "ten closed ports");
    format!("redis://127.0.0.1:{}/", n + 1)
}

/// The Redis name of `key`'s queue (see `src/backend/fence.rs`).
pub fn queue_of(key: &str) -> String {
    let tagged = key
        .find('{')
        .is_some_and(|open| key[open + 1..].find('}').is_some_and(|close| close > 0));
    if tagged || key.contains('}') {
        format!("redguard:queue:t:{key}")
    } else {
        format!("redguard:queue:{{{key}}}")
    }
}

/// Helpers for the queue tests (`order.rs`, `dead_waiters.rs`, `queue_keys.rs`).
impl RedisServer {
    /// The entries of `key`'s queue, first in line first (see `lua/queue/queue.lua`): each
    /// holds its waiter's value, so its metadata too.
    #[allow(dead_code)]
    pub fn queue_entries(&self, key: &str) -> Vec<String> {
        self.query(&["ZRANGE", &queue_of(key), "0", "-1"])
    }

    /// Every key on the server, sorted.
    #[allow(dead_code)]
    pub fn all_keys(&self) -> Vec<String> {
        let mut keys: Vec<String> = self.query(&["KEYS", "*"]);
        keys.sort();
        keys
    }
}

/// For the benches: puts this process (every thread) and `pids` on CPU 0, or back on every
/// CPU.
#[allow(dead_code)]
pub fn pin(pids: &[u32], pinned: bool) {
    let cpus = if pinned {
        "0".to_string()
    } else {
        let n = std::thread::available_parallelism().map_or(1, |n| n.get());
        format!("0-{}", n - 1)
    };
    for pid in std::iter::once(std::process::id()).chain(pids.iter().copied()) {
        let status = std::process::Command::new("taskset")
            .args(["-a", "-cp", &cpus, &pid.to_string()])
            .stdout(std::process::Stdio::null())
            .status()
            .expect("taskset (util-linux) pins the processes");
        assert!(status.success(), "taskset failed");
    }
}

/// For the benches: the span of each run, `BENCH_SECS` (default 2 s).
#[allow(dead_code)]
pub fn bench_span() -> std::time::Duration {
    let secs: f64 = std::env::var("BENCH_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(2.0);
    std::time::Duration::from_secs_f64(secs)
}
