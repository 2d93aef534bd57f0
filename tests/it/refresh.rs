//! TTL, refresh, loss, and the background refresher.

use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker};

use crate::server::RedisServer;
use crate::{eventually, locker};

fn manual(ttl: Duration) -> LockOptions {
    auto(ttl).auto_refresh(false)
}

fn auto(ttl: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl)
}

#[test]
fn refresh_extends_the_ttl() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], manual(Duration::from_secs(1)))
        .unwrap();
    guard.refresh(Duration::from_secs(60)).unwrap();

    let ttl = guard.ttl().unwrap().expect("held");
    assert!(ttl > Duration::from_secs(30), "{ttl:?}");
    assert!(server.query::<i64>(&["PTTL", "k"]) > 30_000);
    let too_short = guard.refresh(Duration::ZERO);
    assert!(matches!(too_short, Err(Error::InvalidInput(_))));
}

#[test]
fn ttl_reports_the_shortest_remaining_ttl() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["a", "b"], manual(Duration::from_secs(60)))
        .unwrap();
    server.query::<()>(&["PEXPIRE", "b", "3000"]);

    let ttl = guard.ttl().unwrap().expect("held");
    assert!(
        ttl <= Duration::from_secs(3) && ttl > Duration::from_secs(1),
        "{ttl:?}"
    );
}

#[test]
fn refresh_ttl_and_release_after_expiry_report_lost() {
    let server = RedisServer::start();
    let locker = locker(&server);

    // Expired by the server (DEL stands in for the TTL running out).
    let guard = locker
        .lock_with(&["k"], manual(Duration::from_secs(60)))
        .unwrap();
    server.query::<()>(&["DEL", "k"]);
    assert!(matches!(
        guard.refresh(Duration::from_secs(60)),
        Err(Error::LockLost)
    ));
    assert!(guard.is_lost());
    assert!(matches!(guard.release(), Err(Error::LockLost)));

    // Expired for real, by a short PEXPIRE on the server.
    let guard = locker
        .lock_with(&["j"], manual(Duration::from_secs(60)))
        .unwrap();
    server.query::<()>(&["PEXPIRE", "j", "1"]);
    eventually(Duration::from_secs(2), "the key expires", || {
        server.query::<u32>(&["EXISTS", "j"]) == 0
    });
    assert_eq!(guard.ttl().unwrap(), None);
    assert!(guard.is_lost());
    assert!(matches!(guard.release(), Err(Error::LockLost)));
}

#[test]
fn release_of_a_key_taken_by_another_owner_is_lost_and_keeps_their_value() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], manual(Duration::from_secs(60)))
        .unwrap();
    server.query::<()>(&["SET", "k", "someone-else"]);

    assert!(matches!(
        guard.refresh(Duration::from_secs(60)),
        Err(Error::LockLost)
    ));
    assert_eq!(
        server.query::<i64>(&["PTTL", "k"]),
        -1,
        "their key was not touched"
    );
    assert!(matches!(guard.release(), Err(Error::LockLost)));
    assert_eq!(server.query::<String>(&["GET", "k"]), "someone-else");
}

#[test]
fn lock_without_refresh_is_lost_once_its_ttl_has_passed() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], manual(Duration::from_millis(50)))
        .unwrap();
    assert!(!guard.is_lost());
    eventually(Duration::from_secs(2), "the ttl passes", || guard.is_lost());
    assert!(matches!(guard.release(), Err(Error::LockLost)));
}

#[test]
fn valid_for_counts_down_to_zero_and_grows_with_a_refresh() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], manual(Duration::from_millis(400)))
        .unwrap();
    // 400 ms less the drift allowance (6 ms), counted from before the request was sent.
    let left = guard.valid_for();
    assert!(
        left <= Duration::from_millis(394) && left > Duration::from_millis(100),
        "{left:?}"
    );
    guard.refresh(Duration::from_secs(60)).unwrap();
    assert!(
        guard.valid_for() > Duration::from_secs(50),
        "{:?}",
        guard.valid_for()
    );
    guard.refresh(Duration::from_millis(30)).unwrap();
    eventually(Duration::from_secs(2), "the ttl passes", || guard.is_lost());
    assert_eq!(guard.valid_for(), Duration::ZERO);
}

