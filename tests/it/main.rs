//! Integration tests: one binary (links once), each test against its own redis-server.

mod cancel;
mod cli;
mod cli_elect;
mod cli_status;
mod cli_stop;
mod cluster;
mod cluster_queue;
mod cluster_server;
mod dead_waiters;
mod election;
mod election_deploy;
mod election_input;
mod election_processes;
mod faults;
mod fencing;
mod force_release;
mod holders;
mod input;
mod lease;
mod lock;
mod lost;
mod order;
mod overlap;
mod pitfalls;
mod props;
mod proxy;
mod queue;
mod read;
mod readme;
mod redlock;
mod refresh;
mod security;
mod semaphore;
mod sentinel;
mod server;
mod stats;
mod stress;
mod testing;
mod threads;
mod tls;
mod torture;
mod wake;
mod wire;

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

/// A locker with small bounds: every call on a dead or frozen server fails well within a
/// few seconds.
fn tight() -> redguard::LockerBuilder {
    Locker::builder()
        .pool_size(2)
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .checkout_timeout(Duration::from_millis(600))
}

/// This test binary again, running only the ignored test `name`: for tests that need
/// another process (or one without the other tests' threads).
fn child_test(name: &str) -> std::process::Command {
    let mut command = std::process::Command::new(std::env::current_exe().unwrap());
    command
        .args(["--exact", name])
        .args(["--ignored", "--nocapture", "--test-threads=1"]);
    command
}

/// Polls `condition` until it holds, failing the test after `limit`.
fn eventually(limit: Duration, what: &str, mut condition: impl FnMut() -> bool) {
    let deadline = Instant::now() + limit;
    while !condition() {
        assert!(Instant::now() < deadline, "not within {limit:?}: {what}");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// Threads of this process with this name (Linux keeps the first 15 bytes of it).
#[cfg(target_os = "linux")]
fn threads_named(name: &str) -> usize {
    let name = &name[..name.len().min(15)];
    std::fs::read_dir("/proc/self/task")
        .unwrap()
        .filter_map(|task| std::fs::read_to_string(task.ok()?.path().join("comm")).ok())
        .filter(|comm| comm.trim_end() == name)
        .count()
}

/// Runs the ignored test `name` in a child process of its own and checks that it passed.
fn in_child_process(name: &str) {
    let output = child_test(name)
        .env("REDGUARD_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// Whether `pid` runs (a zombie, dead but not yet reaped by init, does not).
pub fn alive(pid: u32) -> bool {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let state = stat
        .rsplit_once(')')
        .and_then(|(_, rest)| rest.split_whitespace().next());
    match state {
        Some(state) => state != "Z" && state != "X",
        // No /proc here: ask kill(1), which counts zombies as alive.
        None => std::process::Command::new("kill")
            .args(["-0", &pid.to_string()])
            .stderr(std::process::Stdio::null())
            .status()
            .is_ok_and(|status| status.success()),
    }
}
