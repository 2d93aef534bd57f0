//! Redis Cluster: a private three-master cluster, keys in one slot and across slots, a
//! slot moved to another master while a lock is held, a frozen master.

use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::cluster_server::RedisCluster;
use crate::eventually;
use crate::wake::patient;

pub(crate) fn cluster_locker(cluster: &RedisCluster) -> Locker {
    // One seed is enough: the client learns the others from it.
    Locker::builder()
        .pool_size(4)
        .build_cluster(&cluster.urls()[..1])
        .expect("connect to the test's cluster")
}

/// The value of `key` on the master that serves it (asked there directly).
pub(crate) fn stored(cluster: &RedisCluster, key: &str) -> Option<String> {
    let owner = cluster.owner_of(RedisCluster::slot(key));
    cluster.query(owner, redis::cmd("GET").arg(key))
}

/// Keys on every master together.
fn keys_in_cluster(cluster: &RedisCluster) -> u64 {
    (0..3)
        .map(|node| cluster.query::<u64>(node, &redis::cmd("DBSIZE")))
        .sum()
}

/// SET and EVALSHA calls on every master together.
fn lock_calls(cluster: &RedisCluster) -> u64 {
    (0..3)
        .map(|node| {
            let info: String = cluster.query(node, redis::cmd("INFO").arg("commandstats"));
            info.lines()
                .filter(|line| {
                    line.starts_with("cmdstat_set:") || line.starts_with("cmdstat_evalsha:")
                })
                .filter_map(|line| {
                    line.split("calls=")
                        .nth(1)?
                        .split(',')
                        .next()?
                        .parse::<u64>()
                        .ok()
                })
                .sum::<u64>()
        })
        .sum()
}

#[test]
fn keys_sharing_a_hash_tag_lock_atomically_with_fencing_refresh_and_wake_ups() {
    let cluster = RedisCluster::start();
    let (one, two) = (cluster_locker(&cluster), cluster_locker(&cluster));
    let keys = ["{user42}:a", "{user42}:b"];
    let guard = one
        .lock_with(
            &keys,
            LockOptions::default()
                .fencing(true)
                .ttl(Duration::from_millis(600)),
        )
        .unwrap();
    assert_eq!(guard.fences(), [1, 1]);
    for key in keys {
        assert_eq!(stored(&cluster, key).as_deref(), Some(guard.token()));
    }
    assert!(two.try_lock(&["{user42}:b"]).unwrap().is_none());
    // Kept alive past its TTL by the refresher.
    thread::sleep(Duration::from_millis(1200));
    assert!(!guard.is_lost());
    assert!(guard.ttl().unwrap().expect("held") <= Duration::from_millis(600));

    // A waiter that retries only every 10 s is woken by the release notification.
    let waiting = crate::wake::waiter_with(&two, "{user42}:a", patient().fencing(true));
    // Its place in the queue, in the lock key's slot (so on the same master).
    let queue = crate::server::queue_of("{user42}:a");
    assert_eq!(RedisCluster::slot(&queue), RedisCluster::slot("{user42}:a"));
    let node = cluster.owner_of(RedisCluster::slot(&queue));
    eventually(Duration::from_secs(5), "the waiter is queued", || {
        cluster.query::<u64>(node, redis::cmd("ZCARD").arg(&queue)) == 1
    });
    let released = Instant::now();
    guard.release().unwrap();
    let (next, got) = waiting.join().unwrap();
    let next = next.unwrap();
    assert!(
        got - released < Duration::from_secs(1),
        "{:?}",
        got - released
    );
    assert_eq!(next.fence(), Some(2), "the next owner's token is larger");
}

