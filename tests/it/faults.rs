//! An unreachable or frozen server gives an error within the configured bounds, never a hang.

use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, SocketTimeouts};

use crate::server::{RedisServer, closed_url};
use crate::tight;

/// With [`tight`] bounds, each failing call below should end well within this.
const LIMIT: Duration = Duration::from_secs(3);

fn timed<T>(f: impl FnOnce() -> T) -> (T, Duration) {
    let started = Instant::now();
    let value = f();
    (value, started.elapsed())
}

#[test]
fn permanent_connect_errors_come_back_at_once_saying_what_happened() {
    let server = RedisServer::start();
    server.query::<String>(&["ACL", "SETUSER", "app", "on", ">right", "+@all", "~*"]);
    let port = server
        .url()
        .rsplit(':')
        .next()
        .unwrap()
        .trim_end_matches('/')
        .to_string();
    let cases = [
        (closed_url(0), "refused"),
        ("redis://no-such-host.invalid/".to_string(), "host"),
        (format!("redis://127.0.0.1:{port}/99"), "database"),
        (format!("redis://app:wrong@127.0.0.1:{port}/"), "password"),
    ];
    for (url, says) in cases {
        // Default bounds: a checkout timeout of 3 s that none of these waits for.
        let (result, took) = timed(|| Locker::connect(url.as_str()));
        let err = result.expect_err(&url);
        assert!(matches!(err, Error::Redis(_)), "{url}: {err:?}");
        let text = err.to_string();
        assert!(text.contains(says), "{url}: {text}");
        assert!(!text.contains("pool_size"), "{url}: {text}");
        assert!(took < Duration::from_secs(1), "{url}: took {took:?}");
    }
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
    match result {
        Err(err @ Error::Redis(_)) => assert!(err.to_string().contains("not answering")),
        other => panic!("expected a Redis error, got {other:?}"),
    }
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

#[test]
fn server_paused_while_a_lock_waits_gives_an_error_within_the_bounds() {
    let server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let _holder = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let waiter = {
        let locker = locker.clone();
        std::thread::spawn(move || {
            let options = LockOptions::default()
                .timeout(Duration::from_secs(1))
                .retry(redguard::Retry::linear(Duration::from_millis(20)));
            timed(|| locker.lock_with(&["k"], options))
        })
    };
    std::thread::sleep(Duration::from_millis(100)); // waiting now
    server.pause();
    let (result, took) = waiter.join().unwrap();
    server.resume();
    assert!(result.is_err(), "{result:?}");
    assert!(took < Duration::from_secs(1) + LIMIT, "took {took:?}");
}

#[test]
fn paused_past_the_ttl_with_auto_refresh_ends_lost_not_panicking() {
    let server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(Duration::from_secs(1)))
        .unwrap();
    server.pause();
    std::thread::sleep(Duration::from_secs(3));
    server.resume();

    assert!(guard.is_lost());
    let (result, took) = timed(|| guard.release());
    assert!(matches!(result, Err(Error::LockLost)), "{result:?}");
    assert!(took < LIMIT, "release took {took:?}");
}

#[test]
fn restart_on_the_same_port_recovers_and_never_reuses_a_fencing_token() {
    let mut server = RedisServer::start_persistent();
    let locker = tight().pool_size(4).build(server.url()).unwrap();
    let fenced = LockOptions::default()
        .fencing(true)
        .ttl(Duration::from_millis(500));
    let before = locker.lock_with(&["k"], fenced.clone()).unwrap();
    let old_token = before.fence().unwrap();

    server.kill();
    std::thread::sleep(Duration::from_millis(700)); // the lock's TTL passes while it is down
    server.restart();

    assert!(before.is_lost(), "held across a restart past its TTL");
    // The pool recovers by itself: its connections to the dead server are thrown away.
    let after = locker.lock_with(&["k"], fenced).unwrap();
    let new_token = after.fence().unwrap();
    assert!(new_token > old_token, "token {new_token} after {old_token}");
    assert!(matches!(before.release(), Err(Error::LockLost)));
    after.release().unwrap();
}

