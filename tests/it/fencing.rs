//! Fencing tokens: strictly increasing per key, kept by a same-owner re-obtain.

use std::time::Duration;

use redguard::{Error, LockOptions};

use crate::locker;
use crate::server::RedisServer;

fn fenced() -> LockOptions {
    LockOptions::default().fencing(true)
}

#[test]
fn every_new_acquisition_gets_a_larger_token() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let other = crate::locker(&server);

    let mut last = 0;
    for round in 0..5 {
        let locker = if round % 2 == 0 { &locker } else { &other };
        let guard = locker.lock_with(&["k"], fenced()).unwrap();
        let fence = guard.fence().expect("fenced");
        assert!(fence > last, "round {round}: {fence} after {last}");
        assert_eq!(guard.fences(), [fence]);
        last = fence;
    }

    let plain = locker.lock(&["k"]).unwrap();
    assert_eq!(plain.fence(), None);
    assert!(plain.fences().is_empty());
}

#[test]
fn tokens_are_per_key_in_key_order() {
    let server = RedisServer::start();
    let locker = locker(&server);
    for _ in 0..3 {
        drop(locker.lock_with(&["b"], fenced()).unwrap());
    }
    let both = locker.lock_with(&["a", "b"], fenced()).unwrap();
    assert_eq!(both.fences(), [1, 4]);
    assert_eq!(both.fence(), Some(1));
}

#[test]
fn a_reobtain_by_the_same_owner_keeps_its_token() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let owner = || fenced().token("owner-a").auto_refresh(false);

    let first = locker.lock_with(&["k"], owner()).unwrap();
    let again = locker.lock_with(&["k"], owner().metadata("again")).unwrap();
    assert_eq!(again.fence(), first.fence());
    drop(first); // its value was replaced (other metadata): this releases nothing
    again.release().unwrap();

    let next = locker.lock_with(&["k"], fenced()).unwrap();
    assert!(next.fence() > Some(1));
}

#[test]
fn counters_outlive_their_locks_and_share_the_keys_hash_slot() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let guard = locker
        .lock_with(
            &["job:7", "{user42}:a"],
            fenced().ttl(Duration::from_secs(5)),
        )
        .unwrap();
    guard.release().unwrap();

    for counter in ["redguard:fence:{job:7}", "redguard:fence:t:{user42}:a"] {
        assert_eq!(server.query::<u64>(&["GET", counter]), 1, "{counter}");
        assert_eq!(
            server.query::<i64>(&["PTTL", counter]),
            -1,
            "{counter} expires"
        );
    }
    let slot = crate::cluster_server::RedisCluster::slot;
    assert_eq!(slot("job:7"), slot("redguard:fence:{job:7}"));
    assert_eq!(slot("{user42}:a"), slot("redguard:fence:t:{user42}:a"));
}

#[test]
fn counter_that_incr_would_refuse_is_reported_and_nothing_is_taken() {
    let server = RedisServer::start();
    let locker = locker(&server);
    for bad in [
        "not a number",
        "1.5",
        " 7",
        "0x10",
        "-3",
        "007",
        "00",
        "9223372036854775807",
    ] {
        // The bad counter is the second key's: the first one's must not move either.
        server.query::<()>(&["SET", "redguard:fence:{a}", "5"]);
        server.query::<()>(&["SET", "redguard:fence:{b}", bad]);
        match locker.lock_with(&["a", "b"], fenced()) {
            Err(Error::WrongType { key, kind }) => {
                assert_eq!(key, "redguard:fence:{b}", "{bad:?}");
                assert!(kind.contains("not a fencing counter"), "{kind}");
            }
            other => panic!("{bad:?}: expected WrongType, got {other:?}"),
        }
        assert_eq!(server.query::<u32>(&["EXISTS", "a", "b"]), 0, "{bad:?}");
        assert_eq!(server.query::<String>(&["GET", "redguard:fence:{a}"]), "5");
        assert_eq!(server.query::<String>(&["GET", "redguard:fence:{b}"]), bad);
    }
}

#[test]
fn lock_key_that_is_another_keys_counter_is_refused() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let result = locker.lock_with(&["k", "redguard:fence:{k}"], fenced());
    assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
    assert_eq!(server.query::<u32>(&["DBSIZE"]), 0, "nothing written");
}
