//! Contention inside one locker: waiters queue in arrival order, and a release hands the
//! lock to the first in line.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Retry};

use crate::server::RedisServer;
use crate::{eventually, locker};

#[test]
fn threads_of_one_locker_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock(&["k"]).unwrap();
    let order = Arc::new(Mutex::new(Vec::new()));
    let mut threads = Vec::new();
    for i in 0..5 {
        let (locker, order) = (locker.clone(), order.clone());
        threads.push(thread::spawn(move || {
            let guard = locker.lock(&["k"]).unwrap();
            order.lock().unwrap().push(i);
            thread::sleep(Duration::from_millis(5));
            drop(guard);
        }));
        if i == 0 {
            eventually(
                Duration::from_secs(5),
                "the first waiter subscribes",
                || server.queued("k") == 1,
            );
        }
        // Well after the previous one is in line.
        thread::sleep(Duration::from_millis(100));
    }
    drop(holder);
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(*order.lock().unwrap(), [0, 1, 2, 3, 4]);
}

#[test]
fn a_release_hands_the_lock_to_the_next_in_line_in_one_round_trip() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let options = || {
        LockOptions::default()
            .fencing(true)
            .ttl(Duration::from_secs(7))
    };
    // The release script loaded (else its first call is EVALSHA, NOSCRIPT, then EVAL).
    locker.lock(&["other"]).unwrap().release().unwrap();
    let holder = locker.lock_with(&["k"], options()).unwrap();
    let waiter = {
        let locker = locker.clone();
        // Retries only every 10 s: asleep when the release comes.
        let patient = options().retry(Retry::linear(Duration::from_secs(10)));
        thread::spawn(move || locker.lock_with(&["k"], patient).unwrap())
    };
    eventually(
        Duration::from_secs(5),
        "the waiter is queued and listens",
        || server.queued("k") == 1 && server.lockers_listening() == 1,
    );
    thread::sleep(Duration::from_millis(50)); // past its attempt after subscribing
    let scripts = || server.calls("evalsha") + server.calls("eval");
    let (scripts_before, publishes_before) = (scripts(), server.calls("publish"));
    let old_token = holder.token().to_string();
    holder.release().unwrap();
    let handed = waiter.join().unwrap();
    // The release script, and nothing else: no publish (the waiter is this locker's:
    // told by the reply), no attempt.
    assert_eq!(scripts() - scripts_before, 1, "one script call");
    assert_eq!(
        server.calls("publish"),
        publishes_before,
        "nothing published"
    );
    assert_eq!(
        handed.fence(),
        Some(2),
        "a new acquisition: the next fencing token"
    );
    assert_ne!(handed.token(), old_token, "its own token");
    let stored: String = server.query(&["GET", "k"]);
    assert_eq!(stored, handed.token());
    // Given for what the waiter's place had left (a dead waiter would cost no more), then
    // lengthened to its own TTL by its refresher.
    let ttl: u64 = server.query(&["PTTL", "k"]);
    assert!(ttl <= 2_000, "a short claim: {ttl}");
    eventually(Duration::from_secs(3), "refreshed to its TTL", || {
        server.query::<u64>(&["PTTL", "k"]) > 5_000
    });
    assert!(!handed.is_lost());
    handed.release().unwrap();
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);
}

#[test]
fn a_handed_over_guard_has_its_own_value_and_is_auto_refreshed() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let short = || LockOptions::default().ttl(Duration::from_millis(600));
    let old = locker
        .lock_with(&["k"], short().auto_refresh(false))
        .unwrap();
    let old_value: String = server.query(&["GET", "k"]);
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || locker.lock_with(&["k"], short()).unwrap())
    };
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        server.queued("k") == 1
    });
    thread::sleep(Duration::from_millis(50));
    drop(old);
    let handed = waiter.join().unwrap();
    // The old value is gone: nothing of the old guard can refresh or release it.
    assert_eq!(server.query::<String>(&["GET", "k"]), handed.token());
    assert_ne!(handed.token(), old_value);
    // Auto-refreshed past several TTLs.
    thread::sleep(Duration::from_millis(1500));
    assert!(!handed.is_lost());
    assert!(handed.ttl().unwrap().is_some());
}

