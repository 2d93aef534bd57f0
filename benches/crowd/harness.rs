//! The crowd benches' harness: workers (each one thread, a way to take and a kind of hold),
//! the run that sets them off together, the server's counters, the floor, and pinning.

use std::any::Any;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::sync::{Barrier, Mutex};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker};

use crate::server::RedisServer;

/// Every wait of every worker is bounded by this; a wait that runs out is a TIMEOUT.
pub const WAIT_BOUND: Duration = Duration::from_secs(10);
const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// The options every worker takes with: the defaults, with the wait bounded.
pub fn bounded() -> LockOptions {
    LockOptions::default().timeout(WAIT_BOUND)
}

/// What a worker holds while inside, for the in-process exclusion checks.
#[derive(Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    /// Alone: no one else inside (and the shared counter must come out exact).
    Write,
    /// Beside other readers, never beside a writer.
    Read,
    /// At most this many inside.
    Permit(i64),
}

/// Something held; dropping it releases.
pub type Held = Box<dyn Any>;

/// One worker: its kind and how it takes (`None`: the bounded wait ran out, or it failed).
pub struct Worker {
    pub kind: Kind,
    pub take: Box<dyn FnMut() -> Option<Held>>,
}

/// A bounded `lock`/`read`/`acquire` result as a [`Worker::take`] result: a timeout or an
/// error is `None` (errors other than a timeout are also shown on stderr).
pub fn held<G: 'static>(result: redguard::Result<G>) -> Option<Held> {
    match result {
        Ok(guard) => Some(Box::new(guard)),
        Err(Error::NotObtained) => None,
        Err(e) => {
            eprintln!("worker error (counted as a TIMEOUT): {e}");
            None
        }
    }
}

/// A worker of its own `Locker` (default builder) looping `lock_with(&[key])`.
pub fn lock_worker(url: &str, key: &'static str) -> Worker {
    locker_worker(&Locker::connect(url).expect("locker"), key)
}

/// A worker of a (shared) `locker` looping `lock_with(&[key])`.
pub fn locker_worker(locker: &Locker, key: &'static str) -> Worker {
    let locker = locker.clone();
    Worker {
        kind: Kind::Write,
        take: Box::new(move || held(locker.lock_with(&[key], bounded()))),
    }
}

/// A worker of its own `Locker` looping `read_with(&[key])`.
pub fn read_worker(url: &str, key: &'static str) -> Worker {
    let locker = Locker::connect(url).expect("locker");
    Worker {
        kind: Kind::Read,
        take: Box::new(move || held(locker.read_with(&[key], bounded()))),
    }
}

/// A worker of its own `Locker` looping `acquire_with` on the semaphore `name`.
pub fn permit_worker(url: &str, name: &str, limit: u32) -> Worker {
    let locker = Locker::connect(url).expect("locker");
    let semaphore = locker.semaphore(name, limit).expect("semaphore");
    Worker {
        kind: Kind::Permit(i64::from(limit)),
        take: Box::new(move || held(semaphore.acquire_with(bounded()))),
    }
}

/// The floor: a plain connection, SET NX PX, and on failure a 1 ms pause (at most
/// [`WAIT_BOUND`] in all); released with an EVALSHA compare-and-delete.
pub fn floor_worker(url: &str, key: &'static str, token: String) -> Worker {
    let client = redis::Client::open(url).expect("client");
    let con = std::rc::Rc::new(std::cell::RefCell::new(
        client.get_connection().expect("connection"),
    ));
    Worker {
        kind: Kind::Write,
        take: Box::new(move || {
            let began = Instant::now();
            loop {
                let ok: bool = redis::cmd("SET")
                    .arg(key)
                    .arg(&token)
                    .arg("NX")
                    .arg("PX")
                    .arg(30_000)
                    .query(&mut *con.borrow_mut())
                    .expect("set");
                if ok {
                    return Some(Box::new(Unlock {
                        con: std::rc::Rc::clone(&con),
                        key,
                        token: token.clone(),
                    }));
                }
                if began.elapsed() > WAIT_BOUND {
                    return None;
                }
                thread::sleep(Duration::from_millis(1));
            }
        }),
    }
}

/// The floor's guard: deletes the key on drop if it still holds the token.
struct Unlock {
    con: std::rc::Rc<std::cell::RefCell<redis::Connection>>,
    key: &'static str,
    token: String,
}

