//! `redguard::testing::Server`, as a user's test would use it.

use std::time::{Duration, Instant};

use redguard::Locker;
use redguard::testing::Server;

use crate::{alive, child_test};

#[test]
fn a_users_test_against_a_private_server() {
    let server = Server::start().expect("redis-server on the PATH");
    let locker = Locker::connect(server.url()).unwrap();
    let guard = locker.lock(&["report"]).unwrap();
    assert!(locker.try_lock(&["report"]).unwrap().is_none(), "held once");
    drop(guard);
    let port = server.port();
    drop((locker, server));
    assert!(
        std::net::TcpStream::connect(("127.0.0.1", port)).is_err(),
        "stopped on drop"
    );
}

#[cfg(unix)]
#[test]
fn the_server_stops_when_the_test_process_dies() {
    let output = child_test("testing::dying_child")
        .env("REDGUARD_CHILD", "1")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    let pid: u32 = stdout
        .lines()
        .find_map(|line| line.split("server pid ").nth(1))
        .and_then(|pid| pid.trim().parse().ok())
        .unwrap_or_else(|| panic!("no pid in {stdout}"));
    assert!(!output.status.success(), "the child died");
    let deadline = Instant::now() + Duration::from_secs(5);
    while alive(pid) {
        assert!(
            Instant::now() < deadline,
            "redis-server {pid} outlived its test"
        );
        std::thread::sleep(Duration::from_millis(10));
    }
}

#[test]
#[ignore = "run by the_server_stops_when_the_test_process_dies"]
fn dying_child() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let server = Server::start().unwrap();
    println!("server pid {}", server.pid());
    std::io::Write::flush(&mut std::io::stdout()).unwrap();
    std::process::abort(); // no drop: only the watchdog can stop it
}
