//! Many waiters on one key: 2, 20 and 200 waiters (2 lockers × 1 thread, 20 × 1, 20 × 10),
//! each run until 2,000 acquisitions in all (or the span): the rate, how long the
//! last-served waited against the mean hold-to-hold time, and what the server spent.

use std::time::Duration;

use redguard::Locker;

use crate::harness::{Run, contend, floor_worker, locker_worker, pin, place, timeouts};
use crate::server::RedisServer;

/// Acquisitions per run, in all.
const CAP: u64 = 2_000;
/// The longest run, whatever the span: the six runs of each kind stay under ~20 s.
const LIMIT: Duration = Duration::from_secs(2);
/// (lockers, threads of each).
const SIZES: [(usize, usize); 3] = [(2, 1), (20, 1), (20, 10)];

/// The server's cost of a run: EVALSHA µs per call (INFO commandstats usec / calls; the
/// acquire scripts' calls are in it too), and its CPU (user + sys) µs per acquisition.
fn cost(run: &Run) -> (f64, f64) {
    let s = &run.stats;
    let per_call = s.evalsha_usec as f64 / s.evalsha.max(1) as f64;
    let cpu = s.cpu * 1e6 / run.total().max(1) as f64;
    (per_call, cpu)
}

/// The longest wait of any acquisition (the last-served) over the mean hold-to-hold time.
fn last_served(run: &Run) -> f64 {
    let longest = run
        .waits(0..run.tallies.len())
        .into_iter()
        .max()
        .unwrap_or_default();
    let hold_to_hold = run.elapsed.as_secs_f64() / run.total().max(1) as f64;
    longest.as_secs_f64() / hold_to_hold
}

pub fn many(server: &RedisServer, span: Duration) {
    let span = span.min(LIMIT);
    println!("\n## Many waiters on one key: 2, 20, 200\n");
    println!(
        "Each run until {CAP} acquisitions in all or {} s; one run each. Waiters are the \
         lockers' threads (default builder; 200 = 20 lockers × 10 threads). The last-served \
         wait is the longest of any acquisition, in mean hold-to-hold times (a FIFO queue: \
         about waiters − 1). Server time: EVALSHA µs per call (commandstats usec/calls, \
         acquire and release scripts alike) and server CPU µs (user + sys) per acquisition; \
         the floor's beside them. At 200 the floor's 1 ms spin (200 pollers) swamps the \
         server, so ×floor there says more about the floor than about the lock.\n",
        span.as_secs_f64()
    );
    println!(
        "| waiters | place | acquisitions/s | ×floor | last-served wait (hold-to-hold times) | EVALSHA µs/call | server CPU µs/acq | floor EVALSHA µs/call | floor CPU µs/acq | floor acq/s | timeouts |"
    );
    println!("|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|");
    for pinned in [false, true] {
        pin(&[server.pid()], pinned);
        for (lockers, threads) in SIZES {
            let n = lockers * threads;
            let url = server.url();
            let floor = contend(server, n, span, Some(CAP), |i| {
                floor_worker(&url, "crowd:many:floor", format!("floor-{i}"))
            });
            let all: Vec<Locker> = (0..lockers)
                .map(|_| Locker::connect(server.url()).expect("locker"))
                .collect();
            let ours = contend(server, n, span, Some(CAP), |i| {
                locker_worker(&all[i / threads], "crowd:many")
            });
            drop(all);
            let ((call, cpu), (floor_call, floor_cpu)) = (cost(&ours), cost(&floor));
            println!(
                "| {n} ({lockers} × {threads}) | {} | {:.0} | {:.2} | {:.0} (FIFO ≈ {}) | {call:.1} | {cpu:.1} | {floor_call:.1} | {floor_cpu:.1} | {:.0} | {} |",
                place(pinned),
                ours.rate(),
                ours.rate() / floor.rate(),
                last_served(&ours),
                n - 1,
                floor.rate(),
                timeouts(ours.timeouts() + floor.timeouts()),
            );
        }
    }
    pin(&[server.pid()], false);
}
