//! Arrival order across lockers and processes: each waiter, whatever its locker, takes a
//! place in the server's queue of its key, and releases serve the queue front to back.
//!
//! Every waiter here has a locker of its own (its own pool, subscriber and channel), so a
//! release tells it by a PUBLISH, never by the reply of a release in its own locker; and it
//! retries only every 10 s, so it is served by the queue, never by polling.

use std::process::{Child, Stdio};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redguard::{LockOptions, Locker, Retry};

use crate::server::RedisServer;
use crate::{child_test, eventually, locker};

/// How long a waiter waits at most: far beyond any hand-off here.
const PATIENCE: Duration = Duration::from_secs(10);
/// How long a new waiter (thread or process) may take to be queued on a loaded machine.
const TO_QUEUE: Duration = Duration::from_secs(15);

/// Retries only every 10 s, gives up after [`PATIENCE`].
pub(crate) fn in_line() -> LockOptions {
    LockOptions::default()
        .retry(Retry::linear(Duration::from_secs(10)))
        .timeout(PATIENCE)
}

/// The order the waiters were in their critical sections, each recorded inside it.
#[derive(Clone, Default)]
struct Served(Arc<Mutex<Vec<String>>>);

impl Served {
    fn record(&self, who: impl Into<String>) {
        self.0.lock().unwrap().push(who.into());
    }

    fn order(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }
}

/// Names `prefix0`, `prefix1`, ... for `count` waiters.
fn names(prefix: &str, count: usize) -> Vec<String> {
    (0..count).map(|i| format!("{prefix}{i}")).collect()
}

/// Starts `count` waiters on `key` one after another with `start(i)`, each once the one
/// before it is in the queue, which holds `already` waiters before the first.
fn one_after_another<T>(
    server: &RedisServer,
    key: &str,
    already: u64,
    count: usize,
    mut start: impl FnMut(usize) -> T,
) -> Vec<T> {
    (0..count)
        .map(|i| {
            let waiter = start(i);
            let queued = already + i as u64 + 1;
            eventually(TO_QUEUE, &format!("waiter {i} is queued on {key}"), || {
                server.queued(key) == queued
            });
            waiter
        })
        .collect()
}

/// Joins every waiter thread; each must have got in.
fn all_served(waiters: Vec<JoinHandle<redguard::Result<()>>>) {
    for (i, waiter) in waiters.into_iter().enumerate() {
        let result = waiter.join().expect("a waiter thread panicked");
        assert!(result.is_ok(), "waiter {i}: {result:?}");
    }
}

/// A key held, five waiters of five lockers queued one after another: the releases serve
/// them exactly in the order they arrived.
#[test]
fn lock_waiters_of_different_lockers_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let holder = locker(&server).lock(&["k"]).unwrap();
    let served = Served::default();
    let waiters = one_after_another(&server, "k", 0, 5, |i| {
        let (locker, served) = (locker(&server), served.clone());
        thread::spawn(move || {
            let guard = locker.lock_with(&["k"], in_line())?;
            served.record(format!("w{i}"));
            guard.release()
        })
    });
    holder.release().unwrap();
    all_served(waiters);
    assert_eq!(served.order(), names("w", 5));
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

/// A semaphore of two, one permit held throughout, the other passed along: five waiters
/// of five lockers get it in the order they arrived, never more than two inside.
#[test]
fn permit_waiters_of_different_lockers_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let owner = locker(&server);
    let semaphore = owner.semaphore("s", 2).unwrap();
    let kept = semaphore.acquire().unwrap();
    let passed = semaphore.acquire().unwrap();
    let served = Served::default();
    let waiters = one_after_another(&server, "s", 0, 5, |i| {
        let (locker, served) = (locker(&server), served.clone());
        thread::spawn(move || {
            let semaphore = locker.semaphore("s", 2)?;
            let permit = semaphore.acquire_with(in_line())?;
            served.record(format!("w{i}"));
            // The kept permit and this one: none free.
            assert_eq!(semaphore.available()?, 0, "waiter {i}: a third holder?");
            permit.release()
        })
    });
    passed.release().unwrap();
    all_served(waiters);
    assert_eq!(served.order(), names("w", 5));
    assert!(!kept.is_lost());
    assert_eq!(
        semaphore.holders().unwrap().len(),
        1,
        "only the kept permit"
    );
    kept.release().unwrap();
}

