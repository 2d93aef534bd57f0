//! Who holds what: `Locker::holders` for free, locked, read-locked and semaphore keys.

use std::time::Duration;

use redguard::{Error, LockOptions, Locker};

use crate::locker;
use crate::server::RedisServer;

#[test]
fn holders_of_free_locked_read_and_semaphore_keys() {
    let server = RedisServer::start();
    let locker = Locker::builder()
        .prefix("app:")
        .build(server.url())
        .unwrap();
    assert!(locker.holders("k").unwrap().is_empty(), "free");

    let options = LockOptions::default()
        .ttl(Duration::from_secs(10))
        .metadata("host-1:42")
        .fencing(true);
    let guard = locker.lock_with(&["k"], options).unwrap();
    let holders = locker.holders("k").unwrap();
    assert_eq!(holders.len(), 1);
    let holder = &holders[0];
    assert_eq!(holder.metadata(), "host-1:42");
    assert!(!holder.shared());
    assert_eq!(holder.fence(), guard.fence());
    let ttl = holder.ttl().unwrap();
    assert!(
        ttl > Duration::from_secs(9) && ttl <= Duration::from_secs(10),
        "{ttl:?}"
    );
    assert!(!format!("{holders:?}").contains(guard.token()), "no token");
    drop(guard);

    let first = locker
        .read_with(&["k"], LockOptions::default().metadata("r1"))
        .unwrap();
    let second = locker
        .read_with(&["k"], LockOptions::default().metadata("r2"))
        .unwrap();
    let holders = locker.holders("k").unwrap();
    let mut metadata: Vec<&str> = holders.iter().map(|h| h.metadata()).collect();
    metadata.sort_unstable();
    assert_eq!(metadata, ["r1", "r2"]);
    assert!(holders.iter().all(|h| h.shared() && h.ttl().is_some()));
    assert!(
        holders.iter().all(|h| h.fence() == Some(1)),
        "the last lock's token"
    );
    let shown = format!("{holders:?}");
    assert!(!shown.contains(first.token()) && !shown.contains(second.token()));
    drop((first, second));

    let sem = locker.semaphore("jobs", 3).unwrap();
    let _permits: Vec<_> = (0..2).map(|_| sem.acquire().unwrap()).collect();
    let holders = locker.holders("jobs").unwrap();
    assert_eq!(holders.len(), 2);
    assert!(holders.iter().all(|h| h.shared()));
    // The same holders as the semaphore lists (a moment later: the TTLs may differ by ms).
    let listed = sem.holders().unwrap();
    assert_eq!(listed.len(), holders.len());
    for (a, b) in holders.iter().zip(&listed) {
        assert_eq!(
            (a.metadata(), a.shared(), a.fence()),
            (b.metadata(), b.shared(), b.fence())
        );
        let (a, b) = (a.ttl().unwrap(), b.ttl().unwrap());
        assert!(
            a.abs_diff(b) < Duration::from_millis(500),
            "{a:?} and {b:?}"
        );
    }
}

#[test]
fn a_lock_waiting_behind_readers_is_listed_as_waiting_not_holding() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _reader = locker
        .read_with(&["k"], LockOptions::default().metadata("reader"))
        .unwrap();
    let waiting = {
        let locker = locker.clone();
        std::thread::spawn(move || {
            let options = LockOptions::default().timeout(Duration::from_millis(800));
            locker.lock_with(&["k"], options).map(drop)
        })
    };
    crate::eventually(Duration::from_secs(3), "the lock is queued", || {
        server.queued("k") == 1
    });
    // The waiting lock holds nothing: it is listed after the reader, as waiting.
    let holders = locker.holders("k").unwrap();
    assert_eq!(holders.len(), 2, "{holders:?}");
    assert_eq!(
        (
            holders[0].metadata(),
            holders[0].shared(),
            holders[0].waiting()
        ),
        ("reader", true, false)
    );
    assert!(holders[1].waiting() && !holders[1].shared(), "{holders:?}");
    assert!(waiting.join().unwrap().is_err());
}

#[test]
fn holders_of_a_key_of_another_type_is_wrong_type() {
    let server = RedisServer::start();
    let locker = locker(&server);
    server.query::<u32>(&["RPUSH", "list", "x"]);
    server.query::<u32>(&["ZADD", "board", "1", "alice"]);
    for (key, kind) in [("list", "list"), ("board", "zset, not a lock")] {
        match locker.holders(key) {
            Err(Error::WrongType {
                key: named,
                kind: found,
            }) => {
                assert_eq!((named.as_str(), found.as_str()), (key, kind));
            }
            other => panic!("{key}: {other:?}"),
        }
    }
    assert!(matches!(locker.holders(""), Err(Error::InvalidInput(_))));
}

#[test]
fn holders_on_a_quorum_are_those_a_majority_agree_on() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let redlock = Locker::builder().build_redlock(&urls).unwrap();
    let guard = redlock
        .lock_with(&["k"], LockOptions::default().metadata("m"))
        .unwrap();
    let holders = redlock.holders("k").unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!((holders[0].metadata(), holders[0].fence()), ("m", None));
    // Gone from two of three nodes: no longer held, as a majority sees it.
    for server in &servers[..2] {
        server.query::<u32>(&["DEL", "k"]);
    }
    assert!(redlock.holders("k").unwrap().is_empty());
    drop(guard);
}
