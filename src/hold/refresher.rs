//! One background thread per locker that keeps auto-refreshed locks alive.
//!
//! Each lock is refreshed at about a third of its TTL. When one is due, every lock due
//! within a quarter of its TTL rides along, so all refreshes of one wake-up go out in one
//! script call (one round trip, one reply), and locks refreshed together stay together:
//! as the window is over half the refresh period, all of them soon share one wake-up. A lock found gone is marked lost (nothing is deleted); after an error
//! the lock is tried again, less often each time, until it would have expired anyway, and
//! then it is marked lost.

use std::collections::HashMap;
use std::io;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::{Held, is_random_form};
use crate::backend::Refresh;
use crate::backend::{Backend, Refreshed};
use crate::lost::{Lost, OnLost};
use crate::stats;

pub(crate) struct Refresher {
    state: Arc<State>,
    backend: Backend,
    on_lost: Option<OnLost>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What the thread shares with its owner: the schedule and a way to wake it.
struct State {
    schedule: Mutex<Schedule>,
    wake: Condvar,
}

#[derive(Default)]
struct Schedule {
    entries: HashMap<u64, Entry>,
    /// When the sleeping thread wakes by itself; `None` while it is busy or idle.
    next_wake: Option<Instant>,
    /// Holds found lost by their owners (then released or dropped): to be told of.
    to_tell: Vec<Arc<Held>>,
    stopping: bool,
}

struct Entry {
    held: Arc<Held>,
    /// Set after a failed round trip: try again then instead of at the usual time.
    retry_at: Option<Instant>,
    /// Round trips failed in a row.
    failures: u32,
    /// Its last refresh reached the longest hold ([`LockOptions::max_hold`]): it is due
    /// no more, only to be found lost when it runs out.
    ///
    /// [`LockOptions::max_hold`]: crate::LockOptions::max_hold
    at_most: bool,
}

impl Entry {
    fn new(held: Arc<Held>) -> Entry {
        Entry {
            held,
            retry_at: None,
            failures: 0,
            at_most: false,
        }
    }

    /// When to refresh: after a failure, exactly at the retry time; otherwise at a third
    /// of the TTL, or up to a quarter of the TTL earlier to share a round trip.
    fn due(&self) -> (Instant, Duration) {
        match self.retry_at {
            Some(at) => (at, Duration::ZERO),
            None if self.at_most => (self.held.timing().expires_at(), Duration::ZERO),
            None => {
                let timing = self.held.timing();
                (
                    timing.refresh_at(),
                    Duration::from_millis(timing.ttl_ms / 4),
                )
            }
        }
    }

    fn succeeded(&mut self) {
        self.retry_at = None;
        self.failures = 0;
    }

    /// After a refresh that succeeded with `ttl` where `wanted` was asked for.
    fn refreshed(&mut self, ttl: u64, wanted: u64) {
        self.succeeded();
        self.at_most = ttl < wanted;
    }

    /// Backs off after a failure: a tenth of the TTL (10 ms to 1 s), doubling each time,
    /// never more than a third of the TTL.
    fn failed(&mut self, now: Instant) {
        let ttl = Duration::from_millis(self.held.timing().ttl_ms);
        let gap = (ttl / 10)
            .clamp(Duration::from_millis(10), Duration::from_secs(1))
            .saturating_mul(1 << self.failures.min(8))
            .min(ttl / 3);
        self.failures = self.failures.saturating_add(1);
        self.retry_at = Some(now + gap);
    }
}

impl Refresher {
    /// A refresher that starts its thread with the first lock it is given.
    pub(crate) fn new(backend: Backend, on_lost: Option<OnLost>) -> Refresher {
        Refresher {
            state: Arc::new(State {
                schedule: Mutex::new(Schedule::default()),
                wake: Condvar::new(),
            }),
            backend,
            on_lost,
            thread: Mutex::new(None),
        }
    }

    /// Keeps `held` alive from now on, until [`remove`](Self::remove) or until it is lost.
    pub(crate) fn add(&self, held: Arc<Held>) -> io::Result<()> {
        self.start()?;
        let entry = Entry::new(held);
        let (due, _) = entry.due();
        let mut schedule = self.state.schedule.lock();
        schedule.entries.insert(entry.held.id, entry);
        self.wake_if_before(&schedule, due);
        Ok(())
    }

    /// Stops refreshing the hold `id` (given up by its owner: nothing is told of it).
    pub(crate) fn remove(&self, id: u64) {
        self.state.schedule.lock().entries.remove(&id);
    }

