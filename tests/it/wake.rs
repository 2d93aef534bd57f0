//! Waiters woken by release: fast hand-off, and every race still ends in the lock taken.
//!
//! The waiters here retry only every 10 s, so a hand-off within a second can only come
//! from a release notification (or a subscription that became active), never from polling.

use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{LockOptions, Locker, Retry};

use crate::server::RedisServer;
use crate::{eventually, locker};

const SLOW_RETRY: Duration = Duration::from_secs(10);
/// Far under SLOW_RETRY, far over a few round trips on a loaded 2-core machine.
const QUICK: Duration = Duration::from_secs(1);

/// Retries only every 10 s: a quick hand-off can only come from a notification.
pub fn patient() -> LockOptions {
    LockOptions::default()
        .retry(Retry::linear(SLOW_RETRY))
        .timeout(3 * SLOW_RETRY)
}

/// Waiters in the server's queue of `key`.
fn listeners(server: &RedisServer, key: &str) -> u64 {
    server.queued(key)
}

/// Starts a thread that waits for `key` with [`patient`] options; it returns the result
/// and when it came.
pub fn waiter(
    locker: &Locker,
    key: &'static str,
) -> thread::JoinHandle<(redguard::Result<redguard::LockGuard>, Instant)> {
    waiter_with(locker, key, patient())
}

/// [`waiter`] with other options.
pub fn waiter_with(
    locker: &Locker,
    key: &'static str,
    options: LockOptions,
) -> thread::JoinHandle<(redguard::Result<redguard::LockGuard>, Instant)> {
    let locker = locker.clone();
    thread::spawn(move || {
        let guard = locker.lock_with(&[key], options);
        (guard, Instant::now())
    })
}

/// Releases `holder`, then waits for `waiting` to hold the lock: how long after the
/// release it got it.
pub fn woken_after_release(
    holder: redguard::LockGuard,
    waiting: thread::JoinHandle<(redguard::Result<redguard::LockGuard>, Instant)>,
) -> std::time::Duration {
    let released = Instant::now();
    holder.release().unwrap();
    let (guard, at) = waiting.join().unwrap();
    drop(guard.unwrap());
    at - released
}

/// `key` held, and a thread waiting for it with its subscription active.
fn held_and_awaited(
    server: &RedisServer,
    locker: &Locker,
    key: &'static str,
) -> (
    redguard::LockGuard,
    thread::JoinHandle<(redguard::Result<redguard::LockGuard>, Instant)>,
) {
    let holder = locker.lock(&[key]).unwrap();
    let waiting = waiter(locker, key);
    eventually(QUICK * 5, "the waiter subscribes", || {
        listeners(server, key) == 1
    });
    (holder, waiting)
}

#[test]
fn waiter_is_woken_by_the_release_not_by_its_retry_delay() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock(&["k"]).unwrap();
    assert!(locker.try_lock(&["k"]).unwrap().is_none()); // loads the acquire script
    let attempts = server.evalsha_calls();

    let waiting = waiter(&locker, "k");
    // Subscribed, and past the attempt its subscription woke it for: now it sleeps.
    eventually(QUICK * 5, "the waiter subscribes and tries twice", || {
        listeners(&server, "k") == 1 && server.evalsha_calls() >= attempts + 2
    });
    let released = Instant::now();
    holder.release().unwrap();

    let (guard, acquired) = waiting.join().unwrap();
    assert!(guard.is_ok(), "{guard:?}");
    let took = acquired - released;
    assert!(took < QUICK, "hand-off took {took:?}");
}

/// The races themselves (a release before the subscription, or during an attempt) are
/// pinned down deterministically by the unit tests in `src/subscriber.rs`; this one checks
/// end to end that a release right after a waiter's first attempt is never missed.
#[test]
fn release_right_after_the_first_attempt_is_not_missed() {
    let server = RedisServer::start();
    let locker = locker(&server);
    for key in ["r0", "r1", "r2", "r3", "r4"] {
        let holder = locker.lock(&[key]).unwrap();
        assert!(locker.try_lock(&[key]).unwrap().is_none()); // loads the acquire script
        let attempts = server.evalsha_calls();
        let waiting = waiter(&locker, key);
        eventually(QUICK * 5, "the waiter tries", || {
            server.evalsha_calls() > attempts
        });
        let released = Instant::now();
        holder.release().unwrap();

        let (guard, acquired) = waiting.join().unwrap();
        assert!(guard.is_ok(), "{guard:?}");
        assert!(
            acquired - released < QUICK,
            "took {:?}",
            acquired - released
        );
    }
}

