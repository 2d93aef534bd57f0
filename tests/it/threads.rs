//! The threads a locker runs.

use std::time::Duration;

use redguard::Locker;

use crate::server::RedisServer;
use crate::{eventually, in_child_process, threads_named};

#[cfg(target_os = "linux")]
#[test]
fn each_pool_has_one_background_thread() {
    in_child_process("threads::pool_threads_child");
}

#[cfg(target_os = "linux")]
#[test]
#[ignore = "run by each_pool_has_one_background_thread"]
fn pool_threads_child() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let pool_threads = |n: usize, what: &str| {
        eventually(Duration::from_secs(5), what, || {
            threads_named("redguard-pool") == n
        });
    };

    let single = Locker::connect(servers[0].url()).unwrap();
    pool_threads(1, "one for a locker on one server");
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let redlock = Locker::builder().build_redlock(&urls).unwrap();
    pool_threads(6, "and one per node of a quorum");
    assert_eq!(
        threads_named("r2d2-worker-0"),
        0,
        "r2d2's own are not started"
    );
    drop(redlock.lock(&["k"]).unwrap());
    drop((single, redlock));
    pool_threads(0, "gone with their lockers");
}