impl Drop for Unlock {
    fn drop(&mut self) {
        let _: i64 = redis::Script::new(UNLOCK)
            .key(self.key)
            .arg(&self.token)
            .invoke(&mut *self.con.borrow_mut())
            .expect("del");
    }
}

/// One worker's tally.
#[derive(Default)]
pub struct Tally {
    pub count: u64,
    pub timeouts: u64,
    pub waits: Vec<Duration>,
}

/// One run: every worker's tally (in order), the server's counters over it, its length.
pub struct Run {
    pub tallies: Vec<Tally>,
    pub stats: Stats,
    pub elapsed: Duration,
}

impl Run {
    pub fn total(&self) -> u64 {
        self.tallies.iter().map(|t| t.count).sum()
    }
    pub fn timeouts(&self) -> u64 {
        self.tallies.iter().map(|t| t.timeouts).sum()
    }
    pub fn rate(&self) -> f64 {
        self.total() as f64 / self.elapsed.as_secs_f64()
    }
    /// The acquisitions per second of the workers `range` covers.
    pub fn rate_of(&self, range: std::ops::Range<usize>) -> f64 {
        let n: u64 = self.tallies[range].iter().map(|t| t.count).sum();
        n as f64 / self.elapsed.as_secs_f64()
    }
    pub fn waits(&self, range: std::ops::Range<usize>) -> Vec<Duration> {
        self.tallies[range]
            .iter()
            .flat_map(|t| t.waits.iter().copied())
            .collect()
    }
    pub fn p99_ms(&self) -> f64 {
        percentile(&self.waits(0..self.tallies.len()), 0.99).as_secs_f64() * 1e3
    }
    pub fn trips(&self) -> f64 {
        self.stats.round_trips() as f64 / self.total().max(1) as f64
    }
    /// The counts of `groups` workers each (a locker's threads) as multiples of the mean:
    /// the smallest and the largest.
    pub fn shares(&self, group: usize) -> (f64, f64) {
        let counts: Vec<u64> = self
            .tallies
            .chunks(group)
            .map(|c| c.iter().map(|t| t.count).sum())
            .collect();
        let mean = (counts.iter().sum::<u64>() as f64 / counts.len() as f64).max(1.0);
        let min = *counts.iter().min().unwrap_or(&0) as f64;
        let max = *counts.iter().max().unwrap_or(&0) as f64;
        (min / mean, max / mean)
    }
}

pub fn percentile(samples: &[Duration], q: f64) -> Duration {
    let mut sorted = samples.to_vec();
    sorted.sort_unstable();
    let i = ((sorted.len() as f64 * q) as usize).min(sorted.len().saturating_sub(1));
    sorted.get(i).copied().unwrap_or_default()
}

/// The median run by rate.
pub fn median(mut runs: Vec<Run>) -> Run {
    runs.sort_by(|a, b| a.rate().total_cmp(&b.rate()));
    runs.swap_remove(runs.len() / 2)
}

/// The server's counters (INFO commandstats and cpu), or their change over a run.
#[derive(Clone, Copy, Default)]
pub struct Stats {
    pub set: u64,
    pub evalsha: u64,
    pub evalsha_usec: u64,
    pub eval: u64,
    pub eval_usec: u64,
    pub cpu: f64,
}

impl Stats {
    pub fn read(server: &RedisServer) -> Stats {
        let info: String = server.query(&["INFO", "commandstats", "cpu"]);
        let stat = |command: &str, field: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(&format!("cmdstat_{command}:")))
                .and_then(|rest| rest.split(',').find_map(|f| f.strip_prefix(field)))
                .and_then(|n| n.parse().ok())
                .unwrap_or(0)
        };
        let cpu = |field: &str| -> f64 {
            info.lines()
                .find_map(|l| l.strip_prefix(field))
                .and_then(|n| n.trim().parse().ok())
                .unwrap_or(0.0)
        };
        Stats {
            set: stat("set", "calls="),
            evalsha: stat("evalsha", "calls="),
            evalsha_usec: stat("evalsha", "usec="),
            eval: stat("eval", "calls="),
            eval_usec: stat("eval", "usec="),
            cpu: cpu("used_cpu_user:") + cpu("used_cpu_sys:"),
        }
    }

    /// What changed from `before` to `self`.
    pub fn since(self, before: Stats) -> Stats {
        Stats {
            set: self.set - before.set,
            evalsha: self.evalsha - before.evalsha,
            evalsha_usec: self.evalsha_usec - before.evalsha_usec,
            eval: self.eval - before.eval,
            eval_usec: self.eval_usec - before.eval_usec,
            cpu: self.cpu - before.cpu,
        }
    }

    /// Calls of the lock protocol's commands (the scripts call none of these themselves).
    pub fn round_trips(&self) -> u64 {
        self.set + self.evalsha + self.eval
    }
}

