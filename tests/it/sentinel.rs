//! Sentinel and replicas: a master, replicas and sentinels of each test's own
//! (`redguard::testing::Replicated`), failovers forced and by SIGKILL, and holds that
//! wait for their replicas.

use std::time::{Duration, Instant};

use redguard::testing::{Replicated, Server};
use redguard::{Error, LockOptions, Locker, Retry};

use crate::eventually;
use crate::proxy::Proxy;
use crate::server::{RedisServer, closed_url};

fn start(replicas: usize, sentinels: usize) -> Replicated {
    Replicated::start(replicas, sentinels).unwrap_or_else(|e| panic!("{e}"))
}

/// A locker on the group's sentinels, with short bounds.
pub(crate) fn sentinel_locker(group: &Replicated) -> Locker {
    Locker::builder()
        .pool_size(4)
        .connect_timeout(Duration::from_millis(500))
        .io_timeout(Duration::from_secs(2))
        .checkout_timeout(Duration::from_secs(2))
        // Generous: under load (two test runs at once) an acknowledgement can take long.
        .replica_timeout(Duration::from_secs(1))
        .build_sentinel(&group.sentinel_urls(), group.master_name())
        .expect("a locker through the sentinels")
}

/// What `server` stores at `key`, asked behind the locker's back.
pub(crate) fn stored(group: &Replicated, server: &Server, key: &str) -> Option<String> {
    let client = redis::Client::open(group.url_of(server)).unwrap();
    let mut con = client
        .get_connection_with_timeout(Duration::from_secs(1))
        .unwrap();
    con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    redis::cmd("GET").arg(key).query(&mut con).unwrap()
}

/// `err` says no replica of the one wanted acknowledged.
fn assert_none_replicated(err: &Error) {
    let none = Error::NotReplicated {
        acknowledged: 0,
        wanted: 1,
    };
    assert_eq!(format!("{err:?}"), format!("{none:?}"));
}

fn master(group: &Replicated) -> &Server {
    &group.servers()[group.master_index().expect("the sentinels name a master")]
}

#[test]
fn locks_go_to_the_master_the_sentinels_name() {
    let group = start(1, 3);
    let locker = sentinel_locker(&group);
    let guard = locker.lock(&["s:a", "s:b"]).unwrap();
    assert!(locker.try_lock(&["s:b"]).unwrap().is_none(), "held once");
    let master = master(&group);
    assert_eq!(
        stored(&group, master, "s:a").as_deref(),
        Some(guard.token())
    );
    guard.release().unwrap();
    assert_eq!(stored(&group, master, "s:a"), None);
}

#[test]
fn replicas_one_is_held_only_once_a_replica_has_it() {
    let group = start(2, 3);
    let locker = sentinel_locker(&group);
    let guard = locker
        .lock_with(&["r:k"], LockOptions::default().replicas(2))
        .unwrap();
    // WAIT 2 returned 2: both replicas have it the moment lock returns.
    for replica in &group.servers()[1..] {
        assert_eq!(
            stored(&group, replica, "r:k").as_deref(),
            Some(guard.token())
        );
    }
    // A refresh waits for them too.
    guard.refresh(Duration::from_secs(20)).unwrap();
    drop(guard);

    // Every replica frozen: nothing is held, within the replica timeout.
    for replica in &group.servers()[1..] {
        replica.pause().unwrap();
    }
    let started = Instant::now();
    let err = locker
        .lock_with(&["r:k"], LockOptions::default().replicas(1))
        .unwrap_err();
    let took = started.elapsed();
    for replica in &group.servers()[1..] {
        replica.resume().unwrap();
    }
    assert_none_replicated(&err);
    assert!(took < Duration::from_secs(3), "{took:?}");
    assert_eq!(stored(&group, &group.servers()[0], "r:k"), None, "given up");
    // Free again for anyone.
    assert!(locker.try_lock(&["r:k"]).unwrap().is_some());
}

#[test]
fn a_refresh_short_of_replicas_is_an_error_and_the_refresher_finally_reports_it_lost() {
    let group = start(1, 0);
    let lost = std::sync::Arc::new(std::sync::atomic::AtomicUsize::new(0));
    let counted = std::sync::Arc::clone(&lost);
    let locker = Locker::builder()
        .replica_timeout(Duration::from_secs(1))
        .on_lost(move |_| {
            counted.fetch_add(1, std::sync::atomic::Ordering::SeqCst);
        })
        .build(group.url_of(&group.servers()[0]))
        .unwrap();
    let options = LockOptions::default()
        .replicas(1)
        .ttl(Duration::from_millis(1500));
    let manual = locker
        .lock_with(&["m:k"], options.clone().auto_refresh(false))
        .unwrap();
    let auto = locker.lock_with(&["a:k"], options).unwrap();
    let replica = &group.servers()[1];
    replica.pause().unwrap();
    let err = manual.refresh(Duration::from_millis(1500)).unwrap_err();
    assert_none_replicated(&err);
    // The master has the refresh, but it is not counted: the hold is lost in the end.
    eventually(Duration::from_secs(5), "auto-refreshed hold lost", || {
        auto.is_lost()
    });
    replica.resume().unwrap();
    eventually(Duration::from_secs(2), "on_lost told", || {
        lost.load(std::sync::atomic::Ordering::SeqCst) == 1
    });
}

