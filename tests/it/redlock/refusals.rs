//! Redlock: nodes that refuse (NOPERM, READONLY) or answer late, and what release does.

use super::*;

/// URLs for a user `locker` made on every server, allowed everything but the lock's
/// commands (SET and the scripts) on the servers `refusing`, which answer them NOPERM.
fn urls_as_user(servers: &[RedisServer], refusing: &[usize]) -> Vec<String> {
    servers
        .iter()
        .enumerate()
        .map(|(i, server)| {
            let mut rules = vec!["ACL", "SETUSER", "locker", "on", ">secret", "~*", "&*"];
            rules.push("+@all");
            if refusing.contains(&i) {
                rules.extend(["-set", "-evalsha", "-eval"]);
            }
            server.query::<()>(&rules);
            server.url().replace("redis://", "redis://locker:secret@")
        })
        .collect()
}

/// Whether `result` is the error reply `code` of a server.
fn refused<T>(result: &Result<T, Error>, code: &str) -> bool {
    matches!(result, Err(Error::Redis(e)) if e.code() == Some(code))
}

/// How many error replies `code` the server has given (INFO errorstats).
fn error_replies(server: &RedisServer, code: &str) -> u64 {
    let info: String = server.query(&["INFO", "errorstats"]);
    let prefix = format!("errorstat_{code}:count=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .map_or(0, |n| n.trim().parse().expect("a count"))
}

/// Locks and releases until `refusing` (one of the locker's nodes, answering NOPERM) has
/// failed again and again, and returns just after its latest refusal: it then rests for
/// a good while (at least 400 ms) before the locker asks it again.
fn refused_long_enough(locker: &Locker, refusing: &RedisServer) {
    // It rests longer each time in a row it fails: 50 ms, then 100, 200...
    let until = Instant::now() + Duration::from_secs(1);
    while Instant::now() < until {
        locker.lock(&["warm"]).unwrap().release().unwrap();
    }
    let failures = error_replies(refusing, "NOPERM");
    eventually(Duration::from_secs(3), "the node asked again", || {
        locker.lock(&["warm"]).unwrap().release().unwrap();
        error_replies(refusing, "NOPERM") > failures
    });
}

#[test]
fn servers_refusing_the_lock_commands_give_their_error_not_not_obtained() {
    let servers = five();
    let locker = redlock(&urls_as_user(&servers, &[0, 1, 2]));
    // The second time round the refusing nodes are resting: the same error again.
    for _ in 0..2 {
        let locked = locker.lock(&["k"]);
        assert!(refused(&locked, "NOPERM"), "{locked:?}");
        let once = locker.try_lock(&["k"]);
        assert!(refused(&once, "NOPERM"), "not 'held elsewhere': {once:?}");
    }
    assert!(
        values(&servers, "k").iter().all(Option::is_none),
        "taken back on the nodes that took it"
    );
}

#[test]
fn a_replica_given_as_a_node_is_left_out_and_named_once_it_costs_the_majority() {
    let mut servers = five();
    let master = RedisServer::start();
    let port = master
        .url()
        .trim_end_matches('/')
        .rsplit(':')
        .next()
        .unwrap()
        .to_string();
    let _: () = servers[4].query(&["REPLICAOF", "127.0.0.1", &port]);
    let locker = redlock(&urls(&servers));
    // Four masters are a majority; the replica refuses the write, and is then left out
    // for a while like a node that did not answer, rather than asked every time.
    let held: Vec<_> = (0..20)
        .map(|i| locker.lock(&[format!("k{i}")]).unwrap())
        .collect();
    let refusals = error_replies(&servers[4], "READONLY");
    assert!((1..10).contains(&refusals), "{refusals} of 20 asked");
    drop(held);
    servers[0].kill();
    servers[1].kill();
    // Two masters left: the replica is why there is no majority, and it says so.
    let locked = locker.lock(&["k"]);
    assert!(refused(&locked, "READONLY"), "{locked:?}");
}

#[test]
fn a_node_left_out_after_an_error_reply_is_reported_by_that_error() {
    let mut servers = five();
    let locker = redlock(&urls_as_user(&servers, &[0, 1]));
    refused_long_enough(&locker, &servers[0]);
    let failures = error_replies(&servers[0], "NOPERM");
    servers[2].kill();
    // Only nodes 2 to 4 are asked (the others rest), and node 2 fails: the refusals that
    // left nodes 0 and 1 out are why there is no majority.
    let locked = locker.lock(&["k"]);
    assert!(refused(&locked, "NOPERM"), "{locked:?}");
    assert_eq!(
        error_replies(&servers[0], "NOPERM"),
        failures,
        "the resting node was not asked"
    );
}

#[test]
fn a_held_lock_names_the_refusal_that_stops_its_refresh_and_release() {
    let mut servers = five();
    let locker = redlock(&urls_as_user(&servers, &[]));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    for server in &servers[..2] {
        let _: () = server.query(&["ACL", "SETUSER", "locker", "-evalsha", "-eval"]);
    }
    servers[4].kill();
    // Two nodes refuse, one is gone: the refusal is what to fix, so it is what is said.
    let refreshed = guard.refresh(Duration::from_secs(30));
    assert!(refused(&refreshed, "NOPERM"), "{refreshed:?}");
    let ttl = guard.ttl();
    assert!(refused(&ttl, "NOPERM"), "{ttl:?}");
    let released = guard.release();
    assert!(refused(&released, "NOPERM"), "{released:?}");
}

#[test]
fn a_release_reaches_a_node_left_out_after_a_failure() {
    let servers = five();
    let locker = redlock(&urls_as_user(&servers, &[]));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    // Node 0 refuses the lock's commands for a while, is left out, and is then well again.
    let _: () = servers[0].query(&["ACL", "SETUSER", "locker", "-set", "-evalsha", "-eval"]);
    refused_long_enough(&locker, &servers[0]);
    let _: () = servers[0].query(&["ACL", "SETUSER", "locker", "+set", "+evalsha", "+eval"]);
    guard.release().unwrap();
    // (Its reply may come after the release returned; its TTL is 30 s.)
    eventually(
        Duration::from_secs(1),
        "not left to its TTL on the resting node",
        || values(&servers, "k") == vec![None; 5],
    );
}

#[test]
fn a_lock_won_without_a_late_node_keeps_what_that_node_takes() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    drop(locker.lock(&["warm"]).unwrap()); // connections made, scripts loaded
    servers[0].pause();
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let token = Some(guard.token().to_string());
    servers[0].resume();
    // The late node runs the acquire when it wakes, and nothing after it takes it back.
    eventually(
        Duration::from_secs(3),
        "the late node holds the lock",
        || values(&servers, "k")[0] == token,
    );
    thread::sleep(Duration::from_millis(50));
    assert_eq!(values(&servers, "k"), vec![token; 5]);
    guard.release().unwrap();
    eventually(Duration::from_secs(1), "released everywhere", || {
        values(&servers, "k") == vec![None; 5]
    });
}

