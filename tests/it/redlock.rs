//! Redlock: five private servers, some killed, frozen, restarted empty or out of reach.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::eventually;
use crate::server::{RedisServer, free_port};
use crate::wake::waiter;

/// Far above a round trip on a loaded 2-core machine; far below the TTLs used here.
const NODE_TIMEOUT: Duration = Duration::from_millis(300);

fn five() -> Vec<RedisServer> {
    (0..5).map(|_| RedisServer::start()).collect()
}

fn urls(servers: &[RedisServer]) -> Vec<String> {
    servers.iter().map(RedisServer::url).collect()
}

fn redlock(urls: &[String]) -> Locker {
    Locker::builder()
        .pool_size(4)
        .node_timeout(NODE_TIMEOUT)
        .connect_timeout(NODE_TIMEOUT)
        .build_redlock(urls)
        .expect("a majority of the test's servers answers")
}

/// The value each server stores under `key` (`None` where it has none).
fn values(servers: &[RedisServer], key: &str) -> Vec<Option<String>> {
    servers.iter().map(|s| s.query(&["GET", key])).collect()
}

#[test]
fn lock_is_taken_and_released_on_every_node_in_one_script_call_each() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    // Warm up: each script's first call on a fresh server loads it (NOSCRIPT, then again).
    let warm = locker.lock(&["warm"]).unwrap();
    warm.ttl().unwrap();
    warm.release().unwrap();
    let before: Vec<u64> = servers.iter().map(RedisServer::evalsha_calls).collect();
    let guard = locker.lock(&["a", "b"]).unwrap();
    let token = guard.token().to_string();
    for value in values(&servers, "a")
        .into_iter()
        .chain(values(&servers, "b"))
    {
        assert_eq!(value.as_deref(), Some(token.as_str()));
    }
    let ttl = guard.ttl().unwrap().expect("held");
    assert!(
        ttl > Duration::from_secs(25) && ttl <= Duration::from_secs(30),
        "{ttl:?}"
    );
    guard.release().unwrap();
    assert!(values(&servers, "a").iter().all(Option::is_none));
    // acquire, ttl and release: one script call on each node for each.
    for (server, before) in servers.iter().zip(before) {
        assert_eq!(server.evalsha_calls() - before, 3);
    }
}

#[test]
fn a_majority_excludes_another_owner_and_all_or_nothing_holds() {
    let servers = five();
    let urls = urls(&servers);
    let (one, two) = (redlock(&urls), redlock(&urls));
    let _held = one.lock(&["x", "y"]).unwrap();
    assert!(two.try_lock(&["y", "z"]).unwrap().is_none());
    assert!(
        values(&servers, "z").iter().all(Option::is_none),
        "a failed attempt takes back what it took"
    );
    // Another owner holding the key on three nodes behind our back wins the vote.
    for server in &servers[..3] {
        let _: () = server.query(&["SET", "w", "someone-else", "PX", "60000"]);
    }
    assert!(one.try_lock(&["w"]).unwrap().is_none());
    for server in &servers[3..] {
        assert!(
            server.query::<Option<String>>(&["GET", "w"]).is_none(),
            "taken back"
        );
    }
}