#[test]
fn fencing_tokens_rise_and_exclusion_holds_through_hand_overs() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let counter = Arc::new(AtomicU64::new(0));
    let inside = Arc::new(AtomicBool::new(false));
    let fences = Arc::new(Mutex::new(Vec::new()));
    let workers: Vec<_> = (0..8)
        .map(|_| {
            let (locker, counter, inside, fences) = (
                locker.clone(),
                counter.clone(),
                inside.clone(),
                fences.clone(),
            );
            thread::spawn(move || {
                let mut tokens = std::collections::HashSet::new();
                for _ in 0..200 {
                    let guard = locker
                        .lock_with(&["counter"], LockOptions::default().fencing(true))
                        .unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two holders at once");
                    let seen = counter.load(Ordering::SeqCst);
                    thread::yield_now();
                    counter.store(seen + 1, Ordering::SeqCst);
                    // Recorded inside the critical section: the order they were held in.
                    fences.lock().unwrap().push(guard.fence().unwrap());
                    assert!(tokens.insert(guard.token().to_string()), "a token reused");
                    inside.store(false, Ordering::SeqCst);
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    assert_eq!(counter.load(Ordering::SeqCst), 8 * 200);
    let fences = fences.lock().unwrap();
    assert!(
        fences.windows(2).all(|w| w[0] < w[1]),
        "fencing tokens rise"
    );
}

#[test]
fn a_queued_waiter_that_times_out_does_not_hold_up_the_next() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let holder = locker.lock(&["k"]).unwrap();
    let impatient = {
        let locker = locker.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let options = LockOptions::default().timeout(Duration::from_millis(300));
            let result = locker.lock_with(&["k"], options).map(drop);
            (result, started.elapsed())
        })
    };
    thread::sleep(Duration::from_millis(50));
    let patient = {
        let locker = locker.clone();
        thread::spawn(move || locker.lock(&["k"]).map(drop))
    };
    // Behind the impatient one, with a retry limit: its delays count while it waits.
    let limited = {
        let locker = locker.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let options =
                LockOptions::default().retry(Retry::linear(Duration::from_millis(50)).limit(4));
            let result = locker.lock_with(&["k"], options).map(drop);
            (result, started.elapsed())
        })
    };
    let (result, took) = impatient.join().unwrap();
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    assert!(
        took < Duration::from_millis(800),
        "timed out on time: {took:?}"
    );
    let (result, took) = limited.join().unwrap();
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    assert!(
        took < Duration::from_millis(800),
        "four delays of 50 ms: {took:?}"
    );
    drop(holder);
    patient.join().unwrap().unwrap();
}

