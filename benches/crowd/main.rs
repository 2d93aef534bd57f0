//! Crowds of lockers on one key: waiters in different `Locker`s (threads of one process,
//! and separate processes), many waiters, a semaphore, and readers beside a writer; each
//! against a floor measured in the same round (plain connections: SET NX PX, a 1 ms
//! pause on failure, an EVALSHA compare-and-delete), unpinned and with every process on
//! one CPU (taskset -c 0), the median of 3 alternating rounds.
//!
//! ```text
//! cargo bench --bench crowd                  # every section, Markdown on stdout
//! cargo bench --bench crowd -- lockers       # only some: lockers processes many semaphore reads
//! BENCH_SECS=1 cargo bench --bench crowd     # the span of each run (default 2 s)
//! ```
//!
//! Every worker's wait is bounded (10 s, then counted as a TIMEOUT), so no run hangs.
//! Round trips are counted by the server (INFO commandstats: the SET, EVALSHA and EVAL
//! calls clients made; the lock scripts call none of these themselves). The `processes`
//! section runs this binary again as children (see child.rs); they are killed if the
//! parent panics.

mod child;
mod harness;
mod many;

#[allow(dead_code)] // the tests use more of the harness than the bench does
#[path = "../../tests/it/server.rs"]
mod server;

use std::time::Duration;

use harness::{
    Run, contend, floor_worker, lock_worker, median, permit_worker, pin, place, read_worker,
    timeouts,
};
use server::RedisServer;

/// One section of the bench: its runs and its table.
type Section = fn(&RedisServer, Duration);

const ROUNDS: usize = 3;
/// Waiters of the lockers and processes sections.
const WAITERS: usize = 4;
/// Waiters of the semaphore section, and its permits.
const SEM_WAITERS: usize = 8;
const PERMITS: u32 = 2;
const READERS: usize = 4;

/// Runs `round` (one run of each variant) `ROUNDS` times, unpinned then pinned, and
/// gives each variant's median by place.
fn rounds(server: &RedisServer, mut round: impl FnMut(bool) -> Vec<Run>) -> Vec<(bool, Vec<Run>)> {
    [false, true]
        .into_iter()
        .map(|pinned| {
            pin(&[server.pid()], pinned);
            let mut all: Vec<Vec<Run>> = Vec::new();
            for _ in 0..ROUNDS {
                for (i, run) in round(pinned).into_iter().enumerate() {
                    if all.len() <= i {
                        all.push(Vec::new());
                    }
                    all[i].push(run);
                }
            }
            pin(&[server.pid()], false);
            (pinned, all.into_iter().map(median).collect())
        })
        .collect()
}

/// "✓" or "✗".
fn mark(ok: bool) -> &'static str {
    if ok { "✓" } else { "✗" }
}

const CROWD_HEAD: &str = "| run | acquisitions/s | ×floor | round trips per acquisition | wait p99 ms | locker shares (of the mean) | timeouts | targets: ≥1.0× floor, ≤2.2 trips, p99 ≤1 ms pinned, shares 0.8–1.25 |\n|---|---:|---:|---:|---:|---|---:|---|";

/// A row of the lockers and processes tables; the targets are checked for the lockers'.
fn crowd_row(name: &str, run: &Run, floor: &Run, pinned: bool, targets: bool) -> String {
    let (min, max) = run.shares(1);
    let ratio = run.rate() / floor.rate();
    let checks = if targets {
        let p99 = if pinned {
            format!("p99 {}", mark(run.p99_ms() <= 1.0))
        } else {
            "p99 (pinned only)".into()
        };
        format!(
            "×floor {}, trips {}, {p99}, shares {}",
            mark(ratio >= 1.0),
            mark(run.trips() <= 2.2),
            mark(min >= 0.8 && max <= 1.25)
        )
    } else {
        String::new()
    };
    format!(
        "| {name}, {} | {:.0} | {ratio:.2} | {:.2} | {:.2} | {min:.2}–{max:.2} | {} | {checks} |",
        place(pinned),
        run.rate(),
        run.trips(),
        run.p99_ms(),
        timeouts(run.timeouts()),
    )
}

/// Row 1: 4 waiters, each its own Locker on its own thread, against 4 floor connections.
fn lockers(server: &RedisServer, span: Duration) {
    println!("\n## {WAITERS} waiters on one key, each its own Locker (one thread each)\n");
    println!("{CROWD_HEAD}");
    let url = server.url();
    for (pinned, runs) in rounds(server, |_| {
        vec![
            contend(server, WAITERS, span, None, |i| {
                floor_worker(&url, "crowd:floor", format!("floor-{i}"))
            }),
            contend(server, WAITERS, span, None, |_| {
                lock_worker(&url, "crowd:lockers")
            }),
        ]
    }) {
        let floor = &runs[0];
        println!("{}", crowd_row("floor", floor, floor, pinned, false));
        let name = format!("{WAITERS} Lockers, lock()");
        println!("{}", crowd_row(&name, &runs[1], floor, pinned, true));
    }
}