#[test]
fn two_nodes_killed_locks_still_work() {
    let mut servers = five();
    let urls = urls(&servers);
    let locker = redlock(&urls);
    let held = locker.lock(&["k"]).unwrap();
    servers[1].kill();
    servers[3].kill();
    held.refresh(Duration::from_secs(10)).unwrap();
    assert!(held.ttl().unwrap().is_some());
    assert!(
        locker.try_lock(&["k"]).unwrap().is_none(),
        "still exclusive"
    );
    held.release().unwrap();
    let started = Instant::now();
    let again = locker.lock(&["k"]).unwrap();
    assert!(
        started.elapsed() < 2 * NODE_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    again.release().unwrap();
}

#[test]
fn three_nodes_killed_gives_not_obtained_at_once() {
    let mut servers = five();
    let locker = redlock(&urls(&servers));
    let held = locker.lock(&["k"]).unwrap();
    for i in [0, 2, 4] {
        servers[i].kill();
    }
    for _ in 0..3 {
        let started = Instant::now();
        // No deadline, endless retries: still no hang.
        let result = locker.lock(&["other"]);
        assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
        assert!(
            started.elapsed() < 2 * NODE_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
    }
    let once = locker.try_lock(&["other"]);
    assert!(
        matches!(once, Err(Error::Redis(_))),
        "not 'held elsewhere': {once:?}"
    );
    assert!(held.refresh(Duration::from_secs(10)).is_err());
    assert!(held.ttl().is_err());
    let started = Instant::now();
    drop(held);
    assert!(started.elapsed() < 2 * NODE_TIMEOUT, "drop is bounded");
}

#[test]
fn frozen_nodes_cost_one_node_timeout_together_then_are_left_out() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    drop(locker.lock(&["warm"]).unwrap()); // connections made
    servers[0].pause();
    servers[4].pause();
    let started = Instant::now();
    let guard = locker.lock(&["k"]).unwrap();
    let first = started.elapsed();
    // Both replies are awaited against one deadline, not one after the other.
    assert!(
        first >= NODE_TIMEOUT && first < NODE_TIMEOUT * 3 / 2,
        "{first:?}"
    );
    guard.release().unwrap();
    // From then on, each lock sees the frozen nodes left out, or on probation when their
    // rest ends (waited for about as long as the others took): never a node timeout again.
    let until = Instant::now() + Duration::from_millis(2500);
    let mut slowest = Duration::ZERO;
    let mut cycles = 0;
    while Instant::now() < until {
        let started = Instant::now();
        locker.lock(&["k"]).unwrap().release().unwrap();
        slowest = slowest.max(started.elapsed());
        cycles += 1;
    }
    assert!(
        slowest < NODE_TIMEOUT / 3,
        "slowest of {cycles} cycles: {slowest:?}"
    );
    servers[0].resume();
    servers[4].resume();
    // Back in use once they answer: a lock is then taken on all five.
    eventually(
        Duration::from_secs(3),
        "the resumed nodes hold locks again",
        || {
            let guard = locker.lock(&["back"]).unwrap();
            let held = values(&servers, "back").iter().flatten().count();
            drop(guard);
            held == 5
        },
    );
}

#[test]
fn node_restarted_empty_during_a_hold_keeps_the_lock_and_its_exclusion() {
    let mut servers = five();
    let urls = urls(&servers);
    let (one, two) = (redlock(&urls), redlock(&urls));
    let guard = one.lock(&["k"]).unwrap();
    servers[2].kill();
    servers[2].restart(); // in memory only: the key is gone there
    assert_eq!(values(&servers, "k")[2], None);
    assert!(
        two.try_lock(&["k"]).unwrap().is_none(),
        "four of five still hold it"
    );
    guard.refresh(Duration::from_secs(10)).unwrap();
    assert!(!guard.is_lost());
    assert!(guard.ttl().unwrap().is_some());
    guard.release().unwrap();
    assert!(two.try_lock(&["k"]).unwrap().is_some());
}

#[test]
fn clients_that_each_reach_a_different_three_of_five_exclude_each_other() {
    let servers = five();
    let all = urls(&servers);
    // A node a client cannot reach: a closed port in its place.
    let unreachable = || format!("redis://127.0.0.1:{}/", free_port());
    let views = [[0, 1, 2], [2, 3, 4], [0, 3, 4], [1, 2, 4]];
    let lockers: Vec<Locker> = views
        .iter()
        .map(|view| {
            let seen: Vec<String> = (0..5)
                .map(|i| {
                    if view.contains(&i) {
                        all[i].clone()
                    } else {
                        unreachable()
                    }
                })
                .collect();
            redlock(&seen)
        })
        .collect();
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_millis(1500);
    let threads: Vec<_> = lockers
        .into_iter()
        .map(|locker| {
            let (inside, entries) = (Arc::clone(&inside), Arc::clone(&entries));
            thread::spawn(move || {
                let options =
                    || LockOptions::default().retry(Retry::linear(Duration::from_millis(5)));
                let mut mine = 0;
                while Instant::now() < deadline {
                    let guard = locker
                        .lock_with(&["shared"], options().timeout(Duration::from_secs(5)))
                        .unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two owners at once");
                    thread::sleep(Duration::from_micros(200));
                    inside.store(false, Ordering::SeqCst);
                    entries.fetch_add(1, Ordering::Relaxed);
                    mine += 1;
                    guard.release().unwrap();
                }
                mine
            })
        })
        .collect();
    let per_client: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        per_client.iter().all(|&n| n > 0),
        "every client got in: {per_client:?}"
    );
    assert!(entries.load(Ordering::Relaxed) > 20);
}