    /// Tells of a hold its owner found lost before giving it up, on the refresher thread,
    /// as when the refresher finds a loss itself (once per hold, whoever finds it).
    pub(crate) fn tell_lost(&self, held: Arc<Held>) {
        self.state.schedule.lock().to_tell.push(held);
        self.state.wake.notify_one();
    }

    /// Tells the thread that a refresh of the hold `id` by hand is done (`refreshed` when
    /// it succeeded, maybe with a shorter TTL): the hold is its to refresh again, and it
    /// may be due (the thread skips a hold while a refresh of it is in flight).
    pub(crate) fn rescheduled(&self, id: u64, refreshed: bool) {
        let mut schedule = self.state.schedule.lock();
        if let Some(entry) = schedule.entries.get_mut(&id) {
            if refreshed {
                entry.succeeded();
            }
            self.state.wake.notify_one();
        }
    }

    fn wake_if_before(&self, schedule: &Schedule, due: Instant) {
        if schedule.next_wake.is_none_or(|wake| due < wake) {
            self.state.wake.notify_one();
        }
    }

    fn start(&self) -> io::Result<()> {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let state = Arc::clone(&self.state);
            let backend = self.backend.clone();
            let on_lost = self.on_lost.clone();
            let handle = thread::Builder::new()
                .name("redguard-refresher".into())
                .spawn(move || run(&state, &backend, on_lost.as_ref()))?;
            *thread = Some(handle);
        }
        Ok(())
    }
}

impl Drop for Refresher {
    fn drop(&mut self) {
        self.state.schedule.lock().stopping = true;
        self.state.wake.notify_all();
        if let Some(handle) = self.thread.get_mut().take() {
            // Dropped on the thread itself (by an on_lost callback that upgraded a
            // WeakLocker, the last to let go): it ends by itself once this returns.
            if handle.thread().id() == thread::current().id() {
                return;
            }
            // The thread's waits are bounded by the pool's timeouts, so this join is too.
            // It cannot panic, and if it did there is nothing left to tell.
            let _ = handle.join();
        }
    }
}

fn run(state: &State, backend: &Backend, on_lost: Option<&OnLost>) {
    let mut batch = Vec::new();
    let mut lost = Vec::new();
    loop {
        {
            let mut schedule = state.schedule.lock();
            loop {
                if schedule.stopping {
                    return;
                }
                let now = Instant::now();
                lost.append(&mut schedule.to_tell);
                let next = schedule.collect_due(now, &mut batch, &mut lost);
                if !batch.is_empty() || !lost.is_empty() {
                    schedule.next_wake = None;
                    break;
                }
                schedule.next_wake = next;
                match next {
                    Some(at) => {
                        state.wake.wait_until(&mut schedule, at);
                    }
                    None => state.wake.wait(&mut schedule),
                }
            }
        }
        // Told without the schedule's lock: the callback may take its time.
        for held in lost.drain(..) {
            tell(&held, on_lost);
        }
        // Each hold's refresh turn is taken only now, after the callbacks above: a slow
        // one (or one that refreshes a hold by hand) must not hold the turns up.
        batch.retain(|held| {
            if !held.try_refresh_turn() {
                return false;
            }
            // Given up since it was collected (a release that keeps it for
            // hold_at_least sets a shorter TTL, which this refresh must not undo).
            if held.has_ended() {
                held.end_refresh_turn();
                return false;
            }
            true
        });
        if !batch.is_empty() {
            refresh(state, backend, &batch, on_lost);
            for held in batch.drain(..) {
                held.end_refresh_turn();
            }
        }
    }
}

/// Logs a hold found lost and calls `on_lost`, once per hold (a panic in it is caught).
fn tell(held: &Held, on_lost: Option<&OnLost>) {
    // A waiter's entry gone is no loss: its waiter asks Redis.
    if held.tell_waiter() || !held.first_to_tell() {
        return;
    }
    stats::lost(held.kind);
    // A few characters of a random token tell holds apart in a log; a whole token would
    // let a reader of the log release the hold, and a fixed one is short and guessable:
    // none of it is logged.
    let token = held.token();
    let shown = if is_random_form(token) {
        format!("token {}…", &token[..6])
    } else {
        "a fixed token".to_string()
    };
    log::warn!(
        "redguard: {:?} lost ({shown}, metadata {:?}): it expired or was taken before the refresher could extend it",
        held.names(),
        held.metadata()
    );
    if let Some(OnLost(f)) = on_lost {
        let lost = Lost::new(held.names().to_vec(), held.metadata().to_owned());
        if std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| f(&lost))).is_err() {
            log::warn!("redguard: the on_lost callback panicked; the refresher goes on");
        }
    }
}

