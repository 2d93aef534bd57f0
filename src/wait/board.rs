//! What the subscriber thread and the waiters share: the keys watched, the releases and
//! subscriptions heard, the lines waiters wait in, and each waiter's ticket. (Over 400
//! lines: a third of it is the unit tests of the missed-wake-up rules, beside them.)

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::line::{Handover, Lines, Offer};

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
    /// How many waiters are in line: while none, lock calls and releases need not look at
    /// the lines (nor take the mutex).
    pub(super) waiting: AtomicUsize,
}

#[derive(Default)]
pub(super) struct State {
    keys: HashMap<String, Watch>,
    /// The waiters of this locker, in line per key.
    pub(super) lines: Lines,
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
    waiters: usize,
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

/// What a waiter has seen of its keys: the newest stamps of their events.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Seen {
    released: u64,
    subscribed_at: u64,
    all_subscribed: bool,
}

/// One waiter's place in line, and its registration with the subscriber thread; both
/// given up on drop (the waiter got the lock, gave up, or its thread panicked).
pub(crate) struct Ticket<'a> {
    board: &'a Board,
    id: u64,
    wake: Arc<Condvar>,
    keys: Vec<String>,
    /// Registered with the subscriber thread (not when there is no connection for it).
    watched: bool,
    seen: Seen,
    /// Set once the waiter holds the lock: leaving then lets the next one sleep on.
    got_lock: bool,
}

/// Why a wait ended.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A release of one of the keys was heard: attempt now.
    Released,
    /// The lock was handed over by a releasing guard of this locker: it is held.
    Handed { fences: Vec<u64>, sent_at: Instant },
    /// Attempt now: the waiter became first in line as the one ahead gave up, or the
    /// subscription to its keys was (re)confirmed.
    Turn,
    /// A releasing guard of this locker claimed the waiter for a hand-over and could not
    /// make it (the lock was gone, or, `failed`, Redis failed and the keys may be in the
    /// waiter's name): attempt, unless the wait is over (the claim may have kept the
    /// waiter past its deadline, for the hand-over's round trip).
    Declined { failed: bool },
    /// The wait ran out.
    Timeout,
}

impl<'a> Ticket<'a> {
    /// Puts a waiter in line for `offer.keys`, who noted `seen` of them before its last
    /// attempt; with `watch`, also registers it with the subscriber thread.
    /// `true` with it when some key is new to the thread, which must then subscribe.
    pub(super) fn new(
        board: &'a Board,
        offer: Arc<Offer>,
        watch: bool,
        seen: Seen,
    ) -> (Ticket<'a>, bool) {
        let keys = offer.keys.clone();
        let mut state = board.state.lock();
        let (id, wake) = state.lines.join(offer);
        board.waiting.fetch_add(1, Ordering::SeqCst);
        crate::stats::waiting(true);
        drop(state);
        let new_keys = watch && board.register(&keys);
        let ticket = Ticket {
            board,
            id,
            wake,
            keys,
            watched: watch,
            seen,
            got_lock: false,
        };
        (ticket, new_keys)
    }

    /// Whether this waiter is first in line on all of its keys: only then does it attempt.
    pub(crate) fn is_first(&self) -> bool {
        self.board.state.lock().lines.is_first(self.id)
    }

    /// Notes what has been seen of the keys: call before each attempt.
    pub(crate) fn mark(&mut self) {
        self.seen = self.board.state.lock().observe(&self.keys);
    }

