//! A Redis user allowed only the locker's key prefix and the commands the library needs.

use std::thread;
use std::time::Duration;

use redguard::{LockOptions, Locker};

use crate::eventually;
use crate::server::RedisServer;

/// The minimal ACL rules, as the security chapter of the guide gives them.
const RULES: &str = "resetkeys ~locks:* resetchannels &locks:* -@all \
    +set +evalsha +eval +publish +subscribe +unsubscribe +ping +echo \
    +msetnx +mset +psetex +pexpire +pexpireat +pttl +getrange +type +get +mget +del +incr +exists \
    +time +zadd +zrem +zrange +zrangebyscore +zremrangebyscore +zscore +zrank +zcard +zcount +hset +hmget";

#[test]
fn user_limited_to_the_prefix_and_the_needed_commands_can_do_everything() {
    let server = RedisServer::start();
    let mut rules = vec!["ACL", "SETUSER", "locker", "on", ">secret"];
    rules.extend(RULES.split(' ').filter(|r| !r.is_empty()));
    server.query::<()>(&rules);
    let url = server.url().replace("redis://", "redis://locker:secret@");

    // The user really is limited.
    let mut con = redis::Client::open(url.as_str())
        .unwrap()
        .get_connection()
        .unwrap();
    let outside: redis::RedisResult<()> = redis::cmd("SET").arg("other").arg("1").query(&mut con);
    assert!(outside.is_err(), "a key outside the prefix was writable");
    let flush: redis::RedisResult<()> = redis::cmd("FLUSHALL").query(&mut con);
    assert!(flush.is_err(), "FLUSHALL was allowed");

    let locker = Locker::builder()
        .prefix("locks:")
        .build(url.as_str())
        .unwrap();
    // One key (plain SET), several keys and fencing (scripts), with the refresher running.
    let one = locker.lock(&["a"]).unwrap();
    assert_eq!(one.keys(), ["a"]);
    assert_eq!(server.query::<u32>(&["EXISTS", "locks:a"]), 1);
    let ttl = Duration::from_millis(1500);
    let many = locker
        .lock_with(&["b", "c"], LockOptions::default().fencing(true).ttl(ttl))
        .unwrap();
    assert_eq!(many.fences(), [1, 1]);
    assert_eq!(
        server.query::<u32>(&["EXISTS", "locks:redguard:fence:{locks:b}"]),
        1
    );
    many.refresh(ttl).unwrap();
    assert!(many.ttl().unwrap().is_some());
    // Refreshed in the background, at a third of the TTL: the server's TTL goes back up.
    thread::sleep(Duration::from_millis(700));
    eventually(Duration::from_secs(3), "a background refresh", || {
        server.query::<i64>(&["PTTL", "locks:b"]) > 1000
    });
    assert!(!many.is_lost());

    // A waiter woken by the release, and scripts loaded again after a flush.
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || locker.lock(&["a"]).map(drop))
    };
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        server.queued_at("locks:redguard:queue:{locks:a}") == 1
    });
    one.release().unwrap();
    waiter.join().unwrap().unwrap();
    server.query::<()>(&["SCRIPT", "FLUSH"]);
    many.release().unwrap();
    drop(
        locker
            .lock_with(&["d", "e"], LockOptions::default())
            .unwrap(),
    );
    assert_eq!(
        server
            .query::<Vec<String>>(&["KEYS", "locks:[abcde]"])
            .len(),
        0
    );

    // An election: campaign, proclaim, fenced writes, who leads, an observer.
    let election = locker.election("e").unwrap();
    let mut observer = election.observe().unwrap();
    assert_eq!(observer.next().unwrap().unwrap(), None);
    let mut term = election.campaign("a").unwrap();
    term.proclaim("b").unwrap();
    assert!(term.fenced_set("out", "1").unwrap());
    assert_eq!(server.query::<String>(&["GET", "locks:out"]), "1");
    let leader = election.leader().unwrap().expect("a leader");
    assert_eq!((leader.term(), leader.value()), (term.term(), "b"));
    let seen = observer.next_timeout(Duration::from_secs(5)).expect("news");
    assert_eq!(seen.unwrap().map(|l| l.term()), Some(term.term()));
    term.resign().unwrap();
}
