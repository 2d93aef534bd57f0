//! Bad input gets a clear error and loses nothing.

use std::time::Duration;

use redguard::{Error, LockOptions, MAX_KEYS, MAX_TTL};

use crate::locker;
use crate::server::RedisServer;

#[test]
fn bad_input_is_rejected_before_any_round_trip() {
    let server = RedisServer::start();
    let locker = locker(&server);
    drop(locker.lock(&["warm-up"]).unwrap());
    let calls = server.evalsha_calls();

    let ttl = |ttl| LockOptions::default().ttl(ttl);
    let too_many: Vec<String> = (0..=MAX_KEYS).map(|i| i.to_string()).collect();
    let cases: Vec<(&str, redguard::Result<redguard::LockGuard>)> = vec![
        ("no keys", locker.lock::<&str>(&[])),
        ("an empty key", locker.lock(&["a", ""])),
        ("a duplicate key", locker.lock(&["a", "b", "a"])),
        ("too many keys", locker.lock(&too_many)),
        ("a zero ttl", locker.lock_with(&["a"], ttl(Duration::ZERO))),
        (
            "a sub-ms ttl",
            locker.lock_with(&["a"], ttl(Duration::from_micros(999))),
        ),
        ("a huge ttl", locker.lock_with(&["a"], ttl(Duration::MAX))),
        (
            "an empty token",
            locker.lock_with(&["a"], LockOptions::default().token("")),
        ),
    ];
    for (what, result) in cases {
        match result {
            Err(Error::InvalidInput(why)) => assert!(!why.is_empty(), "{what}"),
            other => panic!("{what}: expected InvalidInput, got {other:?}"),
        }
    }
    assert!(matches!(
        locker.try_lock::<&str>(&[]),
        Err(Error::InvalidInput(_))
    ));
    assert_eq!(server.evalsha_calls(), calls, "nothing was sent");
    assert_eq!(server.query::<u32>(&["DBSIZE"]), 0, "nothing was written");
}

#[test]
fn key_holding_another_type_is_reported_and_left_untouched() {
    let server = RedisServer::start();
    let locker = locker(&server);
    server.query::<()>(&["RPUSH", "queue", "x", "y"]);
    server.query::<()>(&["HSET", "user", "name", "ada"]);

    // `lock` would wait forever if this were mistaken for "held elsewhere".
    match locker.lock(&["free", "queue"]) {
        Err(Error::WrongType { key, kind }) => {
            assert_eq!((key.as_str(), kind.as_str()), ("queue", "list"))
        }
        other => panic!("expected WrongType, got {other:?}"),
    }
    match locker.try_lock(&["user"]) {
        Err(Error::WrongType { kind, .. }) => assert_eq!(kind, "hash"),
        other => panic!("expected WrongType, got {other:?}"),
    }
    let list: Vec<String> = server.query(&["LRANGE", "queue", "0", "-1"]);
    assert_eq!(list, ["x", "y"]);
    assert_eq!(server.query::<i64>(&["PTTL", "queue"]), -1);
    assert_eq!(server.query::<String>(&["HGET", "user", "name"]), "ada");
    assert_eq!(
        server.query::<u32>(&["EXISTS", "free"]),
        0,
        "all or nothing"
    );
}

#[test]
fn unicode_keys_and_metadata_round_trip() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let keys = ["ключ", "🔒/λ", "键 with spaces", "\u{0}nul"];

    let guard = locker
        .lock_with(&keys, LockOptions::default().metadata("日本語 ✓"))
        .unwrap();
    assert_eq!(guard.keys(), keys);
    assert_eq!(guard.metadata(), "日本語 ✓");
    let stored: String = server.query(&["GET", "🔒/λ"]);
    assert_eq!(stored, format!("{}日本語 ✓", guard.token()));
    assert!(locker.try_lock(&["ключ"]).unwrap().is_none());
    guard.release().unwrap();
    assert_eq!(server.query::<u32>(&["DBSIZE"]), 0);
}

#[test]
fn longest_ttl_is_accepted_by_redis_and_kept_exactly() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let longest = || LockOptions::default().ttl(MAX_TTL).auto_refresh(false);
    let guard = locker.lock_with(&["k"], longest()).unwrap();
    let read = locker.read_with(&["r"], longest()).unwrap();
    let permit = locker
        .semaphore("s", 2)
        .unwrap()
        .acquire_with(longest())
        .unwrap();
    let ms = MAX_TTL.as_millis() as i64;
    let pttl = server.query::<i64>(&["PTTL", "k"]);
    assert!(pttl <= ms && pttl > ms - 10_000, "{pttl}");
    for ttl in [guard.ttl(), read.ttl(), permit.ttl()] {
        let ttl = ttl.unwrap().unwrap();
        // Never more than was set (Lua numbers would round above 2^53).
        assert!(
            ttl <= MAX_TTL && ttl > MAX_TTL - Duration::from_secs(10),
            "{ttl:?}"
        );
    }
    assert!(!guard.is_lost() && !read.is_lost() && !permit.is_lost());
    guard.release().unwrap();
    read.release().unwrap();
    permit.release().unwrap();
}

#[test]
fn most_keys_in_one_lock_work() {
    let server = RedisServer::start();
    let keys: Vec<String> = (0..MAX_KEYS).map(|i| format!("k{i}")).collect();
    let guard = locker(&server).lock(&keys).unwrap();
    assert_eq!(server.query::<usize>(&["DBSIZE"]), MAX_KEYS);
    guard.release().unwrap();
    assert_eq!(server.query::<usize>(&["DBSIZE"]), 0);
}
