//! One worker process of the run: a locker, and threads for every primitive, each
//! writing to the checker at the start and the end of each section without looking
//! whether its hold is lost (the checker's fencing is what keeps a late writer out), then
//! saying whether the hold covered the section.

use std::io::{BufRead, BufReader, Write};
use std::net::TcpStream;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{LockOptions, Locker, Retry};

use super::Rng;
use super::watcher::MARK;

/// The locks' TTL, every primitive's, on one server. Through Sentinel every hold waits
/// up to 500 ms for its replica (`WAIT`; a loaded replica can take a few hundred ms), so
/// its TTL is twice this.
const TTL: Duration = Duration::from_millis(500);
/// Keys of the plain locks.
pub const KEYS: u64 = 3;
/// The semaphore's limit.
pub const LIMIT: u32 = 2;

/// Whether the run is a deliberately broken variant of `prim` (`REDGUARD_TORTURE_BREAK`),
/// run by hand to see its checker catch it.
fn broken(prim: &str) -> bool {
    std::env::var("REDGUARD_TORTURE_BREAK").is_ok_and(|b| b == prim)
}

/// A thread's line to the checker.
struct ToChecker {
    con: TcpStream,
    answers: BufReader<TcpStream>,
}

impl ToChecker {
    fn connect(port: u16) -> ToChecker {
        let con = TcpStream::connect(("127.0.0.1", port)).unwrap();
        // The checker answers at once: a silent one fails the worker, never hangs it.
        con.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
        let answers = BufReader::new(con.try_clone().unwrap());
        ToChecker { con, answers }
    }

    /// Sends `<prim> <event> <resource> <id> <fence> <arg>`; whether it was accepted.
    fn send(
        &mut self,
        prim: &str,
        event: &str,
        resource: &str,
        id: &str,
        fence: u64,
        arg: &str,
    ) -> bool {
        let line = format!("{prim} {event} {resource} {id} {fence} {arg}\n");
        self.con.write_all(line.as_bytes()).unwrap();
        let mut answer = String::new();
        let read = self.answers.read_line(&mut answer).unwrap();
        assert!(read > 0, "the checker went away (after {line:?})");
        answer == "OK\n"
    }

    /// A section: its start, a little work (now and then long enough for a fault to
    /// catch it inside), its end, and whether the hold covered it (asked once its end was
    /// written: `is_lost` never turns back).
    #[allow(clippy::too_many_arguments)]
    fn section(
        &mut self,
        prim: &str,
        resource: &str,
        id: &str,
        fence: u64,
        arg: &str,
        rng: &mut Rng,
        is_lost: impl Fn() -> bool,
    ) -> bool {
        if !self.send(prim, "BEGIN", resource, id, fence, arg) {
            return false;
        }
        let work = if rng.below(10) == 0 { 300 } else { 5 };
        thread::sleep(Duration::from_millis(rng.below(work)));
        self.send(prim, "END", resource, id, fence, arg);
        let held = if is_lost() { "lost" } else { "held" };
        self.send(prim, "LEASE", resource, id, fence, held);
        true
    }
}

/// What every thread of the worker shares.
#[derive(Clone)]
struct Setting {
    locker: Locker,
    checker: u16,
    deadline: Instant,
    /// Holds wait for this many replicas (Sentinel).
    replicas: u32,
    ttl: Duration,
    process: String,
    /// Numbers the attempts of every thread: each has an id of its own.
    attempts: Arc<AtomicU64>,
}

impl Setting {
    fn options(&self, timeout: Duration) -> LockOptions {
        let options = LockOptions::default()
            .ttl(self.ttl)
            .fencing(true)
            .timeout(timeout)
            .retry(Retry::linear(Duration::from_millis(5)));
        match self.replicas {
            0 => options,
            n => options.replicas(n),
        }
    }

