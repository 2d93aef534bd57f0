//! An unreachable or frozen server gives an error within the configured bounds, never a hang.

use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker};

use crate::server::{RedisServer, free_port};

/// Small bounds: each failing call below should end well within `LIMIT`.
fn tight() -> redguard::LockerBuilder {
    Locker::builder()
        .pool_size(2)
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .checkout_timeout(Duration::from_millis(600))
}

const LIMIT: Duration = Duration::from_secs(3);

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let value = f();
    (value, started.elapsed())
}

#[test]
fn closed_port_gives_a_pool_error_within_the_bounds() {
    let url = format!("redis://127.0.0.1:{}/", free_port());
    let (result, took) = timed(|| tight().build(url));
    match result {
        Err(err @ Error::Pool(_)) => {
            assert!(err.to_string().starts_with("no redis connection"), "{err}");
        }
        other => panic!("expected a pool error, got {other:?}"),
    }
    assert!(took < LIMIT, "took {took:?}");
}

#[test]
fn paused_server_gives_errors_within_the_bounds() {
    let server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let held = locker
        .lock_with(&["held"], LockOptions::default().auto_refresh(false))
        .unwrap();
    server.pause();

    // A Redis error is returned at once, not retried as if the lock were held.
    let (result, took) = timed(|| locker.lock(&["k"]));
    assert!(
        matches!(result, Err(Error::Redis(_) | Error::Pool(_))),
        "{result:?}"
    );
    assert!(took < LIMIT, "lock took {took:?}");

    let (result, took) = timed(|| held.ttl());
    assert!(
        matches!(result, Err(Error::Redis(_) | Error::Pool(_))),
        "{result:?}"
    );
    assert!(took < LIMIT, "ttl took {took:?}");

    let (_, took) = timed(|| drop(held));
    assert!(took < LIMIT, "drop took {took:?}");

    let (result, took) = timed(|| tight().build(server.url()));
    assert!(matches!(result, Err(Error::Pool(_))), "{result:?}");
    assert!(took < LIMIT, "connect took {took:?}");

    // Once the server is back, the same locker works again without help.
    server.resume();
    let mut recovered = false;
    for _ in 0..10 {
        if let Ok(Some(_)) = locker.try_lock(&["after"]) {
            recovered = true;
            break;
        }
    }
    assert!(recovered, "the pool did not recover");
}

#[test]
fn refresher_rides_out_a_pause_shorter_than_the_ttl() {
    let server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(Duration::from_secs(3)))
        .unwrap();

    // Long enough for refreshes to time out (I/O bound 300 ms), short of the 3 s TTL.
    server.pause();
    std::thread::sleep(Duration::from_millis(1500));
    server.resume();

    // Connection errors are retried, not taken for loss: a TTL later it is still held.
    std::thread::sleep(Duration::from_secs(3));
    assert!(!guard.is_lost());
    assert_eq!(
        server.query::<Option<String>>(&["GET", "k"]).as_deref(),
        Some(guard.token())
    );
    guard.release().unwrap();
}

#[test]
fn refresher_marks_lost_when_the_server_stays_away_past_the_ttl() {
    let server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(Duration::from_secs(1)))
        .unwrap();
    let started = Instant::now();
    server.pause();

    crate::eventually(Duration::from_secs(5), "the guard is marked lost", || {
        guard.is_lost()
    });
    let took = started.elapsed();
    assert!(
        took <= Duration::from_millis(1100),
        "lost only after {took:?}"
    );

    server.resume();
    let (result, took) = timed(|| guard.release());
    assert!(matches!(result, Err(Error::LockLost)), "{result:?}");
    assert!(took < LIMIT, "release took {took:?}");
}
