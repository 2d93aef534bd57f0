//! Generated bad (and good) input: never a panic, always `Ok` or a clear error, and the
//! server holds no keys but those of live guards.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redguard::{Error, LockGuard, LockOptions, MAX_TTL, Retry};

use crate::locker;
use crate::server::RedisServer;

/// Keys of every kind: unicode, control characters, long (up to 64 KiB), empty, and from
/// a small alphabet so that duplicates are common.
fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        "\\PC{0,12}",
        "[\\x00-\\x1f\\u{80}-\\u{ff}]{1,8}",
        "[ab]{0,2}",
        (1usize..=65_536).prop_map(|n| "k".repeat(n)),
        Just(String::new()),
    ]
}

fn ttl() -> impl Strategy<Value = Duration> {
    prop_oneof![
        Just(Duration::ZERO),
        Just(Duration::from_micros(999)),
        Just(Duration::from_millis(1)),
        Just(MAX_TTL),
        Just(MAX_TTL + Duration::from_millis(1)),
        Just(Duration::MAX),
        (2u64..60_000).prop_map(Duration::from_millis),
    ]
}

/// What the library must say of this input before any round trip.
fn valid(keys: &[String], ttl: Duration) -> bool {
    let unique: HashSet<_> = keys.iter().collect();
    !keys.is_empty()
        && keys.iter().all(|k| !k.is_empty())
        && unique.len() == keys.len()
        && ttl >= Duration::from_millis(1)
        && ttl <= MAX_TTL
}

#[test]
fn generated_input_never_panics_and_leaves_no_stray_keys() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let live: RefCell<Vec<LockGuard>> = RefCell::new(Vec::new());
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let input = (proptest::collection::vec(key(), 0..5), ttl(), any::<bool>());

    runner
        .run(&input, |(keys, ttl, keep)| {
            let options = LockOptions::default()
                .ttl(ttl)
                .retry(Retry::none())
                .auto_refresh(false);
            match locker.lock_with(&keys, options) {
                Ok(guard) => {
                    prop_assert!(valid(&keys, ttl), "accepted bad input");
                    if keep {
                        live.borrow_mut().push(guard);
                    }
                }
                Err(Error::InvalidInput(why)) => {
                    prop_assert!(!valid(&keys, ttl), "refused good input: {why}");
                    prop_assert!(!why.is_empty());
                }
                // A key of a live guard, or a same-named one from an earlier case.
                Err(Error::NotObtained) => prop_assert!(valid(&keys, ttl)),
                Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
            let held: HashSet<String> = live
                .borrow()
                .iter()
                .flat_map(|g| g.keys().to_vec())
                .collect();
            let stored: Vec<String> = server.query(&["KEYS", "*"]);
            for key in stored {
                prop_assert!(held.contains(&key), "stray key of {} bytes", key.len());
            }
            Ok(())
        })
        .unwrap();

    live.borrow_mut().clear(); // releases
    assert_eq!(server.query::<u32>(&["DBSIZE"]), 0);
}
