//! Lease policies: `hold_at_least` (a release before then leaves the hold to expire then)
//! and `max_hold` (the refresher never keeps a hold past it), for locks, read locks,
//! permits and terms; and the command's `--at-least` (cron on three hosts runs a job once
//! per period) and `--max-hold`.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker};

use crate::cli::{code, redguard};
use crate::server::RedisServer;
use crate::{eventually, locker};

const MS: Duration = Duration::from_millis(1);

/// A release before `hold_at_least` has passed returns `Ok` and leaves the key held, its
/// TTL shortened to what is left; a waiter gets it once that time is up, not before. A
/// release after it deletes at once.
#[test]
fn a_lock_released_early_stays_held_until_its_shortest_hold_is_over() {
    let server = RedisServer::start();
    let (ours, theirs) = (locker(&server), locker(&server));
    let options = LockOptions::default().hold_at_least(800 * MS);
    let guard = ours.lock_with(&["job"], options).unwrap();
    let taken = Instant::now();
    guard.release().unwrap();
    let pttl: i64 = server.query(&["PTTL", "job"]);
    assert!(
        (1..=800).contains(&pttl),
        "TTL shortened to what is left: {pttl}"
    );
    assert!(theirs.try_lock(&["job"]).unwrap().is_none(), "still held");

    let waited = theirs
        .lock_with(
            &["job"],
            LockOptions::default().timeout(Duration::from_secs(5)),
        )
        .unwrap();
    assert!(taken.elapsed() >= 700 * MS, "not before the time was up");
    drop(waited);

    // Past its shortest hold, a release deletes the key at once.
    let options = LockOptions::default().hold_at_least(50 * MS);
    let guard = ours.lock_with(&["late"], options).unwrap();
    thread::sleep(80 * MS);
    guard.release().unwrap();
    assert_eq!(server.query::<i64>(&["EXISTS", "late"]), 0);
}

/// The same for a drop, a read lock and a permit.
#[test]
fn read_locks_permits_and_drops_keep_their_shortest_hold_too() {
    let server = RedisServer::start();
    let (ours, theirs) = (locker(&server), locker(&server));
    let options = || LockOptions::default().hold_at_least(Duration::from_secs(5));

    drop(ours.lock_with(&["dropped"], options()).unwrap());
    assert!(theirs.try_lock(&["dropped"]).unwrap().is_none());

    ours.read_with(&["read"], options())
        .unwrap()
        .release()
        .unwrap();
    assert!(
        theirs.try_lock(&["read"]).unwrap().is_none(),
        "the reader stays"
    );
    assert!(
        theirs.try_read(&["read"]).unwrap().is_some(),
        "shared as before"
    );

    let semaphore = ours.semaphore("permits", 1).unwrap();
    semaphore
        .acquire_with(options())
        .unwrap()
        .release()
        .unwrap();
    let other = theirs.semaphore("permits", 1).unwrap();
    assert!(
        other.try_acquire().unwrap().is_none(),
        "the permit stays taken"
    );
    assert_eq!(other.available().unwrap(), 0);
}

/// A read lock released before its shortest hold: the writer waiting behind it gets the
/// key when that time is up, not when the reader's old TTL would have run out.
#[test]
fn a_writer_behind_an_early_released_reader_gets_in_when_its_time_is_up() {
    let server = RedisServer::start();
    let (ours, theirs) = (locker(&server), locker(&server));
    let options = LockOptions::default()
        .ttl(Duration::from_secs(30))
        .hold_at_least(500 * MS);
    ours.read_with(&["config"], options)
        .unwrap()
        .release()
        .unwrap();
    let waited = Instant::now();
    let options = LockOptions::default().timeout(Duration::from_secs(10));
    let writer = theirs.lock_with(&["config"], options);
    assert!(writer.is_ok(), "{writer:?} after {:?}", waited.elapsed());
}

/// A hold refreshed in the background is lost at `max_hold`, though its process is alive:
/// `is_lost`, `on_lost` once, and the next waiter gets the keys.
#[test]
fn a_refreshed_lock_is_lost_at_its_longest_hold() {
    let server = RedisServer::start();
    let told = Arc::new(AtomicUsize::new(0));
    let ours = {
        let told = Arc::clone(&told);
        Locker::builder()
            .on_lost(move |_| {
                told.fetch_add(1, Ordering::SeqCst);
            })
            .build(server.url())
            .unwrap()
    };
    let max = Duration::from_millis(1200);
    let options = LockOptions::default()
        .ttl(300 * MS)
        .max_hold(max)
        .fencing(true);
    let guard = ours.lock_with(&["hung"], options).unwrap();
    let taken = Instant::now();
    let waiter = {
        let theirs = locker(&server);
        thread::spawn(move || {
            let options = LockOptions::default()
                .fencing(true)
                .timeout(Duration::from_secs(10));
            theirs.lock_with(&["hung"], options)
        })
    };
    eventually(Duration::from_secs(5), "lost at max_hold", || {
        guard.is_lost()
    });
    let lost_after = taken.elapsed();
    assert!(
        lost_after >= 800 * MS,
        "refreshed past its TTL first: {lost_after:?}"
    );
    // By the thread's clock, counted from before the request: never past max_hold (less
    // what a loaded machine takes to look).
    assert!(
        lost_after <= max + 300 * MS,
        "past max_hold: {lost_after:?}"
    );
    let next = waiter.join().unwrap().unwrap();
    assert!(next.fence() > guard.fence());
    eventually(Duration::from_secs(2), "on_lost", || {
        told.load(Ordering::SeqCst) == 1
    });
    assert!(matches!(guard.release(), Err(Error::LockLost)));
    assert_eq!(told.load(Ordering::SeqCst), 1, "told once");
}

