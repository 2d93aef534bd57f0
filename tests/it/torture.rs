//! A long randomized run: several processes × threads lock a few keys with fencing, and
//! inside each critical section write `(key, fence)` at its start and its end to a checker
//! that, per key, refuses a fence smaller than the largest it accepted (a resource that
//! checks fencing, as the README tells users to build). Meanwhile a fault driver pauses,
//! kills and restarts the server (with AOF), cuts connections, adds latency and
//! blackholes on the proxy every worker goes through, and freezes worker processes (a
//! long GC pause: their leases run out while they are inside). At the end: no two accepted
//! sections of a key overlap in time, fences rise, and the figures are printed.
//!
//! ```text
//! cargo test --test it -- --ignored --exact torture::randomized_faults_never_let_accepted_sections_overlap
//! REDGUARD_TORTURE_SECS=600 cargo test ...   # longer (60 s by default)
//! ```

use std::collections::HashMap;
use std::io::{BufRead, BufReader, Write};
use std::net::{TcpListener, TcpStream};
use std::process::Stdio;
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redguard::{LockOptions, Locker, Retry};

use crate::proxy::{Cut, Proxy};
use crate::server::RedisServer;

const KEYS: usize = 3;
const PROCESSES: usize = 3;
const THREADS: usize = 3;
const TTL: Duration = Duration::from_millis(500);

/// What the checker saw.
#[derive(Default)]
struct Checker {
    /// Per key: the largest fence accepted.
    largest: HashMap<String, u64>,
    /// Per key and fence: when its accepted start came.
    open: HashMap<(String, u64), Instant>,
    /// Every section whose start was accepted.
    sections: Vec<Section>,
    /// Writes refused for a stale fence, at the start and at the end of a section.
    refused_begin: u64,
    refused_end: u64,
}

struct Section {
    key: String,
    fence: u64,
    start: Instant,
    end: Instant,
    /// Its end was accepted too.
    accepted: bool,
    /// The worker's guard still held the lock after the end (`!is_lost()`): the lease
    /// covered the whole section, by the lock's own account.
    held: bool,
}

impl Checker {
    /// What the worker says of a section it ended: whether its guard still `held` the
    /// lock after the end was written.
    fn lease(&mut self, key: &str, fence: u64, held: bool) {
        let last = self.sections.iter_mut().rev();
        if let Some(section) = last.into_iter().find(|s| s.key == key && s.fence == fence) {
            section.held = held;
        }
    }

    /// A write with `fence` to `key` at the `begin` or the end of a section: accepted
    /// unless a larger fence was accepted before.
    fn write(&mut self, key: &str, fence: u64, begin: bool) -> bool {
        let now = Instant::now();
        let largest = self.largest.entry(key.to_string()).or_insert(0);
        let accepted = fence >= *largest;
        if accepted {
            *largest = fence;
        }
        let id = (key.to_string(), fence);
        if begin {
            match accepted {
                true => drop(self.open.insert(id, now)),
                false => self.refused_begin += 1,
            }
        } else if let Some(start) = self.open.remove(&id) {
            self.refused_end += u64::from(!accepted);
            self.sections.push(Section {
                key: key.to_string(),
                fence,
                start,
                end: now,
                accepted,
                held: false, // until the worker says otherwise
            });
        }
        accepted
    }

    /// Overlaps in time between sections of one key that the lock said were held
    /// throughout; between sections the resource accepted; and accepted fences that did
    /// not rise.
    fn violations(&self) -> (usize, usize, usize) {
        let mut by_key: HashMap<&str, Vec<&Section>> = HashMap::new();
        for section in &self.sections {
            by_key.entry(&section.key).or_default().push(section);
        }
        let (mut lock_overlaps, mut accepted_overlaps, mut not_rising) = (0, 0, 0);
        for sections in by_key.values_mut() {
            sections.sort_by_key(|s| s.start);
            let overlaps = |kept: Vec<&&Section>, rising: &mut usize| {
                let mut overlapping = 0;
                for pair in kept.windows(2) {
                    overlapping += usize::from(pair[1].start < pair[0].end);
                    *rising += usize::from(pair[1].fence <= pair[0].fence);
                }
                overlapping
            };
            let mut ignored = 0;
            lock_overlaps += overlaps(sections.iter().filter(|s| s.held).collect(), &mut ignored);
            accepted_overlaps += overlaps(
                sections.iter().filter(|s| s.accepted).collect(),
                &mut not_rising,
            );
        }
        (lock_overlaps, accepted_overlaps, not_rising)
    }
}