#[test]
fn a_forced_failover_is_followed_at_once_by_new_locks_the_refresher_and_the_subscriber() {
    let group = start(2, 3);
    let locker = sentinel_locker(&group);
    let old = group.master_index().unwrap();
    let options = LockOptions::default().ttl(Duration::from_millis(1500));
    let before = locker.lock_with(&["f:before"], options.clone()).unwrap();
    // A waiter of another locker, listening on the old master.
    let held = locker.lock(&["f:wake"]).unwrap();
    let other = sentinel_locker(&group);
    let waiter = std::thread::spawn(move || {
        let options = LockOptions::default().retry(Retry::linear(Duration::from_secs(30)));
        let _guard = other.lock_with(&["f:wake"], options).unwrap();
        Instant::now()
    });
    eventually(Duration::from_secs(5), "waiter on the old master", || {
        listens(&group, &group.servers()[old], "f:wake")
    });

    let new = group.failover().unwrap();
    assert_ne!(new, old);
    // The old master stays writable for seconds after the switch: a locker that did not
    // hear +switch-master would go on taking locks there.
    let started = Instant::now();
    eventually(
        Duration::from_secs(2),
        "a new lock on the new master",
        || {
            let guard = locker.lock(&["f:after"]).unwrap();
            // While it is held: on the new master, and not on the old one.
            stored(&group, &group.servers()[new], "f:after").as_deref() == Some(guard.token())
                && stored(&group, &group.servers()[old], "f:after").is_none()
        },
    );
    println!(
        "new locks on the new master {:?} after the failover",
        started.elapsed()
    );
    eventually(Duration::from_secs(5), "waiter on the new master", || {
        listens(&group, &group.servers()[new], "f:wake")
    });

    // The hold taken before is either refreshed on the new master or reported lost:
    // never assumed held while the new master does not have it.
    std::thread::sleep(Duration::from_millis(2000));
    let on_new = stored(&group, &group.servers()[new], "f:before");
    assert!(
        before.is_lost() || on_new.as_deref() == Some(before.token()),
        "held per the guard, but the new master has {on_new:?}"
    );

    // The waiter (of another locker) listening on the old master moved to the new one,
    // where its place was replicated: the release there serves it at once, not after
    // its 30 s delay.
    let released = Instant::now();
    drop(held);
    let woke = waiter.join().unwrap();
    assert!(woke >= released, "it waited until the release");
    let waited = woke - released;
    assert!(waited < Duration::from_secs(10), "{waited:?}");
}

/// Whether a waiter for `key` listens on `server`: it is queued there, and some locker's
/// subscriber listens there on its own channel (where a release tells it it was served).
fn listens(group: &Replicated, server: &Server, key: &str) -> bool {
    let client = redis::Client::open(group.url_of(server)).unwrap();
    let Ok(mut con) = client.get_connection_with_timeout(Duration::from_secs(1)) else {
        return false;
    };
    let _ = con.set_read_timeout(Some(Duration::from_secs(2)));
    let channels: Vec<String> = redis::cmd("PUBSUB")
        .arg("CHANNELS")
        .arg("*redguard:wake:*")
        .query(&mut con)
        .unwrap_or_default();
    let queued: u64 = redis::cmd("ZCARD")
        .arg(crate::server::queue_of(key))
        .query(&mut con)
        .unwrap_or_default();
    !channels.is_empty() && queued == 1
}

#[test]
fn a_frozen_sentinel_does_not_keep_the_locker_on_the_old_master() {
    let group = start(1, 3);
    let locker = sentinel_locker(&group);
    drop(locker.lock(&["z:warm"]).unwrap());
    // The sentinel the locker listens on (the first) freezes; the others fail over.
    group.sentinels()[0].pause().unwrap();
    let old = group.master_index_by(1).unwrap();
    let new = group.failover_through(1);
    let new = new
        .inspect_err(|_| drop(group.sentinels()[0].resume()))
        .unwrap();
    assert_ne!(new, old);
    // The old master stays writable for seconds: the locker must leave it all the same.
    let found = Instant::now();
    eventually(Duration::from_secs(5), "a lock on the new master", || {
        let guard = locker.lock(&["z:k"]).unwrap();
        stored(&group, &group.servers()[new], "z:k").as_deref() == Some(guard.token())
    });
    group.sentinels()[0].resume().unwrap();
    println!("on the new master {:?} after the failover", found.elapsed());
}

