//! A hold found lost: `on_lost` is called once per hold, and a `warn` is logged.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;
use redguard::{LockOptions, Locker};

use crate::server::RedisServer;
use crate::{eventually, in_child_process};

/// Short, but long enough that a refresher held up a few hundred milliseconds on a loaded
/// machine still keeps the holds it should.
const TTL: Duration = Duration::from_millis(800);

/// What `on_lost` was told of one hold: its keys and metadata.
type Told = (Vec<String>, String);

fn short() -> LockOptions {
    LockOptions::default().ttl(TTL).metadata("m")
}

#[test]
fn on_lost_is_called_once_per_lost_hold_with_its_keys() {
    let server = RedisServer::start();
    let told: Arc<Mutex<Vec<Told>>> = Arc::default();
    let locker = {
        let told = Arc::clone(&told);
        Locker::builder()
            .on_lost(move |lost| {
                told.lock()
                    .push((lost.keys().to_vec(), lost.metadata().to_owned()));
            })
            .build(server.url())
            .unwrap()
    };
    let lock = locker.lock_with(&["a", "b"], short()).unwrap();
    let read = locker.read_with(&["r"], short()).unwrap();
    let permit = locker
        .semaphore("s", 2)
        .unwrap()
        .acquire_with(short())
        .unwrap();
    let kept = locker.lock_with(&["kept"], short()).unwrap();
    for key in ["a", "r", "s"] {
        server.query::<u32>(&["DEL", key]);
    }
    eventually(Duration::from_secs(3), "all three are told", || {
        told.lock().len() >= 3
    });
    thread::sleep(TTL * 2); // more refreshes: nothing is told twice
    let mut told = told.lock().clone();
    told.sort();
    let m = || "m".to_string();
    assert_eq!(
        told,
        [
            (vec!["a".to_string(), "b".to_string()], m()),
            (vec!["r".to_string()], m()),
            (vec!["s".to_string()], m()),
        ]
    );
    assert!(lock.is_lost() && read.is_lost() && permit.is_lost());
    assert!(!kept.is_lost(), "the others are kept");
}

/// A locker whose `on_lost` counts its calls (and then panics, with `panics`).
fn counting(server: &RedisServer, panics: bool) -> (Locker, Arc<AtomicUsize>) {
    let calls = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&calls);
    let locker = Locker::builder()
        .on_lost(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
            assert!(!panics, "a careless callback");
        })
        .build(server.url())
        .unwrap();
    (locker, calls)
}

#[test]
fn a_loss_the_owner_finds_first_is_told_too() {
    let server = RedisServer::start();
    let (locker, calls) = counting(&server, false);
    // A long TTL: the refresher would not look for seconds; the owner finds it first.
    let guard = locker
        .lock_with(&["k"], LockOptions::default().ttl(Duration::from_secs(30)))
        .unwrap();
    server.query::<u32>(&["DEL", "k"]);
    assert!(guard.refresh(Duration::from_secs(30)).is_err());
    drop(guard);
    eventually(Duration::from_secs(2), "told once", || {
        calls.load(Ordering::SeqCst) == 1
    });
    thread::sleep(Duration::from_millis(100));
    assert_eq!(calls.load(Ordering::SeqCst), 1);
}

#[test]
fn a_panicking_callback_leaves_the_refresher_working() {
    let server = RedisServer::start();
    let (locker, calls) = counting(&server, true);
    let first = locker.lock_with(&["first"], short()).unwrap();
    let second = locker.lock_with(&["second"], short()).unwrap();
    server.query::<u32>(&["DEL", "first"]);
    eventually(Duration::from_secs(3), "told", || {
        calls.load(Ordering::SeqCst) == 1
    });
    thread::sleep(TTL * 3); // the refresher lives on: the second lock is kept
    assert!(first.is_lost() && !second.is_lost());
    server.query::<u32>(&["DEL", "second"]);
    eventually(Duration::from_secs(3), "told again", || {
        calls.load(Ordering::SeqCst) == 2
    });
}

#[test]
fn each_lost_hold_is_one_warning_in_the_log() {
    in_child_process("lost::warnings_child");
}

/// Keeps the `warn` records (a process has one logger: hence a child process).
struct Recorder(Mutex<Vec<String>>);

impl log::Log for Recorder {
    fn enabled(&self, metadata: &log::Metadata<'_>) -> bool {
        metadata.level() <= log::Level::Warn
    }

    fn log(&self, record: &log::Record<'_>) {
        if self.enabled(record.metadata()) {
            self.0.lock().push(record.args().to_string());
        }
    }

    fn flush(&self) {}
}

static RECORDER: Recorder = Recorder(Mutex::new(Vec::new()));

