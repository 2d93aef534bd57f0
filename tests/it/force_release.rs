//! Break-glass: `Locker::force_release` and `redguard unlock --force` remove a lock (or a
//! read lock's readers) whoever holds it, hand the keys to the first waiter as a release
//! does, keep the fencing counters, and leave anything else alone.

use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockGuard, LockOptions, Locker, Retry};

use crate::cli::{code, redguard_at, run};
use crate::cluster::{cluster_locker, stored};
use crate::cluster_server::RedisCluster;
use crate::server::{RedisServer, closed_url};
use crate::{eventually, locker};

/// A holder refreshed every 300 ms: it finds a removal out within about that.
fn holder_options(metadata: &str) -> LockOptions {
    LockOptions::default()
        .ttl(Duration::from_millis(900))
        .metadata(metadata)
        .fencing(true)
}

/// A waiter that neither retries nor renews its place within the test's wait: whoever gets
/// in quickly was woken by the script that served it.
fn sleepy_locker(url: &str) -> Locker {
    Locker::builder()
        .waiter_lifetime(Duration::from_secs(60))
        .build(url)
        .unwrap()
}

fn sleepy() -> LockOptions {
    LockOptions::default()
        .retry(Retry::linear(Duration::from_secs(30)))
        .timeout(Duration::from_secs(20))
        .fencing(true)
}

/// Starts a thread that waits for `keys` on `locker` with [`sleepy`] options; it returns
/// the guard and when it came.
fn waiter(
    locker: &Locker,
    keys: &'static [&'static str],
) -> thread::JoinHandle<(redguard::Result<LockGuard>, Instant)> {
    let locker = locker.clone();
    thread::spawn(move || {
        let guard = locker.lock_with(keys, sleepy());
        (guard, Instant::now())
    })
}

/// Waits until `key`'s queue has one waiter and its locker listens for its turn.
fn queued(server: &RedisServer, key: &str) {
    eventually(Duration::from_secs(5), "the waiter queued", || {
        server.queued(key) == 1 && server.lockers_listening() == 1
    });
}

fn counter(server: &RedisServer, key: &str) -> Option<String> {
    server.query(&["GET", &format!("redguard:fence:{{{key}}}")])
}

#[test]
fn a_forced_release_hands_the_keys_on_at_once_with_a_higher_fence_and_the_holder_is_lost() {
    let server = RedisServer::start();
    let stuck = locker(&server)
        .lock_with(&["job"], holder_options("stuck"))
        .unwrap();
    let removed_fence = stuck.fence().unwrap();
    let next = waiter(&sleepy_locker(&server.url()), &["job"]);
    queued(&server, "job");
    let operator = locker(&server);
    let removed_at = Instant::now();
    assert!(operator.force_release(&["job"]).unwrap(), "a hold removed");
    let (guard, got_at) = next.join().unwrap();
    let guard = guard.unwrap();
    let took = got_at.duration_since(removed_at);
    assert!(
        took < Duration::from_millis(500),
        "woken by the script, not by a retry or a renewal: {took:?}"
    );
    let fence = guard.fence().unwrap();
    assert!(fence > removed_fence, "{fence} after {removed_fence}");
    assert_eq!(counter(&server, "job"), Some(fence.to_string()));
    // The holder's next refresh finds the keys gone, and its release says so.
    eventually(Duration::from_secs(3), "the old guard lost", || {
        stuck.is_lost()
    });
    assert!(matches!(stuck.release(), Err(Error::LockLost)));
    assert!(
        !guard.is_lost() && guard.ttl().unwrap().is_some(),
        "not taken by it"
    );
    guard.release().unwrap();
}

#[test]
fn nothing_held_is_false_and_the_fencing_counter_stays() {
    let server = RedisServer::start();
    let locker = locker(&server);
    assert!(!locker.force_release(&["never"]).unwrap());
    let first = locker
        .lock_with(&["job"], LockOptions::default().fencing(true))
        .unwrap();
    assert_eq!(first.fence(), Some(1));
    first.release().unwrap();
    assert!(!locker.force_release(&["job", "never"]).unwrap());
    assert_eq!(counter(&server, "job").as_deref(), Some("1"));
    let mut keys: Vec<String> = server.all_keys();
    keys.sort();
    assert_eq!(keys, ["redguard:fence:{job}"], "nothing else made or left");
    let second = locker
        .lock_with(&["job"], LockOptions::default().fencing(true))
        .unwrap();
    assert_eq!(second.fence(), Some(2));
    // Removed with a key that held nothing: `true` all the same, the counter kept.
    assert!(locker.force_release(&["never", "job"]).unwrap());
    assert_eq!(counter(&server, "job").as_deref(), Some("2"));
    assert_eq!(server.query::<Option<String>>(&["GET", "job"]), None);
}

