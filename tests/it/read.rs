//! Read locks: shared holds that exclude lock(), writers first, on the server's clock.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, ReadGuard, Retry};

use crate::server::RedisServer;
use crate::{eventually, locker};

/// A retry delay far longer than any wait below: whoever gets in quickly was woken.
fn sleepy() -> LockOptions {
    LockOptions::default().retry(Retry::linear(Duration::from_secs(30)))
}

fn manual(ttl: Duration) -> LockOptions {
    LockOptions::default().ttl(ttl).auto_refresh(false)
}

#[test]
fn readers_share_a_key() {
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(8).build(server.url()).unwrap();
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let threads: Vec<_> = (0..4)
        .map(|_| {
            let (locker, inside, most) = (locker.clone(), inside.clone(), most.clone());
            thread::spawn(move || {
                let guard = locker.read(&["config"]).unwrap();
                let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                most.fetch_max(now, Ordering::SeqCst);
                // Stay until another reader is inside too (bounded: fails below if never).
                let until = Instant::now() + Duration::from_secs(5);
                while most.load(Ordering::SeqCst) < 2 && Instant::now() < until {
                    thread::sleep(Duration::from_millis(1));
                }
                inside.fetch_sub(1, Ordering::SeqCst);
                guard.release().unwrap();
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    assert!(most.load(Ordering::SeqCst) >= 2, "readers never overlapped");
    assert_eq!(
        server.query::<u32>(&["DBSIZE"]),
        0,
        "the last reader deletes the key"
    );
}

#[test]
fn a_lock_never_overlaps_a_reader_or_another_lock() {
    let server = RedisServer::start();
    // Two lockers (two processes, as far as Redis can tell) and threads sharing each.
    let lockers: Vec<Locker> = (0..2)
        .map(|_| Locker::builder().pool_size(8).build(server.url()).unwrap())
        .collect();
    let readers = Arc::new(AtomicUsize::new(0));
    let writers = Arc::new(AtomicUsize::new(0));
    let overlaps = Arc::new(AtomicUsize::new(0));
    let (reads, writes) = (Arc::new(AtomicUsize::new(0)), Arc::new(AtomicUsize::new(0)));
    let deadline = Instant::now() + Duration::from_secs(2);
    let mut threads = Vec::new();
    for i in 0..6 {
        let locker = lockers[i % 2].clone();
        let (readers, writers, overlaps) = (readers.clone(), writers.clone(), overlaps.clone());
        let (reads, writes) = (reads.clone(), writes.clone());
        threads.push(thread::spawn(move || {
            let keys: &[&str] = if i % 2 == 0 { &["a", "b"] } else { &["b"] };
            while Instant::now() < deadline {
                if i < 4 {
                    let _guard = locker.read(keys).unwrap();
                    readers.fetch_add(1, Ordering::SeqCst);
                    if writers.load(Ordering::SeqCst) > 0 {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_micros(300));
                    readers.fetch_sub(1, Ordering::SeqCst);
                    reads.fetch_add(1, Ordering::SeqCst);
                } else {
                    let _guard = locker.lock(keys).unwrap();
                    if writers.fetch_add(1, Ordering::SeqCst) > 0
                        || readers.load(Ordering::SeqCst) > 0
                    {
                        overlaps.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(Duration::from_micros(300));
                    writers.fetch_sub(1, Ordering::SeqCst);
                    writes.fetch_add(1, Ordering::SeqCst);
                }
            }
        }));
    }
    for thread in threads {
        thread.join().unwrap();
    }
    assert_eq!(overlaps.load(Ordering::SeqCst), 0);
    let (reads, writes) = (reads.load(Ordering::SeqCst), writes.load(Ordering::SeqCst));
    assert!(reads > 20 && writes > 10, "{reads} reads, {writes} writes");
}

#[test]
fn a_waiting_lock_gets_in_behind_a_stream_of_readers_and_new_readers_wait_for_it() {
    let server = RedisServer::start();
    let locker = Locker::builder().pool_size(12).build(server.url()).unwrap();
    let hold = Duration::from_millis(100);
    let stop = Arc::new(AtomicBool::new(false));
    let written = Arc::new(AtomicBool::new(false));
    let late_readers = Arc::new(AtomicUsize::new(0));
    // Four readers, each taking the key again at once: some reader always holds it.
    let readers: Vec<_> = (0..4)
        .map(|i| {
            let (locker, stop) = (locker.clone(), stop.clone());
            let (written, late_readers) = (written.clone(), late_readers.clone());
            thread::spawn(move || {
                thread::sleep(hold * i / 4);
                while !stop.load(Ordering::SeqCst) {
                    let guard = locker.read(&["k"]).unwrap();
                    if written.load(Ordering::SeqCst) {
                        late_readers.fetch_add(1, Ordering::SeqCst);
                    }
                    thread::sleep(hold);
                    drop(guard);
                }
            })
        })
        .collect();
    thread::sleep(hold * 2);
    let asked = Instant::now();
    let guard = locker.lock(&["k"]).unwrap();
    let waited = asked.elapsed();
    written.store(true, Ordering::SeqCst);
    thread::sleep(hold);
    // Readers that came after the lock asked waited for it: none is inside with it.
    assert_eq!(late_readers.load(Ordering::SeqCst), 0);
    drop(guard);
    stop.store(true, Ordering::SeqCst);
    for reader in readers {
        reader.join().unwrap();
    }
    assert!(
        waited < hold * 4,
        "the lock waited {waited:?} behind readers holding {hold:?} each"
    );
    assert!(
        late_readers.load(Ordering::SeqCst) > 0,
        "readers went on after it"
    );
}

#[test]
fn a_dead_reader_and_a_dead_writers_intent_stop_blocking_once_their_ttl_passes() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let ttl = Duration::from_millis(500);
    std::mem::forget(locker.read_with(&["k"], manual(ttl)).unwrap());
    let asked = Instant::now();
    let guard = locker.lock_with(&["k"], sleepy().timeout(Duration::from_secs(5)));
    let waited = asked.elapsed();
    assert!(guard.is_ok(), "{guard:?}");
    assert!(waited < ttl + Duration::from_secs(1), "{waited:?}");
    drop(guard);

    // A writer that died waiting: its place in the queue, as a waiting lock takes it, with
    // 500 ms left.
    let _reader = locker.read(&["j"]).unwrap();
    let time: Vec<u64> = server.query(&["TIME"]);
    let expiry = (time[0] * 1000 + time[1] / 1000 + 500).to_string();
    let entry = "l1,30000,0,7,4,11:deaddead-writer";
    server.query::<u32>(&["ZADD", &crate::server::queue_of("j"), "1", entry]);
    server.query::<u32>(&["ZADD", "redguard:alive:{j}", &expiry, entry]);
    server.query::<String>(&["SET", "redguard:ticket:{j}", "1"]);
    assert!(
        locker.try_read(&["j"]).unwrap().is_none(),
        "readers wait behind it"
    );
    let asked = Instant::now();
    // A long retry delay: only being told when the intent expires gets it in in time.
    let reader = locker.read_with(&["j"], sleepy().timeout(Duration::from_secs(5)));
    assert!(reader.is_ok(), "{reader:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(2),
        "{:?}",
        asked.elapsed()
    );
}

#[test]
fn a_writer_that_gives_up_takes_its_intent_back() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _reader = locker.read(&["k"]).unwrap();
    let timeout = Duration::from_millis(200);
    let result = locker.lock_with(&["k"], LockOptions::default().timeout(timeout));
    assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
    // No intent is left behind: a new reader gets in at once.
    assert!(locker.try_read(&["k"]).unwrap().is_some());
    let members: Vec<String> = server.query(&["ZRANGE", "k", "0", "-1"]);
    assert!(members.iter().all(|m| !m.starts_with('!')), "{members:?}");
    // try_lock records no intent at all.
    assert!(locker.try_lock(&["k"]).unwrap().is_none());
    assert!(locker.try_read(&["k"]).unwrap().is_some());
}

#[test]
fn all_or_nothing_across_keys() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let reading = locker.read(&["a", "b"]).unwrap();
    assert!(locker.try_lock(&["b", "c"]).unwrap().is_none());
    assert_eq!(server.query::<u32>(&["EXISTS", "c"]), 0, "c not taken");
    drop(reading);
    let _locked = locker.lock(&["c"]).unwrap();
    assert!(locker.try_read(&["a", "c"]).unwrap().is_none());
    assert_eq!(server.query::<u32>(&["EXISTS", "a"]), 0, "a not taken");
    assert!(locker.try_read(&["a", "b"]).unwrap().is_some());
}

/// Waits until a thread waiting for `key` has tried, found it held and now listens.
fn until_listening<T>(server: &RedisServer, key: &str, waiter: &thread::JoinHandle<T>) {
    eventually(Duration::from_secs(5), "the waiter listens", || {
        server.queued(key) > 0
    });
    thread::sleep(Duration::from_millis(50));
    assert!(!waiter.is_finished(), "it got in without waiting");
}

#[test]
fn releases_wake_waiters_both_ways() {
    let server = RedisServer::start();
    let locker = locker(&server);
    // The last reader's release wakes a waiting lock.
    let reading = locker.read(&["k1"]).unwrap();
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || (locker.lock_with(&["k1"], sleepy()).unwrap(), Instant::now()))
    };
    until_listening(&server, "k1", &waiter);
    let released = Instant::now();
    drop(reading);
    let (_locked, got) = waiter.join().unwrap();
    assert!(got.duration_since(released) < Duration::from_secs(1));

    // A lock's release wakes a waiting reader.
    let locked = locker.lock(&["k2"]).unwrap();
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || (locker.read_with(&["k2"], sleepy()).unwrap(), Instant::now()))
    };
    until_listening(&server, "k2", &waiter);
    let released = Instant::now();
    drop(locked);
    let (_reading, got) = waiter.join().unwrap();
    assert!(got.duration_since(released) < Duration::from_secs(1));
}