#[test]
fn one_server_lock_counts_itself_lost_before_its_ttl_by_the_drift_allowance() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let ttl = Duration::from_millis(2000); // drift allowance: 1% + 2 ms = 22 ms
    let guard = locker.lock_with(&["k"], manual(ttl)).unwrap();
    let returned = Instant::now();
    assert!(!guard.is_lost());
    // Lost by 1978 ms after the request was sent, before it returned: a server clock a
    // little faster than ours must not expire the lock while we still believe it held.
    thread::sleep(ttl - Duration::from_millis(15) - returned.elapsed());
    assert!(guard.is_lost());
}

#[test]
fn auto_refresh_keeps_a_300ms_lock_alive_for_2s() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], auto(Duration::from_millis(300)))
        .unwrap();

    let calls = server.evalsha_calls();
    let started = Instant::now();
    while started.elapsed() < Duration::from_secs(2) {
        assert!(!guard.is_lost(), "lost after {:?}", started.elapsed());
        let stored: Option<String> = server.query(&["GET", "k"]);
        assert_eq!(
            stored.as_deref(),
            Some(guard.token()),
            "after {:?}",
            started.elapsed()
        );
        thread::sleep(Duration::from_millis(50));
    }
    // Refreshed about every 100 ms (a third of the TTL), not in a busy loop.
    let refreshes = server.evalsha_calls() - calls;
    assert!(
        (10..=45).contains(&refreshes),
        "{refreshes} refreshes in 2 s"
    );
    guard.release().unwrap();
}

#[test]
fn auto_refresh_keeps_many_locks_alive() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let options = auto(Duration::from_millis(300));
    let guards: Vec<_> = (0..500)
        .map(|i| {
            locker
                .lock_with(&[format!("k{i}")], options.clone())
                .unwrap()
        })
        .collect();

    thread::sleep(Duration::from_secs(1)); // over three TTLs
    assert!(guards.iter().all(|g| !g.is_lost()));
    let held: u32 = server.query(&["DBSIZE"]);
    assert_eq!(held, 500);
    drop(guards);
    assert_eq!(server.query::<u32>(&["DBSIZE"]), 0);
}

/// A TTL long enough that the local clock does not call the lock lost during the test:
/// only the refresher (first refresh at a third of it) can.
const LONG: Duration = Duration::from_secs(3);

#[test]
fn key_deleted_behind_the_guards_back_is_seen_lost_by_the_refresher() {
    let server = RedisServer::start();
    let guard = locker(&server).lock_with(&["k"], auto(LONG)).unwrap();
    server.query::<()>(&["DEL", "k"]);

    eventually(LONG / 2, "the refresher sees the loss", || guard.is_lost());
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0, "never recreated");
    assert!(matches!(guard.release(), Err(Error::LockLost)));
}

#[test]
fn refresher_never_touches_a_lock_taken_over() {
    let server = RedisServer::start();
    let guard = locker(&server).lock_with(&["k"], auto(LONG)).unwrap();
    server.query::<()>(&["SET", "k", "new-owner"]);

    eventually(LONG / 2, "the refresher sees the loss", || guard.is_lost());
    drop(guard);
    assert_eq!(server.query::<String>(&["GET", "k"]), "new-owner");
    assert_eq!(
        server.query::<i64>(&["PTTL", "k"]),
        -1,
        "not extended, not deleted"
    );
}

#[test]
fn refresher_reloads_its_script_after_a_script_flush() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], auto(Duration::from_millis(300)))
        .unwrap();
    server.query::<()>(&["SCRIPT", "FLUSH"]);
    let calls = server.evalsha_calls();

    thread::sleep(Duration::from_secs(1)); // three TTLs
    assert!(!guard.is_lost());
    assert!(server.evalsha_calls() > calls, "refreshed after the flush");
    guard.release().unwrap();
}