#[test]
fn server_killed_for_good_gives_errors_and_bounded_drops() {
    let mut server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let guards: Vec<_> = (0..2)
        .map(|i| locker.lock(&[format!("k{i}")]).unwrap())
        .collect();
    server.kill();

    let (result, took) = timed(|| locker.lock(&["new"]));
    assert!(
        matches!(result, Err(Error::Redis(_) | Error::Pool(_))),
        "{result:?}"
    );
    assert!(took < LIMIT, "lock took {took:?}");
    for guard in guards {
        let (_, took) = timed(|| drop(guard));
        assert!(took < LIMIT, "drop took {took:?}");
    }
    let (_, took) = timed(|| drop(locker));
    assert!(took < LIMIT, "dropping the locker took {took:?}");
}

#[test]
fn killed_pool_connections_are_replaced_without_help() {
    let server = RedisServer::start();
    let locker = tight().pool_size(4).build(server.url()).unwrap();
    for _ in 0..8 {
        drop(locker.lock(&["warm"]).unwrap()); // every pooled connection in use
    }
    // Mid-use: a guard is held, and auto-refreshed, when every connection is killed.
    let held = locker
        .lock_with(
            &["held"],
            LockOptions::default().ttl(Duration::from_millis(600)),
        )
        .unwrap();
    let killed: u32 = server.query(&["CLIENT", "KILL", "TYPE", "normal"]);
    assert!(killed >= 4, "killed {killed}");

    // The refresher's next round trips (every 200 ms) find their connections closed too.
    std::thread::sleep(Duration::from_millis(700));
    assert!(
        !held.is_lost(),
        "the refresher gave up on a killed connection"
    );
    // Not one call fails: each finds its connection closed, drops it and uses another.
    assert!(held.ttl().unwrap().is_some());
    held.refresh(Duration::from_millis(600)).unwrap();
    let guard = locker.lock(&["k"]).unwrap();
    guard.release().unwrap();
    held.release().unwrap();
}

#[test]
fn an_error_reply_redis_rs_has_no_kind_for_keeps_the_connection() {
    let server = RedisServer::start();
    let locker = crate::locker(&server);
    drop(locker.lock(&["warm"]).unwrap());
    // One connection of the test's own for its questions.
    let admin = std::cell::RefCell::new(server.connection());
    let query = |args: &[&str]| -> String {
        let mut cmd = redis::cmd(args[0]);
        cmd.arg(&args[1..]);
        cmd.query(&mut *admin.borrow_mut()).unwrap()
    };
    let connections = || {
        query(&["INFO", "stats"])
            .lines()
            .find_map(|l| l.strip_prefix("total_connections_received:"))
            .and_then(|n| n.trim().parse::<u64>().ok())
            .unwrap()
    };
    let before = connections();
    // OOM is a complete reply (redis-rs gives it no ErrorKind of its own): the connection
    // is still in step and must not be thrown away and made again.
    query(&["CONFIG", "SET", "maxmemory", "1"]);
    for _ in 0..5 {
        let result = locker.lock(&["k"]);
        assert!(
            matches!(&result, Err(Error::Redis(e)) if e.code() == Some("OOM")),
            "{result:?}"
        );
    }
    query(&["CONFIG", "SET", "maxmemory", "0"]);
    drop(locker.lock(&["k"]).unwrap());
    assert_eq!(connections(), before, "connections were made again");
}