    /// Sleeps on this waiter's own wake-up until `until`, or until it is handed the lock,
    /// becomes first in line, or (first in line) one of its keys was released or the
    /// subscription to all of them was (re)confirmed since the last [`mark`](Self::mark)
    /// (or since the snapshot taken before the first attempt).
    pub(crate) fn wait_until(&mut self, until: Instant) -> Wake {
        let mut state = self.board.state.lock();
        state.lines.set_asleep(self.id, true);
        let wake = loop {
            match state.lines.take_handover(self.id) {
                Some(Handover::Done { fences, sent_at }) => break Wake::Handed { fences, sent_at },
                Some(Handover::Declined) => break Wake::Declined { failed: false },
                Some(Handover::Failed) => break Wake::Declined { failed: true },
                None => {}
            }
            if state.lines.is_claimed(self.id) {
                // A releasing guard is handing the lock over, and wakes us when it is done:
                // its call is bounded by the pool's timeouts, and it ends the claim whatever
                // happens (even past our own deadline: the lock may already be ours).
                self.wake.wait_for(&mut state, Duration::from_secs(1));
                continue;
            }
            if state.lines.take_turn(self.id) {
                break Wake::Turn;
            }
            if state.lines.is_first(self.id) {
                let now = state.observe(&self.keys);
                if now.released != self.seen.released {
                    // Others first, for a moment, after this locker's own real release; then
                    // the checks again (a hand-over may have come meanwhile).
                    match state.lines.head_start(self.id) {
                        Some(at) if Instant::now() < at => {
                            self.wake.wait_until(&mut state, at);
                            continue;
                        }
                        _ => break Wake::Released,
                    }
                }
                if now.all_subscribed && now.subscribed_at != self.seen.subscribed_at {
                    break Wake::Turn;
                }
            }
            if Instant::now() >= until {
                break Wake::Timeout;
            }
            self.wake.wait_until(&mut state, until);
        };
        state.lines.set_asleep(self.id, false);
        wake
    }
}

impl Ticket<'_> {
    /// The waiter holds the lock now (handed over, or by its own attempt).
    pub(crate) fn got_lock(&mut self) {
        self.got_lock = true;
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut state = self.board.state.lock();
        state.lines.leave(self.id, self.got_lock);
        self.board.waiting.fetch_sub(1, Ordering::SeqCst);
        crate::stats::waiting(false);
        drop(state);
        if self.watched {
            self.board.unregister(&self.keys);
        }
    }
}

impl Board {
    /// Whether some waiter is registered for `key`.
    pub(super) fn is_watched(&self, key: &str) -> bool {
        self.state
            .lock()
            .keys
            .get(key)
            .is_some_and(|watch| watch.waiters > 0)
    }

    /// Counts one more waiter on each key; `true` when some key is new to the thread.
    pub(super) fn register(&self, keys: &[String]) -> bool {
        let mut state = self.state.lock();
        let mut new_keys = false;
        for key in keys {
            let is_new = !state.keys.contains_key(key);
            let watch = state.keys.entry(key.clone()).or_insert_with(|| Watch {
                waiters: 0,
                released: 0,
                subscribed_at: 0,
                subscribed: false,
                idle_since: Instant::now(),
            });
            watch.waiters += 1;
            if is_new {
                state.pending.push(key.clone());
                new_keys = true;
            }
        }
        new_keys
    }

    pub(super) fn unregister(&self, keys: &[String]) {
        let mut state = self.state.lock();
        for key in keys {
            if let Some(watch) = state.keys.get_mut(key) {
                watch.waiters -= 1;
                if watch.waiters == 0 {
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
            state.generation = stamp;
            // Only the first in line may act on it.
            state.lines.wake_front(key);
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
        state.generation = stamp;
        state.lines.wake_front(key);
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
    /// Whether the thread is subscribed to `key`'s channel.
    pub(super) fn is_subscribed(&self, key: &str) -> bool {
        self.keys.get(key).is_some_and(|watch| watch.subscribed)
    }

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
            let keep = watch.waiters > 0 || watch.idle_since.elapsed() < SWEEP;
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
    use std::thread;

    const LONG: Duration = Duration::from_secs(30);

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    /// Waits on a ticket for at most a second; `true` when it returned before that.
    fn returns_early(ticket: &mut Ticket<'_>) -> bool {
        let started = Instant::now();
        ticket.wait_until(Instant::now() + Duration::from_secs(1));
        started.elapsed() < Duration::from_millis(900)
    }

    fn offer(names: &[&str]) -> Arc<Offer> {
        Arc::new(Offer {
            kind: crate::hold::Kind::Lock,
            keys: keys(names),
            value: "v".into(),
            owner_len: 1,
            ttl_ms: 1000,
            fencing: false,
            fixed_token: false,
            replicas: None,
        })
    }

    fn ticket<'a>(board: &'a Board, names: &[&str], before: Seen) -> Ticket<'a> {
        Ticket::new(board, offer(names), true, before).0
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
