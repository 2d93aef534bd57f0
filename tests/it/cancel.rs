//! Cancellable waits: a `Cancel` (or the locker's `close`) ends a wait from another thread
//! within a bound, whatever it waits for (a lock, a read lock, a permit, a term; in the
//! server's queue or listening for releases), and leaves nothing behind: no queue entry,
//! no key, and a hand-over that raced the cancel goes to the next in line.

use std::sync::{Arc, Barrier};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use redguard::{Cancel, Error, LockOptions, Locker, Retry};

use crate::election::lock_key;
use crate::order::in_line;
use crate::server::RedisServer;
use crate::{eventually, locker, tight};

/// What the issue asks is 100 ms from cancel to return; asserted with room for this
/// noisy 2-core machine (each test prints what it measured).
const PROMPT: Duration = Duration::from_millis(500);
/// How long a new waiter may take to be queued on a loaded machine.
const TO_QUEUE: Duration = Duration::from_secs(15);

/// A locker whose waiters' places live 30 s: its refresher would take a place on only
/// after 5 s (a sixth), and a hand-over it kept without a guard would last that long, so
/// neither can pass for a prompt cancel here.
fn patient(server: &RedisServer) -> Locker {
    Locker::builder()
        .pool_size(4)
        .io_timeout(Duration::from_secs(2))
        .waiter_lifetime(Duration::from_secs(30))
        .build(server.url())
        .expect("connect to the test's redis-server")
}

/// A waiting thread's result, and when it returned.
type Waiting<T> = JoinHandle<(redguard::Result<T>, Instant)>;

fn waiting<T: Send + 'static>(
    wait: impl FnOnce() -> redguard::Result<T> + Send + 'static,
) -> Waiting<T> {
    thread::spawn(move || {
        let result = wait();
        (result, Instant::now())
    })
}

/// Cancels `cancel` now, and checks that `waiter` returns `Cancelled` within [`PROMPT`].
fn cancelled_promptly<T: std::fmt::Debug>(what: &str, cancel: &Cancel, waiter: Waiting<T>) {
    let cancelled_at = Instant::now();
    cancel.cancel();
    let (result, returned_at) = waiter.join().expect("the waiter panicked");
    let took = returned_at - cancelled_at;
    println!("{what}: cancel to return {took:?}");
    assert!(
        matches!(result, Err(Error::Cancelled)),
        "{what}: {result:?}"
    );
    assert!(took < PROMPT, "{what}: returned {took:?} after the cancel");
}

/// Waits until `key`'s queue holds `count` entries.
fn queued(server: &RedisServer, key: &str, count: u64) {
    eventually(TO_QUEUE, &format!("{count} queued on {key}"), || {
        server.queued(key) == count
    });
}

/// Gives waiters just queued (or listening) time to go to sleep: a locker's subscriber,
/// once subscribed, has its waiters ask once more. Not an assertion: a waiter still awake
/// when cancelled ends as promptly, only the test would not test the wake-up then.
fn settle() {
    thread::sleep(Duration::from_millis(200));
}