#[test]
fn refresher_keeps_a_short_lock_alive_on_a_majority() {
    let mut servers = five();
    let locker = redlock(&urls(&servers));
    let guard = locker
        .lock_with(
            &["k"],
            LockOptions::default().ttl(Duration::from_millis(600)),
        )
        .unwrap();
    servers[0].kill();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(!guard.is_lost());
        thread::sleep(Duration::from_millis(50));
    }
    let ttl = guard.ttl().unwrap().expect("held");
    assert!(ttl <= Duration::from_millis(600));
    // Deleted on three nodes behind its back: the refresher sees a minority and gives up.
    for server in &servers[1..4] {
        let _: u64 = server.query(&["DEL", "k"]);
    }
    eventually(
        Duration::from_secs(2),
        "the refresher marks the lock lost",
        || guard.is_lost(),
    );
}

#[test]
fn waiter_is_woken_by_a_release() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let holder = locker.lock(&["k"]).unwrap();
    let waiting = waiter(&locker, "k");
    // The locker listens on the last node first.
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        servers[4].subscribers("redguard:released:k") == 1
    });
    let released = Instant::now();
    holder.release().unwrap();
    let (guard, got) = waiting.join().unwrap();
    drop(guard.unwrap());
    assert!(
        got - released < Duration::from_secs(1),
        "{:?}",
        got - released
    );
}

#[test]
fn bad_quorum_settings_are_refused_before_locking() {
    let servers = five();
    let urls = urls(&servers);
    let none: [&str; 0] = [];
    assert!(matches!(
        Locker::builder().build_redlock(&none),
        Err(Error::InvalidInput(_))
    ));
    let twice = [urls[0].clone(), urls[1].clone(), urls[0].clone()];
    assert!(matches!(
        Locker::builder().build_redlock(&twice),
        Err(Error::InvalidInput(_))
    ));
    for timeout in [Duration::ZERO, Duration::MAX] {
        let bad = Locker::builder().node_timeout(timeout);
        assert!(matches!(
            bad.build_redlock(&urls),
            Err(Error::InvalidInput(_))
        ));
    }
    let locker = redlock(&urls);
    let fenced = locker.lock_with(&["k"], LockOptions::default().fencing(true));
    assert!(matches!(fenced, Err(Error::InvalidInput(_))), "{fenced:?}");
    let tiny = locker.lock_with(&["k"], LockOptions::default().ttl(Duration::from_millis(2)));
    assert!(matches!(tiny, Err(Error::InvalidInput(_))), "{tiny:?}");
    // A majority unreachable at build time.
    let mostly_closed: Vec<String> = (0..3)
        .map(|_| format!("redis://127.0.0.1:{}/", free_port()))
        .chain(urls[..2].iter().cloned())
        .collect();
    let started = Instant::now();
    assert!(
        Locker::builder()
            .node_timeout(NODE_TIMEOUT)
            .build_redlock(&mostly_closed)
            .is_err()
    );
    assert!(started.elapsed() < Duration::from_secs(2));
}

#[test]
fn waiter_is_still_woken_after_the_node_it_listened_on_died() {
    let mut servers = five();
    let locker = redlock(&urls(&servers));
    let holder = locker.lock(&["k"]).unwrap();
    let first = thread::spawn({
        let locker = locker.clone();
        move || {
            drop(locker.lock_with(
                &["k"],
                LockOptions::default().timeout(Duration::from_secs(5)),
            ))
        }
    });
    eventually(
        Duration::from_secs(5),
        "the subscriber listens on the last node",
        || servers[4].subscribers("redguard:released:k") == 1,
    );
    servers[4].kill();
    eventually(
        Duration::from_secs(5),
        "the subscriber moves to the next node",
        || servers[3].subscribers("redguard:released:k") == 1,
    );
    let waiting = waiter(&locker, "k");
    thread::sleep(Duration::from_millis(50)); // let it make its first attempt
    let released = Instant::now();
    holder.release().unwrap();
    first.join().unwrap();
    let (got, at) = waiting.join().unwrap();
    drop(got.unwrap());
    assert!(
        at - released < Duration::from_secs(2),
        "{:?}",
        at - released
    );
}

