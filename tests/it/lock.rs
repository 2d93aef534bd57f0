//! Obtaining and releasing: the Go library's scenarios and mutual exclusion.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Barrier};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::server::RedisServer;
use crate::{eventually, locker};

fn no_retry() -> LockOptions {
    LockOptions::default().retry(Retry::none())
}

/// For holders in tests that count EVALSHA calls: no refresher traffic.
fn no_refresh() -> LockOptions {
    LockOptions::default().auto_refresh(false)
}

#[test]
fn obtain_release_obtain_again() {
    let server = RedisServer::start();
    let locker = locker(&server);

    let guard = locker.lock(&["k"]).unwrap();
    let stored: Option<String> = server.query(&["GET", "k"]);
    assert_eq!(stored.as_deref(), Some(guard.token()));
    assert!(locker.try_lock(&["k"]).unwrap().is_none(), "held twice");

    guard.release().unwrap();
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);

    let again = locker
        .try_lock(&["k"])
        .unwrap()
        .expect("free after release");
    drop(again);
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0, "drop releases");
}

#[test]
fn value_is_random_token_then_metadata() {
    let server = RedisServer::start();
    let locker = locker(&server);

    let guard = locker
        .lock_with(&["k"], LockOptions::default().metadata("job-42"))
        .unwrap();
    assert_eq!(guard.metadata(), "job-42");
    assert_eq!(guard.token().len(), 32);
    assert!(guard.token().bytes().all(|b| b.is_ascii_hexdigit()));
    let stored: String = server.query(&["GET", "k"]);
    assert_eq!(stored, format!("{}job-42", guard.token()));

    let other = locker.lock(&["other"]).unwrap();
    assert_ne!(other.token(), guard.token());
}

#[test]
fn same_owner_token_reobtains_its_own_keys_only() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let owner = |metadata: &str| {
        LockOptions::default()
            .token("owner-1")
            .metadata(metadata)
            .retry(Retry::none())
            .auto_refresh(false)
    };

    let first = locker.lock_with(&["a", "b"], owner("first")).unwrap();
    let stranger = locker.lock_with(&["a"], no_retry().token("owner-2"));
    assert!(matches!(stranger, Err(Error::NotObtained)), "{stranger:?}");

    let second = locker.lock_with(&["a", "b"], owner("second")).unwrap();
    assert_eq!(server.query::<String>(&["GET", "b"]), "7:owner-1second");
    // The first guard's value was replaced: it no longer holds the lock.
    assert!(matches!(
        first.refresh(Duration::from_secs(5)),
        Err(Error::LockLost)
    ));

    // Re-obtaining needs every key: one held by someone else blocks it, and nothing changes.
    let _c = locker.lock(&["c"]).unwrap();
    let mixed = locker.lock_with(&["a", "c"], owner("third"));
    assert!(matches!(mixed, Err(Error::NotObtained)), "{mixed:?}");
    assert_eq!(server.query::<String>(&["GET", "a"]), "7:owner-1second");

    second.release().unwrap();
    assert_eq!(server.query::<u32>(&["EXISTS", "a", "b"]), 0);
}

#[test]
fn a_fixed_token_never_reobtains_a_lock_whose_token_it_only_starts() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let fixed = |token: &str| no_refresh().retry(Retry::none()).token(token);

    let b = locker.lock_with(&["k"], fixed("worker-10")).unwrap();
    let stored = server.query::<String>(&["GET", "k"]);
    assert_eq!(
        stored, "9:worker-10",
        "fixed tokens are stored self-delimited"
    );
    for other in ["worker-1", "worker-", "9:worker-1", "worker-10x"] {
        let a = locker.try_lock_with(&["k"], fixed(other)).unwrap();
        assert!(a.is_none(), "{other:?} took over worker-10's lock");
        assert_eq!(server.query::<String>(&["GET", "k"]), stored);
    }
    // A random token's lock is not taken by its own first characters either.
    let r = locker.lock_with(&["r"], no_refresh()).unwrap();
    let start = r.token()[..8].to_string();
    assert!(
        locker
            .try_lock_with(&["r"], fixed(&start))
            .unwrap()
            .is_none()
    );
    // Exactly the same tokens still re-obtain.
    let again = locker.lock_with(&["k"], fixed("worker-10").metadata("m"));
    assert_eq!(again.unwrap().token(), "worker-10");
    assert!(b.is_lost() || b.refresh(Duration::from_secs(5)).is_err());
    let whole = locker.lock_with(&["r"], fixed(r.token())).unwrap();
    assert_eq!(whole.token(), r.token());
    assert_eq!(server.query::<String>(&["GET", "r"]), r.token());
}