/// Serves the checker on a loopback port: lines `BEGIN|END <key> <fence> held|lost`,
/// answered `OK` or `REFUSED`.
fn serve(checker: Arc<Mutex<Checker>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let checker = Arc::clone(&checker);
            thread::spawn(move || {
                let mut out = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { return };
                    let parts: Vec<&str> = line.split(' ').collect();
                    let [what, key, fence, held] = parts[..] else {
                        return;
                    };
                    let fence: u64 = fence.parse().unwrap_or(0);
                    let mut checker = checker.lock();
                    let ok = match what {
                        "LEASE" => {
                            checker.lease(key, fence, held == "held");
                            true
                        }
                        _ => checker.write(key, fence, what == "BEGIN"),
                    };
                    drop(checker);
                    let answer = if ok { "OK\n" } else { "REFUSED\n" };
                    if out.write_all(answer.as_bytes()).is_err() {
                        return;
                    }
                }
            });
        }
    });
    port
}

#[test]
#[ignore = "a long randomized run: .ci/run runs it for 60 s"]
fn randomized_faults_never_let_accepted_sections_overlap() {
    let secs: u64 = std::env::var("REDGUARD_TORTURE_SECS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(60);
    let run_for = Duration::from_secs(secs);
    let mut server = RedisServer::start_persistent();
    let proxy = Proxy::start(server.port());
    let checker = Arc::new(Mutex::new(Checker::default()));
    let checker_port = serve(Arc::clone(&checker));

    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            crate::child_test("torture::worker")
                .env("REDGUARD_CHILD", "1")
                .env("REDGUARD_TORTURE_URL", proxy.url())
                .env("REDGUARD_TORTURE_CHECKER", checker_port.to_string())
                .env("REDGUARD_TORTURE_MS", run_for.as_millis().to_string())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let mut children = Children(children);

    // The fault driver.
    let mut faults: HashMap<&str, u64> = HashMap::new();
    let deadline = Instant::now() + run_for;
    let mut rng = Rng::new();
    while Instant::now() < deadline {
        thread::sleep(Duration::from_millis(200 + rng.below(600)));
        let kind = match rng.below(7) {
            0 => {
                // Sometimes past the TTL: holders go on while their lease runs out.
                server.pause();
                thread::sleep(Duration::from_millis(100 + rng.below(900)));
                server.resume();
                "server paused"
            }
            1 => {
                server.kill();
                server.restart();
                "server killed and restarted (AOF)"
            }
            2 => {
                proxy.cut(if rng.below(2) == 0 {
                    Cut::Reset
                } else {
                    Cut::Close
                });
                "connections cut"
            }
            3 => {
                let latency = Duration::from_millis(50 + rng.below(600));
                proxy.set(|f| {
                    f.down.latency = latency;
                    f.down.jitter = latency / 2;
                });
                thread::sleep(Duration::from_millis(300 + rng.below(700)));
                proxy.heal();
                "latency"
            }
            4 => {
                proxy.set(|f| {
                    f.up.blackhole = true;
                    f.down.blackhole = true;
                });
                thread::sleep(Duration::from_millis(100 + rng.below(800)));
                proxy.heal();
                proxy.cut(Cut::Reset); // what was in flight is lost
                "blackhole"
            }
            5 => {
                // A worker process frozen like a long GC pause, its refresher too: its
                // leases run out, others take the keys, and it wakes up still "inside".
                let pid = children.0[rng.below(PROCESSES as u64) as usize]
                    .id()
                    .to_string();
                let signal = |name: &str| {
                    let _ = std::process::Command::new("kill")
                        .args([name, pid.as_str()])
                        .status();
                };
                signal("-STOP");
                thread::sleep(Duration::from_millis(600 + rng.below(900)));
                signal("-CONT");
                "worker process paused"
            }
            _ => {
                let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                    .arg("KILL")
                    .arg("TYPE")
                    .arg("normal")
                    .query(&mut server.connection());
                "CLIENT KILL"
            }
        };
        *faults.entry(kind).or_default() += 1;
    }
    proxy.heal();

    // Each worker ends by itself at the deadline; one that does not, within 30 s more,
    // fails the run (and is killed) instead of hanging it.
    let pids: Vec<String> = children.0.iter().map(|c| c.id().to_string()).collect();
    let (ended, outputs) = std::sync::mpsc::channel();
    for child in std::mem::take(&mut children.0) {
        let ended = ended.clone();
        thread::spawn(move || drop(ended.send(child.wait_with_output())));
    }
    let until = Instant::now() + Duration::from_secs(30);
    let mut by_worker = Vec::new();
    for _ in 0..PROCESSES {
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
        by_worker.push(
            stdout
                .lines()
                .find_map(|line| line.split("sections ").nth(1))
                .and_then(|n| n.trim().parse::<u64>().ok())
                .unwrap_or(0),
        );
    }
    let checker = checker.lock();
    let (lock_overlaps, overlaps, not_rising) = checker.violations();
    let accepted = checker.sections.iter().filter(|s| s.accepted).count();
    let ran_out = checker.sections.iter().filter(|s| !s.held).count();
    let mut kinds: Vec<_> = faults.iter().collect();
    kinds.sort();
    let injected: u64 = faults.values().sum();
    println!(
        "torture: {secs} s, {PROCESSES} processes x {THREADS} threads on {KEYS} keys; \
         {} sections begun ({by_worker:?} per worker), {accepted} accepted by the resource; \
         {ran_out} whose lease ran out inside; stale writes refused: {} at the start, {} at \
         the end; overlaps: {lock_overlaps} of sections the lock held throughout, \
         {overlaps} of accepted sections; {not_rising} fences not rising; {injected} faults \
         injected: {}",
        checker.sections.len(),
        checker.refused_begin,
        checker.refused_end,
        kinds
            .iter()
            .map(|(kind, n)| format!("{n} {kind}"))
            .collect::<Vec<_>>()
            .join(", ")
    );
    assert!(
        by_worker.iter().all(|n| *n > 0),
        "every worker got in: {by_worker:?}"
    );
    if secs >= 60 {
        assert_eq!(
            faults.len(),
            7,
            "every kind of fault, at least once: {faults:?}"
        );
    }
    assert_eq!(lock_overlaps, 0, "the lock let two holders in at once");
    assert_eq!(overlaps, 0, "accepted sections of a key overlapped");
    assert_eq!(not_rising, 0, "fences went backwards");
}

/// The worker processes; on drop (a failed assertion, say), none is left frozen or
/// running.
struct Children(Vec<std::process::Child>);

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

/// One worker process (run by the test above): threads that lock, write to the checker
/// at the start and end of each section (without looking whether the lock is lost: the
/// checker's fencing is what keeps a late writer out), and release.
#[test]
#[ignore = "run by randomized_faults_never_let_accepted_sections_overlap"]
fn worker() {
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let var = |name: &str| std::env::var(name).unwrap();
    let url = var("REDGUARD_TORTURE_URL");
    let checker: u16 = var("REDGUARD_TORTURE_CHECKER").parse().unwrap();
    let run_for = Duration::from_millis(var("REDGUARD_TORTURE_MS").parse().unwrap());
    let deadline = Instant::now() + run_for;
    let locker = loop {
        let built = Locker::builder()
            .pool_size(THREADS as u32)
            .connect_timeout(Duration::from_millis(300))
            .io_timeout(Duration::from_millis(300))
            .checkout_timeout(Duration::from_millis(600))
            .build(url.as_str());
        match built {
            Ok(locker) => break locker,
            // Started during a fault: the same settings, a moment later.
            Err(e) if Instant::now() < deadline => {
                let _ = e;
                thread::sleep(Duration::from_millis(100));
            }
            Err(e) => panic!("{e}"),
        }
    };
    let threads: Vec<_> = (0..THREADS)
        .map(|t| {
            let locker = locker.clone();
            thread::spawn(move || {
                let mut rng = Rng::new();
                let mut con = TcpStream::connect(("127.0.0.1", checker)).unwrap();
                // The checker answers at once: a silent one fails the worker, never hangs it.
                con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
                let mut answers = BufReader::new(con.try_clone().unwrap());
                let mut write = |what: &str, key: &str, fence: u64, held: bool| {
                    let held = if held { "held" } else { "lost" };
                    con.write_all(format!("{what} {key} {fence} {held}\n").as_bytes())
                        .unwrap();
                    let mut answer = String::new();
                    answers.read_line(&mut answer).unwrap();
                    answer == "OK\n"
                };
                let mut sections = 0u64;
                while Instant::now() < deadline {
                    let key = format!("t:{}", rng.below(KEYS as u64));
                    let options = LockOptions::default()
                        .ttl(TTL)
                        .fencing(true)
                        .timeout(Duration::from_secs(1))
                        .retry(Retry::linear(Duration::from_millis(5)))
                        .metadata(format!("worker thread {t}"));
                    let Ok(guard) = locker.lock_with(&[key.as_str()], options) else {
                        thread::sleep(Duration::from_millis(20)); // a fault: try again
                        continue;
                    };
                    let fence = guard.fence().unwrap();
                    if write("BEGIN", &key, fence, true) {
                        // Now and then long enough for a fault to catch it inside.
                        let work = if rng.below(10) == 0 { 300 } else { 5 };
                        thread::sleep(Duration::from_millis(rng.below(work)));
                        write("END", &key, fence, true);
                        // Whether the lease covered the section, asked once its end was
                        // written (is_lost never turns back).
                        write("LEASE", &key, fence, !guard.is_lost());
                        sections += 1;
                    }
                    drop(guard);
                }
                sections
            })
        })
        .collect();
    let sections: u64 = threads.into_iter().map(|t| t.join().unwrap()).sum();
    println!("sections {sections}");
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
