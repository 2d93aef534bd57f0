//! Semaphores: at most N holders, reclaimed on the server's clock, woken on release.

use std::collections::HashSet;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redguard::{Error, LockOptions, Locker, MAX_LIMIT, Retry, Semaphore};

use crate::server::RedisServer;
use crate::{eventually, locker, tight};

/// A retry delay far longer than any wait below: whoever gets in quickly was woken.
fn sleepy() -> LockOptions {
    LockOptions::default().retry(Retry::linear(Duration::from_secs(30)))
}

fn manual(ttl: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl).auto_refresh(false)
}

fn invalid<T: std::fmt::Debug>(result: redguard::Result<T>) -> String {
    match result {
        Err(Error::InvalidInput(why)) => why,
        other => panic!("expected InvalidInput, got {other:?}"),
    }
}

#[test]
fn the_types_are_send_and_sync_as_promised() {
    fn send_sync<T: Clone + Send + Sync + 'static>() {}
    fn send<T: Send + 'static>() {}
    send_sync::<Semaphore>();
    send::<redguard::Permit>();
    send_sync::<redguard::Holder>();
}

#[test]
fn a_sorted_set_that_is_not_a_semaphore_is_refused_and_left_alone() {
    let server = RedisServer::start();
    let locker = locker(&server);
    server.query::<u32>(&["ZADD", "board", "100", "alice", "1700000000", "bob"]);
    let before: Vec<String> = server.query(&["ZRANGE", "board", "0", "-1", "WITHSCORES"]);
    let sem = locker.semaphore("board", 2).unwrap();
    for result in [
        sem.try_acquire().map(|_| ()),
        sem.available().map(|_| ()),
        sem.holders().map(|_| ()),
    ] {
        match result {
            Err(Error::WrongType { key, kind }) => {
                assert_eq!(key, "board");
                assert_eq!(kind, "zset, not a semaphore");
            }
            other => panic!("{other:?}"),
        }
    }
    let after: Vec<String> = server.query(&["ZRANGE", "board", "0", "-1", "WITHSCORES"]);
    assert_eq!(before, after);
    assert_eq!(server.query::<i64>(&["PTTL", "board"]), -1, "no TTL given");
}

