//! Elections against the lock they are built on, measured in the same run: a campaign and
//! resign nobody contends for, against a lock and release of one key; the hand-over from
//! a resigning leader to a waiting candidate of another locker, against the same with
//! locks; and how soon an observer hears of the new leader.
//!
//! ```text
//! cargo bench --bench election        # Markdown table on stdout
//! BENCH_SECS=1 cargo bench --bench election
//! ```

use std::sync::{Arc, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{LockOptions, Locker};

#[allow(dead_code)] // the tests use more of the harness than the bench does
#[path = "../tests/it/server.rs"]
mod server;

use server::{RedisServer, pin};

/// How long the leader holds before it resigns: long enough for the other side to queue.
const HOLD: Duration = Duration::from_millis(2);

fn percentile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default()
}

fn ms(d: Duration) -> f64 {
    d.as_secs_f64() * 1000.0
}

/// Cycles per second of `cycle`, run for `span`.
fn rate(span: Duration, mut cycle: impl FnMut()) -> f64 {
    let (start, mut n) = (Instant::now(), 0u64);
    while start.elapsed() < span {
        cycle();
        n += 1;
    }
    n as f64 / start.elapsed().as_secs_f64()
}

/// Two sides, each a locker of its own, take turns for `span`: each takes (`take` waits
/// in the queue), holds for [`HOLD`], and gives up. Every time from a give-up to the
/// other side's return.
fn hand_overs<T: Send + 'static>(
    span: Duration,
    sides: [Box<dyn FnMut() -> T + Send>; 2],
) -> Vec<Duration> {
    let given_up: Arc<Mutex<Option<Instant>>> = Arc::default();
    let waits: Arc<Mutex<Vec<Duration>>> = Arc::default();
    let until = Instant::now() + span;
    let threads: Vec<_> = sides
        .into_iter()
        .map(|mut take| {
            let (given_up, waits) = (Arc::clone(&given_up), Arc::clone(&waits));
            thread::spawn(move || {
                while Instant::now() < until {
                    let held = take();
                    if let Some(at) = given_up.lock().unwrap().take() {
                        waits.lock().unwrap().push(at.elapsed());
                    }
                    thread::sleep(HOLD);
                    *given_up.lock().unwrap() = Some(Instant::now());
                    drop(held);
                }
            })
        })
        .collect();
    for thread in threads {
        thread.join().unwrap();
    }
    Arc::try_unwrap(waits).unwrap().into_inner().unwrap()
}

/// From a resign to an observer's news of it (on a thread of its own), `n` times.
fn observed(server: &RedisServer, n: usize) -> Vec<Duration> {
    let locker = Locker::connect(server.url()).unwrap();
    let election = locker.election("observed").unwrap();
    let mut observer = election.observe().unwrap();
    let (news, heard) = std::sync::mpsc::channel();
    let listening = thread::spawn(move || {
        for change in observer.by_ref().take(2 * n + 1) {
            let leads = change.unwrap().is_some();
            news.send((leads, Instant::now())).unwrap();
        }
    });
    assert!(!heard.recv().unwrap().0, "nobody leads at first");
    let mut waits = Vec::new();
    for _ in 0..n {
        let term = election.campaign("a").unwrap();
        assert!(heard.recv().unwrap().0, "the observer hears the new leader");
        let resigned = Instant::now();
        term.resign().unwrap();
        let (leads, at) = heard.recv().unwrap();
        assert!(!leads, "then the resign");
        waits.push(at - resigned);
    }
    listening.join().unwrap();
    waits
}

fn main() {
    let span = server::bench_span();
    let secs = span.as_secs_f64();
    let server = RedisServer::start();
    let connect = || Locker::connect(server.url()).expect("locker");
    let (one, other) = (connect(), connect());
    println!("\n## Elections against locks, one server, {secs} s per run\n");
    println!(
        "| run | lock+release /s | campaign+resign /s | ratio | lock hand-over p50 / p99 ms | term hand-over p50 / p99 ms | observer hears a resign p50 / p99 ms |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    for pinned in [false, true] {
        pin(&[server.pid()], pinned);
        let locks = rate(span, || drop(one.lock(&["bench:lock"]).unwrap()));
        let election = one.election("bench").unwrap();
        let terms = rate(span, || drop(election.campaign("v").unwrap()));
        let lock_sides: [Box<dyn FnMut() -> _ + Send>; 2] = [one.clone(), other.clone()].map(|l| {
            Box::new(move || l.lock(&["bench:turns"]).unwrap()) as Box<dyn FnMut() -> _ + Send>
        });
        let lock_waits = hand_overs(span, lock_sides);
        let term_sides = [one.clone(), other.clone()].map(|l| {
            let election = l.election("turns").unwrap();
            let options = LockOptions::default();
            Box::new(move || election.campaign_with("v", options.clone()).unwrap())
                as Box<dyn FnMut() -> _ + Send>
        });
        let term_waits = hand_overs(span, term_sides);
        let heard = observed(&server, 200);
        println!(
            "| {} | {locks:.0} | {terms:.0} | {:.2} | {:.2} / {:.2} | {:.2} / {:.2} | {:.2} / {:.2} |",
            if pinned {
                "pinned (one CPU)"
            } else {
                "unpinned"
            },
            terms / locks,
            ms(percentile(&lock_waits, 0.5)),
            ms(percentile(&lock_waits, 0.99)),
            ms(percentile(&term_waits, 0.5)),
            ms(percentile(&term_waits, 0.99)),
            ms(percentile(&heard, 0.5)),
            ms(percentile(&heard, 0.99)),
        );
    }
    pin(&[server.pid()], false);
}