#[test]
fn downgrade_lets_readers_in_and_keeps_locks_out() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let options = LockOptions::default().fencing(true).metadata("m");
    let writing = locker.lock_with(&["k"], options).unwrap();
    let fence = writing.fence();
    let waiting_reader = {
        let locker = locker.clone();
        thread::spawn(move || locker.read_with(&["k"], sleepy()).unwrap())
    };
    until_listening(&server, "k", &waiting_reader);
    let reading: ReadGuard = writing.downgrade().unwrap();
    assert_eq!((reading.fence(), reading.metadata()), (fence, "m"));
    let other = waiting_reader.join().unwrap(); // woken by the downgrade
    assert!(
        locker.try_lock(&["k"]).unwrap().is_none(),
        "no lock while read"
    );
    assert!(reading.ttl().unwrap().is_some());
    drop(reading);
    assert!(
        locker.try_lock(&["k"]).unwrap().is_none(),
        "the other reader is still in"
    );
    other.release().unwrap();
    assert!(locker.try_lock(&["k"]).unwrap().is_some());
}

#[test]
fn a_lock_held_elsewhere_makes_a_waiting_lock_record_no_intent() {
    // Were the intent kept while a lock holds another of its keys, a reader that holds
    // that lock and asks to read would wait for a writer that waits for it.
    let server = RedisServer::start();
    let locker = locker(&server);
    let _reader = locker.read(&["a"]).unwrap();
    let holder_of_b = locker.lock(&["b"]).unwrap();
    let waiting = {
        let locker = locker.clone();
        let options = LockOptions::default().timeout(Duration::from_secs(3));
        thread::spawn(move || locker.lock_with(&["a", "b"], options).map(drop))
    };
    // The lock above tried, and waits (listening for its keys' releases).
    eventually(Duration::from_secs(2), "the lock waits", || {
        server.queued("b") > 0
    });
    assert!(!waiting.is_finished());
    let asked = Instant::now();
    let options = LockOptions::default().timeout(Duration::from_secs(2));
    let reading = locker.read_with(&["a"], options);
    assert!(reading.is_ok(), "{reading:?}");
    assert!(
        asked.elapsed() < Duration::from_secs(1),
        "{:?}",
        asked.elapsed()
    );
    drop((reading, holder_of_b));
    let waited = waiting.join().unwrap();
    assert!(matches!(waited, Err(Error::NotObtained)), "{waited:?}");
}

