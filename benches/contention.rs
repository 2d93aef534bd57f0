//! W3, contention: 4 threads on one key, against a plain-connection floor, unpinned and
//! with every process on one CPU, and with an outsider (a second locker) in the game.
//!
//! ```text
//! cargo bench --bench contention        # Markdown table on stdout
//! BENCH_SECS=1 cargo bench --bench contention
//! ```
//!
//! Round trips are counted by the server (INFO commandstats: the SET, EVALSHA and EVAL
//! calls clients made; the lock scripts call none of these themselves).

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redguard::Locker;

#[allow(dead_code)] // the tests use more of the harness than the bench does
#[path = "../tests/it/server.rs"]
mod server;

use server::RedisServer;

const THREADS: usize = 4;
const ROUNDS: usize = 3;
const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// One run of W3: how many acquisitions, each thread's count, every wait.
struct Run {
    per_thread: Vec<u64>,
    waits: Vec<Duration>,
    round_trips: u64,
    span: Duration,
}

impl Run {
    fn total(&self) -> u64 {
        self.per_thread.iter().sum()
    }
    fn rate(&self) -> f64 {
        self.total() as f64 / self.span.as_secs_f64()
    }
    fn p99(&self) -> Duration {
        percentile(&self.waits, 0.99)
    }
    fn trips(&self) -> f64 {
        self.round_trips as f64 / self.total().max(1) as f64
    }
    /// The smallest and largest thread's share, as multiples of the mean.
    fn shares(&self) -> (f64, f64) {
        let mean = self.total() as f64 / self.per_thread.len() as f64;
        let min = *self.per_thread.iter().min().unwrap_or(&0) as f64;
        let max = *self.per_thread.iter().max().unwrap_or(&0) as f64;
        (min / mean.max(1.0), max / mean.max(1.0))
    }
}

fn percentile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default()
}

/// Calls of the lock protocol's commands so far, as the server counts them.
fn protocol_calls(server: &RedisServer) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]);
    ["set", "evalsha", "eval"]
        .iter()
        .filter_map(|command| {
            info.lines()
                .find_map(|line| line.strip_prefix(&format!("cmdstat_{command}:calls=")))
                .and_then(|rest| rest.split(',').next()?.parse::<u64>().ok())
        })
        .sum()
}

/// `threads` threads, each looping `acquire, critical section, release` for `span`; the
/// critical section reads, yields and writes a shared counter, which must come out exact.
fn contend<G>(
    server: &RedisServer,
    threads: usize,
    span: Duration,
    acquire: impl Fn(usize) -> Box<dyn FnMut() -> G + Send> + Sync,
) -> Run {
    let counter = AtomicU64::new(0);
    let inside = AtomicBool::new(false);
    let start = Barrier::new(threads + 1);
    let before = Mutex::new(0);
    let results: Vec<(u64, Vec<Duration>)> = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let (counter, inside, start, acquire) = (&counter, &inside, &start, &acquire);
                s.spawn(move || {
                    let mut lock = acquire(i);
                    let (mut count, mut waits) = (0, Vec::new());
                    start.wait();
                    let began = Instant::now();
                    while began.elapsed() < span {
                        let t = Instant::now();
                        let guard = lock();
                        waits.push(t.elapsed());
                        assert!(!inside.swap(true, Ordering::SeqCst), "two holders");
                        let seen = counter.load(Ordering::SeqCst);
                        thread::yield_now();
                        counter.store(seen + 1, Ordering::SeqCst);
                        inside.store(false, Ordering::SeqCst);
                        count += 1;
                        drop(guard);
                    }
                    (count, waits)
                })
            })
            .collect();
        *before.lock().unwrap() = protocol_calls(server);
        start.wait();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let round_trips = protocol_calls(server) - *before.lock().unwrap();
    let run = Run {
        per_thread: results.iter().map(|r| r.0).collect(),
        waits: results.into_iter().flat_map(|r| r.1).collect(),
        round_trips,
        span,
    };
    assert_eq!(counter.load(Ordering::SeqCst), run.total(), "lost updates");
    run
}

/// The floor: a plain connection per thread, SET NX PX, and on failure a 1 ms pause;
/// released with an EVALSHA compare-and-delete on the same connection.
fn floor(server: &RedisServer, span: Duration) -> Run {
    contend(server, THREADS, span, |i| {
        let con = std::sync::Arc::new(Mutex::new(server.connection()));
        let token = format!("floor-{i}");
        Box::new(move || {
            loop {
                let ok: bool = redis::cmd("SET")
                    .arg("w3:floor")
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query(&mut *con.lock().unwrap())
                    .expect("set");
                if ok {
                    break;
                }
                thread::sleep(Duration::from_millis(1));
            }
            Unlock {
                con: std::sync::Arc::clone(&con),
                token: token.clone(),
            }
        })
    })
}

