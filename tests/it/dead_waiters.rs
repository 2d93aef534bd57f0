//! Waiters that die, go deaf or give up: a waiter SIGKILLed in the queue delays the next
//! by at most about its place's lifetime and a third (2 s by default), a lost announcement
//! is made up for by the waiter's renewal, and waiters that give up leave nothing behind.

use std::process::{Child, Stdio};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::server::{RedisServer, queue_of};
use crate::{child_test, eventually, locker};

/// The default waiter lifetime (`LockerBuilder::waiter_lifetime`) and a third: how long a
/// dead waiter's place can hold up the next, with some slack for a loaded machine.
const DEAD_PLACE: Duration = Duration::from_millis(2500);

/// Retries only every 10 s (so it is served by the queue, never by polling), gives up
/// after 8 s.
fn patient(metadata: &str) -> LockOptions {
    LockOptions::default()
        .retry(Retry::linear(Duration::from_secs(10)))
        .timeout(Duration::from_secs(8))
        .metadata(metadata)
}

/// A thread of `locker` waiting for "k" as `patient(metadata)`: the guard, and when it
/// came.
fn waiter(
    locker: Locker,
    metadata: &'static str,
) -> JoinHandle<(redguard::Result<redguard::LockGuard>, Instant)> {
    thread::spawn(move || {
        let guard = locker.lock_with(&["k"], patient(metadata));
        (guard, Instant::now())
    })
}

/// The metadata of each entry in the queue of "k", first in line first.
fn in_line(server: &RedisServer) -> Vec<&'static str> {
    server
        .queue_entries("k")
        .iter()
        .map(|entry| match entry {
            e if e.ends_with("dead-child") => "dead-child",
            e if e.ends_with("live") => "live",
            e => panic!("an entry of nobody here: {e:?}"),
        })
        .collect()
}

/// A child process queued for "k" (held), then a live waiter of another locker behind it.
fn dead_child_before_a_live_waiter(
    server: &RedisServer,
) -> (
    Child,
    JoinHandle<(redguard::Result<redguard::LockGuard>, Instant)>,
) {
    let child = child_test("dead_waiters::queued_child")
        .env("REDGUARD_DEAD_URL", server.url())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("start the child");
    eventually(Duration::from_secs(15), "the child is queued", || {
        server.queued("k") == 1
    });
    let live = waiter(locker(server), "live");
    eventually(Duration::from_secs(5), "the live waiter is queued", || {
        server.queued("k") == 2
    });
    assert_eq!(in_line(server), ["dead-child", "live"]);
    (child, live)
}

/// The PTTL of "k" and the server's clock (ms), read at one moment.
fn pttl_and_now(server: &RedisServer) -> (i64, i64) {
    let script = "local t = redis.call('time') \
                  return {redis.call('pttl', 'k'), tonumber(t[1]), tonumber(t[2])}";
    let read: Vec<i64> = server.query(&["EVAL", script, "0"]);
    (read[0], read[1] * 1000 + read[2] / 1000)
}

/// When the dead child's place expires, by the server's clock (ms).
fn expiry_of_the_dead_place(server: &RedisServer) -> i64 {
    let alive = "redguard:alive:{k}";
    let entries: Vec<(String, f64)> = server.query(&["ZRANGE", alive, "0", "-1", "WITHSCORES"]);
    let (_, expiry) = entries
        .iter()
        .find(|(entry, _)| entry.ends_with("dead-child"))
        .expect("the dead child's place");
    *expiry as i64
}

