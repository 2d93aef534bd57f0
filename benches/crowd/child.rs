//! Waiters in separate processes: the bench runs its own binary again as children, each
//! with one worker (a `Locker` of its own, or a floor connection) on one thread.
//!
//! The protocol, one line each way on the child's stdin and stdout:
//! the child is started with `REDGUARD_CROWD_CHILD=<mode>,<url>,<secs>,<key>` (`mode`:
//! `lock` or `floor`), connects, prints `ready`, waits for a line on stdin (`go`: all
//! children then start within the parent's few writes), loops for `secs`, and prints
//! `done <count> <timeouts> <elapsed µs> <every wait in µs…>`.

use std::io::{BufRead, BufReader, Write};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use crate::harness::{Run, Stats, Tally, floor_worker, lock_worker, pin};
use crate::server::RedisServer;

/// The variable whose presence makes the binary a child.
pub const CHILD: &str = "REDGUARD_CROWD_CHILD";

/// The child's side: one worker for the span, its tally on stdout.
pub fn child(spec: &str) {
    let parts: Vec<&str> = spec.splitn(4, ',').collect();
    let [mode, url, secs, key] = parts[..] else {
        panic!("{CHILD}={spec}: want <mode>,<url>,<secs>,<key>");
    };
    let span = Duration::from_secs_f64(secs.parse().expect("seconds"));
    let key: &'static str = Box::leak(key.to_string().into_boxed_str());
    let mut worker = match mode {
        "lock" => lock_worker(url, key),
        "floor" => floor_worker(url, key, format!("floor-{}", std::process::id())),
        _ => panic!("{CHILD}: unknown mode {mode}"),
    };
    println!("ready");
    std::io::stdout().flush().expect("stdout");
    let mut go = String::new();
    if std::io::stdin().read_line(&mut go).expect("stdin") == 0 {
        return; // the parent is gone: nothing to run for
    }
    let mut tally = Tally::default();
    let began = Instant::now();
    while began.elapsed() < span {
        let t = Instant::now();
        let Some(guard) = (worker.take)() else {
            tally.timeouts += 1;
            continue;
        };
        tally.waits.push(t.elapsed());
        // No in-memory check of exclusion across processes: the critical section only
        // yields, and the counts are trusted (the in-thread rows keep the shared-counter
        // check, on the same lock code).
        thread::yield_now();
        tally.count += 1;
        drop(guard);
    }
    let elapsed = began.elapsed();
    let mut line = format!(
        "done {} {} {}",
        tally.count,
        tally.timeouts,
        elapsed.as_micros()
    );
    for wait in &tally.waits {
        line.push_str(&format!(" {}", wait.as_micros()));
    }
    println!("{line}");
}

/// The parent's children: killed (and reaped) when dropped, so a panicking parent leaves
/// none behind.
struct Children(Vec<Child>);

impl Drop for Children {
    fn drop(&mut self) {
        for child in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// The next line of a child's stdout (a panic if it ended: the Drop kills the rest).
fn line(out: &mut BufReader<ChildStdout>) -> String {
    let mut line = String::new();
    let n = out.read_line(&mut line).expect("a child's stdout");
    assert!(n > 0, "a child ended without a word (see its stderr above)");
    line
}

/// `n` children in `mode` on `key`, started together for `span`: one tally each.
pub fn processes(
    server: &RedisServer,
    n: usize,
    mode: &str,
    key: &str,
    span: Duration,
    pinned: bool,
) -> Run {
    let exe = std::env::current_exe().expect("the bench's own binary");
    let spec = format!("{mode},{},{},{key}", server.url(), span.as_secs_f64());
    let mut children = Children(Vec::new());
    for _ in 0..n {
        let child = Command::new(&exe)
            .env(CHILD, &spec)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("start a child");
        children.0.push(child);
    }
    let pids: Vec<u32> = children.0.iter().map(Child::id).collect();
    pin(&pids, pinned);
    let mut outs: Vec<BufReader<ChildStdout>> = children
        .0
        .iter_mut()
        .map(|c| BufReader::new(c.stdout.take().expect("piped")))
        .collect();
    for out in &mut outs {
        assert_eq!(line(out).trim(), "ready", "a child's first line");
    }
    let before = Stats::read(server);
    for child in &mut children.0 {
        let stdin = child.stdin.as_mut().expect("piped");
        stdin.write_all(b"go\n").expect("a child's stdin");
        stdin.flush().expect("a child's stdin");
    }
    let (mut tallies, mut elapsed) = (Vec::new(), Duration::ZERO);
    for out in &mut outs {
        let line = line(out);
        let mut words = line.split_whitespace();
        assert_eq!(words.next(), Some("done"), "a child's last line");
        let mut next = || -> u64 { words.next().and_then(|w| w.parse().ok()).expect("a number") };
        let (count, timeouts) = (next(), next());
        elapsed = elapsed.max(Duration::from_micros(next()));
        let waits = words
            .map(|w| Duration::from_micros(w.parse().expect("a wait")))
            .collect();
        tallies.push(Tally {
            count,
            timeouts,
            waits,
        });
    }
    for child in &mut children.0 {
        let status = child.wait().expect("a child's exit");
        assert!(status.success(), "a child failed: {status}");
    }
    Run {
        tallies,
        stats: Stats::read(server).since(before),
        elapsed,
    }
}