/// Readers hold a key; a writer queues, then three readers behind it. Once the holders
/// leave, the writer gets in before the later readers (alone), and those then go in
/// together: the three are inside at once.
#[test]
fn a_writer_queued_among_readers_goes_before_the_later_readers_which_then_share() {
    let server = RedisServer::start();
    let owner = locker(&server);
    let readers_inside = Arc::new(AtomicUsize::new(0));
    let holders = [owner.read(&["k"]).unwrap(), owner.read(&["k"]).unwrap()];
    readers_inside.fetch_add(2, Ordering::SeqCst);
    let served = Served::default();

    let writer = {
        let (locker, served, readers_inside) =
            (locker(&server), served.clone(), readers_inside.clone());
        thread::spawn(move || {
            let guard = locker.lock_with(&["k"], in_line())?;
            let readers = readers_inside.load(Ordering::SeqCst);
            served.record(format!("writer with {readers} readers"));
            guard.release()
        })
    };
    eventually(TO_QUEUE, "the writer is queued", || server.queued("k") == 1);
    assert!(
        owner.try_read(&["k"]).unwrap().is_none(),
        "a new reader waits behind the queued writer"
    );

    const LATE: usize = 3;
    // How many late readers are inside at once, at most.
    let together = Arc::new(AtomicUsize::new(0));
    let most_together = Arc::new(AtomicUsize::new(0));
    let late = one_after_another(&server, "k", 1, LATE, |i| {
        let locker = locker(&server);
        let (served, readers_inside) = (served.clone(), readers_inside.clone());
        let (together, most_together) = (together.clone(), most_together.clone());
        thread::spawn(move || {
            let guard = locker.read_with(&["k"], in_line())?;
            readers_inside.fetch_add(1, Ordering::SeqCst);
            served.record(format!("reader{i}"));
            let now = together.fetch_add(1, Ordering::SeqCst) + 1;
            most_together.fetch_max(now, Ordering::SeqCst);
            // Stays in until all of them are (bounded: served one by one, it goes on).
            let deadline = Instant::now() + Duration::from_secs(5);
            while most_together.load(Ordering::SeqCst) < LATE && Instant::now() < deadline {
                thread::sleep(Duration::from_millis(2));
            }
            together.fetch_sub(1, Ordering::SeqCst);
            readers_inside.fetch_sub(1, Ordering::SeqCst);
            guard.release()
        })
    });

    let [first, second] = holders;
    readers_inside.fetch_sub(1, Ordering::SeqCst);
    first.release().unwrap();
    // One reader is left: nobody is served yet (the writer is first in line).
    let entries = server.queue_entries("k");
    assert_eq!(entries.len(), 1 + LATE, "still all in line: {entries:?}");
    assert!(entries[0].starts_with('l'), "the writer first: {entries:?}");
    readers_inside.fetch_sub(1, Ordering::SeqCst);
    second.release().unwrap();

    all_served(vec![writer]);
    all_served(late);
    let order = served.order();
    assert_eq!(order[0], "writer with 0 readers", "{order:?}");
    let mut readers = order[1..].to_vec();
    readers.sort();
    assert_eq!(readers, names("reader", LATE), "{order:?}");
    assert_eq!(
        most_together.load(Ordering::SeqCst),
        LATE,
        "the late readers were let in together"
    );
}