/// The state the in-process exclusion checks share.
#[derive(Default)]
struct Inside {
    /// -1: a writer inside; n ≥ 0: n readers or permit holders inside.
    state: AtomicI64,
    /// Read, yielded on, written back by writers: lost updates show as a short count.
    counter: AtomicU64,
}

impl Inside {
    /// The critical section: checks who else is inside, yields, and leaves.
    fn visit(&self, kind: Kind) {
        match kind {
            Kind::Write => {
                let was = self.state.swap(-1, Ordering::SeqCst);
                assert_eq!(was, 0, "a writer beside another holder");
                let seen = self.counter.load(Ordering::SeqCst);
                thread::yield_now();
                self.counter.store(seen + 1, Ordering::SeqCst);
                self.state.store(0, Ordering::SeqCst);
            }
            Kind::Read | Kind::Permit(_) => {
                let was = self.state.fetch_add(1, Ordering::SeqCst);
                assert!(was >= 0, "a reader or permit beside a writer");
                if let Kind::Permit(limit) = kind {
                    assert!(was < limit, "more than {limit} permits held");
                }
                thread::yield_now();
                self.state.fetch_sub(1, Ordering::SeqCst);
            }
        }
    }
}

/// `n` workers (made by `make(i)` on their own threads, before the start), each looping
/// `take, critical section, release` until `span` has passed or, with a `cap`, the
/// acquisitions of all reach it. The run lasts until the last worker is done.
pub fn contend(
    server: &RedisServer,
    n: usize,
    span: Duration,
    cap: Option<u64>,
    make: impl Fn(usize) -> Worker + Sync,
) -> Run {
    let inside = Inside::default();
    let taken = AtomicU64::new(0);
    let start = Barrier::new(n + 1);
    let before = Mutex::new((Stats::default(), Instant::now()));
    let (tallies, kinds): (Vec<Tally>, Vec<Kind>) = thread::scope(|s| {
        let workers: Vec<_> = (0..n)
            .map(|i| {
                let (inside, taken, start, make) = (&inside, &taken, &start, &make);
                s.spawn(move || {
                    let mut worker = make(i);
                    let mut tally = Tally::default();
                    start.wait();
                    let began = Instant::now();
                    while began.elapsed() < span
                        && cap.is_none_or(|cap| taken.load(Ordering::SeqCst) < cap)
                    {
                        let t = Instant::now();
                        let Some(guard) = (worker.take)() else {
                            tally.timeouts += 1;
                            continue;
                        };
                        tally.waits.push(t.elapsed());
                        inside.visit(worker.kind);
                        tally.count += 1;
                        taken.fetch_add(1, Ordering::SeqCst);
                        drop(guard);
                    }
                    (tally, worker.kind)
                })
            })
            .collect();
        *before.lock().unwrap() = (Stats::read(server), Instant::now());
        start.wait();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .unzip()
    });
    let (stats, began) = *before.lock().unwrap();
    let elapsed = began.elapsed();
    let run = Run {
        tallies,
        stats: Stats::read(server).since(stats),
        elapsed,
    };
    let writes: u64 = run
        .tallies
        .iter()
        .zip(&kinds)
        .filter(|(_, k)| **k == Kind::Write)
        .map(|(t, _)| t.count)
        .sum();
    assert_eq!(
        inside.counter.load(Ordering::SeqCst),
        writes,
        "lost updates"
    );
    run
}

pub use crate::server::pin;

/// "pinned (one CPU)" or "unpinned".
pub fn place(pinned: bool) -> &'static str {
    if pinned {
        "pinned (one CPU)"
    } else {
        "unpinned"
    }
}

/// "**TIMEOUT n**" when some waits ran out (or failed), else "0".
pub fn timeouts(n: u64) -> String {
    if n == 0 {
        "0".into()
    } else {
        format!("**TIMEOUT {n}**")
    }
}