#[test]
fn every_reader_is_removed_and_a_waiting_writer_gets_in() {
    let server = RedisServer::start();
    let readers: Vec<_> = ["r1", "r2"]
        .iter()
        .map(|metadata| {
            let options = holder_options(metadata).fencing(false);
            locker(&server).read_with(&["config"], options).unwrap()
        })
        .collect();
    let writer = waiter(&sleepy_locker(&server.url()), &["config"]);
    queued(&server, "config");
    let removed_at = Instant::now();
    assert!(locker(&server).force_release(&["config"]).unwrap());
    let (guard, got_at) = writer.join().unwrap();
    let guard = guard.unwrap();
    assert!(got_at.duration_since(removed_at) < Duration::from_millis(500));
    assert_eq!(guard.fence(), Some(1));
    assert_eq!(server.query::<String>(&["TYPE", "config"]), "string");
    for reader in readers {
        eventually(Duration::from_secs(3), "each reader lost", || {
            reader.is_lost()
        });
        assert!(matches!(reader.release(), Err(Error::LockLost)));
    }
    guard.release().unwrap();
}

#[test]
fn a_key_of_another_type_or_a_semaphore_is_refused_and_nothing_is_removed() {
    let server = RedisServer::start();
    let prefixed = Locker::builder()
        .prefix("app:")
        .build(server.url())
        .unwrap();
    let held = prefixed.lock(&["held"]).unwrap();
    server.query::<u32>(&["RPUSH", "app:list", "x"]);
    match prefixed.force_release(&["held", "list"]) {
        Err(Error::WrongType { key, kind }) => {
            assert_eq!((key.as_str(), kind.as_str()), ("list", "list"))
        }
        other => panic!("{other:?}"),
    }
    assert_eq!(
        server.query::<Vec<String>>(&["LRANGE", "app:list", "0", "-1"]),
        ["x"]
    );
    assert!(held.ttl().unwrap().is_some(), "the other key kept too");
    // A string that is no lock's value (a fencing counter, a plain value) is left alone.
    server.query::<()>(&["SET", "app:counter", "12"]);
    match prefixed.force_release(&["counter"]) {
        Err(Error::WrongType { key, .. }) => assert_eq!(key, "counter"),
        other => panic!("{other:?}"),
    }
    assert_eq!(server.query::<String>(&["GET", "app:counter"]), "12");
    let semaphore = prefixed.semaphore("slots", 2).unwrap();
    let permit = semaphore.acquire().unwrap();
    match prefixed.force_release(&["held", "slots"]) {
        Err(Error::InvalidInput(why)) => assert!(why.contains("\"slots\""), "{why}"),
        other => panic!("{other:?}"),
    }
    assert_eq!(semaphore.available().unwrap(), 1, "the permit kept");
    assert!(held.ttl().unwrap().is_some());
    permit.release().unwrap();
    held.release().unwrap();
}

#[test]
fn on_a_quorum_it_is_removed_when_a_majority_removed_it() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let quorum = || Locker::builder().build_redlock(&urls).unwrap();
    let guard = quorum().lock(&["job"]).unwrap();
    assert!(quorum().force_release(&["job"]).unwrap());
    for server in &servers {
        assert_eq!(server.query::<Option<String>>(&["GET", "job"]), None);
    }
    assert_eq!(
        guard.ttl().unwrap(),
        None,
        "a majority of the nodes hold nothing"
    );
    assert!(matches!(guard.release(), Err(Error::LockLost)));
    // A leftover on one node of three is no lock: removed there, and `false`.
    let token = "0123456789abcdef0123456789abcdef";
    servers[0].query::<()>(&["SET", "left", token]);
    assert!(!quorum().force_release(&["left"]).unwrap());
    assert_eq!(servers[0].query::<Option<String>>(&["GET", "left"]), None);
}

