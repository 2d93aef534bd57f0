//! The randomized fault run, for every primitive: worker processes take plain locks,
//! read locks, permits, long queued waits and terms of an election, and observe the
//! election; inside each section they write to a checker at its start and its end. The
//! checker is a resource that checks fencing (as the guide tells users to build) and
//! keeps the record the verdicts come from (`verdict.rs`). Meanwhile a fault driver
//! injects the deployment's faults (`deployment.rs`) in shuffled rounds, so that every
//! kind comes up, with calm spells between. Afterwards the run idles past the TTLs and
//! looks for keys left behind.
//!
//! ```text
//! cargo test --test it -- --ignored --exact torture::storm_on_one_server --nocapture
//! cargo test --test it -- --ignored --exact torture::storm_through_sentinel --nocapture
//! REDGUARD_TORTURE_SECS=300 cargo test ...   # longer (30 s by default)
//! REDGUARD_TORTURE_DEBUG=1 cargo test ...     # each server's role and keys after each fault
//! REDGUARD_TORTURE_BREAK=permit cargo test ... # a broken variant (lock, read, permit, term,
//!                                              # observe): its checker must fail the run
//! ```

mod checker;
mod deployment;
mod verdict;
mod watcher;
mod worker;

use std::process::Stdio;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use checker::{Checker, Fault};
use deployment::Deployment;
use verdict::{Ending, Verdict};

const PROCESSES: usize = 3;

#[test]
#[ignore = "a long randomized run: .ci/run runs it for 20 s"]
fn storm_on_one_server() {
    storm(Deployment::one_server());
}

#[test]
#[ignore = "a long randomized run: .ci/run runs it for 40 s"]
fn storm_through_sentinel() {
    storm(Deployment::sentinel());
}

/// One worker process (run by the storms above).
#[test]
#[ignore = "run by the storms"]
fn worker() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    worker::run();
}