#[test]
fn keys_in_different_slots_are_refused_unless_allowed_and_then_all_or_nothing() {
    let cluster = RedisCluster::start();
    let locker = cluster_locker(&cluster);
    let (a, b) = (RedisCluster::slot("a"), RedisCluster::slot("b"));
    let refused = locker.lock(&["a", "b"]);
    match &refused {
        Err(Error::InvalidInput(why)) => {
            assert!(
                why.contains(&a.to_string()) && why.contains(&b.to_string()),
                "{why}"
            );
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(keys_in_cluster(&cluster), 0);
    assert_eq!(lock_calls(&cluster), 0, "refused before any round trip");

    let across = || LockOptions::default().across_slots(true);
    let keys = ["a", "b", "c", "{a}:2"];
    let guard = locker.lock_with(&keys, across().fencing(true)).unwrap();
    assert_eq!(
        guard.fences(),
        [1, 1, 1, 1],
        "one token per key, in key order"
    );
    for key in keys {
        assert_eq!(stored(&cluster, key).as_deref(), Some(guard.token()));
    }
    // Another owner wanting "c" and a free key in a lower slot (so taken first) gets
    // neither: "f" is given back (its fencing counter shows it was taken).
    assert!(RedisCluster::slot("f") < RedisCluster::slot("c"));
    let other = cluster_locker(&cluster);
    let once = across().retry(Retry::none()).fencing(true);
    let refused = other.lock_with(&["c", "f"], once);
    assert!(matches!(refused, Err(Error::NotObtained)), "{refused:?}");
    assert_eq!(stored(&cluster, "f"), None, "what was taken was taken back");
    assert_eq!(stored(&cluster, "redguard:fence:{f}").as_deref(), Some("1"));
    guard.refresh(Duration::from_secs(5)).unwrap();
    assert!(guard.ttl().unwrap().expect("held") > Duration::from_secs(4));
    guard.release().unwrap();
    for key in keys {
        assert_eq!(stored(&cluster, key), None);
    }
    // A fencing counter that cannot share its key's slot is refused too.
    let unmatched = locker.lock_with(&["a}b"], LockOptions::default().fencing(true));
    assert!(
        matches!(unmatched, Err(Error::InvalidInput(_))),
        "{unmatched:?}"
    );
}

#[test]
fn a_slot_moved_to_another_master_during_a_hold_is_followed() {
    let cluster = RedisCluster::start();
    let (one, two) = (cluster_locker(&cluster), cluster_locker(&cluster));
    let key = "{moving}:k";
    let slot = RedisCluster::slot(key);
    let guard = one
        .lock_with(
            &[key],
            LockOptions::default().ttl(Duration::from_millis(800)),
        )
        .unwrap();
    let from = cluster.owner_of(slot);
    let to = (from + 1) % 3;
    cluster.migrate_slot(slot, to);
    assert_eq!(cluster.owner_of(slot), to);
    // Every call below first reaches the old master, gets MOVED, and follows it.
    assert!(guard.ttl().unwrap().is_some());
    guard.refresh(Duration::from_secs(5)).unwrap();
    assert!(
        two.try_lock(&[key]).unwrap().is_none(),
        "still exclusive after the move"
    );
    thread::sleep(Duration::from_millis(1000));
    assert!(!guard.is_lost(), "the refresher follows the move too");
    guard.release().unwrap();
    assert_eq!(stored(&cluster, key), None);
    assert!(two.try_lock(&[key]).unwrap().is_some());
}

#[test]
fn unreachable_seeds_are_an_error_within_the_bounds() {
    let started = Instant::now();
    let closed = crate::server::closed_url(0);
    let result = Locker::builder()
        .connect_timeout(Duration::from_millis(300))
        .checkout_timeout(Duration::from_millis(600))
        .build_cluster(&[closed]);
    assert!(result.is_err());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    let none: [&str; 0] = [];
    assert!(matches!(
        Locker::builder().build_cluster(&none),
        Err(Error::InvalidInput(_))
    ));
}

#[test]
fn across_slots_fences_come_in_key_order_and_a_lost_part_loses_the_lock() {
    let cluster = RedisCluster::start();
    let locker = cluster_locker(&cluster);
    // Distinct counters, so that slot order and key order give different lists.
    for (key, count) in [("a", 10), ("b", 20), ("c", 30)] {
        let counter = format!("redguard:fence:{{{key}}}");
        let owner = cluster.owner_of(RedisCluster::slot(&counter));
        let _: () = cluster.query(owner, redis::cmd("SET").arg(&counter).arg(count));
    }
    let options = LockOptions::default().across_slots(true).fencing(true);
    let guard = locker.lock_with(&["a", "b", "c"], options).unwrap();
    assert_eq!(guard.fences(), [11, 21, 31]);
    // "b" is in the lowest slot, "a" in the highest: losing "b" alone loses the lock.
    let owner = cluster.owner_of(RedisCluster::slot("b"));
    let _: u64 = cluster.query(owner, redis::cmd("DEL").arg("b"));
    assert!(matches!(
        guard.refresh(Duration::from_secs(5)),
        Err(Error::LockLost)
    ));
    assert!(guard.is_lost());
    // And losing the highest slot's part ("a") loses a lock as well.
    let guard = locker
        .lock_with(&["a", "b", "c"], LockOptions::default().across_slots(true))
        .unwrap();
    let owner = cluster.owner_of(RedisCluster::slot("a"));
    let _: u64 = cluster.query(owner, redis::cmd("DEL").arg("a"));
    assert!(matches!(
        guard.refresh(Duration::from_secs(5)),
        Err(Error::LockLost)
    ));
}

#[test]
fn a_frozen_master_does_not_stop_the_refresh_of_locks_on_the_others() {
    let cluster = RedisCluster::start();
    let locker = Locker::builder()
        .pool_size(2)
        .io_timeout(Duration::from_millis(200))
        .connect_timeout(Duration::from_millis(200))
        .build_cluster(&cluster.urls())
        .expect("connect to the test's cluster");
    // Six keys on the master to freeze, in slots below a key on another master: each
    // refresh round reaches the frozen master's slots first.
    let mut keys: Vec<String> = (0..400).map(|i| format!("key{i}")).collect();
    keys.sort_by_key(|key| RedisCluster::slot(key));
    let frozen = cluster.owner_of(RedisCluster::slot(&keys[0]));
    let on_frozen_master: Vec<&String> = keys
        .iter()
        .filter(|key| cluster.owner_of(RedisCluster::slot(key)) == frozen)
        .take(6)
        .collect();
    let last_slot = RedisCluster::slot(on_frozen_master[5]);
    let healthy_key = keys
        .iter()
        .find(|key| {
            RedisCluster::slot(key) > last_slot
                && cluster.owner_of(RedisCluster::slot(key)) != frozen
        })
        .expect("a key on another master in a higher slot")
        .clone();
    let healthy = cluster.owner_of(RedisCluster::slot(&healthy_key));
    let ttl = LockOptions::default().ttl(Duration::from_millis(3000));
    let on_frozen: Vec<_> = on_frozen_master
        .iter()
        .map(|key| locker.lock_with(&[key.as_str()], ttl.clone()).unwrap())
        .collect();
    let on_healthy = locker.lock_with(&[&healthy_key], ttl).unwrap();
    cluster.pause(frozen);
    thread::sleep(Duration::from_millis(6000));
    assert!(!on_healthy.is_lost(), "refreshed all along");
    let pttl: i64 = cluster.query(healthy, redis::cmd("PTTL").arg(&healthy_key));
    assert!(pttl > 0, "still held on its master: {pttl}");
    assert!(
        on_frozen.iter().all(|guard| guard.is_lost()),
        "unknown until their TTL ran out"
    );
    cluster.resume(frozen);
    on_healthy.release().unwrap();
}

#[test]
fn a_multi_key_lock_waits_while_its_slot_is_being_moved() {
    let cluster = RedisCluster::start();
    let locker = cluster_locker(&cluster);
    let keys = ["{mig}:a", "{mig}:b"];
    let slot = RedisCluster::slot(keys[0]);
    // While the slot is half-moved, a request for two keys that the new master does not
    // have yet (both do not exist) gets TRYAGAIN there.
    let to = (cluster.owner_of(slot) + 1) % 3;
    let from = cluster.begin_migration(slot, to).expect("a slot to move");
    let patient = LockOptions::default()
        .retry(Retry::linear(Duration::from_millis(20)))
        .timeout(Duration::from_secs(10));
    let waiting = thread::spawn(move || locker.lock_with(&keys, patient).map(drop));
    thread::sleep(Duration::from_millis(300));
    assert!(!waiting.is_finished(), "waits while the slot moves");
    cluster.finish_migration(slot, from, to);
    waiting.join().unwrap().unwrap();
}

#[test]
fn a_frozen_master_costs_a_release_one_failed_call_not_one_per_slot() {
    let cluster = RedisCluster::start();
    let io = Duration::from_millis(200);
    let checkout = Duration::from_millis(400);
    let locker = Locker::builder()
        .pool_size(2)
        .io_timeout(io)
        .connect_timeout(io)
        .checkout_timeout(checkout)
        .build_cluster(&cluster.urls())
        .expect("connect to the test's cluster");
    // A call on a frozen master fails after up to about three I/O timeouts (the client
    // reconnects and retries once), maybe after waiting for a connection to replace the
    // one that failed. Allow two such calls; one per slot would be several times that.
    let bound = 2 * (3 * io + checkout);
    // Three locks of 30 keys each, about a third of them on the master to freeze. Not
    // refreshed, so that only the calls below use the pool.
    let options = LockOptions::default()
        .across_slots(true)
        .auto_refresh(false)
        .ttl(Duration::from_secs(60));
    let frozen = cluster.owner_of(RedisCluster::slot("drop0"));
    let lock = |name: &str| {
        let keys: Vec<String> = (0..30).map(|i| format!("{name}{i}")).collect();
        let guard = locker.lock_with(&keys, options.clone()).unwrap();
        // Each key with its master, asked before the freeze (node 0 may be the frozen one).
        let on_healthy: Vec<(String, usize)> = keys
            .into_iter()
            .map(|key| {
                let owner = cluster.owner_of(RedisCluster::slot(&key));
                (key, owner)
            })
            .filter(|(_, owner)| *owner != frozen)
            .collect();
        assert!(
            (5..=25).contains(&(30 - on_healthy.len())),
            "{} of 30 on the frozen master",
            30 - on_healthy.len()
        );
        (guard, on_healthy)
    };
    let (dropped, dropped_on_healthy) = lock("drop");
    let (released, released_on_healthy) = lock("release");
    let (asked, _) = lock("ttl");

    // All within the cluster's node timeout (5 s): later, the other masters take the
    // frozen one for failed, and refuse every slot (CLUSTERDOWN).
    cluster.pause(frozen);
    let started = Instant::now();
    drop(dropped);
    let drop_took = started.elapsed();
    let started = Instant::now();
    let release = released.release();
    let release_took = started.elapsed();
    let started = Instant::now();
    let ttl = asked.ttl();
    let ttl_took = started.elapsed();
    // Asked while the master is still frozen (and, should the calls above have been too
    // slow, the cluster already down: checked after their times).
    let left: Vec<_> = dropped_on_healthy
        .iter()
        .chain(&released_on_healthy)
        .map(|(key, owner)| {
            let value = cluster.try_query::<Option<String>>(*owner, redis::cmd("GET").arg(key));
            (key, value)
        })
        .filter(|(_, value)| !matches!(value, Ok(None)))
        .collect();
    cluster.resume(frozen);

    assert!(drop_took < bound, "drop took {drop_took:?}");
    assert!(release_took < bound, "release took {release_took:?}");
    assert!(ttl_took < bound, "ttl took {ttl_took:?}");
    assert!(left.is_empty(), "not released on healthy masters: {left:?}");
    match release {
        Err(Error::Redis(e)) => assert!(
            !e.to_string().contains("not asked"),
            "the failed call's error, not a skipped slot's: {e}"
        ),
        other => panic!("{other:?}"),
    }
    assert!(matches!(ttl, Err(Error::Redis(_))), "{ttl:?}");
    // Once the master is back, the same guard is asked and released in full.
    assert!(asked.ttl().unwrap().is_some());
    asked.release().unwrap();
}

#[test]
fn a_semaphore_keeps_every_key_in_one_slot_and_works() {
    let cluster = RedisCluster::start();
    let locker = Locker::builder()
        .pool_size(4)
        .prefix("app:")
        .build_cluster(&cluster.urls()[..1])
        .unwrap();
    let sem = locker.semaphore("payments", 2).unwrap();
    let options = LockOptions::default()
        .ttl(Duration::from_millis(300))
        .fencing(true)
        .metadata("w");
    let first = sem.acquire_with(options.clone()).unwrap();
    let second = sem.acquire_with(options.clone()).unwrap();
    assert!(second.fence() > first.fence());
    assert!(sem.try_acquire().unwrap().is_none(), "both permits held");

    // The semaphore and its counter, both on the master of one slot.
    let keys = ["app:payments", "app:redguard:fence:{app:payments}"];
    let slot = RedisCluster::slot(keys[0]);
    assert!(keys.iter().all(|key| RedisCluster::slot(key) == slot));
    let owner = cluster.owner_of(slot);
    for key in keys {
        let exists: u32 = cluster.query(owner, redis::cmd("EXISTS").arg(key));
        assert_eq!(exists, 1, "{key} on the master of slot {slot}");
    }

    thread::sleep(Duration::from_secs(1)); // over three TTLs: refreshed
    assert!(!first.is_lost() && !second.is_lost());
    assert_eq!(sem.available().unwrap(), 0);
    assert_eq!(sem.holders().unwrap().len(), 2);
    first.release().unwrap();
    let third = sem
        .try_acquire_with(options)
        .unwrap()
        .expect("a permit free");
    assert!(third.fence() > second.fence());
    drop((second, third));
    assert_eq!(sem.available().unwrap(), 2);
    assert_eq!(
        keys_in_cluster(&cluster),
        1,
        "only the fencing counter stays"
    );

    // A name with a stray brace would put the counter in another slot.
    let stray = locker.semaphore("a}b", 1).unwrap();
    let fenced = LockOptions::default().fencing(true);
    assert!(matches!(
        stray.try_acquire_with(fenced),
        Err(Error::InvalidInput(_))
    ));
    assert!(
        stray.try_acquire().unwrap().is_some(),
        "without fencing: one key"
    );
}

#[test]
fn read_locks_in_one_slot_work_and_across_slots_are_refused_before_any_round_trip() {
    let cluster = RedisCluster::start();
    let locker = cluster_locker(&cluster);
    let calls = lock_calls(&cluster);
    for options in [
        LockOptions::default(),
        LockOptions::default().across_slots(true),
    ] {
        let result = locker.try_read_with(&["a", "b"], options);
        assert!(matches!(result, Err(Error::InvalidInput(_))), "{result:?}");
    }
    assert_eq!(lock_calls(&cluster), calls, "nothing was sent");

    let keys = ["{cfg}:a", "{cfg}:b"];
    let first = locker.read(&keys).unwrap();
    let second = locker.try_read(&keys).unwrap().expect("readers share");
    assert!(locker.try_lock(&keys[..1]).unwrap().is_none());
    drop((first, second));
    let writing = locker.lock(&keys).unwrap();
    assert!(locker.try_read(&keys).unwrap().is_none());
    let reading = writing.downgrade().unwrap();
    assert!(locker.try_read(&keys).unwrap().is_some());
    drop(reading);

    // A lock across slots that gives up leaves no intent behind: its attempts each write
    // a value of their own, but the intent is the waiter's, and taken back.
    let _reading = locker.read(&["x"]).unwrap();
    let options = LockOptions::default()
        .across_slots(true)
        .timeout(Duration::from_millis(800));
    let result = locker.lock_with(&["x", "y"], options);
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    let owner = cluster.owner_of(RedisCluster::slot("x"));
    let members: Vec<String> = cluster.query(owner, redis::cmd("ZRANGE").arg("x").arg(0).arg(-1));
    assert!(members.iter().all(|m| !m.starts_with('!')), "{members:?}");
    assert!(locker.try_read(&["x"]).unwrap().is_some());
}

#[test]
fn replicas_are_waited_for_on_each_slots_own_master() {
    let mut cluster = RedisCluster::start();
    cluster.add_replica(0);
    let locker = Locker::builder()
        .pool_size(2)
        // Generous: under load (two test runs at once) an acknowledgement can take long.
        .replica_timeout(Duration::from_secs(1))
        .build_cluster(&cluster.urls()[..1])
        .unwrap();
    // A key on the master with a replica, and one on a master without.
    let on = |master: usize| {
        (0..)
            .map(|i| format!("rep:{i}"))
            .find(|key| cluster.owner_of(RedisCluster::slot(key)) == master)
            .unwrap()
    };
    let (with, without) = (on(0), on(1));
    let replicated = LockOptions::default().replicas(1);
    // A plain WAIT would go to every master, and answer the least count (0).
    let guard = locker
        .lock_with(&[with.as_str()], replicated.clone())
        .unwrap();
    let replica = redis::Client::open(cluster.urls()[3].as_str()).unwrap();
    let mut con = replica
        .get_connection_with_timeout(Duration::from_secs(1))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    let (on_replica,): (Option<String>,) = redis::pipe()
        .cmd("READONLY") // a cluster replica answers reads only after it
        .ignore()
        .cmd("GET")
        .arg(&with)
        .query(&mut con)
        .unwrap();
    assert_eq!(on_replica.as_deref(), Some(guard.token()));
    guard.refresh(Duration::from_secs(10)).unwrap();
    drop(guard);

    let err = locker
        .lock_with(&[without.as_str()], replicated.clone())
        .unwrap_err();
    assert!(
        matches!(
            err,
            Error::NotReplicated {
                acknowledged: 0,
                wanted: 1
            }
        ),
        "{err:?}"
    );
    // Across slots: the part without replicas fails, and every part is given up.
    let both = [with.as_str(), without.as_str()];
    let err = locker
        .lock_with(&both, replicated.across_slots(true))
        .unwrap_err();
    assert!(matches!(err, Error::NotReplicated { .. }), "{err:?}");
    assert_eq!(keys_in_cluster(&cluster), 0, "nothing left behind");
}
