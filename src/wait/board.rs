//! What the subscriber thread and the waiters share: the queued waiters' mailboxes, and,
//! for waiters that do not queue (a quorum, a lock across cluster slots), the keys
//! watched, the releases and subscriptions heard, and each such waiter's ticket. How a
//! queued waiter enrols and hears its word is in `enrolment.rs`.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::joins::Joins;
use super::mailbox::{Letter, Mailbox};

/// How often the thread looks up from its connection: to stop, and to drop channels no
/// one has waited on for a while.
pub(super) const SWEEP: Duration = Duration::from_secs(1);

/// What the thread and the waiters share.
#[derive(Default)]
pub(super) struct Board {
    pub(super) state: Mutex<State>,
    /// For the thread's own stop and finish (waiters sleep on wake-ups of their own).
    pub(super) changed: Condvar,
    /// This locker's own channel: a message there wakes the thread to (un)subscribe or stop.
    pub(super) wake: String,
    /// Where release channels start: the locker's prefix, then [`RELEASED`].
    pub(super) released: String,
    /// Which of the pools the thread listens on now.
    pub(super) listening: AtomicUsize,
    /// How many waiters are registered: while none, releases need not take the mutex.
    pub(super) waiting: AtomicUsize,
    /// This locker's locks and the entries that join the queue by their release.
    pub(super) joins: Joins,
}

#[derive(Default)]
pub(super) struct State {
    keys: HashMap<String, Watch>,
    /// The queued waiters of this locker, by value: where the scripts' word reaches them.
    pub(super) entries: HashMap<String, Vec<Arc<Mailbox>>>,
    /// Word for values not registered yet (the reply that queued the waiter may come after
    /// the message that served it), with when it came; dropped after a [`SWEEP`].
    pub(super) early: HashMap<String, (Letter, Instant)>,
    /// Counts every release heard and subscription confirmed, whatever the key: each
    /// such event is stamped with the next number, so stamps only grow, even for a key
    /// whose watch was swept and made anew (counting per watch would start again at zero
    /// and could look like nothing happened).
    generation: u64,
    /// Keys whose channel the thread has yet to subscribe to.
    pub(super) pending: Vec<String>,
    pub(super) stopping: bool,
    /// Set by the thread as it ends.
    pub(super) finished: bool,
}

struct Watch {
    /// The wake-ups of the waiters registered for this key.
    waiters: Vec<Arc<Condvar>>,
    /// The stamp of the last release heard on this key's channel (0: none yet).
    released: u64,
    /// The stamp of the last confirmed SUBSCRIBE: a new one after a reconnect may follow
    /// a missed release.
    subscribed_at: u64,
    /// Subscribed on the thread's current connection.
    subscribed: bool,
    /// Since when no one waits for this key.
    idle_since: Instant,
}

impl Watch {
    fn wake_all(&self) {
        for wake in &self.waiters {
            wake.notify_one();
        }
    }
}

/// What a waiter has seen of its keys: the newest stamps of their events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    pub(super) released: u64,
    pub(super) subscribed_at: u64,
    pub(super) all_subscribed: bool,
}

impl Board {
    /// Registers a queued waiter whose entry holds `value` (for a lock, on `lock_keys`),
    /// Whether some waiter that does not queue is registered for `key`.
    #[cfg(test)]
    pub(super) fn is_watched(&self, key: &str) -> bool {
        self.state
            .lock()
            .keys
            .get(key)
            .is_some_and(|watch| !watch.waiters.is_empty())
    }

    /// Registers one more waiter on each key; `true` when some key is new to the thread.
    pub(super) fn register(&self, keys: &[String], wake: &Arc<Condvar>) -> bool {
        let mut state = self.state.lock();
        let mut new_keys = false;
        for key in keys {
            let is_new = !state.keys.contains_key(key);
            let watch = state.keys.entry(key.clone()).or_insert_with(|| Watch {
                waiters: Vec::new(),
                released: 0,
                subscribed_at: 0,
                subscribed: false,
                idle_since: Instant::now(),
            });
            watch.waiters.push(Arc::clone(wake));
            if is_new {
                state.pending.push(key.clone());
                new_keys = true;
            }
        }
        new_keys
    }