/// One run: workers, the watcher and the fault driver on `deployment`, then the verdicts.
fn storm(mut deployment: Deployment) {
    let secs: u64 = std::env::var("REDGUARD_TORTURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(30);
    let run_for = Duration::from_secs(secs);
    let checker = Arc::new(Mutex::new(Checker::default()));
    let checker_port = checker::serve(Arc::clone(&checker));
    checker::watch_clock(Arc::clone(&checker));
    let master = Arc::new(Mutex::new(deployment.master_url()));
    let stop = Arc::new(AtomicBool::new(false));
    let settle = deployment::SETTLE;
    let watcher = watcher::watch(
        Arc::clone(&checker),
        Arc::clone(&master),
        Arc::clone(&stop),
        deployment.stale_reads().then_some(settle),
    );
    let children: Vec<_> = (0..PROCESSES)
        .map(|n| {
            let mut worker = crate::child_test("torture::worker");
            deployment.point(&mut worker);
            worker
                .env("REDGUARD_CHILD", "1")
                .env("REDGUARD_TORTURE_CHECKER", checker_port.to_string())
                .env("REDGUARD_TORTURE_MS", run_for.as_millis().to_string())
                .env("REDGUARD_TORTURE_PROCESS", format!("p{n}"))
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut children = Children(children);
    let pids: Vec<u32> = children.0.iter().map(|c| c.id()).collect();

    let warmed = Instant::now() + Duration::from_secs(2);
    drive_faults(&mut deployment, &checker, &master, &pids, run_for);
    deployment.heal();

    let worked = children.wait_all();
    // Idle past every TTL and waiter lifetime (twice 1.5 s): nothing of ours may be left
    // but what the guide says is kept.
    thread::sleep(Duration::from_secs(4));
    stop.store(true, Ordering::Relaxed);
    watcher.join().unwrap();
    let url = deployment.master_url();
    println!("at the end, the master is {url}; {}", deployment.describe());
    let (left, elected) = leftovers(&url);
    let checker = checker.lock();
    let ending = Ending {
        elected,
        limit: worker::LIMIT,
        settle,
        warmed,
        stale_reads: deployment.stale_reads(),
    };
    let verdicts = verdict::verdicts(&checker, &ending);
    report(
        deployment.name(),
        secs,
        &checker.faults,
        &worked,
        &verdicts,
        &left,
    );
    let steps: Vec<i64> = checker.clock_steps.iter().map(|(_, ms)| *ms).collect();
    println!("  steps of the wall clock over 2 ms (ms): {steps:?}");
    for verdict in &verdicts {
        assert!(verdict.done > 0, "{}: never exercised", verdict.prim.name());
        assert!(
            verdict.violations.is_empty(),
            "{}: {} violations (above)",
            verdict.prim.name(),
            verdict.violations.len()
        );
    }
    assert!(left.is_empty(), "keys left behind: {left:?}");
    let kinds = deployment.kinds();
    if secs >= deployment.round_secs() {
        for kind in kinds {
            assert!(
                checker.faults.iter().any(|f| f.kind == *kind),
                "every kind of fault, at least once: not {kind:?}"
            );
        }
    }
}

/// The fault driver: every kind once per round, in a shuffled order, 0.2-0.8 s apart, and
/// a calm spell of 2-3 s after each round (the queue's promptness is measured in calm);
/// each fault recorded in the checker with its span.
fn drive_faults(
    deployment: &mut Deployment,
    checker: &Mutex<Checker>,
    master: &Mutex<String>,
    pids: &[u32],
    run_for: Duration,
) {
    let deadline = Instant::now() + run_for;
    let mut rng = Rng::new();
    let mut round: Vec<&'static str> = Vec::new();
    let mut rounds = 0;
    while Instant::now() < deadline {
        if round.is_empty() {
            if rounds > 0 {
                thread::sleep(Duration::from_millis(2000 + rng.below(1000)));
            }
            rounds += 1;
            round = deployment.kinds().to_vec();
            // REDGUARD_TORTURE_ONLY=<kind>: that kind alone (to chase what it finds).
            if let Ok(only) = std::env::var("REDGUARD_TORTURE_ONLY") {
                round.retain(|kind| *kind == only);
            }
            for i in (1..round.len()).rev() {
                round.swap(i, rng.below(i as u64 + 1) as usize);
            }
            if rounds == 1 {
                // The deployment's first kind first (a failover through Sentinel): a
                // short run has it too.
                let first = round.iter().position(|k| *k == deployment.kinds()[0]);
                let first = round.remove(first.unwrap_or(0));
                round.push(first);
            }
        }
        thread::sleep(Duration::from_millis(200 + rng.below(600)));
        let kind = round.pop().unwrap();
        let start = Instant::now();
        checker.lock().fault_since = Some(start);
        deployment.inject(kind, &mut rng, pids);
        *master.lock() = deployment.master_url();
        if std::env::var("REDGUARD_TORTURE_DEBUG").is_ok() {
            println!(
                "after {kind} ({:?}): {}",
                start.elapsed(),
                deployment.describe()
            );
        }
        let mut checker = checker.lock();
        checker.fault_since = None;
        let end = Instant::now();
        checker.faults.push(Fault { start, end, kind });
    }
}

/// Keys of the crate's left on the server, but those the guides say are kept (fencing
/// counters, an election's proclaimed value, a fenced write's record), and the term the
/// fenced key holds.
fn leftovers(url: &str) -> (Vec<String>, Option<u64>) {
    let mut con = deployment::connect(url).unwrap();
    let keys: Vec<String> = redis::cmd("KEYS").arg("*").query(&mut con).unwrap();
    let kept = [
        "redguard:fence:",
        "redguard:proclaimed:",
        "redguard:fenced:",
    ];
    let mut left: Vec<String> = keys
        .into_iter()
        .filter(|k| k != "torture:elected" && !kept.iter().any(|p| k.starts_with(p)))
        .collect();
    left.sort();
    let elected: Option<String> = redis::cmd("GET")
        .arg("torture:elected")
        .query(&mut con)
        .unwrap();
    (left, elected.and_then(|e| e.parse().ok()))
}

fn report(
    deployment: &str,
    secs: u64,
    faults: &[Fault],
    worked: &[String],
    verdicts: &[Verdict],
    left: &[String],
) {
    let mut kinds: Vec<&str> = faults.iter().map(|f| f.kind).collect();
    kinds.sort();
    let mut counted: Vec<String> = Vec::new();
    for kind in kinds.iter().copied() {
        let n = kinds.iter().filter(|k| **k == kind).count();
        let entry = format!("{n} {kind}");
        if !counted.contains(&entry) {
            counted.push(entry);
        }
    }
    println!(
        "torture ({deployment}): {secs} s, {PROCESSES} worker processes ({}); {} faults: {}",
        worked.join("; "),
        faults.len(),
        counted.join(", ")
    );
    for verdict in verdicts {
        let broken = match verdict.violations.len() {
            0 => "0 violations".to_string(),
            n => format!(
                "{n} VIOLATIONS, the first: {:?}",
                &verdict.violations[..n.min(5)]
            ),
        };
        println!("  {}: {}; {broken}", verdict.prim.name(), verdict.figures);
    }
    println!("  keys left after idling past the TTLs: {left:?}");
}

/// The worker processes; on drop (a failed assertion, say), none is left frozen or
/// running.
struct Children(Vec<std::process::Child>);

impl Children {
    /// Waits for every worker to end by itself at the deadline: one that does not within
    /// 30 s more fails the run (and is killed) instead of hanging it. Returns what each
    /// says it did.
    fn wait_all(&mut self) -> Vec<String> {
        let pids: Vec<String> = self.0.iter().map(|c| c.id().to_string()).collect();
        let (ended, outputs) = std::sync::mpsc::channel();
        for child in std::mem::take(&mut self.0) {
            let ended = ended.clone();
            thread::spawn(move || drop(ended.send(child.wait_with_output())));
        }
        let until = Instant::now() + Duration::from_secs(30);
        let mut worked = Vec::new();
        for _ in 0..pids.len() {
            let wait = until.saturating_duration_since(Instant::now());
            let Ok(output) = outputs.recv_timeout(wait) else {
                for pid in &pids {
                    let _ = std::process::Command::new("kill")
                        .args(["-9", pid])
                        .status();
                }
                panic!("a worker did not end within 30 s of the run's end");
            };
            let output = output.unwrap();
            let stdout = String::from_utf8_lossy(&output.stdout);
            let stderr = String::from_utf8_lossy(&output.stderr);
            assert!(
                output.status.success(),
                "a worker failed:\n{stdout}\n{stderr}"
            );
            let said: Vec<&str> = stdout
                .lines()
                .filter(|line| line.contains(" sections "))
                .collect();
            assert!(
                said.len() == 6 && said.iter().all(|line| !line.ends_with(" 0")),
                "every primitive of every worker got in: {said:?}"
            );
            worked.push(said.join(", "));
        }
        worked
    }
}

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = std::process::Command::new("kill")
                .args(["-CONT", &child.id().to_string()])
                .status();
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// A small xorshift generator, seeded from the clock and the process.
struct Rng(u64);

impl Rng {
    fn new() -> Rng {
        let nanos = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(1, |d| d.as_nanos() as u64);
        Rng(nanos ^ (u64::from(std::process::id()) << 32) | 1)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n.max(1)
    }
}