/// The server freezes just as a holder hands the lock over to a waiter of its locker: the
/// waiter's call still ends within its timeout and one I/O timeout (the hand-over's), not
/// after the hand-over, the release and an attempt of its own have each timed out.
#[test]
fn a_wait_ends_in_time_when_the_server_freezes_during_a_hand_over() {
    let server = RedisServer::start();
    let io = Duration::from_secs(1);
    let locker = Locker::builder()
        .pool_size(2)
        .io_timeout(io)
        .checkout_timeout(2 * io)
        .build(server.url())
        .unwrap();
    let holder = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let timeout = Duration::from_millis(300);
    let waiter = {
        let locker = locker.clone();
        std::thread::spawn(move || {
            let options = LockOptions::default()
                .timeout(timeout)
                .retry(redguard::Retry::linear(Duration::from_secs(10)));
            timed(|| locker.lock_with(&["k"], options))
        })
    };
    let subscribed = Instant::now();
    // Queued, and listening: its attempt after its subscription is confirmed is over.
    while server.queued("k") == 0 || server.lockers_listening() == 0 {
        assert!(subscribed.elapsed() < LIMIT, "the waiter never waited");
        std::thread::sleep(Duration::from_millis(2));
    }
    std::thread::sleep(Duration::from_millis(50));
    server.pause();
    let dropped = std::thread::spawn(move || timed(|| drop(holder)).1);
    let (result, took) = waiter.join().unwrap();
    let drop_took = dropped.join().unwrap();
    server.resume();
    // The waiter's own timeout ends it; leaving the queue then waits out one I/O timeout
    // at most (the hand-over is the release's, on the server: nothing of it is awaited).
    // (An attempt of its own in flight as the server froze says so instead.)
    assert!(
        matches!(result, Err(Error::NotObtained | Error::Redis(_))),
        "{result:?}"
    );
    // Less than half an I/O timeout of slack: one more round trip would show.
    assert!(took < timeout + io + io * 2 / 5, "took {took:?}");
    assert!(drop_took < LIMIT, "the drop is bounded too: {drop_took:?}");
}

/// The server goes away under a live locker (default bounds: a 3 s checkout timeout):
/// once its connections are gone, each call fails at once with the socket's own words and
/// the address, not after the checkout timeout with advice to raise the pool's size.
#[test]
fn a_server_gone_under_a_live_locker_fails_fast_saying_why_and_where() {
    let mut server = RedisServer::start();
    let port = server.port().to_string();
    let locker = Locker::connect(server.url()).unwrap();
    drop(locker.lock(&["k"]).unwrap());
    server.kill();
    // The first calls find the pooled connections dead (at once, as the server closed
    // them), and throw them away.
    let _ = locker.try_lock(&["k"]);
    for _ in 0..3 {
        let (result, took) = timed(|| locker.try_lock(&["k"]));
        let err = result.unwrap_err();
        assert!(matches!(err, Error::Redis(_)), "{err:?}");
        let said = err.to_string();
        assert!(said.contains("refused") && said.contains(&port), "{said}");
        assert!(took < Duration::from_secs(1), "took {took:?}: {said}");
    }
}

/// A server that wants a password the URL does not give: `connect` says so at once (the
/// connection itself is accepted; every command is refused with NOAUTH).
#[test]
fn connect_without_the_password_the_server_wants_is_an_error_at_once() {
    let server = RedisServer::start();
    server.query::<()>(&["CONFIG", "SET", "requirepass", "s3cret"]);
    let err = Locker::connect(server.url()).unwrap_err();
    let said = err.to_string();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    assert!(
        said.contains("credentials") && said.contains("NOAUTH"),
        "{said}"
    );
    let with = server.url().replace("redis://", "redis://:s3cret@");
    assert!(Locker::connect(with).is_ok());
}

/// Something that is not Redis listens at the address: the error says so.
#[test]
fn connect_to_a_listener_that_is_not_redis_says_so() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let speaker = std::thread::spawn(move || {
        if let Ok((mut con, _)) = listener.accept() {
            use std::io::Write;
            let _ = con.write_all(b"HTTP/1.1 400 Bad Request\r\n\r\n");
            std::thread::sleep(Duration::from_millis(500));
        }
    });
    let err = tight()
        .build(format!("redis://127.0.0.1:{port}/"))
        .unwrap_err();
    let said = err.to_string();
    assert!(said.contains("not answer as Redis"), "{said}");
    speaker.join().unwrap();
}