#[test]
fn a_killed_master_is_followed_once_sentinel_promotes_a_replica() {
    let mut group = start(2, 3);
    let locker = sentinel_locker(&group);
    let old = group.master_index().unwrap();
    let old_port = group.servers()[old].port();
    let before = locker
        .lock_with(
            &["k:before"],
            LockOptions::default().ttl(Duration::from_secs(2)),
        )
        .unwrap();
    group.servers_mut()[old].kill();
    let new = group
        .wait_for_new_master(old_port, Duration::from_secs(30))
        .unwrap();
    let started = Instant::now();
    let after = loop {
        match locker.lock(&["k:after"]) {
            Ok(guard) => break guard,
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(10), "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert_eq!(
        stored(&group, &group.servers()[new], "k:after").as_deref(),
        Some(after.token())
    );
    // Taken before, without replicas: refreshed on the new master (if its write had
    // reached the promoted replica), or reported lost; never assumed held otherwise.
    eventually(Duration::from_secs(5), "the old hold decided", || {
        let on_new = stored(&group, &group.servers()[new], "k:before");
        before.is_lost() || on_new.as_deref() == Some(before.token())
    });
}

#[test]
fn a_lock_held_with_replicas_survives_a_failover_forced_right_after_it() {
    let group = start(1, 3);
    let locker = sentinel_locker(&group);
    let guard = locker
        .lock_with(&["w:k"], LockOptions::default().replicas(1))
        .unwrap();
    let new = group.failover().unwrap();
    assert_eq!(
        stored(&group, &group.servers()[new], "w:k").as_deref(),
        Some(guard.token()),
        "the promoted replica had it"
    );
    // And nobody else gets it there.
    eventually(
        Duration::from_secs(3),
        "the locker on the new master",
        || {
            let guard = locker.try_lock(&["w:other"]).unwrap();
            // Held (the guard lives to the end of the expression) on the new master.
            guard.is_some_and(|guard| {
                stored(&group, &group.servers()[new], "w:other").as_deref() == Some(guard.token())
            })
        },
    );
    assert!(locker.try_lock(&["w:k"]).unwrap().is_none());
    assert!(!guard.is_lost());
}

#[test]
fn sentinels_and_master_with_passwords() {
    let group = Replicated::start_with_password(1, 1, "pw-Ab3").unwrap();
    let urls = group.sentinel_urls();
    let err = match Locker::builder().build_sentinel(&urls, group.master_name()) {
        Err(err) => err,
        Ok(_) => panic!("the master wants a password"),
    };
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    let locker = Locker::builder()
        .master_password("pw-Ab3")
        .build_sentinel(&urls, group.master_name())
        .unwrap();
    assert!(locker.try_lock(&["p:k"]).unwrap().is_some());
}

#[test]
fn a_frozen_or_closed_sentinel_is_passed_over_within_the_bounds() {
    let group = start(0, 2);
    group.sentinels()[0].pause().unwrap();
    let mut urls = vec![closed_url(0)];
    urls.extend(group.sentinel_urls());
    let started = Instant::now();
    let locker = Locker::builder()
        .connect_timeout(Duration::from_millis(300))
        .io_timeout(Duration::from_millis(300))
        .replica_timeout(Duration::from_millis(100))
        .build_sentinel(&urls, group.master_name());
    group.sentinels()[0].resume().unwrap();
    let locker = locker.unwrap();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    assert!(locker.try_lock(&["z:k"]).unwrap().is_some());

    // No sentinel at all, or none that knows the name: an error, within the bounds.
    let started = Instant::now();
    let err = match Locker::builder()
        .connect_timeout(Duration::from_millis(300))
        .build_sentinel(&[closed_url(1)], "redguard")
    {
        Err(err) => err,
        Ok(_) => panic!("no sentinel listens there"),
    };
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    let err = match Locker::builder().build_sentinel(&group.sentinel_urls(), "nobody") {
        Err(err) => err,
        Ok(_) => panic!("no master of that name"),
    };
    assert!(err.to_string().contains("unreachable") || matches!(err, Error::Redis(_)));
    assert!(started.elapsed() < Duration::from_secs(3));
}

#[test]
fn bad_sentinel_and_replica_settings_are_refused_before_any_round_trip() {
    let none: [&str; 0] = [];
    let sentinel = closed_url(2);
    let cases = [
        Locker::builder().build_sentinel(&none, "m"),
        Locker::builder().build_sentinel(&[sentinel.as_str()], ""),
        Locker::builder().build_sentinel(&["redis://127.0.0.1:3/2"], "m"),
        Locker::builder().build_sentinel(&[sentinel.as_str(), "rediss://127.0.0.1:4/"], "m"),
        Locker::builder()
            .replica_timeout(Duration::ZERO)
            .build_sentinel(&[sentinel.as_str()], "m"),
        Locker::builder()
            .io_timeout(Duration::from_millis(500))
            .replica_timeout(Duration::from_millis(500))
            .build(sentinel.as_str()),
    ];
    for result in cases {
        match result {
            Err(Error::InvalidInput(_)) => {}
            Err(other) => panic!("{other:?}"),
            Ok(_) => panic!("accepted"),
        }
    }

    // replicas(n) on Redlock, or more than any master has: before any round trip.
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let quorum = Locker::builder().build_redlock(&urls).unwrap();
    let err = quorum
        .lock_with(&["q"], LockOptions::default().replicas(1))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    for server in &servers {
        assert_eq!(server.query::<i64>(&["EXISTS", "q"]), 0);
    }
    let single = crate::locker(&servers[0]);
    let err = single
        .lock_with(&["q"], LockOptions::default().replicas(101))
        .unwrap_err();
    assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
    assert!(
        single.try_lock(&["q"]).unwrap().is_some(),
        "nothing was taken"
    );
}

/// A master, one replica and three sentinels, the replica replicating through a proxy
/// whose replication stream the test can stop; the sentinels reach every server directly.
pub(crate) fn replicating_through_a_proxy() -> (Replicated, Proxy) {
    let mut proxy = None;
    let group = Replicated::start_via(1, 3, |master| {
        let through = Proxy::start(master);
        let port = through.port();
        proxy = Some(through);
        port
    })
    .unwrap_or_else(|e| panic!("{e}"));
    (group, proxy.expect("the replication proxy"))
}

#[test]
fn the_failover_hole_without_replicas_and_how_replicas_closes_it() {
    let (group, proxy) = replicating_through_a_proxy();
    let locker = sentinel_locker(&group);
    // The master's writes stop reaching the replica (the link stays open).
    proxy.set(|f| f.down.blackhole = true);
    let unreplicated = locker
        .lock_with(&["hole:k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    assert_eq!(stored(&group, &group.servers()[1], "hole:k"), None);
    // With replicas(1) nothing is held that the replica does not have.
    let err = locker
        .lock_with(&["hole:w"], LockOptions::default().replicas(1))
        .unwrap_err();
    assert_none_replicated(&err);
    assert_eq!(stored(&group, &group.servers()[0], "hole:w"), None);

    // The master dies; Sentinel promotes the replica, which never saw the lock.
    let mut group = group;
    let old_port = group.servers()[0].port();
    group.servers_mut()[0].kill();
    let new = group
        .wait_for_new_master(old_port, Duration::from_secs(30))
        .unwrap();
    assert_eq!(new, 1);
    let other = sentinel_locker(&group);
    let started = Instant::now();
    let second = loop {
        match other.try_lock(&["hole:k"]) {
            Ok(Some(second)) => break second,
            Ok(None) => panic!("the promoted replica had the lock after all"),
            Err(e) => {
                assert!(started.elapsed() < Duration::from_secs(10), "{e}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    // The known hole: two owners, the first not yet told (its next refresh finds out).
    assert!(!unreplicated.is_lost());
    assert!(matches!(
        unreplicated.refresh(Duration::from_secs(30)),
        Err(Error::LockLost)
    ));
    drop(second);
}

#[test]
fn permits_and_read_locks_wait_for_replicas_too() {
    let group = start(1, 0);
    let locker = Locker::builder()
        .replica_timeout(Duration::from_secs(1))
        .build(group.url_of(&group.servers()[0]))
        .unwrap();
    let replicated = LockOptions::default().replicas(1);
    let payments = locker.semaphore("r:sem", 2).unwrap();
    let permit = payments.acquire_with(replicated.clone()).unwrap();
    let reading = locker.read_with(&["r:read"], replicated.clone()).unwrap();
    drop((permit, reading));
    let replica = &group.servers()[1];
    replica.pause().unwrap();
    let permit = payments.acquire_with(replicated.clone());
    let reading = locker.read_with(&["r:read"], replicated);
    replica.resume().unwrap();
    assert_none_replicated(&permit.unwrap_err());
    assert_none_replicated(&reading.unwrap_err());
    // Given up again: nothing left behind.
    assert_eq!(payments.available().unwrap(), 2);
    assert!(locker.holders("r:read").unwrap().is_empty());
}