#[test]
fn overlapping_multi_key_waiters_all_make_progress() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let sets = [["a", "b"], ["b", "c"], ["c", "a"]];
    let workers: Vec<_> = sets
        .iter()
        .map(|keys| {
            let locker = locker.clone();
            let keys = *keys;
            thread::spawn(move || {
                for _ in 0..50 {
                    let options = LockOptions::default().timeout(Duration::from_secs(10));
                    drop(locker.lock_with(&keys, options).unwrap());
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
}

/// `insiders` threads of one locker pass "k" around, each holding it for `hold`; a
/// thread of another locker must get it 20 times, each within a bound.
fn an_outsider_is_served(insiders: usize, hold: Duration) {
    let server = RedisServer::start();
    let inside = locker(&server);
    let outsider = locker(&server);
    let stop = Arc::new(AtomicBool::new(false));
    let workers: Vec<_> = (0..insiders)
        .map(|_| {
            let (locker, stop) = (inside.clone(), stop.clone());
            thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    let guard = locker.lock(&["k"]).unwrap();
                    thread::sleep(hold);
                    drop(guard);
                }
            })
        })
        .collect();
    thread::sleep(Duration::from_millis(100));
    let mut slowest = Duration::ZERO;
    for _ in 0..20 {
        let started = Instant::now();
        let options = LockOptions::default().timeout(Duration::from_secs(5));
        drop(outsider.lock_with(&["k"], options).unwrap());
        slowest = slowest.max(started.elapsed());
    }
    stop.store(true, Ordering::Relaxed);
    for worker in workers {
        worker.join().unwrap();
    }
    assert!(
        slowest < Duration::from_secs(2),
        "the outsider waited {slowest:?}"
    );
}

#[test]
fn a_thread_of_another_locker_is_served_while_one_locker_passes_the_key_around() {
    an_outsider_is_served(4, Duration::ZERO);
}

#[test]
fn a_thread_holding_one_key_still_gets_a_free_one_that_a_multi_key_waiter_wants() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let b = locker.lock(&["b"]).unwrap();
    // Waits for both; holds neither (all or nothing).
    let both = {
        let locker = locker.clone();
        thread::spawn(move || locker.lock(&["a", "b"]).map(drop))
    };
    eventually(
        Duration::from_secs(5),
        "the multi-key waiter subscribes",
        || server.queued("b") == 1,
    );
    // The holder of `b` asks for `a`, which is free: no line of `[a, b]` holds it back.
    let options = LockOptions::default().timeout(Duration::from_secs(2));
    let a = locker.lock_with(&["a"], options).unwrap();
    assert!(locker.try_lock(&["c"]).unwrap().is_some());
    drop((a, b));
    both.join().unwrap().unwrap();
}

#[test]
fn two_threads_passing_a_key_back_and_forth_do_not_starve_another_locker() {
    // Held a moment: the other insider is asleep in line at every release.
    an_outsider_is_served(2, Duration::from_millis(1));
}

/// A holder that is gone: its key expires without a release, so nobody is woken.
fn forgotten_holder(locker: &redguard::Locker) {
    let options = LockOptions::default()
        .ttl(Duration::from_millis(300))
        .auto_refresh(false);
    std::mem::forget(locker.lock_with(&["k"], options).unwrap());
}

/// A waiter asleep in line for its whole (10 s) retry delay.
fn sleeper(locker: &redguard::Locker, server: &RedisServer) -> thread::JoinHandle<()> {
    let locker = locker.clone();
    let waiter = thread::spawn(move || {
        let patient = LockOptions::default().retry(Retry::linear(Duration::from_secs(10)));
        drop(locker.lock_with(&["k"], patient).unwrap());
    });
    eventually(Duration::from_secs(5), "the sleeper subscribes", || {
        server.queued("k") == 1
    });
    waiter
}

#[test]
fn try_lock_asks_redis_even_behind_a_sleeping_waiter() {
    let server = RedisServer::start();
    let locker = locker(&server);
    forgotten_holder(&locker);
    let sleeper = sleeper(&locker, &server);
    thread::sleep(Duration::from_millis(400)); // the holder's key has expired
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);
    let guard = locker.try_lock(&["k"]).unwrap();
    assert!(guard.is_some(), "the key is free");
    drop(guard); // a release: the sleeper is woken
    sleeper.join().unwrap();
}

#[test]
fn a_waiter_behind_a_sleeping_one_attempts_before_its_timeout_ends_it() {
    let server = RedisServer::start();
    let locker = locker(&server);
    forgotten_holder(&locker);
    let sleeper = sleeper(&locker, &server);
    // Arrives while the key is held (its attempt fails), then waits behind the sleeper.
    let options = LockOptions::default().timeout(Duration::from_secs(1));
    let started = Instant::now();
    let guard = locker.lock_with(&["k"], options);
    assert!(guard.is_ok(), "{guard:?} after {:?}", started.elapsed());
    drop(guard);
    sleeper.join().unwrap();
}