#[test]
fn an_acquire_whose_replies_came_too_late_is_taken_back_everywhere() {
    let servers = five();
    let urls = urls(&servers);
    let locker = redlock(&urls);
    drop(locker.lock(&["warm"]).unwrap()); // connections made
    for server in &servers {
        // Servers that know the acquire script but not the release script: the late
        // acquire runs when they wake, and the take-back must not need its script.
        let _: () = server.query(&["SCRIPT", "FLUSH"]);
        let _: String = server.query(&["SCRIPT", "LOAD", include_str!("../../lua/acquire.lua")]);
    }
    for server in &servers[..3] {
        server.pause();
    }
    let result = locker.try_lock(&["k"]);
    // Two nodes are not a majority of five: an error, not "held elsewhere".
    assert!(matches!(result, Err(Error::Redis(_))), "{result:?}");
    for server in &servers[..3] {
        server.resume();
    }
    // The frozen nodes ran the acquire when they woke, then the take-back sent after it
    // on the same connection; the others were taken back at once.
    eventually(Duration::from_secs(3), "no node keeps the key", || {
        values(&servers, "k").iter().all(Option::is_none)
    });
    let other = redlock(&urls);
    assert!(other.try_lock(&["k"]).unwrap().is_some());
}

#[test]
fn a_waiter_does_not_spin_when_one_node_lost_the_holders_key() {
    let servers = five();
    let urls = urls(&servers);
    let (one, two) = (redlock(&urls), redlock(&urls));
    let _held = one.lock(&["k"]).unwrap();
    let _: u64 = servers[2].query(&["DEL", "k"]); // that node is free, the others held
    let before = servers[0].evalsha_calls();
    let patient = LockOptions::default()
        .retry(Retry::linear(Duration::from_millis(300)))
        .timeout(Duration::from_secs(1));
    assert!(matches!(
        two.lock_with(&["k"], patient),
        Err(Error::NotObtained)
    ));
    let attempts = servers[0].evalsha_calls() - before;
    // About one attempt per 300 ms (and the last one at the deadline), not one every
    // few milliseconds.
    assert!((2..=7).contains(&attempts), "{attempts} attempts in 1 s");
    assert_eq!(values(&servers, "k")[2], None, "taken back");
}

#[test]
fn ttl_is_how_long_a_majority_still_holds_the_lock() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(Duration::from_secs(60)))
        .unwrap();
    for (server, secs) in servers.iter().zip([10, 50, 20, 40, 30]) {
        let _: u64 = server.query(&["PEXPIRE", "k", &(secs * 1000).to_string()]);
    }
    let ttl = guard.ttl().unwrap().expect("held");
    // Three of five hold it for at least 30 s; the fourth longest goes at 20 s.
    assert!(
        ttl > Duration::from_secs(29) && ttl <= Duration::from_secs(30),
        "{ttl:?}"
    );
}

#[test]
fn a_quorum_lock_counts_itself_lost_before_its_ttl_by_the_drift_allowance() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let ttl = Duration::from_millis(2000); // drift allowance: 1% + 2 ms = 22 ms
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(ttl).auto_refresh(false))
        .unwrap();
    let returned = Instant::now();
    assert!(!guard.is_lost());
    // Lost by 1978 ms after the request was sent, before it returned. Sleeping longer
    // than asked cannot make this fail; without the allowance it would still be held.
    thread::sleep(ttl - Duration::from_millis(15) - returned.elapsed());
    assert!(guard.is_lost());
}

#[test]
fn a_ttl_too_short_for_the_node_timeout_is_refused() {
    let servers = five();
    let locker = redlock(&urls(&servers)); // node timeout 300 ms: attempts up to 450 ms
    let short = locker.lock_with(
        &["k"],
        LockOptions::default().ttl(Duration::from_millis(450)),
    );
    assert!(matches!(short, Err(Error::InvalidInput(_))), "{short:?}");
    let enough = locker.lock_with(
        &["k"],
        LockOptions::default().ttl(Duration::from_millis(500)),
    );
    assert!(enough.is_ok());
}

