//! What ends a wait from another thread: its [`Cancel`](crate::Cancel) and its locker's
//! [`close`](crate::Locker::close). Each is an [`Alarm`], rung once and for good. A wait
//! listens to its alarms while it sleeps, and checks them under the lock it sleeps under
//! (its mailbox's, or the board's for a waiter that does not queue); a ring wakes it under
//! that same lock, so a ring is never missed: no polling, no round trip.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use parking_lot::{Condvar, Mutex};

use super::board::Board;
use super::mailbox::Mailbox;

/// Rung once, for good: wakes the waits listening to it then; a wait that checks it later
/// finds it rung.
#[derive(Default)]
pub(crate) struct Alarm {
    rung: AtomicBool,
    /// The waits asleep now, each with the number of its listening.
    sleepers: Mutex<HashMap<u64, Sleeper>>,
}

impl Alarm {
    /// Rings it: every wait listening to it wakes, and each that checks it from now on
    /// stops.
    pub(crate) fn ring(&self) {
        self.rung.store(true, Ordering::SeqCst);
        // Woken outside the list's lock. A wait that listens after the list was read
        // finds the alarm rung at its next check (the list's lock orders the two).
        let sleepers: Vec<Sleeper> = self.sleepers.lock().values().cloned().collect();
        for sleeper in sleepers {
            sleeper.wake();
        }
    }

    /// Whether it was rung: one atomic load.
    pub(crate) fn is_rung(&self) -> bool {
        self.rung.load(Ordering::SeqCst)
    }
}

/// What a wait sleeps on, to wake it.
#[derive(Clone)]
pub(crate) struct Sleeper(Sleeps);

#[derive(Clone)]
enum Sleeps {
    /// A queued (or joining) waiter's mailbox.
    Mailbox(Arc<Mailbox>),
    /// A waiter that does not queue: its wake-up, with the board whose lock it sleeps
    /// under.
    Ticket(Arc<Board>, Arc<Condvar>),
}

impl Sleeper {
    /// A waiter sleeping on `mailbox`.
    pub(crate) fn mailbox(mailbox: &Arc<Mailbox>) -> Sleeper {
        Sleeper(Sleeps::Mailbox(Arc::clone(mailbox)))
    }

    /// A waiter that does not queue, sleeping on `wake` under `board`'s lock.
    pub(super) fn ticket(board: &Arc<Board>, wake: &Arc<Condvar>) -> Sleeper {
        Sleeper(Sleeps::Ticket(Arc::clone(board), Arc::clone(wake)))
    }

    /// Wakes it without word, under the lock its wait checks the alarms under.
    fn wake(&self) {
        match &self.0 {
            Sleeps::Mailbox(mailbox) => mailbox.wake(),
            Sleeps::Ticket(board, wake) => {
                let _state = board.state.lock();
                wake.notify_all();
            }
        }
    }
}

/// What ends one wait early: its locker's close and, if it has one, its own cancel.
#[derive(Clone, Copy, Default)]
pub(crate) struct Stop<'a> {
    alarms: [Option<&'a Alarm>; 2],
}

impl<'a> Stop<'a> {
    /// A wait of the locker whose close is `closed`, cancelled by `cancel` if any.
    pub(crate) fn new(closed: &'a Alarm, cancel: Option<&'a Alarm>) -> Stop<'a> {
        Stop {
            alarms: [Some(closed), cancel],
        }
    }

    /// What nothing ends early.
    pub(crate) fn never() -> Stop<'static> {
        Stop::default()
    }

    /// Whether the wait should end now.
    pub(crate) fn is_set(&self) -> bool {
        self.alarms.iter().flatten().any(|alarm| alarm.is_rung())
    }

    /// Has a ring of either alarm wake `sleeper`, until the listening is dropped.
    pub(crate) fn listen(self, sleeper: Sleeper) -> Listening<'a> {
        static NEXT: AtomicU64 = AtomicU64::new(1);
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        for alarm in self.alarms.iter().flatten() {
            alarm.sleepers.lock().insert(id, sleeper.clone());
        }
        Listening { stop: self, id }
    }
}

/// A sleeper listening to the alarms of a [`Stop`]; it stops listening on drop.
pub(crate) struct Listening<'a> {
    stop: Stop<'a>,
    id: u64,
}

impl Drop for Listening<'_> {
    fn drop(&mut self) {
        for alarm in self.stop.alarms.iter().flatten() {
            alarm.sleepers.lock().remove(&self.id);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::Letter;
    use std::thread;
    use std::time::{Duration, Instant};

    #[test]
    fn a_ring_wakes_a_mailbox_asleep_and_ends_later_waits_at_once() {
        let (closed, cancel) = (Alarm::default(), Alarm::default());
        let stop = Stop::new(&closed, Some(&cancel));
        let mailbox = Arc::new(Mailbox::new(None));
        let far = Instant::now() + Duration::from_secs(30);
        thread::scope(|s| {
            let _listening = stop.listen(Sleeper::mailbox(&mailbox));
            s.spawn(|| {
                thread::sleep(Duration::from_millis(20));
                cancel.ring();
            });
            let started = Instant::now();
            assert_eq!(mailbox.wait_until(far, stop), None);
            assert!(started.elapsed() < Duration::from_secs(10));
        });
        assert!(stop.is_set() && !closed.is_rung());
        assert!(cancel.sleepers.lock().is_empty(), "stopped listening");
        assert!(closed.sleepers.lock().is_empty(), "stopped listening");
        let started = Instant::now();
        assert_eq!(mailbox.wait_until(far, stop), None);
        assert!(started.elapsed() < Duration::from_secs(1));
    }

    #[test]
    fn word_in_the_mailbox_comes_before_the_stop() {
        let closed = Alarm::default();
        closed.ring();
        let mailbox = Mailbox::new(None);
        mailbox.post(Letter::Attempt);
        let stop = Stop::new(&closed, None);
        assert_eq!(
            mailbox.wait_until(Instant::now(), stop),
            Some(Letter::Attempt)
        );
        assert!(!Stop::never().is_set());
    }
}