/// How many times the server ran `command` (INFO commandstats).
fn calls(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|line| line.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("a number of calls"))
}

#[test]
fn one_free_key_is_taken_with_a_plain_set_and_a_set_one_asks_the_script() {
    let servers = five();
    let urls = urls(&servers);
    let (one, two) = (redlock(&urls), redlock(&urls));
    drop(one.lock(&["warm"]).unwrap()); // scripts loaded
    let count = |command: &str| -> Vec<u64> { servers.iter().map(|s| calls(s, command)).collect() };
    let (sets, scripts) = (count("set"), count("evalsha"));
    let held = one.lock(&["k"]).unwrap();
    let more = |now: Vec<u64>, before: &[u64]| -> Vec<u64> {
        now.iter()
            .zip(before)
            .map(|(now, before)| now - before)
            .collect()
    };
    assert_eq!(more(count("set"), &sets), [1; 5]);
    assert_eq!(more(count("evalsha"), &scripts), [0; 5], "no script");
    // Set on every node: the script tells whose it is.
    assert!(two.try_lock(&["k"]).unwrap().is_none());
    assert_eq!(more(count("evalsha"), &scripts), [1; 5]);
    drop(held);
    // A list on three nodes: named, though a plain SET only finds the key set.
    for server in &servers[..3] {
        let _: u64 = server.query(&["LPUSH", "k", "x"]);
    }
    let wrong = two.lock(&["k"]);
    assert!(
        matches!(&wrong, Err(Error::WrongType { key, kind }) if key == "k" && kind == "list"),
        "{wrong:?}"
    );
    assert!(
        values(&servers[3..], "k").iter().all(Option::is_none),
        "taken back"
    );
}