    /// Runs `step` (given the attempt's id) until the deadline; how many sections it had.
    fn repeat(
        self,
        name: &'static str,
        mut step: impl FnMut(&Setting, &mut ToChecker, &mut Rng, &str) -> bool + Send + 'static,
    ) -> thread::JoinHandle<(&'static str, u64)> {
        thread::spawn(move || {
            let mut report = ToChecker::connect(self.checker);
            let mut rng = Rng::new();
            let mut sections = 0u64;
            while Instant::now() < self.deadline {
                let n = self.attempts.fetch_add(1, Ordering::Relaxed);
                let id = format!("{}.{name}.{n}", self.process);
                if step(&self, &mut report, &mut rng, &id) {
                    sections += 1;
                } else {
                    thread::sleep(Duration::from_millis(20)); // a fault, say: again
                }
            }
            (name, sections)
        })
    }
}

fn lock(s: &Setting, report: &mut ToChecker, rng: &mut Rng, id: &str) -> bool {
    let key = format!("t:{}", rng.below(KEYS));
    let mut options = s.options(Duration::from_secs(1)).metadata(id);
    if broken("lock") {
        options = options.token("everyone"); // one owner: all of them get in at once
    }
    let Ok(guard) = s.locker.lock_with(&[key.as_str()], options) else {
        return false;
    };
    let fence = guard.fence().unwrap();
    report.section("lock", &key, id, fence, "w", rng, || guard.is_lost())
}

/// A reader twice in three, else a writer.
fn read(s: &Setting, report: &mut ToChecker, rng: &mut Rng, id: &str) -> bool {
    let options = s.options(Duration::from_secs(1)).fencing(false);
    // Broken: a writer that takes only a read lock.
    if rng.below(3) == 0 && !broken("read") {
        let Ok(guard) = s.locker.lock_with(&["r:0"], options) else {
            return false;
        };
        report.section("read", "r:0", id, 0, "w", rng, || guard.is_lost())
    } else {
        let Ok(guard) = s.locker.read_with(&["r:0"], options) else {
            return false;
        };
        let writer = if broken("read") && rng.below(3) == 0 {
            "w"
        } else {
            "r"
        };
        report.section("read", "r:0", id, 0, writer, rng, || guard.is_lost())
    }
}

fn permit(s: &Setting, report: &mut ToChecker, rng: &mut Rng, id: &str) -> bool {
    // Broken: a semaphore that admits one more than the limit.
    let admits = LIMIT + u32::from(broken("permit"));
    let Ok(semaphore) = s.locker.semaphore("s", admits) else {
        return false;
    };
    let Ok(permit) = semaphore.acquire_with(s.options(Duration::from_secs(1))) else {
        return false;
    };
    let fence = permit.fence().unwrap();
    let limit = LIMIT.to_string();
    report.section("permit", "s", id, fence, &limit, rng, || permit.is_lost())
}

/// A waiter that waits long, its id in its queue entry for the watcher.
fn queue(s: &Setting, report: &mut ToChecker, rng: &mut Rng, id: &str) -> bool {
    report.send("queue", "CALL", "q:0", id, 0, "-");
    let options = s
        .options(Duration::from_secs(5))
        .metadata(format!("{MARK}{id}"));
    match s.locker.lock_with(&["q:0"], options) {
        Ok(guard) => {
            let fence = guard.fence().unwrap();
            report.section("queue", "q:0", id, fence, "w", rng, || guard.is_lost())
        }
        Err(e) => {
            let error = format!("{e:?}").replace([' ', '\n'], "_");
            report.send("queue", "GAVEUP", "q:0", id, 0, &error);
            false
        }
    }
}