#[test]
fn refresher_backs_off_when_redis_refuses() {
    let server = RedisServer::start();
    let guard = locker(&server).lock_with(&["k"], auto(LONG)).unwrap();
    server.query::<()>(&["ACL", "SETUSER", "default", "-evalsha"]);
    // Refusals counted by the server's ACL log (entries of one kind add up in `count`).
    let rejected = || {
        let log: Vec<Vec<redis::Value>> = server.query(&["ACL", "LOG"]);
        log.iter()
            .filter_map(|entry| {
                let at = entry
                    .iter()
                    .position(|v| *v == redis::Value::BulkString(b"count".to_vec()))?;
                redis::from_redis_value_ref::<u64>(entry.get(at + 1)?).ok()
            })
            .sum::<u64>()
    };
    eventually(LONG / 2, "the first refresh is refused", || rejected() > 0);
    let before = rejected();
    thread::sleep(Duration::from_secs(1));
    // Retries start at a tenth of the TTL and double: a handful in a second, not thousands.
    let retries = rejected() - before;
    assert!(retries <= 4, "{retries} refused refreshes in 1 s");
    assert!(!guard.is_lost(), "a refused refresh is not a lost lock");
}

#[test]
fn manual_refresh_sets_the_ttl_the_refresher_keeps() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], auto(Duration::from_secs(60)))
        .unwrap();
    guard.refresh(Duration::from_millis(300)).unwrap();

    // Kept alive at the new, shorter TTL: after a second the key still lives, and its TTL
    // is the new one, not the original 60 s.
    thread::sleep(Duration::from_secs(1));
    assert!(!guard.is_lost());
    let ttl = guard.ttl().unwrap().expect("held");
    assert!(ttl <= Duration::from_millis(300), "{ttl:?}");
}

/// `release` must report a loss it only learns from the release script itself
/// (the guard did not know beforehand).
#[test]
fn release_reports_lost_when_only_the_script_sees_it() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let manual = || auto(Duration::from_secs(60)).auto_refresh(false);

    let guard = locker.lock_with(&["k"], manual()).unwrap();
    server.query::<()>(&["DEL", "k"]);
    assert!(!guard.is_lost(), "nothing told the guard yet");
    assert!(matches!(guard.release(), Err(Error::LockLost)));

    let guard = locker.lock_with(&["j"], manual()).unwrap();
    server.query::<()>(&["SET", "j", "someone-else"]);
    assert!(!guard.is_lost());
    assert!(matches!(guard.release(), Err(Error::LockLost)));
    assert_eq!(server.query::<String>(&["GET", "j"]), "someone-else");
}

/// A refresh extends every key of a multi-key lock, not just the first.
#[test]
fn refresh_extends_every_key_of_a_multi_key_lock() {
    let server = RedisServer::start();
    let locker = locker(&server);

    // By hand.
    let guard = locker
        .lock_with(
            &["a", "b", "c"],
            auto(Duration::from_secs(1)).auto_refresh(false),
        )
        .unwrap();
    guard.refresh(Duration::from_secs(60)).unwrap();
    for key in ["a", "b", "c"] {
        assert!(server.query::<i64>(&["PTTL", key]) > 30_000, "{key}");
    }
    drop(guard);

    // By the refresher: after several TTLs, every key is still there.
    let guard = locker
        .lock_with(&["x", "y", "z"], auto(Duration::from_millis(300)))
        .unwrap();
    thread::sleep(Duration::from_secs(1));
    assert_eq!(server.query::<u32>(&["EXISTS", "x", "y", "z"]), 3);
    assert!(!guard.is_lost());
}

/// In one batched refresh, a lock found gone must not make the refresher
/// report the other locks of the batch as gone (nor skip extending them).
#[test]
fn a_lost_lock_in_a_refresh_batch_does_not_affect_the_others() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let ttl = Duration::from_secs(3);
    // Taken together, so they are due together and share the refresher's round trips.
    let guards: Vec<_> = (0..20)
        .map(|i| locker.lock_with(&[format!("k{i}")], auto(ttl)).unwrap())
        .collect();
    let (gone, live) = guards.split_at(10);
    for i in 0..10 {
        server.query::<()>(&["DEL", &format!("k{i}")]);
    }

    eventually(ttl / 2, "the refresher sees the deleted locks", || {
        gone.iter().all(|g| g.is_lost())
    });
    thread::sleep(ttl); // more refreshes of the live locks, past their first TTL
    for (i, guard) in live.iter().enumerate() {
        assert!(!guard.is_lost(), "live lock {} reported lost", i + 10);
    }
    let keys: Vec<String> = (10..20).map(|i| format!("k{i}")).collect();
    let mut exists = vec!["EXISTS"];
    exists.extend(keys.iter().map(String::as_str));
    assert_eq!(server.query::<u32>(&exists), 10);
}

