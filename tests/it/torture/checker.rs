//! The checker: the one resource every worker of the run writes to, and the record of
//! what it saw. Workers send it lines `<primitive> <event> <resource> <id> <fence> <arg>`
//! and it answers `OK` or `REFUSED` at once; the verdicts (`verdict.rs`) are drawn from
//! its record afterwards, on its one clock. It trusts nothing but what workers report and
//! what it accepts: a write with a stale fence is refused, as a resource that checks
//! fencing refuses it.

use std::collections::{BTreeSet, HashMap};
use std::io::{BufRead, BufReader, Write};
use std::net::TcpListener;
use std::sync::Arc;
use std::thread;
use std::time::Instant;

use parking_lot::Mutex;

/// The primitives under test.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Prim {
    /// `lock` on keys `t:*`.
    Lock,
    /// `read` and `lock` on `r:0`: readers and writers.
    Read,
    /// Permits of semaphore `s`.
    Permit,
    /// `lock` on `q:0` with long waits: the queue's order and promptness.
    Queue,
    /// Terms of election `e`.
    Term,
    /// Observers of election `e`.
    Observe,
}

impl Prim {
    pub const ALL: [Prim; 6] = [
        Prim::Lock,
        Prim::Read,
        Prim::Permit,
        Prim::Queue,
        Prim::Term,
        Prim::Observe,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Prim::Lock => "lock",
            Prim::Read => "read",
            Prim::Permit => "permit",
            Prim::Queue => "queue",
            Prim::Term => "term",
            Prim::Observe => "observe",
        }
    }

    fn parse(name: &str) -> Option<Prim> {
        Prim::ALL.into_iter().find(|p| p.name() == name)
    }
}

/// A hold's section: from its accepted-or-not start to its end.
pub struct Section {
    pub prim: Prim,
    pub resource: String,
    pub id: String,
    /// The fence (or term); 0 for a hold without one.
    pub fence: u64,
    /// A writer: excludes every other section of its resource (a reader does not).
    pub writer: bool,
    pub start: Instant,
    pub end: Option<Instant>,
    /// Both its start and its end were accepted by the resource.
    pub accepted: bool,
    /// The worker's hold was not lost after its end was written: by the lock's own
    /// account, its lease covered the whole section.
    pub held: bool,
}

/// A queued wait that ended without the keys.
pub struct GaveUp {
    pub called: Option<Instant>,
    pub at: Instant,
    pub error: String,
}

/// An observer's yield: the leader's term (0 for none), read after `waited`.
pub struct Sighting {
    pub waited: Instant,
    pub term: u64,
}

/// A span in which a fault was in progress.
#[derive(Clone, Copy)]
pub struct Fault {
    pub start: Instant,
    pub end: Instant,
    pub kind: &'static str,
}

/// Continuous presence of a waiter in the queue of `q:0` with one ticket, as the
/// watcher (`watcher.rs`) saw it: seen there in a read answered before `first` and in
/// one sent after `last`, and in every read between.
pub struct Presence {
    pub id: String,
    pub first: Instant,
    pub last: Instant,
}

#[derive(Default)]
pub struct Checker {
    pub sections: Vec<Section>,
    /// Attempt id -> index in `sections`, until its lease is reported.
    open: HashMap<String, usize>,
    /// Per exclusive resource: the largest fence accepted.
    largest: HashMap<String, u64>,
    /// Per semaphore: the fences of the writers it admits now (at most its limit).
    admitted: HashMap<String, BTreeSet<u64>>,
    /// Writes refused for a stale fence, per primitive.
    refused: HashMap<Prim, u64>,
    /// Queue attempt id -> when its `lock` call began.
    pub calls: HashMap<String, Instant>,
    pub gave_up: Vec<GaveUp>,
    /// Terms whose `fenced_set` said it wrote (`true`) or was refused.
    pub fenced_sets: Vec<(u64, bool)>,
    /// Term -> when its resign returned.
    pub resigned: HashMap<u64, Instant>,
    /// Observer id -> when its last wait began.
    waits: HashMap<String, Instant>,
    pub sightings: Vec<Sighting>,
    pub faults: Vec<Fault>,
    /// A fault in progress since then.
    pub fault_since: Option<Instant>,
    /// Steps of the wall clock (which Redis expires keys by) against the monotonic one:
    /// when, and by how many ms (positive: forward).
    pub clock_steps: Vec<(Instant, i64)>,
    pub presences: Vec<Presence>,
    /// Reads of the queue the watcher made.
    pub queue_reads: u64,
}