#[test]
#[ignore = "run by each_lost_hold_is_one_warning_in_the_log"]
fn warnings_child() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    log::set_logger(&RECORDER).unwrap();
    log::set_max_level(log::LevelFilter::Warn);
    let server = RedisServer::start();
    let locker = Locker::connect(server.url()).unwrap();
    let guards: Vec<_> = ["x", "y"]
        .iter()
        .map(|key| locker.lock_with(&[key], short()).unwrap())
        .chain([locker.lock_with(&["z"], short().token("job42")).unwrap()])
        .collect();
    server.query::<u32>(&["DEL", "x", "y", "z"]);
    eventually(Duration::from_secs(3), "both lost", || {
        guards.iter().all(|guard| guard.is_lost())
    });
    thread::sleep(TTL);
    let warnings = RECORDER.0.lock().clone();
    let lost: Vec<&String> = warnings.iter().filter(|w| w.contains("lost")).collect();
    assert_eq!(lost.len(), 3, "{warnings:?}");
    for guard in &guards {
        assert!(
            !lost.iter().any(|w| w.contains(guard.token())),
            "no whole token"
        );
    }
    assert!(
        !lost.iter().any(|w| w.contains("job")),
        "nothing of a fixed token"
    );
}

/// Holds given up cleanly while the refresher may be refreshing them: a release, a
/// hand-over to another thread, a downgrade. None of them is ever told lost.
#[test]
fn holds_given_up_cleanly_are_never_told_lost() {
    let server = RedisServer::start();
    let told: Arc<Mutex<Vec<String>>> = Arc::default();
    let locker = {
        let told = Arc::clone(&told);
        Locker::builder()
            .on_lost(move |lost| told.lock().push(lost.metadata().to_owned()))
            .build(server.url())
            .unwrap()
    };
    // Refreshed every 10 ms, held about as long: releases meet refreshes in flight.
    let ttl = Duration::from_millis(30);
    let clean: Arc<Mutex<Vec<String>>> = Arc::default();
    let workers: Vec<_> = (0..4)
        .map(|worker| {
            let (locker, clean) = (locker.clone(), Arc::clone(&clean));
            thread::spawn(move || {
                for round in 0..60 {
                    let metadata = format!("{worker}-{round}");
                    let options = LockOptions::default().ttl(ttl).metadata(&metadata);
                    let guard = locker.lock_with(&["k"], options).unwrap();
                    thread::sleep(Duration::from_millis(5 + round % 8));
                    let released = if round % 3 == 0 {
                        guard.downgrade().and_then(|read| {
                            thread::sleep(Duration::from_millis(round % 8));
                            read.release()
                        })
                    } else {
                        guard.release() // handed over, mostly: three others wait
                    };
                    if released.is_ok() {
                        clean.lock().push(metadata);
                    }
                }
            })
        })
        .collect();
    for worker in workers {
        worker.join().unwrap();
    }
    // The refresher is joined with the locker: every call it was to make is made.
    drop(locker);
    let (told, clean) = (told.lock().clone(), clean.lock().clone());
    assert!(
        clean.len() > 120,
        "most holds were given up cleanly: {}",
        clean.len()
    );
    let spurious: Vec<&String> = told.iter().filter(|m| clean.contains(m)).collect();
    assert!(
        spurious.is_empty(),
        "told lost after a clean release: {spurious:?}"
    );
}

/// An `on_lost` that needs the locker holds a `WeakLocker`: it can use the locker while
/// it lives, and the locker's threads still stop with it.
#[cfg(target_os = "linux")]
#[test]
fn an_on_lost_holding_a_weak_locker_lets_it_go() {
    in_child_process("lost::weak_locker_child");
}

#[cfg(target_os = "linux")]
#[test]
#[ignore = "run by an_on_lost_holding_a_weak_locker_lets_it_go"]
fn weak_locker_child() {
    use std::sync::OnceLock;
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let server = RedisServer::start();
    let weak: Arc<OnceLock<redguard::WeakLocker>> = Arc::default();
    let asked = Arc::new(AtomicUsize::new(0));
    let locker = {
        let (weak, asked) = (Arc::clone(&weak), Arc::clone(&asked));
        Locker::builder()
            .on_lost(move |lost| {
                let locker = weak.get().and_then(|weak| weak.upgrade());
                if let Some(locker) = locker
                    && locker.holders(&lost.keys()[0]).is_ok()
                {
                    asked.fetch_add(1, Ordering::SeqCst);
                }
            })
            .build(server.url())
            .unwrap()
    };
    weak.set(locker.downgrade()).unwrap();
    let guard = locker.lock_with(&["k"], short()).unwrap();
    server.query::<u32>(&["DEL", "k"]);
    eventually(
        Duration::from_secs(3),
        "the callback used the locker",
        || asked.load(Ordering::SeqCst) == 1,
    );
    drop((guard, locker));
    eventually(Duration::from_secs(3), "the locker's threads stop", || {
        crate::threads_named("redguard-refresher") == 0
    });
    assert!(weak.get().unwrap().upgrade().is_none());
}
