//! Elections: what is refused (bad input, keys of another type, Redlock), what a campaign
//! that gives up leaves behind (nothing), where the keys are under a prefix, and fenced
//! writes of terms and of locks.

use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::election::{TO_QUEUE, counter_key, lock_key, proclaimed_key, seen};
use crate::order::in_line;
use crate::server::RedisServer;
use crate::{eventually, locker};

/// `result` is `Error::WrongType` naming `key` and `kind`.
fn assert_wrong_type<T: std::fmt::Debug>(result: redguard::Result<T>, key: &str, kind: &str) {
    match result {
        Err(Error::WrongType { key: k, kind: t }) => {
            assert_eq!((k.as_str(), t.as_str()), (key, kind));
        }
        other => panic!("expected WrongType for {key}, got {other:?}"),
    }
}

/// `result` is `Error::InvalidInput`.
fn assert_invalid<T: std::fmt::Debug>(result: redguard::Result<T>) {
    assert!(
        matches!(result, Err(Error::InvalidInput(_))),
        "expected InvalidInput, got {result:?}"
    );
}

/// A campaign that runs out of time (or of retries) is `NotObtained` and takes its place
/// out of the queue: the server keeps only the leader's lock, the term counter and the
/// proclaimed value, and after the resignation only the last two.
#[test]
fn a_timed_out_campaign_is_not_obtained_and_leaves_nothing_behind() {
    let server = RedisServer::start();
    let election = locker(&server).election("e").unwrap();
    let mut leader = election.campaign("leader").unwrap();
    leader.proclaim("leader, proclaimed").unwrap();
    let mut held = vec![lock_key("e"), counter_key("e"), proclaimed_key("e")];
    held.sort();
    assert_eq!(server.all_keys(), held);

    let other = locker(&server).election("e").unwrap();
    let timeout = Duration::from_secs(1);
    let late = {
        let other = other.clone();
        thread::spawn(move || {
            let started = Instant::now();
            let result = other.campaign_with("late", LockOptions::default().timeout(timeout));
            (result, started.elapsed())
        })
    };
    eventually(TO_QUEUE, "the late candidate is queued", || {
        server.queued(&lock_key("e")) == 1
    });
    assert!(server.all_keys().len() > held.len(), "its place is kept");
    let (result, took) = late.join().unwrap();
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    assert!(took >= timeout && took < timeout * 3, "{took:?}");
    assert_eq!(server.all_keys(), held, "its place went with it");
    let limited = Retry::linear(Duration::from_millis(50)).limit(3);
    let result = other.campaign_with("limited", LockOptions::default().retry(limited));
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    assert!(other.try_campaign("eager").unwrap().is_none());
    assert_eq!(server.all_keys(), held, "no place left");
    assert_eq!(
        seen(other.leader().unwrap()),
        Some((leader.term(), "leader, proclaimed".into()))
    );

    leader.resign().unwrap();
    let mut left = vec![counter_key("e"), proclaimed_key("e")];
    left.sort();
    assert_eq!(server.all_keys(), left);
}

/// An empty name, a fixed owner token (a term must be new) and metadata (the value takes
/// its place) are refused before any round trip: the server has no key.
#[test]
fn campaigns_that_would_break_a_term_are_invalid_input_and_take_nothing() {
    let server = RedisServer::start();
    let locker = locker(&server);
    assert_invalid(locker.election(""));
    let election = locker.election("e").unwrap();
    assert_invalid(election.campaign_with("v", LockOptions::default().token("owner-a")));
    assert_invalid(election.campaign_with("v", LockOptions::default().metadata("m")));
    assert_eq!(server.all_keys(), Vec::<String>::new());
    assert!(
        election.try_campaign("v").unwrap().is_some(),
        "nothing was held"
    );
}

/// A term must come from one counter: a locker over three independent servers refuses
/// elections, and writes nothing anywhere.
#[test]
fn elections_are_refused_on_redlock() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let quorum = Locker::builder().build_redlock(&urls).unwrap();
    assert_invalid(quorum.election("e"));
    for server in &servers {
        assert_eq!(server.all_keys(), Vec::<String>::new());
    }
}