/// The floor's guard: deletes the key on drop if it still holds the token.
struct Unlock {
    con: std::sync::Arc<Mutex<redis::Connection>>,
    token: String,
}

impl Drop for Unlock {
    fn drop(&mut self) {
        let _: i64 = redis::Script::new(UNLOCK)
            .key("w3:floor")
            .arg(&self.token)
            .invoke(&mut *self.con.lock().unwrap())
            .expect("del");
    }
}

fn ours(server: &RedisServer, locker: &Locker, span: Duration) -> Run {
    contend(server, THREADS, span, |_| {
        let locker = locker.clone();
        Box::new(move || locker.lock(&["w3:ours"]).expect("lock"))
    })
}

/// The 4 threads of `locker`, and one thread of `outsider`: the outsider's waits.
fn with_outsider(server: &RedisServer, locker: &Locker, outsider: &Locker, span: Duration) -> Run {
    contend(server, THREADS + 1, span, |i| {
        let locker = if i == THREADS { outsider } else { locker }.clone();
        Box::new(move || locker.lock(&["w3:outsider"]).expect("lock"))
    })
}

/// Puts this process (every thread) and the server on CPU 0, or back on every CPU.
fn pin(server: &RedisServer, pinned: bool) {
    server::pin(&[server.pid()], pinned);
}

fn median_by(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    runs.swap_remove(runs.len() / 2)
}

fn row(name: &str, run: &Run, floor: Option<&Run>) -> String {
    let (min, max) = run.shares();
    let ratio = floor.map_or("1 (floor)".into(), |f| {
        format!("{:.2}", run.rate() / f.rate())
    });
    format!(
        "| {name} | {:.0} | {:.2} | {:.2} | {min:.2}–{max:.2} | {ratio} |",
        run.rate(),
        run.p99().as_secs_f64() * 1e3,
        run.trips(),
    )
}

fn main() {
    let span = server::bench_span();
    let secs = span.as_secs_f64();
    let server = RedisServer::start();
    let locker = Locker::connect(server.url()).expect("locker");
    let outsider = Locker::connect(server.url()).expect("locker");
    println!("\n## W3: {THREADS} threads on one key, default options\n");
    println!("{secs} s per run, median of {ROUNDS} alternating rounds.\n");
    println!(
        "| run | acquisitions/s | wait p99 ms | round trips per acquisition | thread shares (of the mean) | ratio to floor |"
    );
    println!("|---|---:|---:|---:|---|---:|");
    for pinned in [false, true] {
        pin(&server, pinned);
        let (mut floors, mut runs, mut mixed) = (Vec::new(), Vec::new(), Vec::new());
        for _ in 0..ROUNDS {
            floors.push(floor(&server, span));
            runs.push(ours(&server, &locker, span));
            mixed.push(with_outsider(&server, &locker, &outsider, span));
        }
        let (floor, ours, mixed) = (median_by(floors), median_by(runs), median_by(mixed));
        let place = if pinned {
            "pinned (one CPU)"
        } else {
            "unpinned"
        };
        println!(
            "{}",
            row(
                &format!("floor: SET NX PX + EVALSHA del, 1 ms spin, {place}"),
                &floor,
                None
            )
        );
        println!(
            "{}",
            row(
                &format!("redguard, one shared Locker, {place}"),
                &ours,
                Some(&floor)
            )
        );
        // The outsider is the last thread: its waits against the insiders' hold-to-hold time.
        let insiders: u64 = mixed.per_thread[..THREADS].iter().sum();
        let outsider_waits: Vec<Duration> = {
            // Waits are recorded thread after thread; the outsider's are the last ones.
            let theirs = mixed.per_thread[THREADS] as usize;
            mixed.waits[mixed.waits.len() - theirs..].to_vec()
        };
        let hold_to_hold = span.as_secs_f64() / insiders.max(1) as f64;
        let p99 = percentile(&outsider_waits, 0.99).as_secs_f64();
        println!(
            "| with an outsider (a second Locker), {place}: outsider got {} of {} | {:.0} | outsider p99 {:.2} | {:.2} | {:.1}× the insiders' hold-to-hold time | |",
            mixed.per_thread[THREADS],
            mixed.total(),
            mixed.rate(),
            p99 * 1e3,
            mixed.trips(),
            p99 / hold_to_hold,
        );
    }
    pin(&server, false);
}