impl Schedule {
    /// Once some lock is due, moves every lock due within a quarter of its TTL into `batch`
    /// (so that they share the round trip, and stay together from then on); drops lost
    /// ones; returns when the next lock falls due. Locks that are only nearly due never
    /// start a round trip by themselves, or they would trickle out one small batch each.
    fn collect_due(
        &mut self,
        now: Instant,
        batch: &mut Vec<Arc<Held>>,
        lost: &mut Vec<Arc<Held>>,
    ) -> Option<Instant> {
        let mut next: Option<Instant> = None;
        let mut any_due = false;
        self.entries.retain(|_, entry| {
            // Being given up by its owner: whatever it is now, no loss.
            if entry.held.has_ended() {
                return false;
            }
            if entry.held.is_lost() {
                lost.push(Arc::clone(&entry.held));
                return false;
            }
            let (due, slack) = entry.due();
            if due <= now {
                any_due = true;
            } else {
                next = Some(next.map_or(due, |n| n.min(due)));
            }
            if due.checked_sub(slack).is_none_or(|early| early <= now) {
                batch.push(Arc::clone(&entry.held));
            }
            true
        });
        if !any_due {
            batch.clear();
        }
        next
    }
}

/// One round trip for the whole batch (each hold's refresh turn taken: a hold being
/// refreshed by hand is left out, and its owner wakes the thread when done), then the
/// bookkeeping, without holding the schedule's lock across the I/O.
fn refresh(state: &State, backend: &Backend, batch: &[Arc<Held>], on_lost: Option<&OnLost>) {
    // Each capped by what is left of its longest hold (see `Lease`).
    let now = Instant::now();
    let wanted: Vec<u64> = batch.iter().map(|held| held.timing().ttl_ms).collect();
    let ttls: Vec<u64> = batch
        .iter()
        .zip(&wanted)
        .map(|(held, &ttl)| held.lease.capped_ms(ttl, now).max(1))
        .collect();
    let locks: Vec<Refresh<'_>> = batch
        .iter()
        .zip(&ttls)
        .map(|(held, &ttl_ms)| Refresh {
            kind: held.kind,
            entry_of: held.entry_of,
            keys: &held.keys,
            value: &held.value,
            ttl_ms,
            replicas: held.replicas,
        })
        .collect();
    let sent_at = Instant::now();
    let result = backend.refresh(&locks);
    let round_trip = sent_at.elapsed();

    let outcomes = match result {
        Ok(outcomes) => outcomes,
        Err(e) => {
            log::warn!(
                "redguard: refreshing {} holds failed, to be tried again: {e}",
                batch.len()
            );
            vec![Refreshed::Unknown; batch.len()]
        }
    };
    let mut found_lost = Vec::new();
    let mut schedule = state.schedule.lock();
    let now = Instant::now();
    let (mut kept, mut unknown) = (0, 0);
    for (((held, &ttl), &wanted), outcome) in batch.iter().zip(&ttls).zip(&wanted).zip(outcomes) {
        match outcome {
            // Given up by its owner while this refresh was in flight: whatever it found
            // is that release, never a loss (and the entry is gone already).
            _ if held.has_ended() => {}
            Refreshed::Held { sent_at } => {
                kept += 1;
                held.refreshed(sent_at, ttl);
                if let Some(entry) = schedule.entries.get_mut(&held.id) {
                    entry.refreshed(ttl, wanted);
                }
            }
            Refreshed::Lost => {
                held.mark_lost();
                schedule.entries.remove(&held.id);
                found_lost.push(held);
            }
            Refreshed::Unknown | Refreshed::NotReplicated { .. } if held.is_lost() => {
                schedule.entries.remove(&held.id);
                found_lost.push(held);
            }
            // Short of replicas: tried again as a refresh that failed, and lost in the end.
            Refreshed::Unknown | Refreshed::NotReplicated { .. } => {
                unknown += 1;
                if let Some(entry) = schedule.entries.get_mut(&held.id) {
                    entry.failed(now);
                }
            }
        }
    }
    drop(schedule);
    stats::refreshed(kept, found_lost.len() as u64, unknown, round_trip);
    for held in found_lost {
        tell(held, on_lost);
    }
}