#[test]
fn on_a_cluster_the_waiter_gets_the_key_and_keys_across_slots_are_refused() {
    let cluster = RedisCluster::start();
    let url = cluster.urls()[0].clone();
    let stuck = cluster_locker(&cluster)
        .lock_with(&["job"], holder_options("stuck"))
        .unwrap();
    let waiting = Locker::builder()
        .waiter_lifetime(Duration::from_secs(60))
        .build_cluster(&[url])
        .unwrap();
    let waiting = {
        let locker = waiting.clone();
        thread::spawn(move || locker.lock_with(&["job"], sleepy()))
    };
    let operator = cluster_locker(&cluster);
    eventually(Duration::from_secs(5), "the waiter queued", || {
        operator
            .holders("job")
            .is_ok_and(|holders| holders.len() == 1)
            && cluster_queued(&cluster, "job")
    });
    assert!(RedisCluster::slot("job") != RedisCluster::slot("other"));
    let across = operator.force_release(&["job", "other"]);
    assert!(matches!(across, Err(Error::InvalidInput(_))), "{across:?}");
    assert!(operator.force_release(&["job"]).unwrap());
    let guard = waiting.join().unwrap().unwrap();
    assert!(guard.fence() > stuck.fence());
    assert_eq!(
        stored(&cluster, "redguard:fence:{job}"),
        guard.fence().map(|fence| fence.to_string())
    );
    eventually(Duration::from_secs(3), "the old guard lost", || {
        stuck.is_lost()
    });
    guard.release().unwrap();
}

/// Whether `key`'s queue on the master of its slot has an entry.
fn cluster_queued(cluster: &RedisCluster, key: &str) -> bool {
    let queue = format!("redguard:queue:{{{key}}}");
    let owner = cluster.owner_of(RedisCluster::slot(&queue));
    cluster.query::<u64>(owner, redis::cmd("ZCARD").arg(&queue)) == 1
}

#[test]
fn unlock_force_prints_what_it_removed_and_without_force_removes_nothing() {
    let server = RedisServer::start();
    let holder = locker(&server)
        .lock_with(&["job"], holder_options("host-1:4242"))
        .unwrap();
    server.query::<u32>(&["RPUSH", "list", "x"]);
    let refused = run(&server, &["unlock", "job"]);
    assert_eq!(code(&refused), Some(64));
    let said = String::from_utf8_lossy(&refused.stderr);
    assert!(said.contains("--force"), "{said}");
    assert!(server.query::<Option<String>>(&["GET", "job"]).is_some());
    let output = run(&server, &["unlock", "--force", "job", "free"]);
    assert_eq!(code(&output), Some(0), "{output:?}");
    let text = String::from_utf8_lossy(&output.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert!(
        lines[0].starts_with("job: removed exclusive; \"host-1:4242\" ")
            && lines[0].ends_with(", fence 1"),
        "{text}"
    );
    assert_eq!(lines[1], "free: nothing held", "{text}");
    assert_eq!(server.query::<Option<String>>(&["GET", "job"]), None);
    eventually(Duration::from_secs(3), "the holder lost", || {
        holder.is_lost()
    });
    let wrong = run(&server, &["unlock", "--force", "list"]);
    assert_eq!(code(&wrong), Some(64));
    assert_eq!(
        String::from_utf8_lossy(&wrong.stdout),
        "list: not a lock (list), left alone\n"
    );
    assert_eq!(server.query::<u32>(&["LLEN", "list"]), 1);
    let semaphore = locker(&server).semaphore("slots", 2).unwrap();
    let _permit = semaphore.acquire().unwrap();
    let permits = run(&server, &["unlock", "--force", "slots", "free"]);
    assert_eq!(code(&permits), Some(64));
    let said = String::from_utf8_lossy(&permits.stdout);
    assert_eq!(said, "slots: a semaphore, left alone\nfree: nothing held\n");
    assert_eq!(semaphore.available().unwrap(), 1, "the permit kept");
    let down = redguard_at(&closed_url(0), &["unlock", "--force", "job"])
        .output()
        .unwrap();
    assert_eq!(code(&down), Some(69));
    let help = run(&server, &["unlock", "--help"]);
    let help = String::from_utf8_lossy(&help.stdout);
    for status in ["\n  0 ", "\n  64 ", "\n  69 "] {
        assert!(help.contains(status), "lists {status:?}:\n{help}");
    }
}