/// Three processes, each with its locker, queued one after another for a held key: each
/// appends its number to a Redis list inside its critical section, and the list comes out
/// in the order they arrived.
#[test]
fn waiters_in_different_processes_are_served_in_arrival_order() {
    let server = RedisServer::start();
    let holder = locker(&server).lock(&["k"]).unwrap();
    let children: Vec<Child> = one_after_another(&server, "k", 0, 3, |i| {
        child_test("order::arrival_child")
            .env("REDGUARD_ORDER_URL", server.url())
            .env("REDGUARD_ORDER_INDEX", i.to_string())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("start a child process")
    });
    holder.release().unwrap();
    for (i, child) in children.into_iter().enumerate() {
        // Bounded: the child gives up after PATIENCE.
        let output = child.wait_with_output().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success() && stdout.contains("1 passed"),
            "child {i} failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let order: Vec<String> = server.query(&["LRANGE", "served", "0", "-1"]);
    assert_eq!(order, ["0", "1", "2"]);
}

#[test]
#[ignore = "run by waiters_in_different_processes_are_served_in_arrival_order"]
fn arrival_child() {
    let url = std::env::var("REDGUARD_ORDER_URL").expect("run by the parent test");
    let index = std::env::var("REDGUARD_ORDER_INDEX").expect("run by the parent test");
    let locker = Locker::connect(url.as_str()).unwrap();
    let guard = locker.lock_with(&["k"], in_line()).unwrap();
    let mut con = redis::Client::open(url).unwrap().get_connection().unwrap();
    redis::cmd("RPUSH")
        .arg("served")
        .arg(&index)
        .query::<()>(&mut con)
        .unwrap();
    guard.release().unwrap();
}

/// What MONITOR shows of the server's commands (those run by scripts too) until `marker`
/// is echoed: each line, lowercased.
struct Monitor(redis::Connection);

impl Monitor {
    fn start(server: &RedisServer) -> Monitor {
        let mut con = server.connection(); // every read bounded (2 s)
        redis::cmd("MONITOR").query::<()>(&mut con).unwrap();
        Monitor(con)
    }

    fn until(mut self, server: &RedisServer, marker: &str) -> Vec<String> {
        server.query::<String>(&["ECHO", marker]);
        let mut lines = Vec::new();
        let deadline = Instant::now() + Duration::from_secs(10);
        while lines
            .last()
            .is_none_or(|line: &String| !line.contains(marker))
        {
            assert!(Instant::now() < deadline, "MONITOR never showed {marker}");
            let line: String = redis::from_redis_value(self.0.recv_response().unwrap()).unwrap();
            lines.push(line.to_lowercase());
        }
        lines
    }
}

/// Fifty uncontended holds of every kind, taken and released: nobody waits, so no
/// PUBLISH is sent (neither by the scripts nor by the clients), as the command counts and
/// MONITOR both show.
#[test]
fn nothing_is_published_when_nobody_waits() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let semaphore = locker.semaphore("s", 2).unwrap();
    let publishes = server.calls("publish");
    let monitor = Monitor::start(&server);
    for round in 0..10 {
        locker.lock(&["k"]).unwrap().release().unwrap();
        locker.lock(&["a", "b"]).unwrap().release().unwrap();
        drop(locker.lock(&["k"]).unwrap()); // released by the drop
        locker.read(&["r"]).unwrap().release().unwrap();
        semaphore.acquire().unwrap().release().unwrap();
        assert_eq!(server.all_keys(), Vec::<String>::new(), "round {round}");
    }
    let seen = monitor.until(&server, "order-monitor-end");
    assert_eq!(server.calls("publish"), publishes, "PUBLISH counted");
    let published: Vec<_> = seen.iter().filter(|l| l.contains("\"publish\"")).collect();
    assert!(published.is_empty(), "{published:?}");
    // MONITOR saw them: a script call to take and one to give up each hold.
    let scripts = seen.iter().filter(|l| l.contains("\"evalsha\"")).count();
    assert!(scripts >= 100, "{scripts} script calls seen");
}