    pub(super) fn unregister(&self, keys: &[String], wake: &Arc<Condvar>) {
        let mut state = self.state.lock();
        for key in keys {
            if let Some(watch) = state.keys.get_mut(key) {
                watch.waiters.retain(|other| !Arc::ptr_eq(other, wake));
                if watch.waiters.is_empty() {
                    watch.idle_since = Instant::now();
                }
            }
        }
    }

    /// The thread heard a release of `key`.
    pub(super) fn released(&self, key: &str) {
        let mut state = self.state.lock();
        let stamp = state.generation + 1;
        if let Some(watch) = state.keys.get_mut(key) {
            watch.released = stamp;
            watch.wake_all();
            state.generation = stamp;
        }
    }

    /// The thread's SUBSCRIBE to `key` was confirmed; `false` if no one watches it any more.
    pub(super) fn subscribed(&self, key: &str) -> bool {
        let mut state = self.state.lock();
        let stamp = state.generation + 1;
        let Some(watch) = state.keys.get_mut(key) else {
            return false;
        };
        watch.subscribed = true;
        watch.subscribed_at = stamp;
        watch.wake_all();
        state.generation = stamp;
        true
    }

    /// The thread's connection failed: every subscription is gone, and subscribes taken
    /// from `pending` may not have been sent. Drops idle keys, then queues every other key.
    pub(super) fn disconnected(&self) {
        let mut state = self.state.lock();
        state.take_idle();
        let State { keys, pending, .. } = &mut *state;
        pending.clear();
        for (key, watch) in keys.iter_mut() {
            watch.subscribed = false;
            pending.push(key.clone());
        }
    }
}

impl State {
    /// The newest release and confirmed subscription of `keys` so far, and whether all of
    /// them are subscribed now. Any new event on one of them changes what this returns.
    pub(super) fn observe(&self, keys: &[String]) -> Seen {
        let mut seen = Seen {
            released: 0,
            subscribed_at: 0,
            all_subscribed: true,
        };
        for key in keys {
            match self.keys.get(key) {
                Some(watch) => {
                    seen.released = seen.released.max(watch.released);
                    seen.subscribed_at = seen.subscribed_at.max(watch.subscribed_at);
                    seen.all_subscribed &= watch.subscribed;
                }
                None => seen.all_subscribed = false,
            }
        }
        seen
    }

