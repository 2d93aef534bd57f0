//! Elections through Sentinel (a master, two replicas and three sentinels of the test's own,
//! `redguard::testing::Replicated`) across a forced failover, and on a private
//! three-master Redis Cluster.

use std::thread;
use std::time::{Duration, Instant};

use redguard::testing::Replicated;
use redguard::{Error, LockOptions, Observer};

use crate::cluster::{cluster_locker, stored};
use crate::cluster_server::RedisCluster;
use crate::election::{TO_QUEUE, counter_key, lock_key, next_change, proclaimed_key, seen};
use crate::eventually;
use crate::order::in_line;
use crate::sentinel::sentinel_locker;
use crate::server::queue_of;

/// What `observer` yields until it names a leader of term `term` (within 5 s), which it
/// returns; no term it names on the way is smaller than the one before.
fn observed_until(observer: &mut Observer, term: u64) -> (u64, String) {
    let deadline = Instant::now() + Duration::from_secs(5);
    let mut last = 0;
    loop {
        let left = deadline.saturating_duration_since(Instant::now());
        if let Some((seen_term, value)) = seen(next_change(observer, left)) {
            assert!(seen_term >= last, "term {seen_term} after {last}");
            last = seen_term;
            if seen_term == term {
                return (seen_term, value);
            }
        }
    }
}

/// How many candidates wait in the queue of election "e" on server `at` of `group`.
fn queued(group: &Replicated, at: usize) -> u64 {
    let client = redis::Client::open(group.url_of(&group.servers()[at])).unwrap();
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let queue = queue_of(&lock_key("e"));
    redis::cmd("ZCARD").arg(queue).query(&mut con).unwrap()
}

/// How many replicas of server `at` of `group` are online, as it says.
fn replicas_online(group: &Replicated, at: usize) -> usize {
    let Ok(client) = redis::Client::open(group.url_of(&group.servers()[at])) else {
        return 0;
    };
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
        return 0;
    };
    let info: String = redis::cmd("INFO")
        .arg("replication")
        .query(&mut con)
        .unwrap_or_default();
    info.lines()
        .filter(|line| line.starts_with("slave") && line.contains("state=online"))
        .count()
}

/// Terms taken with `replicas(1)` (the promoted replica has each one, and the counter,
/// once the campaign returns) go on growing after a forced failover: the leader of
/// before is on the new master and resigns there, a waiting candidate of another locker
/// leads with a larger term, and its fenced write lands on the new master.
#[test]
fn an_election_through_sentinel_raises_its_terms_across_a_failover() {
    let group = Replicated::start(2, 3).unwrap_or_else(|e| panic!("{e}"));
    let on = |at: usize, key: &str| crate::sentinel::stored(&group, &group.servers()[at], key);
    let locker = sentinel_locker(&group);
    let election = locker.election("e").unwrap();
    let replicated = || {
        LockOptions::default()
            .replicas(1)
            .ttl(Duration::from_secs(10)) // outlasts the renewals missed in the failover
    };
    let first = election.campaign_with("a", replicated()).unwrap();
    assert!(first.fenced_set("cursor", "a").unwrap());
    let first_term = first.term();
    first.resign().unwrap();
    let second = election.campaign_with("b", replicated()).unwrap();
    assert!(second.term() > first_term);
    assert!(second.fenced_set("cursor", "b").unwrap());
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((second.term(), "b".into()))
    );
    let mut observer = election.observe().unwrap();
    let wait = Duration::from_secs(3);
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((second.term(), "b".into()))
    );

    let old = group.master_index().unwrap();
    let new = group.failover().unwrap();
    assert_ne!(new, old);
    // The other replica follows the new master as part of the failover (the old master
    // only after Sentinel's next look at it, seconds later): replicas(1) waits for one.
    eventually(
        Duration::from_secs(10),
        "a replica of the new master",
        || replicas_online(&group, new) >= 1,
    );
    let term = second.term().to_string();
    assert_eq!(
        on(new, &counter_key("e")),
        Some(term),
        "the counter was there"
    );
    assert!(on(new, &lock_key("e")).is_some(), "and the term");
    // The locker follows the new master (the old one stays writable for a while).
    eventually(
        Duration::from_secs(5),
        "the locker on the new master",
        || {
            let guard = locker.lock(&["x"]).unwrap();
            on(new, "x").as_deref() == Some(guard.token())
        },
    );
    assert!(!second.is_lost());
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((second.term(), "b".into()))
    );

    let theirs = sentinel_locker(&group).election("e").unwrap();
    let waiting = thread::spawn(move || {
        theirs.campaign_with("c", replicated().timeout(Duration::from_secs(10)))
    });
    eventually(TO_QUEUE, "c is queued on the new master", || {
        queued(&group, new) == 1
    });
    let second_term = second.term();
    second.resign().unwrap();
    let third = waiting.join().unwrap().unwrap();
    assert!(
        third.term() > second_term,
        "{} after {second_term}",
        third.term()
    );
    assert_eq!(on(new, &counter_key("e")), Some(third.term().to_string()));
    assert!(third.fenced_set("cursor", "c").unwrap());
    assert_eq!(on(new, "cursor").as_deref(), Some("c"));
    assert_eq!(observed_until(&mut observer, third.term()).1, "c");
}

