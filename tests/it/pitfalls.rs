//! Known pitfalls of the field, one test each (each has bitten a peer).

use std::time::Duration;

use redguard::{Error, LockOptions, Locker};

use crate::proxy::Proxy;
use crate::server::RedisServer;

/// node-redlock #296: a guard is never returned already expired. Replies come 300 ms
/// late and the TTL is 200 ms: every lock taken has expired by the time its reply comes,
/// so `lock` keeps trying (a refresh finds each gone) and ends in `NotObtained`, never
/// with a guard whose `is_lost` is `true` from the start.
#[test]
fn a_guard_is_never_returned_already_expired_after_slow_replies() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = Locker::builder()
        .io_timeout(Duration::from_secs(2))
        .build(proxy.url())
        .unwrap();
    proxy.set(|f| f.down.latency = Duration::from_millis(300));
    let options = LockOptions::default()
        .ttl(Duration::from_millis(200))
        .timeout(Duration::from_secs(2));
    match locker.lock_with(&["slow"], options) {
        Ok(guard) => assert!(!guard.is_lost(), "a guard lost from the start"),
        Err(e) => assert!(matches!(e, Error::NotObtained), "{e:?}"),
    }
}