    /// Forgets keys no one has waited on for a [`SWEEP`]; returns those subscribed, to
    /// unsubscribe.
    pub(super) fn take_idle(&mut self) -> Vec<String> {
        let mut idle = Vec::new();
        self.keys.retain(|key, watch| {
            let keep = !watch.waiters.is_empty() || watch.idle_since.elapsed() < SWEEP;
            if !keep && watch.subscribed {
                idle.push(key.clone());
            }
            keep
        });
        self.pending.retain(|key| self.keys.contains_key(key));
        idle
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::wait::stop::Stop;
    use crate::wait::ticket::Ticket;
    use std::thread;

    const LONG: Duration = Duration::from_secs(30);

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    /// Waits on a ticket for at most a second; `true` when it returned before that.
    fn returns_early(ticket: &mut Ticket<'_>) -> bool {
        let started = Instant::now();
        ticket.wait_until(Instant::now() + Duration::from_secs(1), Stop::never());
        started.elapsed() < Duration::from_millis(900)
    }

    fn ticket<'a>(board: &'a Board, names: &[&str], before: Seen) -> Ticket<'a> {
        Ticket::new(board, &keys(names), true, before).0
    }

    #[test]
    fn a_release_heard_before_registration_is_not_missed() {
        let board = Board::default();
        drop(ticket(&board, &["k"], Seen::default()));
        assert!(board.subscribed("k"));
        // The waiter notes the key before its attempt, a release is heard while the
        // attempt is in flight, then the waiter registers.
        let before = board.state.lock().observe(&keys(&["k"]));
        board.released("k");
        let mut late = ticket(&board, &["k"], before);
        assert!(returns_early(&mut late));
    }

    #[test]
    fn the_confirmed_subscription_ends_the_first_wait() {
        let board = Board::default();
        let before = board.state.lock().observe(&keys(&["k"]));
        let mut waiter = ticket(&board, &["k"], before);
        // Not subscribed yet: releases are not heard, the wait would run its full delay.
        let board = &board;
        thread::scope(|s| {
            s.spawn(|| {
                thread::sleep(Duration::from_millis(50));
                board.subscribed("k");
            });
            assert!(returns_early(&mut waiter));
        });
    }

    #[test]
    fn a_reconnect_during_an_attempt_ends_the_next_wait() {
        let board = Board::default();
        let mut waiter = ticket(&board, &["k"], Seen::default());
        board.subscribed("k");
        waiter.mark();
        // While the attempt is in flight: the connection drops, and comes back.
        board.disconnected();
        board.subscribed("k");
        assert!(returns_early(&mut waiter));
    }

    #[test]
    fn nothing_new_waits_until_the_deadline() {
        let board = Board::default();
        let mut waiter = ticket(&board, &["k", "j"], Seen::default());
        board.subscribed("k");
        board.subscribed("j");
        waiter.mark();
        board.released("other-key");
        assert!(!returns_early(&mut waiter));
    }

    #[test]
    fn a_release_of_one_of_several_keys_wakes() {
        let board = Board::default();
        let mut waiter = ticket(&board, &["a", "b"], Seen::default());
        board.subscribed("a");
        board.subscribed("b");
        waiter.mark();
        board.released("b");
        assert!(returns_early(&mut waiter));
    }

    #[test]
    fn a_watch_swept_and_made_anew_still_ends_the_wait() {
        let board = Board::default();
        // A waiter comes and goes: the key is subscribed, no release heard.
        drop(ticket(&board, &["k"], Seen::default()));
        board.subscribed("k");
        // The next waiter notes the key before its attempt; meanwhile the sweep forgets
        // the idle watch, and a release goes unheard (no longer subscribed).
        let before = board.state.lock().observe(&keys(&["k"]));
        board.state.lock().keys.get_mut("k").unwrap().idle_since = Instant::now() - LONG;
        assert_eq!(board.state.lock().take_idle(), ["k"]);
        // The waiter registers; the thread subscribes anew: that must end its wait, as
        // the release may have come before it.
        let mut waiter = ticket(&board, &["k"], before);
        board.subscribed("k");
        assert!(returns_early(&mut waiter));
    }

    #[test]
    fn word_that_comes_before_the_enrolment_is_kept_for_it() {
        let board = Board::default();
        let handed = Letter::Handed {
            fences: vec![7],
            sent_at: None,
            counted: false,
        };
        board.deliver("v", handed.clone());
        let enrolment = board.enrol("v", None);
        assert_eq!(
            enrolment.mailbox.wait_until(Instant::now(), Stop::never()),
            Some(handed)
        );
        drop(enrolment);
        assert!(board.state.lock().entries.is_empty());
    }

    #[test]
    fn a_resubscribed_own_channel_makes_every_queued_waiter_ask() {
        let board = Board::default();
        let (a, b) = (board.enrol("a", None), board.enrol("b", None));
        board.own_channel_subscribed();
        for enrolment in [&a, &b] {
            assert_eq!(
                enrolment.mailbox.wait_until(Instant::now(), Stop::never()),
                Some(Letter::Attempt)
            );
        }
        assert!(!board.is_watched("a"));
    }

    #[test]
    fn idle_keys_are_forgotten_and_listed_for_unsubscribing() {
        let board = Board::default();
        let waiter = ticket(&board, &["gone", "kept"], Seen::default());
        let other = ticket(&board, &["kept"], Seen::default());
        board.subscribed("gone");
        drop(waiter);
        let mut state = board.state.lock();
        state.keys.get_mut("gone").unwrap().idle_since = Instant::now() - LONG;
        assert_eq!(state.take_idle(), ["gone"]);
        assert!(state.keys.contains_key("kept"));
        assert!(!state.pending.iter().any(|k| k == "gone"));
        drop(state);
        drop(other);
    }
}