/// On a cluster: every key of an election is in its name's slot, on that slot's master;
/// campaign, proclaim, observe and fenced writes work there; a waiting candidate of
/// another locker is queued on that master and takes over when the leader resigns; a
/// term taken over behind its back writes no more. A name whose keys could not share a
/// slot is refused.
#[test]
fn an_election_on_a_cluster_campaigns_observes_fences_and_hands_over() {
    let cluster = RedisCluster::start();
    let (mine, theirs) = (cluster_locker(&cluster), cluster_locker(&cluster));
    let refused = mine.election("a}b");
    assert!(
        matches!(refused, Err(Error::InvalidInput(_))),
        "{refused:?}"
    );
    let election = mine.election("e").unwrap();
    let slot = RedisCluster::slot("e");
    let node = cluster.owner_of(slot);
    let mut observer = election.observe().unwrap();
    let wait = Duration::from_secs(3);
    assert_eq!(next_change(&mut observer, wait), None);

    let mut a = election.campaign("a").unwrap();
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((a.term(), "a".into()))
    );
    a.proclaim("a2").unwrap();
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((a.term(), "a2".into()))
    );
    assert!(a.fenced_set("cursor", "a").unwrap());
    assert_eq!(stored(&cluster, "cursor").as_deref(), Some("a"));
    for key in [lock_key("e"), counter_key("e"), proclaimed_key("e")] {
        assert_eq!(RedisCluster::slot(&key), slot, "{key}");
        let there: u32 = cluster.query(node, redis::cmd("EXISTS").arg(&key));
        assert_eq!(there, 1, "{key} on its slot's master");
    }
    assert_eq!(
        stored(&cluster, &counter_key("e")),
        Some(a.term().to_string())
    );

    let other = theirs.election("e").unwrap();
    let waiting = thread::spawn(move || other.campaign_with("b", in_line()));
    let queue = queue_of(&lock_key("e"));
    eventually(TO_QUEUE, "b is queued on the election's master", || {
        cluster.query::<u64>(node, redis::cmd("ZCARD").arg(&queue)) == 1
    });
    let first = a.term();
    let resigned = Instant::now();
    a.resign().unwrap();
    let b = waiting.join().unwrap().unwrap();
    let took = resigned.elapsed();
    assert!(took < Duration::from_secs(1), "served {took:?} after");
    assert!(b.term() > first);
    assert_eq!(observed_until(&mut observer, b.term()).1, "b");
    assert!(b.fenced_set("cursor", "b").unwrap());

    // b's lock deleted behind its back: c leads, writes, and b's write is refused.
    cluster.query::<u32>(node, redis::cmd("DEL").arg(lock_key("e")));
    let c = election.try_campaign("c").unwrap().expect("nobody leads");
    assert!(c.term() > b.term());
    assert!(c.fenced_set("cursor", "c").unwrap());
    assert!(!b.fenced_set("cursor", "stale").unwrap());
    assert_eq!(stored(&cluster, "cursor").as_deref(), Some("c"));
    assert_eq!(
        seen(theirs.election("e").unwrap().leader().unwrap()),
        Some((c.term(), "c".into()))
    );
}

#[test]
fn a_fenced_write_waits_for_the_replicas_its_hold_waits_for() {
    let (group, proxy) = crate::sentinel::replicating_through_a_proxy();
    let locker = sentinel_locker(&group);
    let options = LockOptions::default().replicas(1);
    let leadership = locker
        .election("fw")
        .unwrap()
        .campaign_with("a", options.clone())
        .unwrap();
    let guard = locker
        .lock_with(&["fw:lock"], options.fencing(true))
        .unwrap();
    assert!(leadership.fenced_set("fw:term", "1").unwrap());
    assert!(guard.fenced_set("fw:guard", "1").unwrap());

    // The master's writes stop reaching the replica: a write a failover would forget is
    // said to be one, as a hold's would be.
    proxy.set(|f| f.down.blackhole = true);
    let none = Error::NotReplicated {
        acknowledged: 0,
        wanted: 1,
    };
    let err = leadership.fenced_set("fw:term", "2").unwrap_err();
    assert_eq!(format!("{err:?}"), format!("{none:?}"));
    let err = guard.fenced_set("fw:guard", "2").unwrap_err();
    assert_eq!(format!("{err:?}"), format!("{none:?}"));
    let master = &group.servers()[group.master_index().unwrap()];
    let on_master = crate::sentinel::stored(&group, master, "fw:term");
    assert_eq!(on_master.as_deref(), Some("2"), "written on the master");

    // A lock taken without replicas writes as before.
    let plain = locker
        .lock_with(&["fw:plain"], LockOptions::default().fencing(true))
        .unwrap();
    assert!(plain.fenced_set("fw:plain:v", "1").unwrap());
    proxy.heal();
}