#[test]
fn a_failed_re_obtain_with_a_fixed_token_leaves_the_owners_lock_alone() {
    let servers = five();
    let urls = urls(&servers);
    let (owner, other) = (redlock(&urls), redlock(&urls));
    let fixed = || LockOptions::default().token("owner-7").auto_refresh(false);
    let held = owner.lock_with(&["k"], fixed()).unwrap();
    for server in &servers[2..] {
        server.pause();
    }
    let again = owner.lock_with(&["k"], fixed().retry(Retry::none()));
    assert!(again.is_err(), "two nodes are not a majority");
    for server in &servers[2..] {
        server.resume();
    }
    // Nothing took the owner's keys away: not the take-back, not an undo on the nodes
    // that were frozen.
    thread::sleep(NODE_TIMEOUT);
    assert!(
        values(&servers, "k")
            .iter()
            .all(|v| v.as_deref() == Some("7:owner-7"))
    );
    assert!(other.try_lock(&["k"]).unwrap().is_none());
    assert!(!held.is_lost());
}

#[test]
fn threads_sharing_busy_pools_all_get_their_locks() {
    let servers = five();
    let locker = Locker::builder()
        .pool_size(2)
        .node_timeout(NODE_TIMEOUT)
        .build_redlock(&urls(&servers))
        .unwrap();
    let slowest = thread::scope(|s| {
        let threads: Vec<_> = (0..8)
            .map(|t| {
                let locker = &locker;
                s.spawn(move || {
                    let mut slowest = Duration::ZERO;
                    for i in 0..40 {
                        let started = Instant::now();
                        let key = format!("t{t}:{i}");
                        locker.lock(&[key.as_str()]).unwrap().release().unwrap();
                        slowest = slowest.max(started.elapsed());
                    }
                    slowest
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap())
            .max()
            .unwrap()
    });
    assert!(
        slowest < NODE_TIMEOUT,
        "slowest lock + release: {slowest:?}"
    );
    for server in &servers {
        assert_eq!(server.query::<u64>(&["DBSIZE"]), 0, "no key left behind");
    }
}

#[test]
fn waiter_is_woken_even_when_the_node_it_listens_on_never_had_the_lock() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let holder = locker.lock(&["k"]).unwrap();
    let _: u64 = servers[4].query(&["DEL", "k"]); // the node the locker listens on
    let waiting = waiter(&locker, "k");
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        servers[4].subscribers("redguard:released:k") == 1
    });
    thread::sleep(Duration::from_millis(50)); // let it make its attempt after that
    let released = Instant::now();
    holder.release().unwrap();
    let (got, at) = waiting.join().unwrap();
    drop(got.unwrap());
    assert!(
        at - released < Duration::from_secs(1),
        "{:?}",
        at - released
    );
}

#[test]
fn a_lock_is_not_given_up_while_the_silent_nodes_could_still_hold_it() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    servers[0].pause();
    servers[1].pause();
    // Lost there (as on a restart), but the node answers: a restarted node's pool would
    // first have to find its old connections closed, and the refresh be short of answers.
    let _: u64 = servers[2].query(&["DEL", "k"]);
    // Two of the three that answer hold it; the two silent ones may too.
    let refreshed = guard.refresh(Duration::from_secs(30));
    assert!(
        matches!(&refreshed, Err(Error::Redis(e)) if e.to_string().contains("a majority holds")),
        "says what happened: {refreshed:?}"
    );
    assert!(guard.ttl().is_err());
    assert!(!guard.is_lost());
    servers[0].resume();
    servers[1].resume();
    eventually(
        Duration::from_secs(3),
        "refreshed once the nodes answer",
        || guard.refresh(Duration::from_secs(30)).is_ok(),
    );
    // Deleted on three nodes: now lost for certain.
    for server in &servers[..3] {
        let _: u64 = server.query(&["DEL", "k"]);
    }
    // (Once the resumed nodes answer again: until then they might still hold it.)
    eventually(
        Duration::from_secs(3),
        "refresh reports the lock lost",
        || matches!(guard.refresh(Duration::from_secs(30)), Err(Error::LockLost)),
    );
    assert!(matches!(guard.release(), Err(Error::LockLost)));
}

#[test]
fn a_release_still_on_its_way_to_the_other_nodes_is_caught_up_with_quickly() {
    let servers = five();
    let (holder, waiter) = (redlock(&urls(&servers)), redlock(&urls(&servers)));
    let held = holder
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let waiting = crate::wake::waiter(&waiter, "k");
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        servers[4].subscribers("redguard:released:k") == 1
    });
    thread::sleep(Duration::from_millis(50)); // its attempt after the subscription
    // A release that has reached only the node the waiter listens on: it hears it, and
    // its next attempt finds one node free and four still held.
    let attempts = servers[0].evalsha_calls();
    let _: u64 = servers[4].query(&["DEL", "k"]);
    let _: u64 = servers[4].query(&["PUBLISH", "redguard:released:k", ""]);
    eventually(Duration::from_secs(5), "the waiter tries again", || {
        servers[0].evalsha_calls() > attempts
    });
    // Then the release reaches the others, without telling anyone.
    let released = Instant::now();
    for server in &servers[..4] {
        let _: u64 = server.query(&["DEL", "k"]);
    }
    let (got, at) = waiting.join().unwrap();
    drop(got.unwrap());
    assert!(
        at - released < Duration::from_secs(1),
        "{:?}",
        at - released
    );
    drop(held);
}