/// A TTL longer than `max_hold` is cut to it from the first acquisition, a refresh by
/// hand never goes past it, and so for a term too; contradictory or empty policies are
/// refused before any round trip.
#[test]
fn no_ttl_outlasts_the_longest_hold_and_bad_policies_are_refused() {
    let server = RedisServer::start();
    let ours = locker(&server);
    let options = LockOptions::default()
        .ttl(Duration::from_secs(60))
        .max_hold(500 * MS);
    let guard = ours.lock_with(&["k"], options.clone()).unwrap();
    assert!(server.query::<i64>(&["PTTL", "k"]) <= 500);
    guard.refresh(Duration::from_secs(60)).unwrap();
    assert!(server.query::<i64>(&["PTTL", "k"]) <= 500);
    eventually(Duration::from_secs(3), "the lock runs out", || {
        guard.is_lost()
    });
    assert!(matches!(
        guard.refresh(Duration::from_secs(60)),
        Err(Error::LockLost)
    ));

    let term = ours
        .election("e")
        .unwrap()
        .campaign_with("v", options)
        .unwrap();
    eventually(Duration::from_secs(3), "the term runs out", || {
        term.is_lost()
    });

    for bad in [
        LockOptions::default().max_hold(Duration::ZERO),
        LockOptions::default()
            .hold_at_least(Duration::from_secs(2))
            .max_hold(Duration::from_secs(1)),
    ] {
        let refused = ours.lock_with(&["bad"], bad);
        assert!(
            matches!(refused, Err(Error::InvalidInput(_))),
            "{refused:?}"
        );
    }
    assert_eq!(server.query::<i64>(&["EXISTS", "bad"]), 0);
}

/// Cron on three hosts: each period, three `redguard run -n --at-least` start the same job
/// within 100 ms of each other; over 10 periods the job ran exactly 10 times.
#[test]
fn three_hosts_cron_runs_the_job_once_per_period() {
    let server = RedisServer::start();
    let log = std::env::temp_dir().join(format!("redguard-cron-{}", std::process::id()));
    let _ = std::fs::remove_file(&log);
    let job = format!("echo ran >> {}", log.display());
    let period = Duration::from_millis(500);
    let start = Instant::now();
    let mut runs = Vec::new();
    for n in 0..10u32 {
        for host in 0..3u32 {
            let at = start + period * n + Duration::from_millis(50) * host;
            thread::sleep(at.saturating_duration_since(Instant::now()));
            let args = ["run", "-n", "--at-least", "400ms", "cron", "-c", &job];
            runs.push(redguard(&server, &args).spawn().unwrap());
        }
    }
    let mut codes = Vec::new();
    for mut run in runs {
        codes.push(run.wait().unwrap().code());
    }
    let ran = std::fs::read_to_string(&log)
        .unwrap_or_default()
        .lines()
        .count();
    let _ = std::fs::remove_file(&log);
    assert_eq!(ran, 10, "exit codes {codes:?}");
    assert_eq!(codes.iter().filter(|c| **c == Some(0)).count(), 10);
    assert_eq!(codes.iter().filter(|c| **c == Some(1)).count(), 20);
}

/// `--max-hold`: a command that runs past it is stopped as on a loss, exit 75.
#[test]
fn a_command_past_its_longest_hold_is_stopped_and_exits_75() {
    let server = RedisServer::start();
    let args = [
        "run",
        "--ttl",
        "300ms",
        "--max-hold",
        "1s",
        "slow",
        "--",
        "sleep",
        "30",
    ];
    let started = Instant::now();
    let output = redguard(&server, &args).output().unwrap();
    assert_eq!(code(&output), Some(75), "{output:?}");
    assert!(started.elapsed() < Duration::from_secs(10));

    // With the default TTL, longer than max_hold, the command still runs until about then.
    let mark = std::env::temp_dir().join(format!("redguard-max-hold-{}", std::process::id()));
    let _ = std::fs::remove_file(&mark);
    let line = format!("sleep 0.5; touch {}; sleep 30", mark.display());
    let args = ["run", "--max-hold", "2s", "slower", "-c", &line];
    let output = redguard(&server, &args).output().unwrap();
    let ran = mark.exists();
    let _ = std::fs::remove_file(&mark);
    assert_eq!(code(&output), Some(75), "{output:?}");
    assert!(ran, "stopped at once: {output:?}");
}