#[test]
fn never_more_than_the_limit_inside_and_everyone_gets_in() {
    const LIMIT: usize = 3;
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(16).build(server.url()).unwrap();
    let sem = locker.semaphore("jobs", LIMIT as u32).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let full_once = Arc::new(AtomicBool::new(false));
    let entered = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..3 * LIMIT)
        .map(|_| {
            let (sem, inside, most) = (sem.clone(), inside.clone(), most.clone());
            let (full_once, entered) = (full_once.clone(), entered.clone());
            thread::spawn(move || {
                let permit = sem.acquire().unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                if now == LIMIT {
                    full_once.store(true, Ordering::SeqCst);
                }
                // Stay until the semaphore was full once, so that it must have been.
                let until = Instant::now() + Duration::from_secs(10);
                while !full_once.load(Ordering::SeqCst) && Instant::now() < until {
                    thread::sleep(Duration::from_millis(1));
                }
                thread::sleep(Duration::from_millis(5));
                inside.fetch_sub(1, Ordering::SeqCst);
                entered.fetch_add(1, Ordering::SeqCst);
                permit.release().unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(
        most.load(Ordering::SeqCst),
        LIMIT,
        "the most inside at once"
    );
    assert_eq!(entered.load(Ordering::SeqCst), 3 * LIMIT);
    assert_eq!(sem.available().unwrap(), LIMIT as u32);
    assert_eq!(
        server.query::<u32>(&["DBSIZE"]),
        0,
        "both keys go with the last"
    );
}

#[test]
fn a_limit_of_one_is_a_mutex() {
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(8).build(server.url()).unwrap();
    let sem = locker.semaphore("counter", 1).unwrap();
    // Not atomic on purpose: a read, a pause, a write. Two holders at once lose updates.
    let counter = Arc::new(Mutex::new(0u32));
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let (sem, counter) = (sem.clone(), counter.clone());
            thread::spawn(move || {
                for _ in 0..100 {
                    let _permit = sem.acquire().unwrap();
                    let read = *counter.lock();
                    thread::yield_now();
                    *counter.lock() = read + 1;
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(*counter.lock(), 800);
}

#[test]
fn a_dead_holders_permit_is_taken_once_its_ttl_passes_without_waiting_a_retry_delay() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let sem = locker.semaphore("s", 1).unwrap();
    let ttl = Duration::from_millis(600);
    let dead = sem.acquire_with(manual(ttl)).unwrap();
    let taken = Instant::now();
    std::mem::forget(dead); // never released, never refreshed: as if its process died

    let permit = sem
        .acquire_with(sleepy().timeout(Duration::from_secs(5)))
        .unwrap();
    let waited = taken.elapsed();
    assert!(
        waited >= ttl - Duration::from_millis(50),
        "got in after {waited:?}, before the dead holder expired"
    );
    assert!(
        waited < ttl + Duration::from_secs(1),
        "got in after {waited:?}: not woken by the expiry"
    );
    assert_eq!(sem.holders().unwrap().len(), 1);
    permit.release().unwrap();
}

#[test]
fn refresh_and_release_after_expiry_are_lost_and_count_nothing_twice() {
    let server = RedisServer::start();
    let sem = locker(&server).semaphore("s", 2).unwrap();
    let expired = sem
        .acquire_with(manual(Duration::from_millis(100)))
        .unwrap();
    let other = sem.acquire().unwrap();
    eventually(Duration::from_secs(2), "the permit expires", || {
        expired.is_lost() && sem.available().unwrap() == 1
    });
    thread::sleep(Duration::from_millis(20)); // past the server's expiry too
    assert!(matches!(
        expired.refresh(Duration::from_secs(10)),
        Err(Error::LockLost)
    ));
    assert_eq!(sem.available().unwrap(), 1, "a refresh never revives it");
    assert_eq!(expired.ttl().unwrap(), None);
    assert!(matches!(expired.release(), Err(Error::LockLost)));
    assert_eq!(
        sem.available().unwrap(),
        1,
        "the other permit is still counted"
    );
    other.release().unwrap();
    assert_eq!(sem.available().unwrap(), 2);
}

#[test]
fn a_permit_the_server_has_expired_is_never_revived() {
    // The server's clock says expired while ours does not: as after a jump of its clock.
    let server = RedisServer::start();
    let sem = locker(&server).semaphore("s", 3).unwrap();
    let auto = sem
        .acquire_with(LockOptions::default().ttl(Duration::from_millis(600)))
        .unwrap();
    let by_hand = sem.acquire_with(manual(Duration::from_secs(30))).unwrap();
    let asked = sem.acquire_with(manual(Duration::from_secs(30))).unwrap();
    for permit in [&auto, &by_hand, &asked] {
        server.query::<u32>(&["ZADD", "s", "XX", "1", permit.token()]);
    }
    assert!(matches!(
        by_hand.refresh(Duration::from_secs(30)),
        Err(Error::LockLost)
    ));
    assert!(by_hand.is_lost());
    assert_eq!(asked.ttl().unwrap(), None);
    assert!(asked.is_lost());
    // The refresher's batch finds it gone too (first refresh at 200 ms), and writes nothing.
    eventually(
        Duration::from_secs(2),
        "the refresher finds it gone",
        || auto.is_lost(),
    );
    let score: Option<String> = server.query(&["ZSCORE", "s", auto.token()]);
    assert_eq!(score, None, "not revived");
    assert_eq!(sem.available().unwrap(), 3);
    assert!(matches!(auto.release(), Err(Error::LockLost)));
    drop(asked);
    let others: Vec<_> = (0..3).map(|_| sem.try_acquire().unwrap()).collect();
    assert!(others.iter().all(Option::is_some));
    assert!(matches!(by_hand.release(), Err(Error::LockLost)));
    assert_eq!(
        sem.available().unwrap(),
        0,
        "a late release gives back nothing"
    );
}

#[test]
fn another_limit_is_refused_while_held_and_accepted_once_free() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let two = locker.semaphore("s", 2).unwrap();
    let permit = two.acquire().unwrap();
    let three = locker.semaphore("s", 3).unwrap();
    let why = invalid(three.try_acquire());
    assert!(why.contains("limit of 2, not 3"), "{why}");
    assert_eq!(two.available().unwrap(), 1, "nothing taken");
    permit.release().unwrap();
    let permits: Vec<_> = (0..3).map(|_| three.try_acquire().unwrap()).collect();
    assert!(permits.iter().all(Option::is_some), "the new limit applies");
    assert!(three.try_acquire().unwrap().is_none());
}

#[test]
fn holders_and_available_agree_with_what_is_held_and_show_no_token() {
    let server = RedisServer::start();
    let sem = locker(&server).semaphore("s", 5).unwrap();
    assert_eq!(sem.available().unwrap(), 5);
    assert!(sem.holders().unwrap().is_empty());
    let short = LockOptions::default().ttl(Duration::from_secs(10));
    let a = sem
        .acquire_with(short.clone().metadata("worker-a"))
        .unwrap();
    let b = sem
        .acquire_with(
            LockOptions::default()
                .ttl(Duration::from_secs(20))
                .metadata("b:7"),
        )
        .unwrap();
    let c = sem
        .acquire_with(short.clone().token("cron-1").metadata("cron"))
        .unwrap();
    assert_eq!(sem.available().unwrap(), 2);
    let holders = sem.holders().unwrap();
    let metadata: Vec<&str> = holders.iter().map(|h| h.metadata()).collect();
    assert_eq!(metadata.len(), 3);
    assert_eq!(metadata[2], "b:7", "the last to expire last: {metadata:?}");
    assert_eq!(
        metadata[..2].iter().copied().collect::<HashSet<_>>(),
        HashSet::from(["worker-a", "cron"])
    );
    for holder in &holders {
        let ttl = holder.ttl().unwrap();
        assert!(ttl > Duration::from_secs(9) && ttl <= Duration::from_secs(20));
        let shown = format!("{holder:?}");
        for token in [a.token(), b.token(), c.token()] {
            assert!(!shown.contains(token), "{shown} shows a token");
        }
    }
    drop(a);
    assert_eq!(sem.available().unwrap(), 3);
    assert_eq!(sem.holders().unwrap().len(), 2);
}

#[test]
fn fencing_numbers_rise_with_every_permit() {
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(8).build(server.url()).unwrap();
    let sem = locker.semaphore("fenced", 3).unwrap();
    let threads: Vec<_> = (0..8)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || {
                let mut mine = Vec::new();
                for _ in 0..50 {
                    let permit = sem
                        .acquire_with(LockOptions::default().fencing(true))
                        .unwrap();
                    mine.push(permit.fence().unwrap());
                }
                mine
            })
        })
        .collect();
    let mut all = Vec::new();
    for thread in threads {
        let mine = thread.join().unwrap();
        assert!(mine.windows(2).all(|w| w[0] < w[1]), "{mine:?}");
        all.extend(mine);
    }
    all.sort_unstable();
    let count = all.len();
    all.dedup();
    // Each one new (a waiter that asks just as a release gave it its permit takes a
    // newer token for it: numbers may be skipped, never repeated).
    assert_eq!(all.len(), count, "each one new");
    assert_eq!(count, 400);
    assert_eq!(sem.acquire().unwrap().fence(), None, "none without fencing");
}

#[test]
fn a_release_wakes_waiters_of_this_locker_and_of_others_at_once() {
    let server = RedisServer::start();
    let here = locker(&server);
    for (name, waiter_locker) in [("mine", here.clone()), ("theirs", locker(&server))] {
        let sem = here.semaphore(name, 1).unwrap();
        let held = sem.acquire().unwrap();
        let waiter_sem = waiter_locker.semaphore(name, 1).unwrap();
        let waiter = thread::spawn(move || {
            let permit = waiter_sem.acquire_with(sleepy()).unwrap();
            (Instant::now(), permit)
        });
        // The waiter has tried once and sleeps for its 30 s delay.
        eventually(Duration::from_secs(5), "the waiter subscribes", || {
            server.queued(name) > 0
        });
        thread::sleep(Duration::from_millis(50));
        let released = Instant::now();
        held.release().unwrap();
        let (got, permit) = waiter.join().unwrap();
        let after = got.duration_since(released);
        assert!(after < Duration::from_secs(1), "woken {after:?} after");
        permit.release().unwrap();
    }
}

#[test]
fn threads_of_one_locker_each_get_a_free_permit_in_turn() {
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(8).build(server.url()).unwrap();
    let sem = locker.semaphore("s", 4).unwrap();
    let held: Vec<_> = (0..4).map(|_| sem.acquire().unwrap()).collect();
    let waiters: Vec<_> = (0..4)
        .map(|_| {
            let sem = sem.clone();
            thread::spawn(move || sem.acquire_with(sleepy()).unwrap())
        })
        .collect();
    eventually(Duration::from_secs(5), "the waiters subscribe", || {
        server.queued("s") > 0
    });
    thread::sleep(Duration::from_millis(100));
    let released = Instant::now();
    drop(held); // four releases: each waiter must get one, not only the first in line
    let permits: Vec<_> = waiters.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
    assert_eq!(permits.len(), 4);
    assert_eq!(sem.available().unwrap(), 0);
}

#[test]
fn auto_refresh_keeps_permits_alive_in_the_same_round_trips_as_locks() {
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(4).build(server.url()).unwrap();
    // Long enough that all 100 holds are taken within a quarter of it, even on a loaded
    // machine: then they share every refresh from the first on.
    let ttl = Duration::from_millis(1500);
    let options = LockOptions::default().ttl(ttl);
    let sems: Vec<Semaphore> = (0..10)
        .map(|i| locker.semaphore(&format!("s{i}"), 10).unwrap())
        .collect();
    let permits: Vec<_> = (0..50)
        .map(|i| sems[i % 10].acquire_with(options.clone()).unwrap())
        .collect();
    let guards: Vec<_> = (0..50)
        .map(|i| {
            locker
                .lock_with(&[format!("k{i}")], options.clone())
                .unwrap()
        })
        .collect();
    let calls = server.evalsha_calls();
    thread::sleep(Duration::from_secs(3)); // two TTLs
    assert!(
        permits
            .iter()
            .all(|p| !p.is_lost() && p.ttl().unwrap().is_some())
    );
    assert!(guards.iter().all(|g| !g.is_lost()));
    // A refresh every ~500 ms (a third of the TTL), each one script call for all 100.
    let rounds = server.evalsha_calls() - calls - 50; // less the ttl() calls above
    assert!(
        (3..=12).contains(&rounds),
        "{rounds} refresh round trips in 3 s"
    );
    assert!(sems.iter().all(|s| s.available().unwrap() == 5));
}

#[test]
fn a_fixed_token_re_obtains_its_own_permit() {
    let server = RedisServer::start();
    let sem = locker(&server).semaphore("s", 2).unwrap();
    let options = LockOptions::default().token("cron-7").fencing(true);
    let first = sem.acquire_with(options.clone()).unwrap();
    let again = sem.try_acquire_with(options).unwrap().expect("re-obtained");
    assert_eq!(sem.available().unwrap(), 1, "one permit, not two");
    assert!(again.fence() > first.fence(), "a new fencing number");
    assert_eq!(again.token(), "cron-7");
    drop(first); // the same value: gives back the permit both stand for
    assert_eq!(sem.available().unwrap(), 2);
    assert!(matches!(again.release(), Err(Error::LockLost)));
}

#[test]
fn bad_input_is_refused_and_other_types_are_left_alone() {
    let server = RedisServer::start();
    let locker = locker(&server);
    assert!(invalid(locker.semaphore("", 1)).contains("empty"));
    assert!(invalid(locker.semaphore("s", 0)).contains("limit 0"));
    assert!(invalid(locker.semaphore("s", MAX_LIMIT + 1)).contains("limit"));
    assert!(locker.semaphore("s", MAX_LIMIT).is_ok());

    server.query::<u32>(&["RPUSH", "list", "x"]);
    let sem = locker.semaphore("list", 2).unwrap();
    for result in [sem.try_acquire().map(|_| ()), sem.available().map(|_| ())] {
        match result {
            Err(Error::WrongType { key, kind }) => assert_eq!((&*key, &*kind), ("list", "list")),
            other => panic!("{other:?}"),
        }
    }
    assert_eq!(
        server.query::<Vec<String>>(&["LRANGE", "list", "0", "-1"]),
        ["x"]
    );

    // A semaphore and a lock of one name are one key: whichever comes second is refused.
    let permit = locker.semaphore("both", 1).unwrap().acquire().unwrap();
    assert!(matches!(
        locker.try_lock(&["both"]),
        Err(Error::WrongType { .. })
    ));
    drop(permit);
    let _guard = locker.lock(&["both"]).unwrap();
    let sem = locker.semaphore("both", 1).unwrap();
    assert!(matches!(sem.try_acquire(), Err(Error::WrongType { .. })));
    // A fencing counter that is not one.
    server.query::<String>(&["SET", "redguard:fence:{fenced}", "seven"]);
    let fenced = locker.semaphore("fenced", 8).unwrap();
    let result = fenced.try_acquire_with(LockOptions::default().fencing(true));
    assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
    assert_eq!(
        server.query::<u32>(&["EXISTS", "fenced"]),
        0,
        "nothing taken"
    );
}

#[test]
fn semaphores_are_refused_on_a_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let redlock = Locker::builder().build_redlock(&urls).unwrap();
    assert!(invalid(redlock.semaphore("s", 8)).contains("quorum"));
}