#[test]
fn a_stale_permit_never_touches_a_read_lock_of_the_same_name() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let permit = locker
        .semaphore("x", 1)
        .unwrap()
        .acquire_with(manual(Duration::from_millis(100)))
        .unwrap();
    eventually(Duration::from_secs(2), "the permit expires", || {
        server.query::<u32>(&["EXISTS", "x"]) == 0
    });
    let _reading = locker.read(&["x"]).unwrap();
    // And a waiting lock's intent, which outlives the reader (the key's TTL with it).
    let time: Vec<u64> = server.query(&["TIME"]);
    let intent_end = time[0] * 1000 + time[1] / 1000 + 60_000;
    server.query::<u32>(&["ZADD", "x", &format!("-{intent_end}"), "!writer"]);
    server.query::<u32>(&["PEXPIREAT", "x", &intent_end.to_string()]);
    let before: Vec<String> = server.query(&["ZRANGE", "x", "0", "-1", "WITHSCORES"]);
    let pttl: i64 = server.query(&["PTTL", "x"]);
    assert!(matches!(permit.release(), Err(Error::LockLost)));
    let after: Vec<String> = server.query(&["ZRANGE", "x", "0", "-1", "WITHSCORES"]);
    assert_eq!(before, after);
    assert!(
        server.query::<i64>(&["PTTL", "x"]) > pttl - 1000,
        "its TTL is left alone"
    );
}

