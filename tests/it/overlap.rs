//! Waiters for overlapping sets of keys, readers and writers among them, each with a
//! locker of its own: everyone is served, without stalls, and no writer overlaps another
//! holder of a key.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use crate::locker;
use crate::order::in_line;
use crate::server::RedisServer;

/// What a worker of [`overlapping_sets`] takes, again and again.
#[derive(Clone, Copy)]
enum Want {
    Lock(&'static [usize]),
    Read(&'static [usize]),
}

/// A lock or a shared hold.
enum Held {
    Lock(redguard::LockGuard),
    Read(redguard::ReadGuard),
}

/// Per key ("a", "b", "c"): the writers and the readers inside now, and the overlaps seen.
#[derive(Default)]
struct Inside {
    writers: [AtomicUsize; 3],
    readers: [AtomicUsize; 3],
    overlaps: AtomicUsize,
}

impl Inside {
    fn enter(&self, want: Want) {
        let overlap = match want {
            Want::Lock(set) => set.iter().any(|&i| {
                self.writers[i].fetch_add(1, Ordering::SeqCst) != 0
                    || self.readers[i].load(Ordering::SeqCst) != 0
            }),
            Want::Read(set) => set.iter().any(|&i| {
                self.readers[i].fetch_add(1, Ordering::SeqCst);
                self.writers[i].load(Ordering::SeqCst) != 0
            }),
        };
        if overlap {
            self.overlaps.fetch_add(1, Ordering::SeqCst);
        }
    }

    fn leave(&self, want: Want) {
        let (set, inside) = match want {
            Want::Lock(set) => (set, &self.writers),
            Want::Read(set) => (set, &self.readers),
        };
        for &i in set {
            inside[i].fetch_sub(1, Ordering::SeqCst);
        }
    }
}

/// Each of `wants` in a thread and a locker of its own, `rounds` times: all are served,
/// none overlaps a writer on a key, no single wait is long (each holds 1 ms), and nothing
/// is left on the server at the end. Returns how long it all took.
fn overlapping_sets(wants: &[Want], rounds: usize) -> Duration {
    const KEYS: [&str; 3] = ["a", "b", "c"];
    let server = RedisServer::start();
    let inside = Arc::new(Inside::default());
    let started = Instant::now();
    let workers: Vec<_> = wants
        .iter()
        .map(|&want| {
            let (locker, inside) = (locker(&server), inside.clone());
            thread::spawn(move || -> redguard::Result<Duration> {
                let mut longest = Duration::ZERO;
                for _ in 0..rounds {
                    let asked = Instant::now();
                    let held = match want {
                        Want::Lock(set) => {
                            let keys: Vec<&str> = set.iter().map(|&i| KEYS[i]).collect();
                            Held::Lock(locker.lock_with(&keys, in_line())?)
                        }
                        Want::Read(set) => {
                            let keys: Vec<&str> = set.iter().map(|&i| KEYS[i]).collect();
                            Held::Read(locker.read_with(&keys, in_line())?)
                        }
                    };
                    longest = longest.max(asked.elapsed());
                    inside.enter(want);
                    thread::sleep(Duration::from_millis(1));
                    inside.leave(want);
                    match held {
                        Held::Lock(guard) => guard.release()?,
                        Held::Read(guard) => guard.release()?,
                    }
                }
                Ok(longest)
            })
        })
        .collect();
    let mut longest = Duration::ZERO;
    for (i, worker) in workers.into_iter().enumerate() {
        let waited = worker.join().expect("a worker panicked");
        longest = longest.max(waited.unwrap_or_else(|e| panic!("worker {i}: {e:?}")));
    }
    let took = started.elapsed();
    assert_eq!(
        inside.overlaps.load(Ordering::SeqCst),
        0,
        "a writer overlapped"
    );
    for key in KEYS {
        let entries = server.queue_entries(key);
        assert!(
            entries.is_empty(),
            "left in the queue of {key}: {entries:?}"
        );
    }
    assert_eq!(server.all_keys(), Vec::<String>::new(), "nothing left");
    // Seven holders of 1 ms before it at most: a long wait is a stall.
    assert!(longest < Duration::from_secs(1), "a wait of {longest:?}");
    took
}

/// Lockers wanting overlapping sets of keys in a cycle ([a, b], [b, c], [c, a], and all
/// three) while others take single keys, many rounds each: all finish in time (nobody
/// waits for ever on a set whose keys the others pass around), and no key ever has two
/// holders at once.
#[test]
fn multi_key_waiters_in_a_cycle_of_overlapping_sets_are_all_served() {
    let wants = [
        Want::Lock(&[0, 1]),
        Want::Lock(&[1, 2]),
        Want::Lock(&[2, 0]),
        Want::Lock(&[0, 1, 2]),
        Want::Lock(&[0]),
        Want::Lock(&[1]),
        Want::Lock(&[2]),
    ];
    let took = overlapping_sets(&wants, 60);
    assert!(took < Duration::from_secs(20), "took {took:?}");
}

/// Readers and writers of overlapping sets ([a, b] and [b], as in `read.rs`), each with
/// a locker of its own: all are served without a stall, and no queue entry outlives its
/// waiter.
#[test]
fn readers_and_writers_of_overlapping_sets_are_served_without_stalls() {
    let wants = [
        Want::Read(&[0, 1]),
        Want::Read(&[1]),
        Want::Read(&[0, 1]),
        Want::Read(&[1]),
        Want::Lock(&[0, 1]),
        Want::Lock(&[1]),
    ];
    let took = overlapping_sets(&wants, 100);
    assert!(took < Duration::from_secs(20), "took {took:?}");
}
