//! The queue on Redis Cluster: a waiter's place is in the slot of the keys it waits for,
//! so on the master that serves them, where the release that serves it runs. (A one-key
//! lock waiter is checked in `cluster.rs`; here a waiter for two keys of one slot, and a
//! semaphore's.)

use std::thread;
use std::time::{Duration, Instant};

use redguard::{LockOptions, Locker, Retry};

use crate::cluster_server::RedisCluster;
use crate::eventually;
use crate::server::queue_of;

/// Far below the waiters' retry delay (10 s): whoever is served this fast was served by
/// the release.
const QUICK: Duration = Duration::from_secs(1);

fn cluster_locker(cluster: &RedisCluster) -> Locker {
    Locker::builder()
        .pool_size(4)
        .build_cluster(&cluster.urls()[..1])
        .expect("connect to the test's cluster")
}

/// Retries only every 10 s, gives up after 8 s.
fn patient() -> LockOptions {
    LockOptions::default()
        .retry(Retry::linear(Duration::from_secs(10)))
        .timeout(Duration::from_secs(8))
}

/// Keys on each master, in node order.
fn keys_per_node(cluster: &RedisCluster) -> Vec<u64> {
    (0..3)
        .map(|node| cluster.query::<u64>(node, &redis::cmd("DBSIZE")))
        .collect()
}

/// Waits until the queue of each of `keys` holds one waiter on `node`, and checks that no
/// other master has a key of theirs.
fn queued_on(cluster: &RedisCluster, node: usize, keys: &[&str]) {
    eventually(Duration::from_secs(5), "the waiter is queued", || {
        keys.iter()
            .all(|key| cluster.query::<u64>(node, redis::cmd("ZCARD").arg(queue_of(key))) == 1)
    });
    let mut elsewhere = keys_per_node(cluster);
    elsewhere.remove(node);
    assert_eq!(elsewhere, [0, 0], "keys on the other masters");
}

/// A waiter of another locker for `{t}a` and `{t}b` (one slot) while `{t}b` is held: its
/// place is in both keys' queues on that slot's master, and the release of `{t}b` there
/// gives it both keys at once.
#[test]
fn a_waiter_for_two_keys_of_one_slot_is_queued_and_served_on_its_master() {
    let cluster = RedisCluster::start();
    let (holder, waiter) = (cluster_locker(&cluster), cluster_locker(&cluster));
    let keys = ["{t}a", "{t}b"];
    let slot = RedisCluster::slot("t");
    assert!(
        keys.iter()
            .all(|key| RedisCluster::slot(&queue_of(key)) == slot)
    );
    let node = cluster.owner_of(slot);

    let held = holder.lock(&["{t}b"]).unwrap();
    let waiting = thread::spawn(move || {
        let guard = waiter.lock_with(&keys, patient());
        (guard, Instant::now())
    });
    queued_on(&cluster, node, &keys);
    let released = Instant::now();
    held.release().unwrap();
    let (guard, got) = waiting.join().unwrap();
    let guard = guard.unwrap();
    assert!(got - released < QUICK, "served {:?} after", got - released);
    for key in keys {
        let value: Option<String> = cluster.query(node, redis::cmd("GET").arg(key));
        assert_eq!(value.as_deref(), Some(guard.token()), "{key}");
    }
    guard.release().unwrap();
    assert_eq!(keys_per_node(&cluster), [0, 0, 0], "nothing left");
}

/// A semaphore of one held on the cluster: a waiter of another locker is queued on the
/// master of the semaphore's slot, and the release there hands it the permit.
#[test]
fn a_semaphore_waiter_is_queued_and_served_on_its_master() {
    let cluster = RedisCluster::start();
    let (holder, waiter) = (cluster_locker(&cluster), cluster_locker(&cluster));
    let name = "{t}sem";
    let node = cluster.owner_of(RedisCluster::slot(name));
    assert_eq!(
        RedisCluster::slot(&queue_of(name)),
        RedisCluster::slot(name)
    );

    let held = holder.semaphore(name, 1).unwrap().acquire().unwrap();
    let waiting = thread::spawn(move || {
        let permit = waiter
            .semaphore(name, 1)
            .and_then(|semaphore| semaphore.acquire_with(patient()));
        (permit, Instant::now())
    });
    queued_on(&cluster, node, &[name]);
    let released = Instant::now();
    held.release().unwrap();
    let (permit, got) = waiting.join().unwrap();
    let permit = permit.unwrap();
    assert!(got - released < QUICK, "served {:?} after", got - released);
    let semaphore = holder.semaphore(name, 1).unwrap();
    assert_eq!(semaphore.available().unwrap(), 0, "the waiter holds it");
    assert!(semaphore.try_acquire().unwrap().is_none());
    permit.release().unwrap();
    assert_eq!(semaphore.available().unwrap(), 1);
    assert_eq!(keys_per_node(&cluster), [0, 0, 0], "nothing left");
}
