//! Generated bad (and good) input: never a panic, always `Ok` or a clear error, and the
//! server holds no keys but those of live guards.

use std::cell::RefCell;
use std::collections::HashSet;
use std::time::Duration;

use proptest::prelude::*;
use proptest::test_runner::{Config, TestCaseError, TestRunner};
use redguard::{Error, LockGuard, LockOptions, Locker, MAX_TTL, Retry};

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
    let plain = locker(&server);
    let prefixed = Locker::builder()
        .prefix("pre:")
        .build(server.url())
        .unwrap();
    // Live guards, with the prefix their keys carry in Redis.
    let live: RefCell<Vec<(&str, LockGuard)>> = RefCell::new(Vec::new());
    let mut runner = TestRunner::new(Config {
        cases: 96,
        failure_persistence: None,
        ..Config::default()
    });
    let input = (
        proptest::collection::vec(key(), 0..5),
        ttl(),
        any::<bool>(), // keep the guard
        any::<bool>(), // fencing
        any::<bool>(), // prefixed locker
    );

    runner
        .run(&input, |(keys, ttl, keep, fencing, with_prefix)| {
            let (locker, prefix) = if with_prefix {
                (&prefixed, "pre:")
            } else {
                (&plain, "")
            };
            let options = LockOptions::default()
                .ttl(ttl)
                .fencing(fencing)
                .retry(Retry::none())
                .auto_refresh(false);
            match locker.lock_with(&keys, options) {
                Ok(guard) => {
                    prop_assert!(valid(&keys, ttl), "accepted bad input");
                    prop_assert_eq!(guard.fences().len(), if fencing { keys.len() } else { 0 });
                    prop_assert!(guard.fences().iter().all(|&f| f >= 1));
                    if keep {
                        live.borrow_mut().push((prefix, guard));
                    }
                }
                Err(Error::InvalidInput(why)) => {
                    prop_assert!(!valid(&keys, ttl), "refused good input: {}", why);
                    prop_assert!(!why.is_empty());
                }
                // A key of a live guard (or a counter's, as a plain lock key).
                Err(Error::NotObtained) => prop_assert!(valid(&keys, ttl)),
                // With fencing, a generated key that names a counter: refused unwritten.
                Err(Error::WrongType { .. }) => prop_assert!(valid(&keys, ttl) && fencing),
                Err(other) => return Err(TestCaseError::fail(format!("{other:?}"))),
            }
            let held: HashSet<String> = live
                .borrow()
                .iter()
                .flat_map(|(prefix, g)| g.keys().iter().map(move |k| format!("{prefix}{k}")))
                .collect();
            let stored: Vec<String> = server.query(&["KEYS", "*"]);
            for key in stored {
                let counter =
                    key.starts_with("redguard:fence:") || key.starts_with("pre:redguard:fence:");
                prop_assert!(
                    held.contains(&key) || counter,
                    "stray key of {} bytes",
                    key.len()
                );
            }
            Ok(())
        })
        .unwrap();

    live.borrow_mut().clear(); // releases
    let left: Vec<String> = server.query(&["KEYS", "*"]);
    assert!(
        left.iter().all(|k| k.contains("redguard:fence:")),
        "{} keys left",
        left.len()
    );
}