#[cfg(target_os = "linux")]
fn refresher_threads() -> usize {
    crate::threads_named("redguard-refresher")
}

/// Runs [`refresher_thread_per_locker_child`] alone in a child process, so that no other
/// test's threads are counted.
#[cfg(target_os = "linux")]
#[test]
fn one_refresher_thread_per_locker_gone_with_its_guards() {
    crate::in_child_process("refresh::refresher_thread_per_locker_child");
}

#[cfg(target_os = "linux")]
#[test]
#[ignore = "run by one_refresher_thread_per_locker_gone_with_its_guards"]
fn refresher_thread_per_locker_child() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let server = RedisServer::start();
    let options = auto(Duration::from_secs(3));

    let first = Locker::connect(server.url()).unwrap();
    // A thread exists once spawned, but names itself only when it runs: count them all.
    let tasks = || std::fs::read_dir("/proc/self/task").unwrap().count();
    let before = tasks();
    let manual = first
        .lock_with(&["m"], options.clone().auto_refresh(false))
        .unwrap();
    assert_eq!(tasks(), before, "started lazily, not for manual guards");
    let threads = |n: usize, what: &str| {
        eventually(Duration::from_secs(5), what, || refresher_threads() == n);
    };

    let guards: Vec<_> = (0..50)
        .map(|i| {
            first
                .lock_with(&[format!("a{i}")], options.clone())
                .unwrap()
        })
        .collect();
    threads(1, "one thread for 50 guards");

    let second = Locker::connect(server.url()).unwrap();
    let other = second.lock_with(&["b"], options.clone()).unwrap();
    threads(2, "one per locker");

    drop(first);
    assert_eq!(
        refresher_threads(),
        2,
        "guards keep their locker's refresher"
    );
    drop((guards, manual));
    threads(1, "joined with the last guard");
    drop((second, other));
    threads(0, "joined with the last locker");
}

/// A lease of 1,000 years or of `MAX_TTL` is refreshed once a period like any other (a
/// third of a capped 100 years): holding it costs no commands at all for seconds.
#[test]
fn huge_leases_cost_one_refresh_per_period() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let semaphore = locker.semaphore("s", 10).unwrap();
    let millennium = Duration::from_secs(1000 * 365 * 24 * 3600);
    let (mut locks, mut reads, mut permits) = (Vec::new(), Vec::new(), Vec::new());
    for (i, ttl) in [millennium, redguard::MAX_TTL].into_iter().enumerate() {
        let options = || LockOptions::default().ttl(ttl);
        locks.push(locker.lock_with(&[format!("l{i}")], options()).unwrap());
        reads.push(locker.read_with(&[format!("r{i}")], options()).unwrap());
        permits.push(semaphore.acquire_with(options()).unwrap());
    }
    let before = server.evalsha_calls();
    thread::sleep(Duration::from_secs(2));
    let sent = server.evalsha_calls() - before;
    assert!(sent <= 2, "{sent} script calls in 2 s for 6 huge leases");
    assert!(locks.iter().all(|g| !g.is_lost()) && reads.iter().all(|g| !g.is_lost()));
    assert!(permits.iter().all(|p| !p.is_lost()));
}

/// A refresh by hand while the refresher's own may be in flight: one waits for the other,
/// so the guard never counts on a longer TTL than the server applied last.
#[test]
fn a_refresh_by_hand_never_overlaps_the_refreshers() {
    let server = RedisServer::start();
    let guard = locker(&server)
        .lock_with(&["k"], auto(Duration::from_millis(300)))
        .unwrap();
    for round in 0..20 {
        guard.refresh(Duration::from_millis(300)).unwrap();
        // About when the refresher's next refresh (at a third of the TTL) is under way.
        thread::sleep(Duration::from_millis(90 + round % 20));
        guard.refresh(Duration::from_secs(10)).unwrap();
        let asked = Instant::now();
        let believed = guard.valid_for();
        let pttl = server.query::<u64>(&["PTTL", "k"]);
        let slack = asked.elapsed() + Duration::from_millis(1);
        assert!(
            believed <= Duration::from_millis(pttl) + slack,
            "round {round}: the guard counts on {believed:?}, the server has {pttl} ms"
        );
    }
}
