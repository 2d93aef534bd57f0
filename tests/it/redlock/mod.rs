//! Redlock on five private servers: locking, releasing, waking and the vote; `faults.rs`,
//! nodes killed, frozen, restarted empty or out of reach; `refusals.rs`, servers that
//! answer with an error, and what release and late nodes do.

mod faults;
mod refusals;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::eventually;
use crate::server::{RedisServer, closed_url};
use crate::wake::{waiter, woken_after_release};

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
fn waiter_is_woken_by_a_release() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let holder = locker.lock(&["k"]).unwrap();
    let waiting = waiter(&locker, "k");
    // The locker listens on the last node first.
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        servers[4].subscribers("redguard:released:k") == 1
    });
    let took = woken_after_release(holder, waiting);
    assert!(took < Duration::from_secs(1), "{took:?}");
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
        .map(closed_url)
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
fn an_acquire_whose_replies_came_too_late_is_taken_back_everywhere() {
    let servers = five();
    let urls = urls(&servers);
    let locker = redlock(&urls);
    drop(locker.lock(&["warm"]).unwrap()); // connections made
    for server in &servers {
        // Servers that know the acquire script but not the release script: the late
        // acquire runs when they wake, and the take-back must not need its script.
        let _: () = server.query(&["SCRIPT", "FLUSH"]);
        let _: String = server.query(&["SCRIPT", "LOAD", include_str!("../../../lua/acquire.lua")]);
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
    let took = woken_after_release(holder, waiting);
    assert!(took < Duration::from_secs(1), "{took:?}");
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

/// Every value written to `key` on `server` while `during` runs, from MONITOR.
fn values_written(server: &RedisServer, key: &str, during: impl FnOnce()) -> Vec<String> {
    let mut monitor = server.connection();
    monitor
        .send_packed_command(&redis::cmd("MONITOR").get_packed_command())
        .unwrap();
    assert_eq!(monitor.recv_response().unwrap(), redis::Value::Okay);
    during();
    monitor
        .set_read_timeout(Some(Duration::from_millis(200)))
        .unwrap();
    let mut written = Vec::new();
    // `... "SET" "<key>" "<value>" "NX" ...`, and the acquire script's MSETNX/MSET.
    while let Ok(redis::Value::SimpleString(line)) = monitor.recv_response() {
        let quoted: Vec<&str> = line.split('"').skip(1).step_by(2).collect();
        if let [command, k, value, ..] = quoted[..]
            && ["SET", "msetnx", "mset"].contains(&command)
            && k == key
        {
            written.push(value.to_string());
        }
    }
    written
}

#[test]
fn each_attempt_on_a_quorum_takes_the_keys_with_a_value_of_its_own() {
    let servers = five();
    let urls = urls(&servers);
    let locker = redlock(&urls);
    // Another owner holds the key on three of the five: every attempt takes the other two,
    // falls short, and takes them back; a late take-back of one attempt must never match
    // what a later attempt wrote.
    for server in &servers[..3] {
        server.query::<String>(&["SET", "k", "someone-else"]);
    }
    let options = LockOptions::default()
        .retry(Retry::linear(Duration::from_millis(30)))
        .timeout(Duration::from_millis(300));
    let written = values_written(&servers[4], "k", || {
        let result = locker.lock_with(&["k"], options);
        assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    });
    assert!(
        written.len() >= 3,
        "only {} attempts reached the node",
        written.len()
    );
    let distinct: std::collections::HashSet<&String> = written.iter().collect();
    assert_eq!(
        distinct.len(),
        written.len(),
        "a value was used twice: {written:?}"
    );
}