#[test]
fn lost_notifications_still_end_in_the_lock_taken() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let (holder, waiting) = held_and_awaited(&server, &locker, "k");

    // Cut the subscriber's connection and release while it is gone.
    server.query::<()>(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let released = Instant::now();
    holder.release().unwrap();

    let (guard, acquired) = waiting.join().unwrap();
    assert!(guard.is_ok(), "{guard:?}");
    let took = acquired - released;
    assert!(
        took < QUICK * 2,
        "took {took:?}: the resubscription should retry"
    );
}

#[test]
fn holder_that_never_releases_is_outlasted_by_its_ttl() {
    let server = RedisServer::start();
    let locker = locker(&server);
    // A holder that crashed: its key just expires, nobody publishes a release.
    let started = Instant::now();
    server.query::<()>(&["SET", "k", "crashed-owner", "PX", "300"]);

    let guard = locker.lock(&["k"]).unwrap(); // default backoff: at most 100 ms
    let took = started.elapsed();
    assert!(
        took >= Duration::from_millis(295),
        "took {took:?}: before the expiry?"
    );
    assert!(took < Duration::from_millis(300) + QUICK, "took {took:?}");
    drop(guard);
}

#[test]
fn channels_are_unsubscribed_once_no_one_waits() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let (holder, waiting) = held_and_awaited(&server, &locker, "k");
    holder.release().unwrap();
    drop(waiting.join().unwrap().0.unwrap());

    // Idle for a sweep (1 s), then the thread drops the channel.
    eventually(QUICK * 5, "the channel is dropped", || {
        listeners(&server, "k") == 0
    });
}

#[test]
fn subscriber_connection_closes_with_its_locker() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let (holder, waiting) = held_and_awaited(&server, &locker, "k");
    holder.release().unwrap();
    drop(waiting.join().unwrap());

    let started = Instant::now();
    drop(locker);
    assert!(
        started.elapsed() < QUICK * 2,
        "drop took {:?}",
        started.elapsed()
    );
    let clients: String = server.query(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert_eq!(clients.lines().count(), 0, "still subscribed:\n{clients}");
}

#[test]
fn user_without_channel_rights_still_releases() {
    let server = RedisServer::start();
    // Redis 7's default for new users: no pub/sub channels at all.
    server.query::<()>(&[
        "ACL",
        "SETUSER",
        "locks",
        "on",
        ">secret",
        "~*",
        "+@all",
        "resetchannels",
    ]);
    let url = server.url().replace("redis://", "redis://locks:secret@");
    let locker = Locker::connect(url).unwrap();

    let guard = locker.lock(&["k"]).unwrap();
    guard.release().unwrap();
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);
}

#[test]
fn many_waiting_threads_share_one_subscriber_connection() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let keys: Vec<String> = (0..10).map(|i| format!("k{i}")).collect();
    let holders: Vec<_> = keys.iter().map(|k| locker.lock(&[k]).unwrap()).collect();

    // 40 waiters: four on each of the ten held keys.
    let start = Arc::new(Barrier::new(40));
    let waiters: Vec<_> = (0..40)
        .map(|i| {
            let (locker, start, key) = (locker.clone(), start.clone(), keys[i % 10].clone());
            thread::spawn(move || {
                start.wait();
                locker.lock_with(&[key], patient()).map(drop)
            })
        })
        .collect();
    eventually(QUICK * 5, "every key has its four waiters queued", || {
        keys.iter().all(|k| listeners(&server, k) == 4)
    });
    let clients: String = server.query(&["CLIENT", "LIST", "TYPE", "pubsub"]);
    assert_eq!(
        clients.lines().count(),
        1,
        "one subscriber connection:\n{clients}"
    );

    let released = Instant::now();
    drop(holders);
    for waiter in waiters {
        waiter.join().unwrap().unwrap();
    }
    // Each key passes through four waiters one after another, each woken by a release.
    assert!(
        released.elapsed() < QUICK * 4,
        "took {:?}",
        released.elapsed()
    );
}

/// A waiter in another process is woken just as fast: the notification goes through Redis.
#[test]
fn waiter_in_another_process_is_woken_by_the_release() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock(&["k"]).unwrap();

    let child = crate::child_test("wake::waiter_process_child")
        .env("REDGUARD_CHILD_URL", server.url())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    eventually(QUICK * 10, "the other process subscribes", || {
        listeners(&server, "k") == 1
    });
    let released = Instant::now();
    holder.release().unwrap();

    let output = child.wait_with_output().unwrap();
    let took = released.elapsed();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success() && stdout.contains("1 passed"),
        "child failed:\n{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(took < QUICK * 2, "the other process took {took:?}");
}

#[test]
#[ignore = "run by waiter_in_another_process_is_woken_by_the_release"]
fn waiter_process_child() {
    let url = std::env::var("REDGUARD_CHILD_URL").expect("run by the parent test");
    let locker = Locker::connect(url).unwrap();
    let guard = locker.lock_with(&["k"], patient()).unwrap();
    guard.release().unwrap();
}