#[test]
fn a_reader_gets_the_keys_fencing_counters_as_they_are() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let fenced = LockOptions::default().fencing(true);
    let reading = locker.read_with(&["a", "b"], fenced.clone()).unwrap();
    assert_eq!(reading.fences(), [0, 0], "no lock took a token yet");
    drop(reading);
    let locked = locker.lock_with(&["a"], fenced.clone()).unwrap();
    let token = locked.fence().unwrap();
    drop(locked);
    let reading = locker.read_with(&["a", "b"], fenced).unwrap();
    assert_eq!(reading.fences(), [token, 0]);
}

#[test]
fn readers_are_refreshed_and_never_revived() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let ttl = Duration::from_millis(800);
    let auto = locker
        .read_with(&["k", "j"], LockOptions::default().ttl(ttl))
        .unwrap();
    let by_hand = locker
        .read_with(&["k"], manual(Duration::from_secs(30)))
        .unwrap();
    thread::sleep(ttl * 3); // three TTLs
    assert!(!auto.is_lost() && auto.ttl().unwrap().is_some());
    // As if the server's clock had jumped: both expired there.
    for guard in [&auto, &by_hand] {
        server.query::<u32>(&["ZADD", "k", "XX", "1", guard.token()]);
    }
    assert!(matches!(
        by_hand.refresh(Duration::from_secs(30)),
        Err(Error::LockLost)
    ));
    eventually(
        Duration::from_secs(2),
        "the refresher finds it gone",
        || auto.is_lost(),
    );
    let score: Option<String> = server.query(&["ZSCORE", "k", auto.token()]);
    assert!(
        score.as_deref().is_none_or(|s| s == "1"),
        "not revived: {score:?}"
    );
    assert!(matches!(auto.release(), Err(Error::LockLost)));
}

#[test]
fn other_types_are_refused_and_left_alone() {
    let server = RedisServer::start();
    let locker = locker(&server);
    server.query::<u32>(&["RPUSH", "list", "x"]);
    match locker.try_read(&["list"]) {
        Err(Error::WrongType { key, kind }) => assert_eq!((&*key, &*kind), ("list", "list")),
        other => panic!("{other:?}"),
    }
    assert_eq!(
        server.query::<Vec<String>>(&["LRANGE", "list", "0", "-1"]),
        ["x"]
    );
    server.query::<u32>(&["ZADD", "board", "1", "alice"]);
    for result in [
        locker.try_read(&["board"]).map(|_| ()),
        locker.try_lock(&["board"]).map(|_| ()),
    ] {
        assert!(matches!(result, Err(Error::WrongType { .. })), "{result:?}");
    }
    let _permit = locker.semaphore("sem", 2).unwrap().acquire().unwrap();
    assert!(matches!(
        locker.try_read(&["sem"]),
        Err(Error::WrongType { .. })
    ));
    let _reading = locker.read(&["shared"]).unwrap();
    let sem = locker.semaphore("shared", 2).unwrap();
    assert!(matches!(sem.try_acquire(), Err(Error::WrongType { .. })));
    for keys in [&[][..], &[""][..], &["a", "a"][..]] {
        assert!(matches!(locker.try_read(keys), Err(Error::InvalidInput(_))));
    }
}