impl Checker {
    /// Handles one line; whether the resource accepted it.
    pub fn handle(&mut self, line: &str) -> bool {
        let parts: Vec<&str> = line.split(' ').collect();
        let [prim, event, resource, id, fence, arg] = parts[..] else {
            panic!("a line the checker does not know: {line:?}");
        };
        let prim = Prim::parse(prim).unwrap_or_else(|| panic!("no primitive {prim:?}"));
        let fence: u64 = fence.parse().unwrap_or(0);
        let now = Instant::now();
        match event {
            "BEGIN" => {
                let accepted = self.fenced(prim, resource, fence, arg, true);
                self.open.insert(id.to_string(), self.sections.len());
                self.sections.push(Section {
                    prim,
                    resource: resource.to_string(),
                    id: id.to_string(),
                    fence,
                    writer: arg != "r",
                    start: now,
                    end: None,
                    accepted,
                    held: false, // until its lease is reported
                });
                accepted
            }
            "END" => {
                let accepted = self.fenced(prim, resource, fence, arg, false);
                if let Some(&at) = self.open.get(id) {
                    let section = &mut self.sections[at];
                    section.end = Some(now);
                    section.accepted &= accepted;
                }
                accepted
            }
            "LEASE" => {
                if let Some(at) = self.open.remove(id) {
                    let section = &mut self.sections[at];
                    section.held = arg == "held" && section.end.is_some();
                }
                true
            }
            "CALL" => {
                self.calls.insert(id.to_string(), now);
                true
            }
            "GAVEUP" => {
                let called = self.calls.get(id).copied();
                let error = arg.to_string();
                self.gave_up.push(GaveUp {
                    called,
                    at: now,
                    error,
                });
                true
            }
            "FENCEDSET" => {
                self.fenced_sets.push((fence, arg == "ok"));
                true
            }
            "RESIGNED" => {
                self.resigned.insert(fence, now);
                true
            }
            "WAIT" => {
                self.waits.insert(id.to_string(), now);
                true
            }
            "SAW" => {
                let waited = self.waits.get(id).copied().unwrap_or(now);
                self.sightings.push(Sighting {
                    waited,
                    term: fence,
                });
                true
            }
            _ => panic!("an event the checker does not know: {line:?}"),
        }
    }

    /// A write with `fence` to `resource`, at the `start` of a section or at its end:
    /// accepted unless the resource has accepted a newer fence. A semaphore of `limit`
    /// permits admits `limit` writers at once: a new one past the limit evicts the oldest,
    /// whose writes are refused from then on, as is a writer older than all it admits.
    fn fenced(&mut self, prim: Prim, resource: &str, fence: u64, limit: &str, start: bool) -> bool {
        let accepted = match prim {
            Prim::Lock | Prim::Queue | Prim::Term => {
                let largest = self.largest.entry(resource.to_string()).or_insert(0);
                let accepted = fence >= *largest;
                *largest = (*largest).max(fence);
                accepted
            }
            Prim::Permit if start => {
                let limit: usize = limit.parse().unwrap_or(1);
                let admitted = self.admitted.entry(resource.to_string()).or_default();
                let full = admitted.len() >= limit;
                let accepted = !(full && admitted.first().is_some_and(|oldest| fence < *oldest));
                if accepted {
                    admitted.insert(fence);
                    while admitted.len() > limit {
                        admitted.pop_first();
                    }
                }
                accepted
            }
            Prim::Permit => self
                .admitted
                .get_mut(resource)
                .is_some_and(|admitted| admitted.remove(&fence)),
            Prim::Read | Prim::Observe => true,
        };
        if !accepted {
            *self.refused.entry(prim).or_default() += 1;
        }
        accepted
    }

    /// Writes of `prim` refused for a stale fence.
    pub fn refused_of(&self, prim: Prim) -> u64 {
        self.refused.get(&prim).copied().unwrap_or(0)
    }

    /// Whether a fault is in progress, or ended less than `settle` ago.
    pub fn unsettled(&self, now: Instant, settle: std::time::Duration) -> bool {
        self.fault_since.is_some()
            || self
                .faults
                .last()
                .is_some_and(|fault| fault.end + settle > now)
    }
}

/// Watches the wall clock against the monotonic one every 5 ms, recording each step of
/// more than 2 ms: Redis counts every TTL on its wall clock, so a step forward shortens
/// every lease by its size.
pub fn watch_clock(checker: Arc<Mutex<Checker>>) {
    thread::spawn(move || {
        let offset = || {
            let wall = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_micros() as i64);
            (Instant::now(), wall)
        };
        let (start, wall0) = offset();
        let mut last = 0i64;
        loop {
            thread::sleep(std::time::Duration::from_millis(5));
            let (now, wall) = offset();
            let drift = wall - wall0 - now.duration_since(start).as_micros() as i64;
            if (drift - last).abs() > 2000 {
                checker
                    .lock()
                    .clock_steps
                    .push((now, (drift - last) / 1000));
            }
            last = drift;
        }
    });
}

/// Serves the checker on a loopback port; returns the port.
pub fn serve(checker: Arc<Mutex<Checker>>) -> u16 {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    thread::spawn(move || {
        for stream in listener.incoming().flatten() {
            let checker = Arc::clone(&checker);
            thread::spawn(move || {
                let mut out = stream.try_clone().unwrap();
                for line in BufReader::new(stream).lines() {
                    let Ok(line) = line else { return };
                    let ok = checker.lock().handle(&line);
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