#[test]
fn with_a_prefix_every_key_starts_with_it() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .prefix("app:")
        .build(server.url())
        .unwrap();
    let sem = locker.semaphore("s", 2).unwrap();
    let permit = sem
        .acquire_with(LockOptions::default().fencing(true))
        .unwrap();
    let mut keys: Vec<String> = server.query(&["KEYS", "*"]);
    keys.sort();
    assert_eq!(keys, ["app:redguard:fence:{app:s}", "app:s"]);
    // The limit is stored in the semaphore itself, below every expiry.
    let limit: Vec<String> = server.query(&["ZRANGE", "app:s", "0", "0", "WITHSCORES"]);
    assert_eq!(limit, ["", "-2"]);
    assert_eq!(permit.semaphore(), "s");
}

#[test]
fn a_paused_server_gives_errors_in_time_and_a_restart_loses_the_permits() {
    let mut server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let sem = locker.semaphore("s", 3).unwrap();
    let kept = sem.acquire_with(manual(Duration::from_secs(30))).unwrap();
    let refreshed = sem
        .acquire_with(LockOptions::default().ttl(Duration::from_secs(1)))
        .unwrap();
    let dropped = sem.acquire().unwrap();
    server.pause();
    let started = Instant::now();
    drop(dropped); // bounded, and no panic
    let took = started.elapsed();
    assert!(took < Duration::from_secs(3), "drop took {took:?}");
    let started = Instant::now();
    assert!(matches!(
        sem.try_acquire(),
        Err(Error::Redis(_) | Error::Pool(_))
    ));
    assert!(matches!(
        sem.available(),
        Err(Error::Redis(_) | Error::Pool(_))
    ));
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    server.resume();
    // Answering again (the release the drop sent may run now, or not: 0 or 1 free).
    assert!(sem.available().unwrap() <= 1);

    server.restart(); // in memory only: the permits are gone
    assert!(matches!(
        kept.refresh(Duration::from_secs(30)),
        Err(Error::LockLost)
    ));
    eventually(
        Duration::from_secs(3),
        "the refresher finds it gone",
        || refreshed.is_lost(),
    );
    assert_eq!(sem.available().unwrap(), 3);
}