#[test]
fn retry_obtains_once_the_holder_releases() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock_with(&["k"], no_refresh()).unwrap();
    let calls = server.evalsha_calls();

    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || {
            let retry = Retry::linear(Duration::from_millis(10)).limit(1000);
            locker.lock_with(&["k"], LockOptions::default().retry(retry))
        })
    };
    eventually(Duration::from_secs(5), "the waiter retries", || {
        server.evalsha_calls() >= calls + 3
    });
    holder.release().unwrap();

    let guard = waiter.join().unwrap().expect("obtained after the release");
    let stored: String = server.query(&["GET", "k"]);
    assert_eq!(stored, guard.token());
}

#[test]
fn retry_gives_up_after_its_limit() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock_with(&["k"], no_refresh()).unwrap();
    // A failed attempt loads the acquire script, so the count below is of attempts only.
    assert!(locker.try_lock(&["k"]).unwrap().is_none());
    let calls = server.evalsha_calls();

    let started = Instant::now();
    let retry = Retry::linear(Duration::from_millis(100)).limit(3);
    let result = locker.lock_with(&["k"], LockOptions::default().retry(retry));
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    assert!(
        started.elapsed() >= Duration::from_millis(300),
        "3 delays served"
    );
    // One attempt (which queued it: its place keeps its turn while the delays pass, with
    // no attempt of their own), one more when the subscription became active (word sent
    // before may have been missed), and one to leave the queue.
    let attempts = server.evalsha_calls() - calls;
    assert!((2..=3).contains(&attempts), "{attempts} attempts");
    assert!(!holder.is_lost());
}

#[test]
fn wake_ups_do_not_use_up_retries() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _holder = locker.lock_with(&["k"], no_refresh()).unwrap();
    // The subscription's confirmation wakes the waiter early: that attempt must not
    // count as the one retry allowed.
    let started = Instant::now();
    let retry = Retry::linear(Duration::from_millis(300)).limit(1);
    let result = locker.lock_with(&["k"], LockOptions::default().retry(retry));
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300),
        "gave up after {waited:?}"
    );
}

#[test]
fn timeout_ends_the_wait_with_not_obtained() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _holder = locker.lock(&["k"]).unwrap();

    let started = Instant::now();
    let options = LockOptions::default()
        .timeout(Duration::from_millis(300))
        .retry(Retry::linear(Duration::from_millis(20)));
    let result = locker.lock_with(&["k"], options);
    let waited = started.elapsed();
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    assert!(
        waited >= Duration::from_millis(300),
        "gave up early: {waited:?}"
    );
    assert!(waited < Duration::from_millis(1300), "overran: {waited:?}");
}

#[test]
fn timeout_is_independent_of_the_ttl() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock_with(&["k"], no_refresh()).unwrap();
    let calls = server.evalsha_calls();
    let ttl = Duration::from_millis(50);

    let started = Instant::now();
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || {
            let options = LockOptions::default()
                .ttl(ttl)
                .timeout(Duration::from_secs(10))
                .retry(Retry::linear(Duration::from_millis(10)));
            locker.lock_with(&["k"], options)
        })
    };
    // The waiter keeps retrying past its own TTL.
    eventually(Duration::from_secs(5), "the waiter retries", || {
        server.evalsha_calls() >= calls + 3 && started.elapsed() > 3 * ttl
    });
    holder.release().unwrap();

    let guard = waiter
        .join()
        .unwrap()
        .expect("a TTL must not cut the wait short");
    assert!(started.elapsed() > 2 * ttl);
    drop(guard);
}

#[test]
fn hundred_threads_race_for_one_key_and_exactly_one_wins() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let start = Arc::new(Barrier::new(100));

    let racers: Vec<_> = (0..100)
        .map(|_| {
            let (locker, start) = (locker.clone(), Arc::clone(&start));
            thread::spawn(move || {
                start.wait();
                locker.try_lock(&["prize"])
            })
        })
        .collect();
    // Keep every winner's guard until all have tried.
    let results: Vec<_> = racers.into_iter().map(|r| r.join().unwrap()).collect();
    let winners = results.iter().filter(|r| matches!(r, Ok(Some(_)))).count();
    let losers = results.iter().filter(|r| matches!(r, Ok(None))).count();
    assert_eq!((winners, losers), (1, 99));
}

