//! Integration tests: one binary (links once), each test against its own redis-server.

mod faults;
mod fencing;
mod input;
mod lock;
mod props;
mod refresh;
mod security;
mod server;
mod stress;
mod tls;
mod wake;

use std::time::{Duration, Instant};

use redguard::Locker;
use server::RedisServer;

/// A locker on `server` with short bounds, so a failing test fails fast.
fn locker(server: &RedisServer) -> Locker {
    Locker::builder()
        .pool_size(4)
        .io_timeout(Duration::from_secs(2))
        .build(server.url())
        .expect("connect to the test's redis-server")
}

/// Polls `condition` until it holds, failing the test after `limit`.
fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}
