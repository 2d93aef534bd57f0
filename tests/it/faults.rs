//! An unreachable or frozen server gives an error within the configured bounds, never a hang.

use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, SocketTimeouts};

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
fn guard_is_lost_once_its_ttl_passes_while_the_server_is_away() {
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

#[test]
fn dropping_guards_and_locker_is_bounded_while_the_refresher_is_stuck() {
    let server = RedisServer::start();
    let locker = tight().pool_size(4).build(server.url()).unwrap();
    let options = LockOptions::default().ttl(Duration::from_millis(900));
    let guards: Vec<_> = (0..40)
        .map(|i| {
            locker
                .lock_with(&[format!("k{i}")], options.clone())
                .unwrap()
        })
        .collect();
    server.pause();
    std::thread::sleep(Duration::from_millis(400)); // the refresher is now waiting on Redis

    // Each drop waits at most a checkout and an I/O timeout; dropped in parallel, the
    // guards take about one such wait, and the locker then joins its refresher, whose
    // batch is one request with one reply, so one I/O timeout too.
    let (_, took) = timed(|| {
        let droppers: Vec<_> = guards
            .into_iter()
            .map(|guard| std::thread::spawn(move || drop(guard)))
            .collect();
        droppers.into_iter().for_each(|d| d.join().unwrap());
    });
    assert!(took < LIMIT, "dropping the guards took {took:?}");
    let (_, took) = timed(|| drop(locker));
    assert!(took < LIMIT, "dropping the locker took {took:?}");
    server.resume();
}

#[test]
fn request_that_failed_mid_write_does_not_poison_the_pool() {
    let server = RedisServer::start();
    let locker = tight().pool_size(1).build(server.url()).unwrap();
    server.query::<()>(&["SET", "x", "someone-else"]);

    // Far more than the socket buffers hold: the write times out half done.
    server.pause();
    let huge = LockOptions::default().metadata("m".repeat(64 << 20));
    let result = locker.lock_with(&["y"], huge);
    assert!(matches!(result, Err(Error::Redis(_))), "{result:?}");
    server.resume();

    // The only connection must not be reused with half a request on it.
    let result = locker.try_lock(&["x"]);
    assert!(matches!(result, Ok(None)), "{result:?}");
    assert_eq!(server.query::<String>(&["GET", "x"]), "someone-else");
}

#[test]
fn given_pool_with_socket_timeouts_errs_within_the_bounds_and_recovers() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let pool = r2d2::Pool::builder()
        .max_size(1)
        .connection_timeout(Duration::from_millis(600))
        .connection_customizer(Box::new(SocketTimeouts(Duration::from_millis(300))))
        .build(client)
        .unwrap();
    let locker = Locker::from_pool(pool);
    server.query::<()>(&["SET", "x", "someone-else"]);
    server.pause();

    let (result, took) = timed(|| locker.try_lock(&["k"]));
    assert!(
        matches!(result, Err(Error::Redis(_) | Error::Pool(_))),
        "{result:?}"
    );
    assert!(took < LIMIT, "try_lock took {took:?}");

    server.resume();
    let result = locker.try_lock(&["x"]);
    assert!(matches!(result, Ok(None)), "{result:?}");
}