/// A candidate: leads a while, writes its term with `fenced_set`, resigns.
fn term(s: &Setting, report: &mut ToChecker, rng: &mut Rng, id: &str) -> bool {
    // Broken: one process's candidates run in an election of their own.
    let name = if broken("term") && s.process == "p0" {
        "e2"
    } else {
        "e"
    };
    let Ok(election) = s.locker.election(name) else {
        return false;
    };
    let Ok(leadership) = election.campaign_with(id, s.options(Duration::from_secs(2))) else {
        return false;
    };
    let term = leadership.term();
    if !report.send("term", "BEGIN", "e", id, term, "w") {
        return false;
    }
    let wrote = leadership.fenced_set("torture:elected", &term.to_string());
    if let Ok(wrote) = wrote {
        let wrote = if wrote { "ok" } else { "refused" };
        report.send("term", "FENCEDSET", "e", id, term, wrote);
    }
    thread::sleep(Duration::from_millis(20 + rng.below(300)));
    report.send("term", "END", "e", id, term, "w");
    let held = if leadership.is_lost() { "lost" } else { "held" };
    report.send("term", "LEASE", "e", id, term, held);
    if leadership.resign().is_ok() {
        report.send("term", "RESIGNED", "e", id, term, "-");
    }
    true
}

/// An observer: each change it yields, after saying when it began to wait for it.
fn observe(s: &Setting, report: &mut ToChecker, rng: &mut Rng, id: &str) -> bool {
    let Ok(election) = s.locker.election("e") else {
        return false;
    };
    let Ok(mut observer) = election.observe() else {
        return false;
    };
    let mut seen = false;
    while Instant::now() < s.deadline {
        if broken("observe") {
            // Broken: it reports the leader it read a moment before it began to wait.
            let read = election.leader().ok().flatten().map_or(0, |l| l.term());
            thread::sleep(Duration::from_millis(rng.below(100)));
            report.send("observe", "WAIT", "e", id, 0, "-");
            seen |= report.send("observe", "SAW", "e", id, read, "-");
            continue;
        }
        report.send("observe", "WAIT", "e", id, 0, "-");
        if let Some(Ok(leader)) = observer.next_timeout(Duration::from_millis(300)) {
            let term = leader.map_or(0, |l| l.term());
            seen |= report.send("observe", "SAW", "e", id, term, "-");
        }
    }
    seen
}

/// The worker process's body (see `super::worker`).
pub fn run() {
    let var = |name: &str| std::env::var(name).unwrap();
    let checker: u16 = var("REDGUARD_TORTURE_CHECKER").parse().unwrap();
    let run_for = Duration::from_millis(var("REDGUARD_TORTURE_MS").parse().unwrap());
    let deadline = Instant::now() + run_for;
    let sentinels = std::env::var("REDGUARD_TORTURE_SENTINELS").ok();
    let (io, replicas) = match sentinels {
        Some(_) => (Duration::from_millis(800), Duration::from_millis(500)),
        None => (Duration::from_millis(300), Duration::from_millis(200)),
    };
    let locker = loop {
        let builder = Locker::builder()
            .pool_size(14)
            .connect_timeout(Duration::from_millis(300))
            .io_timeout(io)
            .checkout_timeout(io * 2)
            .replica_timeout(replicas);
        let built = match &sentinels {
            Some(urls) => {
                let urls: Vec<&str> = urls.split(',').collect();
                builder.build_sentinel(&urls, &var("REDGUARD_TORTURE_MASTER"))
            }
            None => builder.build(var("REDGUARD_TORTURE_URL").as_str()),
        };
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
    let setting = Setting {
        locker,
        checker,
        deadline,
        replicas: u32::from(sentinels.is_some()),
        ttl: TTL * (1 + u32::from(sentinels.is_some())),
        process: var("REDGUARD_TORTURE_PROCESS"),
        attempts: Arc::default(),
    };
    let threads = vec![
        setting.clone().repeat("lock", lock),
        setting.clone().repeat("lock", lock),
        setting.clone().repeat("read", read),
        setting.clone().repeat("read", read),
        setting.clone().repeat("permit", permit),
        setting.clone().repeat("permit", permit),
        setting.clone().repeat("queue", queue),
        setting.clone().repeat("queue", queue),
        setting.clone().repeat("term", term),
        setting.repeat("observe", observe),
    ];
    let mut done = std::collections::BTreeMap::new();
    for thread in threads {
        let (name, sections) = thread.join().unwrap();
        *done.entry(name).or_insert(0) += sections;
    }
    println!(); // after the test harness's "test torture::worker ... "
    for (name, sections) in done {
        println!("{name} sections {sections}");
    }
}
