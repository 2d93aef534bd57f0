//! Known pitfalls of the field, one test each (each has bitten a peer).

use std::time::Duration;

use redguard::{Error, LockOptions, Locker};

use crate::proxy::{Cut, Proxy};
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

/// node-redlock #369: an acquire sent again after its reply was lost finds its own keys
/// and succeeds (not "held elsewhere" by itself). The acquire reaches the server, its
/// reply does not; the connection is cut, and the request goes out again on another.
#[test]
fn an_acquire_sent_again_after_a_lost_reply_finds_its_own_keys() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = Locker::builder()
        .pool_size(2)
        .io_timeout(Duration::from_secs(5))
        .build(proxy.url())
        .unwrap();
    // The script loaded (else the first call is EVALSHA, whose NOSCRIPT would be lost).
    locker.lock(&["warm"]).unwrap().release().unwrap();
    proxy.drop_replies_after(0);
    let taking = {
        let locker = locker.clone();
        std::thread::spawn(move || {
            let options = LockOptions::default().timeout(Duration::from_secs(3));
            locker.lock_with(&["k"], options)
        })
    };
    crate::eventually(Duration::from_secs(5), "the acquire ran", || {
        server.query::<Option<String>>(&["GET", "k"]).is_some()
    });
    let first: String = server.query(&["GET", "k"]);
    proxy.heal();
    proxy.cut(Cut::Reset);
    let guard = taking
        .join()
        .unwrap()
        .expect("its own keys, taken by the lost reply's request");
    assert_eq!(first, guard.token(), "the same lock, not a second one");
    assert!(!guard.is_lost());
    guard.release().unwrap();
    assert_eq!(server.query::<Option<String>>(&["GET", "k"]), None);
}
