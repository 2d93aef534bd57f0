//! Elections: campaign, terms, observe, fenced writes.

use std::time::Duration;

use redguard::LockOptions;

use crate::locker;
use crate::server::RedisServer;

#[test]
fn smoke() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let election = locker.election("scheduler").unwrap();
    assert_eq!(election.leader().unwrap(), None);
    let mut observer = election.observe().unwrap();
    assert_eq!(
        observer
            .next_timeout(Duration::from_millis(100))
            .unwrap()
            .unwrap(),
        None
    );
    let mut term = election.campaign("a").unwrap();
    let seen = observer
        .next_timeout(Duration::from_secs(2))
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((seen.term(), seen.value()), (term.term(), "a"));
    assert!(election.try_campaign("b").unwrap().is_none());
    term.proclaim("a2").unwrap();
    let seen = observer
        .next_timeout(Duration::from_secs(2))
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!((seen.term(), seen.value()), (term.term(), "a2"));
    assert!(term.fenced_set("cursor", "1").unwrap());
    let first = term.term();
    let waiting = {
        let election = election.clone();
        std::thread::spawn(move || {
            election
                .campaign_with("b", LockOptions::default().timeout(Duration::from_secs(5)))
                .unwrap()
        })
    };
    std::thread::sleep(Duration::from_millis(200));
    term.resign().unwrap();
    let second = waiting.join().unwrap();
    assert!(second.term() > first);
    assert!(second.fenced_set("cursor", "2").unwrap());
    let seen = loop {
        let seen = observer
            .next_timeout(Duration::from_secs(2))
            .unwrap()
            .unwrap();
        if let Some(seen) = seen {
            break seen;
        }
    };
    assert_eq!((seen.term(), seen.value()), (second.term(), "b"));
    let leader = election.leader().unwrap().unwrap();
    assert_eq!(leader.value(), "b");
    drop(second);
    assert_eq!(
        observer
            .next_timeout(Duration::from_secs(2))
            .unwrap()
            .unwrap(),
        None
    );
    let _ = first;
}