/// Row 2: the same with 4 processes (children of this binary), against 4 floor processes.
fn processes(server: &RedisServer, span: Duration) {
    println!("\n## {WAITERS} waiters on one key, each its own process (one Locker, one thread)\n");
    println!("{CROWD_HEAD}");
    for (pinned, runs) in rounds(server, |pinned| {
        vec![
            child::processes(server, WAITERS, "floor", "crowd:pfloor", span, pinned),
            child::processes(server, WAITERS, "lock", "crowd:procs", span, pinned),
        ]
    }) {
        let floor = &runs[0];
        println!(
            "{}",
            crowd_row("floor processes", floor, floor, pinned, false)
        );
        let name = format!("{WAITERS} processes, lock()");
        println!("{}", crowd_row(&name, &runs[1], floor, pinned, true));
    }
}

/// Row 4: 8 waiters on a semaphore of 2 permits against the same 8 on `lock()`.
fn semaphore(server: &RedisServer, span: Duration) {
    println!(
        "\n## Semaphore: {SEM_WAITERS} waiters (each its own Locker, one thread) on {PERMITS} permits\n"
    );
    println!(
        "| run | acquisitions/s | ×floor | ×lock | wait p99 ms | locker shares | timeouts | target: semaphore ≥0.9× lock |"
    );
    println!("|---|---:|---:|---:|---:|---|---:|---|");
    let url = server.url();
    for (pinned, runs) in rounds(server, |_| {
        vec![
            contend(server, SEM_WAITERS, span, None, |i| {
                floor_worker(&url, "crowd:sfloor", format!("floor-{i}"))
            }),
            contend(server, SEM_WAITERS, span, None, |_| {
                lock_worker(&url, "crowd:semlock")
            }),
            contend(server, SEM_WAITERS, span, None, |_| {
                permit_worker(&url, "crowd:sem", PERMITS)
            }),
        ]
    }) {
        let (floor, lock) = (&runs[0], &runs[1]);
        for (name, run) in [
            ("floor".to_string(), floor),
            (format!("{SEM_WAITERS} Lockers, lock()"), lock),
            (
                format!("{SEM_WAITERS} Lockers, semaphore({PERMITS}).acquire()"),
                &runs[2],
            ),
        ] {
            let (min, max) = run.shares(1);
            let to_lock = run.rate() / lock.rate();
            let target = if name.contains("semaphore") {
                mark(to_lock >= 0.9)
            } else {
                ""
            };
            println!(
                "| {name}, {} | {:.0} | {:.2} | {to_lock:.2} | {:.2} | {min:.2}–{max:.2} | {} | {target} |",
                place(pinned),
                run.rate(),
                run.rate() / floor.rate(),
                run.p99_ms(),
                timeouts(run.timeouts()),
            );
        }
    }
}

/// Row 5: 4 readers and 1 writer, each its own Locker, against 5 floor connections.
fn reads(server: &RedisServer, span: Duration) {
    println!(
        "\n## Read locks across lockers: {READERS} readers and 1 writer, each its own Locker\n"
    );
    println!(
        "| run | reader acquisitions/s | writer acquisitions/s | all ×floor | writer wait p99 ms | reader wait p99 ms | timeouts |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    let url = server.url();
    for (pinned, runs) in rounds(server, |_| {
        vec![
            contend(server, READERS + 1, span, None, |i| {
                floor_worker(&url, "crowd:rfloor", format!("floor-{i}"))
            }),
            contend(server, READERS + 1, span, None, |i| {
                if i < READERS {
                    read_worker(&url, "crowd:rw")
                } else {
                    lock_worker(&url, "crowd:rw")
                }
            }),
        ]
    }) {
        let (floor, rw) = (&runs[0], &runs[1]);
        let p99 = |range| harness::percentile(&rw.waits(range), 0.99).as_secs_f64() * 1e3;
        println!(
            "| floor ({} exclusive connections), {} | | | 1.00 ({:.0}/s) | | | {} |",
            READERS + 1,
            place(pinned),
            floor.rate(),
            timeouts(floor.timeouts()),
        );
        println!(
            "| {READERS} readers + 1 writer, {} | {:.0} | {:.0} | {:.2} | {:.2} | {:.2} | {} |",
            place(pinned),
            rw.rate_of(0..READERS),
            rw.rate_of(READERS..READERS + 1),
            rw.rate() / floor.rate(),
            p99(READERS..READERS + 1),
            p99(0..READERS),
            timeouts(rw.timeouts()),
        );
    }
}

fn main() {
    if let Ok(spec) = std::env::var(child::CHILD) {
        return child::child(&spec);
    }
    let span = server::bench_span();
    let secs = span.as_secs_f64();
    // cargo bench passes `--bench`; the other words pick sections.
    let filters: Vec<String> = std::env::args()
        .skip(1)
        .filter(|a| !a.starts_with('-'))
        .collect();
    let wanted = |name: &str| filters.is_empty() || filters.iter().any(|f| name.contains(f));
    let server = RedisServer::start();
    println!("\n# Crowds: {secs} s per run, median of {ROUNDS} alternating rounds\n");
    let sections: [(&str, Section); 5] = [
        ("lockers", lockers),
        ("processes", processes),
        ("many", many::many),
        ("semaphore", semaphore),
        ("reads", reads),
    ];
    for (name, section) in sections {
        if wanted(name) {
            section(&server, span);
        }
    }
}