/// After the live waiter got "k": it alone holds it, and the queue's keys are gone.
fn only_the_live_waiter_is_left(server: &RedisServer, guard: redguard::LockGuard) {
    let holders = locker(server).holders("k").unwrap();
    assert_eq!(holders.len(), 1, "{holders:?}");
    assert_eq!(holders[0].metadata(), "live");
    assert!(server.queue_entries("k").is_empty());
    guard.release().unwrap();
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

/// A release right after the queued child was SIGKILLed hands "k" to the dead child's
/// place, for only what that place had left: the live waiter behind it has the lock
/// within the lifetime and a third of the release.
#[test]
fn a_key_handed_to_a_killed_waiter_reaches_the_next_within_the_bound() {
    let server = RedisServer::start();
    let holder = locker(&server).lock(&["k"]).unwrap();
    let (mut child, live) = dead_child_before_a_live_waiter(&server);
    child.kill().unwrap();
    child.wait().unwrap();
    let dead_until = expiry_of_the_dead_place(&server);

    let released = Instant::now();
    holder.release().unwrap();
    let first = in_line(&server);
    let holders = locker(&server).holders("k").unwrap();
    let (left, now) = pttl_and_now(&server);
    // Unless this machine stalled past the dead place's end, what was seen above was seen
    // while the dead child held "k", and only until its place would have expired.
    if now + 50 < dead_until {
        assert_eq!(first, ["live"], "the dead child was served");
        assert_eq!(holders.len(), 1, "{holders:?}");
        assert_eq!(holders[0].metadata(), "dead-child");
        assert!(
            left > 0 && left <= dead_until - now + 1,
            "handed for {left} ms; its place had {} ms left",
            dead_until - now
        );
    }

    let (guard, got) = live.join().unwrap();
    let guard = guard.unwrap();
    let took = got - released;
    assert!(took < DEAD_PLACE, "the live waiter waited {took:?}");
    only_the_live_waiter_is_left(&server, guard);
}

/// The child SIGKILLed while queued, and the release long after: the live waiter's renewal
/// drops the dead place within the lifetime and a third, and the release serves the live
/// waiter at once.
#[test]
fn a_killed_waiters_place_is_dropped_and_the_release_serves_the_next_at_once() {
    let server = RedisServer::start();
    let holder = locker(&server).lock(&["k"]).unwrap();
    let (mut child, live) = dead_child_before_a_live_waiter(&server);
    child.kill().unwrap();
    child.wait().unwrap();
    let killed = Instant::now();
    eventually(
        DEAD_PLACE + Duration::from_secs(1),
        "the dead place goes",
        || in_line(&server) == ["live"],
    );
    assert!(
        killed.elapsed() < DEAD_PLACE,
        "the dead place lasted {:?}",
        killed.elapsed()
    );
    assert!(!live.is_finished(), "the key is still held");

    let released = Instant::now();
    holder.release().unwrap();
    let (guard, got) = live.join().unwrap();
    let guard = guard.unwrap();
    let took = got - released;
    assert!(took < Duration::from_millis(500), "served {took:?} after");
    only_the_live_waiter_is_left(&server, guard);
}

#[test]
#[ignore = "run by the tests of a killed waiter"]
fn queued_child() {
    let url = std::env::var("REDGUARD_DEAD_URL").expect("run by the parent test");
    let locker = Locker::connect(url).unwrap();
    // Killed while it waits.
    let options = patient("dead-child").timeout(Duration::from_secs(30));
    let _ = locker.lock_with(&["k"], options);
}

/// A locker of its own user, "w", whose subscriber [`deafen`] will cut off.
fn deaf_to_be(server: &RedisServer) -> Locker {
    server.query::<()>(&[
        "ACL",
        "SETUSER",
        "w",
        "on",
        ">pw",
        "~*",
        "+@all",
        "allchannels",
    ]);
    let url = server.url().replace("redis://", "redis://w:pw@");
    Locker::builder().pool_size(2).build(url).unwrap()
}

/// Takes every channel from "w": Redis 7 disconnects its subscriber then, which cannot
/// subscribe again.
fn deafen(server: &RedisServer) {
    server.query::<()>(&["ACL", "SETUSER", "w", "resetchannels"]);
}

/// A waiter of another locker, whose subscriber is cut off (and kept off by its ACL) just
/// before the release: the announcement reaches nobody, and the waiter's renewal, finding
/// its place gone (served), has it take the lock all the same.
#[test]
fn a_waiter_whose_announcement_is_lost_is_served_by_its_renewal() {
    let server = RedisServer::start();
    let deaf = deaf_to_be(&server);
    let holder = locker(&server).lock(&["k"]).unwrap();
    let live = waiter(deaf, "live");
    eventually(Duration::from_secs(5), "queued and listening", || {
        server.queued("k") == 1 && server.lockers_listening() == 1
    });

    deafen(&server);
    eventually(Duration::from_secs(2), "the subscriber is gone", || {
        server.lockers_listening() == 0
    });
    let released = Instant::now();
    holder.release().unwrap();
    assert_eq!(server.lockers_listening(), 0, "nobody heard the release");
    assert!(
        server.queue_entries("k").is_empty(),
        "served by the release"
    );

    let (guard, got) = live.join().unwrap();
    let guard = guard.unwrap();
    let took = got - released;
    assert!(took < Duration::from_millis(1500), "served {took:?} after");
    assert_eq!(server.lockers_listening(), 0, "still deaf");
    only_the_live_waiter_is_left(&server, guard);
}

/// The same with a plain `CLIENT KILL` of every subscriber right before the release: the
/// waiter is served whether its renewal or its resubscription notices first.
#[test]
fn a_waiter_whose_subscriber_is_cut_before_the_release_is_served_soon() {
    let server = RedisServer::start();
    let holder = locker(&server).lock(&["k"]).unwrap();
    let live = waiter(locker(&server), "live");
    eventually(Duration::from_secs(5), "queued and listening", || {
        server.queued("k") == 1 && server.lockers_listening() == 1
    });
    server.query::<u64>(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    let released = Instant::now();
    holder.release().unwrap();
    let (guard, got) = live.join().unwrap();
    let guard = guard.unwrap();
    let took = got - released;
    assert!(took < Duration::from_millis(1500), "served {took:?} after");
    only_the_live_waiter_is_left(&server, guard);
}

/// Waiters of every kind give up (timeouts, a retry limit) while the keys are held: each
/// takes its place out as it goes, so the queue's keys are gone at once, and once the
/// holds are released nothing of the crate's is left on the server.
#[test]
fn waiters_that_give_up_leave_nothing_behind() {
    let server = RedisServer::start();
    let owner = locker(&server);
    let lock = owner.lock(&["k"]).unwrap();
    let write = owner.lock(&["r"]).unwrap();
    let semaphore = owner.semaphore("s", 1).unwrap();
    let permit = semaphore.acquire().unwrap();
    let held = server.all_keys();
    assert_eq!(held, ["k", "r", "s"]);

    let timeout = || LockOptions::default().timeout(Duration::from_secs(3));
    let limited = || {
        let retry = Retry::linear(Duration::from_millis(750)).limit(4);
        LockOptions::default().retry(retry)
    };
    type Gives = Box<dyn FnOnce(&Locker) -> redguard::Result<()> + Send>;
    let waiters: Vec<(&str, &str, Gives)> = vec![
        (
            "k",
            "a lock with a timeout",
            Box::new(move |l| l.lock_with(&["k"], timeout()).map(drop)),
        ),
        (
            "k",
            "a lock with a retry limit",
            Box::new(move |l| l.lock_with(&["k"], limited()).map(drop)),
        ),
        (
            "j",
            "a lock of two keys",
            Box::new(move |l| l.lock_with(&["j", "k"], timeout()).map(drop)),
        ),
        (
            "r",
            "a reader",
            Box::new(move |l| l.read_with(&["r"], timeout()).map(drop)),
        ),
        (
            "s",
            "a permit",
            Box::new(move |l| l.semaphore("s", 1)?.acquire_with(timeout()).map(drop)),
        ),
    ];
    let mut threads = Vec::new();
    for (key, what, gives) in waiters {
        let before = server.queued(key);
        let locker = locker(&server);
        threads.push((what, thread::spawn(move || gives(&locker))));
        eventually(Duration::from_secs(2), &format!("{what} is queued"), || {
            server.queued(key) == before + 1
        });
    }
    assert_eq!(server.queued("k"), 3, "{:?}", server.queue_entries("k"));
    for (what, thread) in threads {
        let result = thread.join().unwrap();
        assert!(
            matches!(result, Err(Error::NotObtained)),
            "{what}: {result:?}"
        );
    }
    assert_eq!(
        server.all_keys(),
        held,
        "the places went with their waiters"
    );
    for key in ["k", "j", "r", "s"] {
        assert_eq!(server.query::<u32>(&["EXISTS", &queue_of(key)]), 0);
    }

    drop((lock, write, permit));
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

/// As above, for a reader first in line with a writer of another locker behind it: the
/// release gives the reader its share, the word of it is lost, and the reader's renewal
/// has it ask. That attempt must take what it was given (its value is a reader of the
/// key already), not queue it again behind the writer, which waits for the readers.
#[test]
fn a_reader_whose_announcement_is_lost_is_served_before_the_writer_behind_it() {
    let server = RedisServer::start();
    let deaf = deaf_to_be(&server);
    let holder = locker(&server).lock(&["k"]).unwrap();
    let served = Arc::new(Mutex::new(Vec::new()));
    let in_turn = |locker: Locker, who: &'static str| {
        let served = served.clone();
        thread::spawn(move || -> redguard::Result<Instant> {
            let options = patient(who);
            let guard: Box<dyn std::any::Any> = match who {
                "reader" => Box::new(locker.read_with(&["k"], options)?),
                _ => Box::new(locker.lock_with(&["k"], options)?),
            };
            let got = Instant::now();
            served.lock().unwrap().push(who);
            drop(guard);
            Ok(got)
        })
    };
    let reader = in_turn(deaf, "reader");
    eventually(Duration::from_secs(5), "the reader is queued", || {
        server.queued("k") == 1 && server.lockers_listening() == 1
    });
    let writer = in_turn(locker(&server), "writer");
    eventually(Duration::from_secs(5), "the writer is queued", || {
        server.queued("k") == 2 && server.lockers_listening() == 2
    });
    deafen(&server);
    eventually(
        Duration::from_secs(2),
        "the reader's subscriber is gone",
        || server.lockers_listening() == 1,
    );

    let released = Instant::now();
    holder.release().unwrap();
    let read_at = reader.join().unwrap().unwrap();
    let wrote_at = writer.join().unwrap().unwrap();
    assert_eq!(
        *served.lock().unwrap(),
        ["reader", "writer"],
        "the order of arrival"
    );
    let took = read_at - released;
    assert!(
        took < Duration::from_millis(1500),
        "the reader was served {took:?} after"
    );
    assert!(wrote_at > read_at);
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}