#[test]
fn multi_key_locks_are_all_or_nothing() {
    let server = RedisServer::start();
    let locker = locker(&server);

    let g12 = locker.try_lock(&["1", "2"]).unwrap().expect("free");
    let g34 = locker.try_lock(&["3", "4"]).unwrap().expect("free");
    assert!(locker.try_lock(&["2", "3"]).unwrap().is_none());
    assert!(locker.try_lock(&["5", "1"]).unwrap().is_none());
    assert_eq!(server.query::<u32>(&["EXISTS", "5"]), 0, "5 taken alone");

    drop(g12);
    assert!(
        locker.try_lock(&["2", "3"]).unwrap().is_none(),
        "3 is still held"
    );
    assert_eq!(server.query::<u32>(&["EXISTS", "2"]), 0, "2 taken alone");

    drop(g34);
    let g23 = locker.try_lock(&["2", "3"]).unwrap().expect("both free");
    assert_eq!(g23.keys(), ["2", "3"]);
    let value: Vec<Option<String>> = server.query(&["MGET", "2", "3"]);
    assert_eq!(value, vec![Some(g23.token().to_string()); 2]);
}

#[test]
fn mutual_exclusion_holds_for_8_threads_200_iterations() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));

    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (locker, counter, inside) = (locker.clone(), counter.clone(), inside.clone());
            thread::spawn(move || {
                for _ in 0..200 {
                    let _guard = locker.lock(&["counter"]).unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    // Read, yield, write: loses updates unless the lock excludes.
                    let seen = counter.load(Ordering::SeqCst);
                    thread::yield_now();
                    counter.store(seen + 1, Ordering::SeqCst);
                    inside.store(false, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 8 * 200);
}

#[test]
fn guard_dropped_during_a_panic_releases() {
    let server = RedisServer::start();
    let locker = locker(&server);

    let panicker = {
        let locker = locker.clone();
        thread::spawn(move || {
            let _guard = locker.lock(&["k"]).unwrap();
            panic!("the critical section failed");
        })
    };
    assert!(panicker.join().is_err());
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);
    assert!(locker.try_lock(&["k"]).unwrap().is_some());
}

#[test]
fn guard_outlives_its_locker() {
    let server = RedisServer::start();
    let guard = locker(&server).lock(&["k"]).unwrap();
    // The locker handle is gone; the guard keeps what it needs.
    assert!(guard.ttl().unwrap().is_some());
    guard.release().unwrap();
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);
}

#[test]
fn locker_on_a_given_pool_locks_and_releases() {
    let server = RedisServer::start();
    let client = redis::Client::open(server.url()).unwrap();
    let pool = r2d2::Pool::builder().max_size(2).build(client).unwrap();
    let locker = Locker::from_pool(pool);

    let guard = locker.lock(&["k"]).unwrap();
    assert!(locker.try_lock(&["k"]).unwrap().is_none());
    guard.release().unwrap();
    assert!(locker.try_lock(&["k"]).unwrap().is_some());
}

#[test]
fn scripts_are_reloaded_after_a_script_flush() {
    let server = RedisServer::start();
    let locker = locker(&server);
    drop(locker.lock(&["k"]).unwrap());

    server.query::<()>(&["SCRIPT", "FLUSH"]);
    let guard = locker.lock(&["k"]).unwrap();
    assert!(guard.ttl().unwrap().is_some());
    guard.release().unwrap();
}

#[test]
fn try_lock_with_makes_one_attempt_with_the_options() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let options = || {
        LockOptions::default()
            .ttl(Duration::from_secs(7))
            .metadata("cron")
            .fencing(true)
            // Not used: one attempt only, returned at once.
            .timeout(Duration::from_secs(30))
    };
    let guard = locker.try_lock_with(&["job"], options()).unwrap().unwrap();
    assert_eq!(guard.metadata(), "cron");
    assert_eq!(guard.fence(), Some(1));
    let ttl = server.query::<u64>(&["PTTL", "job"]);
    assert!((6_000..=7_000).contains(&ttl), "{ttl}");

    let started = std::time::Instant::now();
    assert!(locker.try_lock_with(&["job"], options()).unwrap().is_none());
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "one attempt, no wait"
    );
    drop(guard);
    let again = locker.try_lock_with(&["job"], options()).unwrap().unwrap();
    assert_eq!(again.fence(), Some(2));
}

#[test]
fn release_deletes_every_key_still_ours_when_some_are_gone() {
    let server = RedisServer::start();
    let locker = locker(&server);
    // As when keys set with a 1 ms TTL expire a moment apart: one gone, the others ours.
    let guard = locker.lock_with(&["a", "b", "c"], no_refresh()).unwrap();
    server.query::<u32>(&["DEL", "a"]);
    assert!(matches!(guard.release(), Err(Error::LockLost)));
    assert_eq!(server.query::<u32>(&["EXISTS", "a", "b", "c"]), 0);

    // One key taken by another owner since: ours are deleted, theirs is left alone.
    let guard = locker.lock_with(&["a", "b"], no_refresh()).unwrap();
    server.query::<String>(&["SET", "b", "someone-else"]);
    drop(guard);
    assert_eq!(server.query::<u32>(&["EXISTS", "a"]), 0);
    assert_eq!(server.query::<String>(&["GET", "b"]), "someone-else");
}