/// A leader's fenced write to a key of another type, or beside a record that is not a
/// term, is `WrongType` and changes nothing; an empty key is `InvalidInput`.
#[test]
fn a_fenced_write_to_a_key_of_another_type_is_wrong_type_and_leaves_it() {
    let server = RedisServer::start();
    let term = locker(&server)
        .election("e")
        .unwrap()
        .campaign("a")
        .unwrap();
    server.query::<u32>(&["RPUSH", "cursor", "x", "y"]);
    assert_wrong_type(term.fenced_set("cursor", "1"), "cursor", "list");
    let list: Vec<String> = server.query(&["LRANGE", "cursor", "0", "-1"]);
    assert_eq!(list, ["x", "y"]);
    assert_eq!(
        server.query::<u32>(&["EXISTS", "redguard:fenced:{cursor}"]),
        0
    );

    server.query::<()>(&["SET", "redguard:fenced:{out}", "soon"]);
    assert_wrong_type(
        term.fenced_set("out", "1"),
        "redguard:fenced:{out}",
        "string that is not a fencing token",
    );
    assert_eq!(server.query::<u32>(&["EXISTS", "out"]), 0);
    assert_eq!(
        server.query::<String>(&["GET", "redguard:fenced:{out}"]),
        "soon"
    );
    assert_invalid(term.fenced_set("", "1"));
    assert!(!term.is_lost(), "the term is not lost by a refused write");
}

/// An election's own keys holding another type: `leader` and campaigns say which key and
/// what type (at once, without waiting), `proclaim` too, and none of them is changed.
#[test]
fn an_elections_keys_of_another_type_are_wrong_type_and_left_alone() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let at_most = LockOptions::default().timeout(Duration::from_secs(1));

    let counted = locker.election("counted").unwrap();
    server.query::<u32>(&["RPUSH", &counter_key("counted"), "x"]);
    assert_wrong_type(counted.leader(), &counter_key("counted"), "list");
    assert_wrong_type(
        counted.campaign_with("v", at_most.clone()),
        &counter_key("counted"),
        "list, not a fencing counter",
    );

    let locked = locker.election("locked").unwrap();
    server.query::<u32>(&["HSET", &lock_key("locked"), "f", "v"]);
    assert_wrong_type(locked.leader(), &lock_key("locked"), "hash");
    let started = Instant::now();
    assert_wrong_type(
        locked.campaign_with("v", at_most),
        &lock_key("locked"),
        "hash",
    );
    assert!(started.elapsed() < Duration::from_millis(500), "no waiting");

    let proclaimed = locker.election("proclaimed").unwrap();
    server.query::<()>(&["SET", &proclaimed_key("proclaimed"), "x"]);
    let mut term = proclaimed.campaign("v").unwrap();
    assert_wrong_type(term.proclaim("w"), &proclaimed_key("proclaimed"), "string");
    assert_eq!(term.value(), "v");
    assert!(!term.is_lost());
    assert_eq!(
        seen(proclaimed.leader().unwrap()),
        Some((term.term(), "v".into()))
    );

    assert_eq!(
        server.query::<String>(&["TYPE", &counter_key("counted")]),
        "list"
    );
    assert_eq!(
        server.query::<String>(&["TYPE", &lock_key("locked")]),
        "hash"
    );
    assert_eq!(
        server.query::<String>(&["GET", &proclaimed_key("proclaimed")]),
        "x"
    );
    for name in ["counted", "locked"] {
        assert!(server.queue_entries(&lock_key(name)).is_empty(), "{name}");
    }
}

/// A lock taken without fencing has no token to write with: `InvalidInput`, nothing
/// written.
#[test]
fn a_lock_guards_fenced_set_needs_fencing() {
    let server = RedisServer::start();
    let guard = locker(&server).lock(&["k"]).unwrap();
    assert_invalid(guard.fenced_set("out", "1"));
    assert_eq!(server.all_keys(), ["k"]);
    let fenced = locker(&server)
        .lock_with(&["j"], LockOptions::default().fencing(true))
        .unwrap();
    assert_invalid(fenced.fenced_set("", "1"));
}

