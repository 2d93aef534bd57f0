//! A waiter that does not queue (a lock on a quorum, or across cluster slots): its
//! registration for the releases of its keys, and its wait for one.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use parking_lot::Condvar;

use super::board::{Board, Seen};
use super::stop::Stop;

/// A waiter that does not queue: its registration with the subscriber thread, given up
/// on drop (the waiter got the lock, gave up, or its thread panicked).
pub(crate) struct Ticket<'a> {
    board: &'a Board,
    pub(super) wake: Arc<Condvar>,
    keys: Vec<String>,
    /// Registered with the subscriber thread (not when there is no connection for it).
    watched: bool,
    seen: Seen,
}

/// Why a waiter that does not queue stopped waiting.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Wake {
    /// A release of one of the keys was heard: attempt now.
    Released,
    /// The subscription to its keys was (re)confirmed: attempt now, as a release may have
    /// gone unheard before.
    Subscribed,
    /// The wait ran out.
    Timeout,
    /// Its [`Stop`] was set: the wait was cancelled, or its locker closed.
    Stopped,
}

impl<'a> Ticket<'a> {
    /// Registers a waiter for `keys`, who noted `seen` of them before its last attempt;
    /// with `watch`, also with the subscriber thread. `true` with it when some key is new
    /// to the thread, which must then subscribe.
    pub(super) fn new(
        board: &'a Board,
        keys: &[String],
        watch: bool,
        seen: Seen,
    ) -> (Ticket<'a>, bool) {
        let wake = Arc::new(Condvar::new());
        board.waiting.fetch_add(1, Ordering::SeqCst);
        crate::stats::waiting(true);
        let new_keys = watch && board.register(keys, &wake);
        let ticket = Ticket {
            board,
            wake,
            keys: keys.to_vec(),
            watched: watch,
            seen,
        };
        (ticket, new_keys)
    }

    /// Notes what has been seen of the keys: call before each attempt.
    pub(crate) fn mark(&mut self) {
        self.seen = self.board.state.lock().observe(&self.keys);
    }

    /// Sleeps until `until`, or until one of the keys was released or the subscription to
    /// all of them was (re)confirmed since the last [`mark`](Self::mark) (or since the
    /// snapshot taken before the first attempt), or until `stop` is set (which a waiter
    /// that listens to it hears at once, see `stop.rs`).
    pub(crate) fn wait_until(&mut self, until: Instant, stop: Stop<'_>) -> Wake {
        let mut state = self.board.state.lock();
        loop {
            if stop.is_set() {
                return Wake::Stopped;
            }
            let now = state.observe(&self.keys);
            if now.released != self.seen.released {
                return Wake::Released;
            }
            if now.all_subscribed && now.subscribed_at != self.seen.subscribed_at {
                return Wake::Subscribed;
            }
            if Instant::now() >= until {
                return Wake::Timeout;
            }
            self.wake.wait_until(&mut state, until);
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.board.waiting.fetch_sub(1, Ordering::SeqCst);
        crate::stats::waiting(false);
        if self.watched {
            self.board.unregister(&self.keys, &self.wake);
        }
    }
}
