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

/// etcd #22082: a release sent again after its reply was lost never deletes a newer
/// holder's lock, even one with the same fixed token (its metadata differs, so its value
/// does). The release runs, its reply is lost; a newer holder takes the key; then the
/// connection is cut and the release goes out again.
#[test]
fn a_release_sent_again_never_deletes_a_newer_holders_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let behind = Locker::builder()
        .pool_size(2)
        .io_timeout(Duration::from_secs(5))
        .build(proxy.url())
        .unwrap();
    let direct = crate::locker(&server);
    let owner = |metadata: &str| LockOptions::default().token("worker-1").metadata(metadata);
    behind.lock(&["warm"]).unwrap().release().unwrap();
    let old = behind.lock_with(&["k"], owner("old")).unwrap();
    proxy.drop_replies_after(0);
    let releasing = std::thread::spawn(move || old.release());
    crate::eventually(Duration::from_secs(5), "the release ran", || {
        server.query::<Option<String>>(&["GET", "k"]).is_none()
    });
    let newer = direct.lock_with(&["k"], owner("newer")).unwrap();
    let stored: String = server.query(&["GET", "k"]);
    proxy.heal();
    proxy.cut(Cut::Reset);
    let released = releasing.join().unwrap();
    assert!(
        matches!(released, Ok(()) | Err(Error::LockLost)),
        "{released:?}"
    );
    assert_eq!(
        server.query::<Option<String>>(&["GET", "k"]),
        Some(stored),
        "the newer holder's lock is intact"
    );
    assert!(!newer.is_lost());
    newer.release().unwrap();
}

/// Redisson #7272: a hold whose release raced its first scheduled refresh is never
/// refreshed again. Each round releases a lock at about the moment its refresh is due,
/// then the same fixed token and metadata take the key without auto-refresh and a short
/// TTL: were the old hold still refreshed, it would keep that key alive for ever.
#[test]
fn the_refresher_lets_go_of_a_hold_whose_release_raced_its_refresh() {
    let server = RedisServer::start();
    let locker = crate::locker(&server);
    let same = || LockOptions::default().token("worker-1").metadata("m");
    for round in 0..12u64 {
        let old = locker
            .lock_with(&["k"], same().ttl(Duration::from_millis(60)))
            .unwrap();
        // Its first refresh is due at about 20 ms: release around then.
        std::thread::sleep(Duration::from_millis(16 + round % 8));
        old.release().unwrap();
        let short = same().ttl(Duration::from_millis(150)).auto_refresh(false);
        let again = locker.lock_with(&["k"], short).unwrap();
        crate::eventually(
            Duration::from_secs(2),
            "the key expires with its TTL",
            || server.query::<Option<String>>(&["GET", "k"]).is_none(),
        );
        assert!(again.is_lost());
    }
}

/// Ours, found by the randomized run: a word of a hand-over names the wait, not its queue
/// entry, so one that comes late for an entry since replaced (found gone, the waiter
/// queued again) must not be taken for a fresh hold. The test takes the waiter's entry
/// out behind its back (its next renewal finds it gone, and it queues again), then, once
/// a hold counted from the old entry would be over and right after the new entry's
/// renewal, sends the word such a late hand-over would have sent: the waiter must not
/// come back with a guard while the holder still holds.
#[test]
fn a_late_word_for_a_replaced_queue_entry_is_not_a_hold() {
    let server = RedisServer::start();
    let holder = crate::locker(&server);
    let held = holder.lock(&["late"]).unwrap();
    let waiter = crate::locker(&server);
    let (got, result) = std::sync::mpsc::channel();
    let thread = std::thread::spawn(move || {
        let options = LockOptions::default()
            .ttl(Duration::from_millis(300))
            .timeout(Duration::from_secs(10));
        let guard = waiter.lock_with(&["late"], options);
        got.send(guard.map(|g| g.is_lost())).unwrap();
    });
    let queue = crate::server::queue_of("late");
    let entry = || server.query::<Vec<String>>(&["ZRANGE", &queue, "0", "-1"]);
    crate::eventually(Duration::from_secs(5), "the waiter is queued", || {
        entry().len() == 1
    });
    let member = entry().remove(0);
    // '<kind><n>,<ttl>,<fencing>,<wait>,<channel length>,<value length>:<channel>...'
    let (head, rest) = member.split_once(':').unwrap();
    let fields: Vec<&str> = head.split(',').collect();
    let (wait, channel_len): (&str, usize) = (fields[3], fields[4].parse().unwrap());
    let channel = &rest[..channel_len];
    let ticket: f64 = server.query(&["ZSCORE", &queue, &member]);
    server.query::<u32>(&["ZREM", &queue, &member]);
    server.query::<u32>(&["ZREM", "redguard:alive:{late}", &member]);
    crate::eventually(Duration::from_secs(5), "the waiter queued again", || {
        server
            .query::<Option<f64>>(&["ZSCORE", &queue, &member])
            .is_some_and(|again| again != ticket)
    });
    // A real late word's hold was counted from the replaced entry: over 300 ms (its TTL)
    // after the requeue, such a hold is surely over. Then, right after the new entry's
    // renewal (which a hold counted from the new entry would trust), the word.
    std::thread::sleep(Duration::from_millis(400));
    let renewed = || server.query::<Option<f64>>(&["ZSCORE", "redguard:alive:{late}", &member]);
    let before = renewed();
    crate::eventually(Duration::from_secs(5), "the new entry renewed", || {
        renewed() != before
    });
    server.query::<u32>(&["PUBLISH", channel, &format!("h:{wait}")]);
    match result.recv_timeout(Duration::from_secs(1)) {
        Err(_) => {} // still waiting: right
        Ok(returned) => panic!("returned while the holder holds: {returned:?}"),
    }
    drop(held);
    let returned = result.recv_timeout(Duration::from_secs(5)).unwrap();
    assert!(!returned.unwrap(), "the real hand-over, held");
    thread.join().unwrap();
}