#[test]
fn a_lock_waiter_of_another_locker_is_cancelled_promptly_and_leaves_nothing() {
    let server = RedisServer::start();
    let holder = locker(&server).lock(&["k"]).unwrap();
    let cancel = Cancel::new();
    let waiter = {
        let (locker, options) = (patient(&server), in_line().cancel(&cancel));
        waiting(move || locker.lock_with(&["k"], options.metadata("waiter")))
    };
    queued(&server, "k", 1);
    settle();
    cancelled_promptly("lock", &cancel, waiter);
    assert!(server.queue_entries("k").is_empty(), "its entry is gone");
    holder.release().unwrap();
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

/// A waiter of the holder's own locker first waits for its locker's release to let it
/// in (`wait::Pending`), then in the queue; `close` ends it there.
#[test]
fn a_lock_waiter_of_the_holders_own_locker_is_ended_by_close() {
    let server = RedisServer::start();
    let locker = patient(&server);
    let holder = locker.lock(&["k"]).unwrap();
    let waiter = {
        let locker = locker.clone();
        waiting(move || locker.lock_with(&["k"], in_line()))
    };
    queued(&server, "k", 1);
    settle();
    let closed_at = Instant::now();
    locker.close();
    let (result, returned_at) = waiter.join().unwrap();
    println!("lock closed: close to return {:?}", returned_at - closed_at);
    assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    assert!(returned_at - closed_at < PROMPT);
    assert!(server.queue_entries("k").is_empty());
    holder.release().unwrap();
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

#[test]
fn a_permit_waiter_is_cancelled_promptly_and_leaves_nothing() {
    let server = RedisServer::start();
    let held = locker(&server)
        .semaphore("s", 1)
        .unwrap()
        .acquire()
        .unwrap();
    let cancel = Cancel::new();
    let waiter = {
        let semaphore = patient(&server).semaphore("s", 1).unwrap();
        let options = in_line().cancel(&cancel);
        waiting(move || semaphore.acquire_with(options))
    };
    queued(&server, "s", 1);
    settle();
    cancelled_promptly("acquire", &cancel, waiter);
    assert!(server.queue_entries("s").is_empty(), "its entry is gone");
    let holders = locker(&server)
        .semaphore("s", 1)
        .unwrap()
        .holders()
        .unwrap();
    assert_eq!(holders.len(), 1, "only the permit held before: {holders:?}");
    held.release().unwrap();
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

#[test]
fn a_reader_waiting_for_a_writer_is_cancelled_promptly_and_leaves_nothing() {
    let server = RedisServer::start();
    let writer = locker(&server).lock(&["r"]).unwrap();
    let cancel = Cancel::new();
    let reader = {
        let (locker, options) = (patient(&server), in_line().cancel(&cancel));
        waiting(move || locker.read_with(&["r"], options))
    };
    queued(&server, "r", 1);
    settle();
    cancelled_promptly("read", &cancel, reader);
    assert!(server.queue_entries("r").is_empty(), "its entry is gone");
    writer.release().unwrap();
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

#[test]
fn a_candidate_is_cancelled_promptly_and_leaves_nothing() {
    let server = RedisServer::start();
    let leader = locker(&server)
        .election("e")
        .unwrap()
        .campaign("a")
        .unwrap();
    let cancel = Cancel::new();
    let candidate = {
        let election = patient(&server).election("e").unwrap();
        let options = in_line().cancel(&cancel);
        waiting(move || election.campaign_with("b", options))
    };
    queued(&server, &lock_key("e"), 1);
    settle();
    cancelled_promptly("campaign", &cancel, candidate);
    assert!(
        server.queue_entries(&lock_key("e")).is_empty(),
        "its entry is gone"
    );
    let now = locker(&server).election("e").unwrap().leader().unwrap();
    assert_eq!(now.map(|l| l.value().to_owned()).as_deref(), Some("a"));
    leader.resign().unwrap();
}

/// On a quorum nobody queues: the waiter listens for releases (a ticket on the board),
/// and the cancel wakes it there.
#[test]
fn a_waiter_on_a_quorum_is_cancelled_promptly_and_leaves_nothing() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let redlock = || {
        Locker::builder()
            .pool_size(4)
            .node_timeout(Duration::from_millis(300))
            .build_redlock(&urls)
            .unwrap()
    };
    let holder = redlock().lock(&["k"]).unwrap();
    let cancel = Cancel::new();
    let waiter = {
        let (locker, options) = (redlock(), in_line().cancel(&cancel));
        waiting(move || locker.lock_with(&["k"], options))
    };
    // Listening for releases: subscribed to the key's release channel.
    eventually(TO_QUEUE, "the waiter listens", || {
        servers
            .iter()
            .any(|s| s.subscribers("redguard:released:k") > 0)
    });
    settle();
    cancelled_promptly("quorum lock", &cancel, waiter);
    let token = holder.token().to_owned();
    for server in &servers {
        assert_eq!(server.all_keys(), ["k"]);
        let value: String = server.query(&["GET", "k"]);
        assert!(value.contains(&token), "the holder's: {value}");
    }
    holder.release().unwrap();
}

/// Cancelled before the call, or after `close`: `Cancelled` at once, before any round
/// trip, which the frozen server would not answer (an I/O error after 300 ms).
#[test]
fn a_wait_cancelled_before_it_starts_ends_at_once_without_a_round_trip() {
    let server = RedisServer::start();
    let locker = tight().build(server.url()).unwrap();
    let semaphore = locker.semaphore("s", 1).unwrap();
    let election = locker.election("e").unwrap();
    let cancel = Cancel::new();
    cancel.cancel();
    server.pause();
    let options = || LockOptions::default().cancel(&cancel);
    let started = Instant::now();
    let results = [
        locker.lock_with(&["k"], options()).map(drop),
        locker.try_lock_with(&["k"], options()).map(drop),
        locker.read_with(&["k"], options()).map(drop),
        semaphore.acquire_with(options()).map(drop),
        election.campaign_with("a", options()).map(drop),
    ];
    let took = started.elapsed();
    println!("five calls cancelled before they started: {took:?}");
    for result in results {
        assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    }
    assert!(took < Duration::from_millis(250), "{took:?}: a round trip?");

    locker.close();
    let started = Instant::now();
    let results = [
        locker.lock(&["k"]).map(drop),
        locker.try_lock(&["k"]).map(drop),
        locker.read(&["k"]).map(drop),
        locker.try_read(&["k"]).map(drop),
        semaphore.acquire().map(drop),
        semaphore.try_acquire().map(drop),
        election.campaign("a").map(drop),
        election.try_campaign("a").map(drop),
    ];
    let took = started.elapsed();
    println!("eight calls after close: {took:?}");
    for result in results {
        assert!(matches!(result, Err(Error::Cancelled)), "{result:?}");
    }
    assert!(took < Duration::from_millis(250), "{took:?}: a round trip?");
    server.resume();
}

/// Eight threads of one locker wait (locks, read locks, permits; retrying only every
/// 10 s); `close` ends all eight, later calls end at once, and a guard held before is
/// still held, refreshed, and released as usual.
#[test]
fn close_ends_eight_waits_and_later_calls_and_leaves_the_guards_held() {
    let server = RedisServer::start();
    let locker = patient(&server);
    let ttl = Duration::from_millis(400);
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(ttl))
        .unwrap();
    let semaphore = locker.semaphore("s", 1).unwrap();
    let permit = semaphore.acquire().unwrap();
    let mut waiters: Vec<Waiting<()>> = Vec::new();
    for i in 0..8 {
        let (locker, semaphore) = (locker.clone(), semaphore.clone());
        waiters.push(waiting(move || match i % 4 {
            0 | 1 => locker.lock_with(&["k"], in_line()).map(drop),
            2 => locker.read_with(&["k"], in_line()).map(drop),
            _ => semaphore.acquire_with(in_line()).map(drop),
        }));
    }
    queued(&server, "k", 6);
    queued(&server, "s", 2);
    settle();
    let closed_at = Instant::now();
    locker.close();
    let mut slowest = Duration::ZERO;
    for (i, waiter) in waiters.into_iter().enumerate() {
        let (result, returned_at) = waiter.join().unwrap();
        assert!(
            matches!(result, Err(Error::Cancelled)),
            "waiter {i}: {result:?}"
        );
        slowest = slowest.max(returned_at - closed_at);
    }
    println!("close to the last of 8 waiters' return: {slowest:?}");
    assert!(slowest < PROMPT, "{slowest:?}");
    assert!(server.queue_entries("k").is_empty() && server.queue_entries("s").is_empty());

    let started = Instant::now();
    assert!(matches!(locker.lock(&["other"]), Err(Error::Cancelled)));
    assert!(matches!(semaphore.try_acquire(), Err(Error::Cancelled)));
    assert!(started.elapsed() < Duration::from_millis(250));

    // Past its TTL twice over: the refresher kept it.
    thread::sleep(ttl * 2);
    assert!(!guard.is_lost());
    assert!(guard.ttl().unwrap().is_some(), "still held");
    assert_eq!(locker.holders("k").unwrap().len(), 1);
    guard.release().unwrap();
    permit.release().unwrap();
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
}

/// A holder releases just as the waiter first in line is cancelled, many times over: the
/// waiter either returns the lock (then it alone holds it) or `Cancelled` (then the key
/// goes on to a third waiter at once); never a key nobody owns. The waiter's place lives
/// 30 s (see [`patient`]): a hand-over it kept without a guard would hold the third up
/// that long.
#[test]
fn a_hand_over_racing_a_cancel_is_kept_with_a_guard_or_passed_on() {
    let server = RedisServer::start();
    let (holders, waiters, thirds) = (patient(&server), patient(&server), locker(&server));
    let (mut kept, mut passed) = (0, 0);
    for round in 0..40 {
        let holder = holders.lock(&["k"]).unwrap();
        // Every other round the waiter is of the holder's own locker, which hears of the
        // hand-over from the release's reply rather than from a message.
        let waiter_locker = if round % 2 == 0 { &waiters } else { &holders };
        let cancel = Cancel::new();
        let waiter = {
            let (locker, options) = (waiter_locker.clone(), in_line().cancel(&cancel));
            waiting(move || locker.lock_with(&["k"], options.metadata("waiter")))
        };
        queued(&server, "k", 1);
        let third = {
            let locker = thirds.clone();
            let options = in_line().retry(Retry::linear(Duration::from_secs(30)));
            waiting(move || locker.lock_with(&["k"], options.metadata("third")))
        };
        queued(&server, "k", 2);

        let barrier = Arc::new(Barrier::new(2));
        let releasing = {
            let barrier = Arc::clone(&barrier);
            thread::spawn(move || {
                barrier.wait();
                holder.release().unwrap();
            })
        };
        barrier.wait();
        // The cancel comes with the release, or up to 1 ms later (about when the waiter
        // hears of its hand-over), a little later each round.
        let raced_at = Instant::now();
        let lag = Duration::from_micros(round * 50 % 1000);
        while raced_at.elapsed() < lag {
            std::hint::spin_loop();
        }
        cancel.cancel();
        releasing.join().unwrap();
        let (result, _) = waiter.join().unwrap();
        match result {
            Ok(guard) => {
                kept += 1;
                let now = holders.holders("k").unwrap();
                assert_eq!(now.len(), 1, "round {round}: {now:?}");
                assert_eq!(now[0].metadata(), "waiter", "round {round}");
                guard.release().unwrap();
            }
            Err(Error::Cancelled) => passed += 1,
            Err(e) => panic!("round {round}: {e}"),
        }
        let (third, got_at) = third.join().unwrap();
        let third = third
            .unwrap_or_else(|e| panic!("round {round}: the third: {e} (the key kept for nobody?)"));
        let took = got_at - raced_at;
        assert!(
            took < Duration::from_secs(5),
            "round {round}: the third waited {took:?}"
        );
        let now = holders.holders("k").unwrap();
        assert_eq!(now.len(), 1, "round {round}: {now:?}");
        assert_eq!(now[0].metadata(), "third", "round {round}");
        third.release().unwrap();
        assert_eq!(
            server.all_keys(),
            Vec::<String>::new(),
            "round {round}: left"
        );
    }
    println!("hand-over racing a cancel: kept with a guard {kept}, passed on {passed}");
}