#[test]
fn read_locks_are_refused_on_a_quorum() {
    let servers: Vec<RedisServer> = (0..3).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let redlock = Locker::builder().build_redlock(&urls).unwrap();
    assert!(matches!(
        redlock.try_read(&["k"]),
        Err(Error::InvalidInput(_))
    ));
    let guard = redlock.lock(&["k"]).unwrap();
    assert!(matches!(guard.downgrade(), Err(Error::InvalidInput(_))));
}

#[test]
fn a_writer_waiting_for_readers_shows_in_holders_until_it_gives_up() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let reader = locker
        .read_with(&["r"], LockOptions::default().metadata("reader"))
        .unwrap();
    let writer = {
        let locker = locker.clone();
        thread::spawn(move || {
            let options = sleepy()
                .metadata("writer")
                .timeout(Duration::from_millis(1500));
            locker.lock_with(&["r"], options).map(drop)
        })
    };
    eventually(Duration::from_secs(3), "the writer shows", || {
        locker.holders("r").unwrap().iter().any(|h| h.waiting())
    });
    let holders = locker.holders("r").unwrap();
    let shown: Vec<_> = holders
        .iter()
        .map(|h| (h.metadata(), h.shared(), h.waiting()))
        .collect();
    assert_eq!(shown, [("reader", true, false), ("writer", false, true)]);
    assert!(holders[1].ttl().unwrap() <= Duration::from_secs(2));
    assert!(matches!(writer.join().unwrap(), Err(Error::NotObtained)));
    let holders = locker.holders("r").unwrap();
    assert!(holders.iter().all(|h| !h.waiting()), "{holders:?}");
    reader.release().unwrap();
}

#[test]
fn writers_that_do_not_wait_record_no_intent() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _reader = locker.read(&["r"]).unwrap();
    let published = server.calls("publish");
    for _ in 0..5 {
        assert!(locker.try_lock(&["r"]).unwrap().is_none());
        let once = LockOptions::default().timeout(Duration::ZERO);
        assert!(matches!(
            locker.lock_with(&["r"], once),
            Err(Error::NotObtained)
        ));
    }
    // No intent written, so none taken back and announced (waking every waiting reader).
    assert_eq!(server.calls("publish"), published);
    assert!(locker.holders("r").unwrap().iter().all(|h| !h.waiting()));
}

/// A writer waiting behind a reader is killed (SIGKILL: nothing is taken back): new
/// readers wait behind its intent only as long as the intent lives, about 2 s, not for
/// the writer's TTL.
#[cfg(target_os = "linux")]
#[test]
fn a_killed_waiting_writer_holds_readers_off_only_briefly() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _reader = locker.read(&["r"]).unwrap();
    let mut writer = crate::child_test("read::waiting_writer_child")
        .env("REDGUARD_CHILD", "1")
        .env("REDGUARD_URL", server.url())
        .stdout(std::process::Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), "the writer waits", || {
        locker.holders("r").unwrap().iter().any(|h| h.waiting())
    });
    assert!(
        locker.try_read(&["r"]).unwrap().is_none(),
        "readers wait behind it"
    );
    writer.kill().unwrap();
    writer.wait().unwrap();
    let killed = Instant::now();
    let next = loop {
        if let Some(next) = locker.try_read(&["r"]).unwrap() {
            break next;
        }
        assert!(killed.elapsed() < Duration::from_secs(5), "still held off");
        thread::sleep(Duration::from_millis(20));
    };
    assert!(
        killed.elapsed() < Duration::from_millis(2500),
        "{:?}",
        killed.elapsed()
    );
    next.release().unwrap();
}

#[cfg(target_os = "linux")]
#[test]
#[ignore = "run by a_killed_waiting_writer_holds_readers_off_only_briefly"]
fn waiting_writer_child() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let locker = Locker::connect(std::env::var("REDGUARD_URL").unwrap()).unwrap();
    // Waits (default TTL: 30 s) until killed.
    let _ = locker.lock_with(&["r"], sleepy().timeout(Duration::from_secs(60)));
}