/// URLs for a user `locker` made on every server, allowed everything but the lock's
/// commands (SET and the scripts) on the servers `refusing`, which answer them NOPERM.
fn urls_as_user(servers: &[RedisServer], refusing: &[usize]) -> Vec<String> {
    servers
        .iter()
        .enumerate()
        .map(|(i, server)| {
            let mut rules = vec!["ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*"];
            rules.push("+@all");
            if refusing.contains(&i) {
                rules.extend(["-set", "-evalsha", "-eval"]);
            }
            server.query::<()>(&rules);
            server.url().replace("redis://", "redis://locker:secret@")
        })
        .collect()
}

/// Whether `result` is the error reply `code` of a server.
fn refused<T>(result: &Result<T, Error>, code: &str) -> bool {
    matches!(result, Err(Error::Redis(e)) if e.code() == Some(code))
}

/// How many error replies `code` the server has given (INFO errorstats).
fn error_replies(server: &RedisServer, code: &str) -> u64 {
    let info: String = server.query(&["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Locks and releases until `refusing` (one of the locker's nodes, answering NOPERM) has
/// failed again and again, and returns just after its latest refusal: it then rests for
/// a good while (at least 400 ms) before the locker asks it again.
fn refused_long_enough(locker: &Locker, refusing: &RedisServer) {
    // It rests longer each time in a row it fails: 50 ms, then 100, 200...
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        locker.lock(&["warm"]).unwrap().release().unwrap();
    }
    let failures = error_replies(refusing, "NOPERM");
    eventually(Duration::from_secs(3), "the node asked again", || {
        locker.lock(&["warm"]).unwrap().release().unwrap();
        error_replies(refusing, "NOPERM") > failures
    });
}

#[test]
fn servers_refusing_the_lock_commands_give_their_error_not_not_obtained() {
    let servers = five();
    let locker = redlock(&urls_as_user(&servers, &[0, 1, 2]));
    // The second time round the refusing nodes are resting: the same error again.
    for _ in 0..2 {
        let locked = locker.lock(&["k"]);
        assert!(refused(&locked, "NOPERM"), "{locked:?}");
        let once = locker.try_lock(&["k"]);
        assert!(refused(&once, "NOPERM"), "not 'held elsewhere': {once:?}");
    }
    assert!(
        values(&servers, "k").iter().all(Option::is_none),
        "taken back on the nodes that took it"
    );
}

#[test]
fn a_replica_given_as_a_node_is_left_out_and_named_once_it_costs_the_majority() {
    let mut servers = five();
    let master = RedisServer::start();
    let port = master
        .url()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let _: () = servers[4].query(&["REPLICAOF", "127.0.0.1", &port]);
    let locker = redlock(&urls(&servers));
    // Four masters are a majority; the replica refuses the write, and is then left out
    // for a while like a node that did not answer, rather than asked every time.
    let held: Vec<_> = (0..20)
        .map(|i| locker.lock(&[format!("k{i}")]).unwrap())
        .collect();
    let refusals = error_replies(&servers[4], "READONLY");
    assert!((1..10).contains(&refusals), "{refusals} of 20 asked");
    drop(held);
    servers[0].kill();
    servers[1].kill();
    // Two masters left: the replica is why there is no majority, and it says so.
    let locked = locker.lock(&["k"]);
    assert!(refused(&locked, "READONLY"), "{locked:?}");
}

#[test]
fn a_node_left_out_after_an_error_reply_is_reported_by_that_error() {
    let mut servers = five();
    let locker = redlock(&urls_as_user(&servers, &[0, 1]));
    refused_long_enough(&locker, &servers[0]);
    let failures = error_replies(&servers[0], "NOPERM");
    servers[2].kill();
    // Only nodes 2 to 4 are asked (the others rest), and node 2 fails: the refusals that
    // left nodes 0 and 1 out are why there is no majority.
    let locked = locker.lock(&["k"]);
    assert!(refused(&locked, "NOPERM"), "{locked:?}");
    assert_eq!(
        error_replies(&servers[0], "NOPERM"),
        failures,
        "the resting node was not asked"
    );
}

#[test]
fn a_held_lock_names_the_refusal_that_stops_its_refresh_and_release() {
    let mut servers = five();
    let locker = redlock(&urls_as_user(&servers, &[]));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    for server in &servers[..2] {
        let _: () = server.query(&["ACL", "SETUSER", "locker", "-evalsha", "-eval"]);
    }
    servers[4].kill();
    // Two nodes refuse, one is gone: the refusal is what to fix, so it is what is said.
    let refreshed = guard.refresh(Duration::from_secs(30));
    assert!(refused(&refreshed, "NOPERM"), "{refreshed:?}");
    let ttl = guard.ttl();
    assert!(refused(&ttl, "NOPERM"), "{ttl:?}");
    let released = guard.release();
    assert!(refused(&released, "NOPERM"), "{released:?}");
}

#[test]
fn a_release_reaches_a_node_left_out_after_a_failure() {
    let servers = five();
    let locker = redlock(&urls_as_user(&servers, &[]));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    // Node 0 refuses the lock's commands for a while, is left out, and is then well again.
    let _: () = servers[0].query(&["ACL", "SETUSER", "locker", "-set", "-evalsha", "-eval"]);
    refused_long_enough(&locker, &servers[0]);
    let _: () = servers[0].query(&["ACL", "SETUSER", "locker", "+set", "+evalsha", "+eval"]);
    guard.release().unwrap();
    // (Its reply may come after the release returned; its TTL is 30 s.)
    eventually(
        Duration::from_secs(1),
        "not left to its TTL on the resting node",
        || values(&servers, "k") == vec![None; 5],
    );
}

#[test]
fn a_lock_won_without_a_late_node_keeps_what_that_node_takes() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    drop(locker.lock(&["warm"]).unwrap()); // connections made, scripts loaded
    servers[0].pause();
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let token = Some(guard.token().to_string());
    servers[0].resume();
    // The late node runs the acquire when it wakes, and nothing after it takes it back.
    eventually(
        Duration::from_secs(3),
        "the late node holds the lock",
        || values(&servers, "k")[0] == token,
    );
    thread::sleep(Duration::from_millis(50));
    assert_eq!(values(&servers, "k"), vec![token; 5]);
    guard.release().unwrap();
    eventually(Duration::from_secs(1), "released everywhere", || {
        values(&servers, "k") == vec![None; 5]
    });
}

/// How many times the server ran `command` (INFO commandstats).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a number of calls"))
}

