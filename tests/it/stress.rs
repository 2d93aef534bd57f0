//! Several OS processes, several threads each, on a few shared keys: critical sections
//! never overlap, and fencing tokens rise in critical-section order.

use std::collections::HashMap;
use std::process::Stdio;
use std::thread;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use redguard::{LockOptions, Locker};

use crate::server::RedisServer;

const PROCESSES: usize = 4;
const THREADS: usize = 2;
const KEYS: [&str; 3] = ["s0", "s1", "s2"];
const RUN: Duration = Duration::from_millis(1500);

/// One critical section, as a child logged it.
#[derive(Debug)]
struct Section {
    token: u64,
    start: u128,
    end: u128,
}

#[test]
fn processes_and_threads_never_overlap_and_tokens_rise() {
    let server = RedisServer::start();
    let children: Vec<_> = (0..PROCESSES)
        .map(|_| {
            crate::child_test("stress::stress_child")
                .env("REDGUARD_STRESS_URL", server.url())
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();

    // Drain every child at once: a child blocked on a full pipe would stop competing.
    let readers: Vec<_> = children
        .into_iter()
        .map(|child| thread::spawn(move || child.wait_with_output().unwrap()))
        .collect();
    let deadline = Instant::now() + RUN + Duration::from_secs(60);
    let mut sections: HashMap<String, Vec<Section>> = HashMap::new();
    for reader in readers {
        while !reader.is_finished() {
            assert!(Instant::now() < deadline, "a child process hung");
            thread::sleep(Duration::from_millis(20));
        }
        let output = reader.join().unwrap();
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(
            output.status.success(),
            "child failed:\n{stdout}\n{}",
            String::from_utf8_lossy(&output.stderr)
        );
        let mut logged = 0;
        for line in stdout.lines().filter_map(|l| l.strip_prefix("CS ")) {
            let f: Vec<&str> = line.split(' ').collect();
            sections.entry(f[0].to_string()).or_default().push(Section {
                token: f[1].parse().unwrap(),
                start: f[2].parse().unwrap(),
                end: f[3].parse().unwrap(),
            });
            logged += 1;
        }
        assert!(
            logged >= 20,
            "a child logged only {logged} critical sections"
        );
    }

    for key in KEYS {
        let mut log = sections.remove(key).unwrap_or_default();
        assert!(
            log.len() >= 10,
            "{key}: only {} critical sections",
            log.len()
        );
        log.sort_by_key(|s| s.start);
        for pair in log.windows(2) {
            let (a, b) = (&pair[0], &pair[1]);
            assert!(
                a.end <= b.start,
                "{key}: overlapping critical sections {a:?} {b:?}"
            );
            assert!(
                a.token < b.token,
                "{key}: token did not rise: {a:?} then {b:?}"
            );
        }
    }
}

#[test]
#[ignore = "run by processes_and_threads_never_overlap_and_tokens_rise"]
fn stress_child() {
    let Ok(url) = std::env::var("REDGUARD_STRESS_URL") else {
        return; // run alone (say with --include-ignored): nothing to do
    };
    let locker = Locker::connect(url).unwrap();
    let until = Instant::now() + RUN;
    let options = LockOptions::default()
        .fencing(true)
        .ttl(Duration::from_secs(5))
        .timeout(Duration::from_secs(5));
    thread::scope(|s| {
        for t in 0..THREADS {
            let (locker, options) = (&locker, &options);
            s.spawn(move || {
                let mut round = t;
                while Instant::now() < until {
                    let key = KEYS[round % KEYS.len()];
                    round += 1;
                    let guard = locker.lock_with(&[key], options.clone()).unwrap();
                    let start = now_ns();
                    // A while inside, for the others to collide with if exclusion failed.
                    thread::sleep(Duration::from_micros(200));
                    let end = now_ns();
                    let token = guard.fence().unwrap();
                    guard.release().unwrap();
                    println!("CS {key} {token} {start} {end}");
                }
            });
        }
    });
}

/// Wall-clock time: the one clock all the processes share.
fn now_ns() -> u128 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .unwrap()
        .as_nanos()
}