/// Once a later holder of a lock (a larger fencing token) wrote a key, the earlier
/// holder's fenced write to it returns `false` and changes nothing; a key the later
/// holder never wrote is still the earlier one's to write (tokens, not leases, decide).
#[test]
fn a_later_lock_holders_fenced_write_refuses_the_earlier_holders() {
    let server = RedisServer::start();
    let fenced = LockOptions::default().fencing(true);
    let early = locker(&server)
        .lock_with(
            &["k"],
            fenced
                .clone()
                .ttl(Duration::from_millis(300))
                .auto_refresh(false),
        )
        .unwrap();
    assert!(early.fenced_set("out", "early").unwrap());
    assert!(
        early.fenced_set("out", "early again").unwrap(),
        "same token"
    );

    let late = locker(&server)
        .lock_with(&["k"], fenced.timeout(Duration::from_secs(5)))
        .unwrap();
    assert!(late.fence() > early.fence());
    assert!(late.fenced_set("out", "late").unwrap());
    assert!(!early.fenced_set("out", "stale").unwrap());
    assert_eq!(server.query::<String>(&["GET", "out"]), "late");
    assert_eq!(
        server.query::<u64>(&["GET", "redguard:fenced:{out}"]),
        late.fence().unwrap()
    );
    assert!(early.fenced_set("other", "early").unwrap());
    assert_eq!(server.query::<String>(&["GET", "other"]), "early");

    // A fenced write keeps the key's TTL.
    server.query::<()>(&["PEXPIRE", "out", "100000"]);
    assert!(late.fenced_set("out", "later").unwrap());
    assert!(
        server.query::<i64>(&["PTTL", "out"]) > 90_000,
        "the TTL was kept"
    );
}

/// An observer whose reads fail yields each error, but reads again only a second after
/// it: a loop that logs errors and carries on does not hammer a server that is down.
#[test]
fn an_observer_that_cannot_read_does_not_spin() {
    let mut server = RedisServer::start();
    let locker = crate::tight().build(server.url()).unwrap();
    let mut observer = locker.election("e").unwrap().observe().unwrap();
    assert_eq!(observer.next().unwrap().unwrap(), None);
    server.kill();
    let started = Instant::now();
    let mut errors = 0;
    while started.elapsed() < Duration::from_millis(2500) {
        match observer.next_timeout(Duration::from_millis(100)) {
            Some(Err(_)) => errors += 1,
            None => {}
            Some(Ok(change)) => panic!("a change from a dead server: {change:?}"),
        }
    }
    assert!((1..=4).contains(&errors), "{errors} errors in 2.5 s");
}

/// Under a locker's prefix every key of the election (and of its fenced writes) is the
/// prefix's, and `leader` reads the same term the campaign was given.
#[test]
fn an_election_under_a_prefix_keeps_its_keys_there_and_reads_its_own_term() {
    let server = RedisServer::start();
    let prefixed = || {
        Locker::builder()
            .prefix("app:")
            .build(server.url())
            .unwrap()
    };
    let election = prefixed().election("e").unwrap();
    let mut a = election.campaign("a").unwrap();
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((a.term(), "a".into()))
    );
    a.proclaim("a2").unwrap();
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((a.term(), "a2".into()))
    );
    assert!(a.fenced_set("cursor", "a").unwrap());
    assert_eq!(server.query::<String>(&["GET", "app:cursor"]), "a");

    let other = prefixed().election("e").unwrap();
    let waiting = thread::spawn(move || other.campaign_with("b", in_line()));
    eventually(TO_QUEUE, "b is queued", || {
        server.all_keys().iter().any(|key| key.contains("queue"))
    });
    let keys = server.all_keys();
    assert!(keys.iter().all(|key| key.starts_with("app:")), "{keys:?}");
    let first = a.term();
    a.resign().unwrap();
    let b = waiting.join().unwrap().unwrap();
    assert!(b.term() > first);
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((b.term(), "b".into()))
    );
    assert!(b.fenced_set("cursor", "b").unwrap());
    let keys = server.all_keys();
    assert!(keys.iter().all(|key| key.starts_with("app:")), "{keys:?}");
}

/// A campaign with a lease of a millisecond or two ends (a term, or `LockLost` when every
/// term it got ran out before it could be used), and never waits for ever.
#[test]
fn a_campaign_with_a_tiny_ttl_ends() {
    let server = RedisServer::start();
    let election = locker(&server).election("e").unwrap();
    let (sender, receiver) = std::sync::mpsc::channel();
    thread::spawn(move || {
        for ms in [1, 2, 3] {
            let options = LockOptions::default().ttl(Duration::from_millis(ms));
            let ended = match election.campaign_with("v", options) {
                Ok(term) => term.term() > 0,
                Err(e) => matches!(e, Error::LockLost),
            };
            sender.send(ended).unwrap();
        }
    });
    for _ in 0..3 {
        let ended = receiver.recv_timeout(Duration::from_secs(10));
        assert_eq!(ended, Ok(true), "a term or LockLost, within 10 s");
    }
}