#[test]
fn one_free_key_is_taken_with_a_plain_set_and_a_set_one_asks_the_script() {
    let servers = five();
    let urls = urls(&servers);
    let (one, two) = (redlock(&urls), redlock(&urls));
    drop(one.lock(&["warm"]).unwrap()); // scripts loaded
    let count = |command: &str| -> Vec<u64> { servers.iter().map(|s| calls(s, command)).collect() };
    let (sets, scripts) = (count("set"), count("evalsha"));
    let held = one.lock(&["k"]).unwrap();
    let more = |now: Vec<u64>, before: &[u64]| -> Vec<u64> {
        now.iter()
            .zip(before)
            .map(|(now, before)| now - before)
            .collect()
    };
    assert_eq!(more(count("set"), &sets), [1; 5]);
    assert_eq!(more(count("evalsha"), &scripts), [0; 5], "no script");
    // Set on every node: the script tells whose it is.
    assert!(two.try_lock(&["k"]).unwrap().is_none());
    assert_eq!(more(count("evalsha"), &scripts), [1; 5]);
    drop(held);
    // A list on three nodes: named, though a plain SET only finds the key set.
    for server in &servers[..3] {
        let _: u64 = server.query(&["LPUSH", "k", "x"]);
    }
    let wrong = two.lock(&["k"]);
    assert!(
        matches!(&wrong, Err(Error::WrongType { key, kind }) if key == "k" && kind == "list"),
        "{wrong:?}"
    );
    assert!(
        values(&servers[3..], "k").iter().all(Option::is_none),
        "taken back"
    );
}
