//! Waiters woken by releases: one subscriber connection per locker.
//!
//! `lua/release.lua` publishes on `<prefix>redguard:released:<key>` for each key it frees
//! (or finds already gone). One
//! thread per locker (started with its first waiter) holds one connection subscribed to
//! the channels of the keys its threads wait for, and counts the releases it hears. A
//! waiter still waits at most its retry delay, but a counted release of one of its keys,
//! or a (re)confirmed subscription to all of them, cuts the wait short.
//!
//! Why no release is missed for longer than a retry delay, and usually not at all:
//! - a waiter notes what it has seen of its keys *before* each attempt, so a release
//!   counted while the attempt was in flight ends the next wait at once;
//! - releases before the subscription is confirmed are not counted, so the confirmation
//!   itself ends the wait, and the next attempt sees any such release;
//! - a reconnect counts as a new confirmation, for the same reason.
//!
//! Without a thread (it could not start) or a connection (a caller's pool of one), waiters
//! simply wait out their retry delays.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::Result;
use crate::pool::Pool;
use crate::token::random_token;

/// The channel `lua/release.lua` publishes on for `key` is the locker's prefix, this, and
/// the key.
const RELEASED: &str = "redguard:released:";

/// How often the thread looks up from its connection: to stop, and to drop channels no
/// one has waited on for a while.
const SWEEP: Duration = Duration::from_secs(1);

pub(crate) struct Subscriber {
    board: Arc<Board>,
    /// The servers it may listen on (several for a quorum, where each hears every
    /// release): it moves to the next one when its connection fails.
    pools: Arc<[Pool]>,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What the thread and the waiters share.
#[derive(Default)]
struct Board {
    state: Mutex<State>,
    changed: Condvar,
    /// This locker's own channel: a message there wakes the thread to (un)subscribe or stop.
    wake: String,
    /// Where release channels start: the locker's prefix, then [`RELEASED`].
    released: String,
    /// Which of the pools the thread listens on now.
    listening: AtomicUsize,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Watch>,
    /// Counts every release heard and subscription confirmed, whatever the key: each
    /// such event is stamped with the next number, so stamps only grow, even for a key
    /// whose watch was swept and made anew (counting per watch would start again at zero
    /// and could look like nothing happened).
    generation: u64,
    /// Keys whose channel the thread has yet to subscribe to.
    pending: Vec<String>,
    stopping: bool,
    /// Set by the thread as it ends.
    finished: bool,
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

impl Subscriber {
    /// A subscriber for a locker whose keys and channels start with `prefix`.
    pub(crate) fn new(pools: Vec<Pool>, prefix: &str) -> Subscriber {
        // A random channel name: lockers in other processes must not wake ours.
        let id = random_token().unwrap_or_else(|_| format!("{:p}", &pools));
        Subscriber {
            board: Arc::new(Board {
                wake: format!("{prefix}redguard:wake:{id}"),
                released: format!("{prefix}{RELEASED}"),
                ..Board::default()
            }),
            pools: pools.into(),
            thread: Mutex::new(None),
        }
    }

    /// Where the release channels of this locker's keys start (the key follows).
    pub(crate) fn release_channels(&self) -> &str {
        &self.board.released
    }

    /// Whether this locker has threads waiting for `key` (so it is most likely held).
    pub(crate) fn is_watched(&self, key: &str) -> bool {
        self.board
            .state
            .lock()
            .keys
            .get(key)
            .is_some_and(|watch| watch.waiters > 0)
    }

    /// Registers a waiter for `keys`, who noted `before` of them before its last attempt.
    /// Starts the thread, and has it subscribe to new keys, if need be.
    pub(crate) fn wait_for(&self, keys: &[String], before: Seen) -> Ticket<'_> {
        if !self.pools.iter().any(Pool::can_dedicate) {
            // No connection to subscribe with: the waiter waits out its delays.
            return Ticket::new(&self.board, Vec::new(), before);
        }
        let new_keys = self.board.register(keys);
        if new_keys {
            self.start();
            self.wake_thread();
        }
        Ticket::new(&self.board, keys.to_vec(), before)
    }

    /// What a waiter has seen so far of `keys` (nothing for keys no one watches yet).
    pub(crate) fn seen(&self, keys: &[String]) -> Seen {
        self.board.state.lock().observe(keys)
    }

    fn start(&self) {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let board = Arc::clone(&self.board);
            let pools = Arc::clone(&self.pools);
            // If the thread cannot start, waiters wait out their delays: slower, correct.
            *thread = thread::Builder::new()
                .name("redguard-subscriber".into())
                .spawn(move || run(&board, &pools))
                .ok();
        }
    }

    /// Interrupts the thread's read with a message on its own channel. Best effort, and
    /// only with a connection free at once: the thread looks up every [`SWEEP`] anyway.
    fn wake_thread(&self) {
        let listening = self.board.listening.load(Ordering::Relaxed);
        if let Some(mut con) = self.pools.get(listening).and_then(Pool::try_get) {
            let _ = con.run(|con| {
                redis::cmd("PUBLISH")
                    .arg(&self.board.wake)
                    .arg("")
                    .query::<i64>(con)
            });
        }
    }
}

impl Drop for Subscriber {
    fn drop(&mut self) {
        self.board.state.lock().stopping = true;
        self.board.changed.notify_all();
        if let Some(handle) = self.thread.get_mut().take() {
            self.wake_thread();
            // The thread looks up at least every SWEEP, or after a connect or checkout,
            // each bounded by the pool's timeouts. Should any wait escape those bounds,
            // stop waiting after a while and let the thread end on its own: it holds
            // nothing of the locker's but the pool and the board.
            let deadline = Instant::now() + SWEEP + STOP_GRACE;
            let mut state = self.board.state.lock();
            while !state.finished {
                if self
                    .board
                    .changed
                    .wait_until(&mut state, deadline)
                    .timed_out()
                {
                    return;
                }
            }
            drop(state);
            let _ = handle.join();
        }
    }
}

/// How long, beyond a [`SWEEP`], dropping a locker waits for its subscriber thread.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// One waiter's registration; unregisters on drop.
pub(crate) struct Ticket<'a> {
    board: &'a Board,
    keys: Vec<String>,
    seen: Seen,
}

impl<'a> Ticket<'a> {
    fn new(board: &'a Board, keys: Vec<String>, seen: Seen) -> Ticket<'a> {
        Ticket { board, keys, seen }
    }

    /// Notes what has been seen of the keys: call before each attempt.
    pub(crate) fn mark(&mut self) {
        self.seen = self.board.state.lock().observe(&self.keys);
    }

    /// Sleeps until `until`, or until one of the keys was released or the subscription to
    /// all of them was (re)confirmed since the last [`mark`](Self::mark) (or since the
    /// snapshot taken before the first attempt), whichever comes first; `true` when a
    /// release was heard.
    pub(crate) fn wait_until(&mut self, until: Instant) -> bool {
        let mut state = self.board.state.lock();
        loop {
            let now = state.observe(&self.keys);
            let released = now.released != self.seen.released;
            let resubscribed = now.all_subscribed && now.subscribed_at != self.seen.subscribed_at;
            if released || resubscribed {
                return released;
            }
            if self.board.changed.wait_until(&mut state, until).timed_out() {
                return false;
            }
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        self.board.unregister(&self.keys);
    }
}

impl Board {
    /// Counts one more waiter on each key; `true` when some key is new to the thread.
    fn register(&self, keys: &[String]) -> bool {
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

    fn unregister(&self, keys: &[String]) {
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
    fn released(&self, key: &str) {
        let mut state = self.state.lock();
        let stamp = state.generation + 1;
        if let Some(watch) = state.keys.get_mut(key) {
            watch.released = stamp;
            state.generation = stamp;
            self.changed.notify_all();
        }
    }

    /// The thread's SUBSCRIBE to `key` was confirmed; `false` if no one watches it any more.
    fn subscribed(&self, key: &str) -> bool {
        let mut state = self.state.lock();
        let stamp = state.generation + 1;
        let Some(watch) = state.keys.get_mut(key) else {
            return false;
        };
        watch.subscribed = true;
        watch.subscribed_at = stamp;
        state.generation = stamp;
        self.changed.notify_all();
        true
    }

    /// The thread's connection failed: every subscription is gone, and subscribes taken
    /// from `pending` may not have been sent. Drops idle keys, then queues every other key.
    fn disconnected(&self) {
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
    fn observe(&self, keys: &[String]) -> Seen {
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
    fn take_idle(&mut self) -> Vec<String> {
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

/// The thread: (re)connect, subscribe, listen, until the locker is gone.
fn run(board: &Board, pools: &[Pool]) {
    listen_until_stopped(board, pools);
    board.state.lock().finished = true;
    board.changed.notify_all();
}

fn listen_until_stopped(board: &Board, pools: &[Pool]) {
    let mut backoff = Duration::from_millis(10);
    let mut listening = 0;
    loop {
        if board.state.lock().stopping {
            return;
        }
        board.listening.store(listening, Ordering::Relaxed);
        let Some(pool) = pools.get(listening) else {
            return; // no server at all: waiters wait out their delays
        };
        match listen(board, pool, &mut backoff) {
            Ok(()) => return, // stopped
            Err(_) => board.disconnected(),
        }
        listening = (listening + 1) % pools.len();
        let mut state = board.state.lock();
        if !state.stopping {
            board.changed.wait_for(&mut state, backoff);
        }
        backoff = (backoff * 2).min(SWEEP);
    }
}

/// Listens on one connection; `Ok` when asked to stop, `Err` when the connection failed.
fn listen(board: &Board, pool: &Pool, backoff: &mut Duration) -> Result<()> {
    let mut con = pool.dedicated(SWEEP)?;
    con.set_read_timeout(Some(SWEEP))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(&board.wake)?;
    *backoff = Duration::from_millis(10); // connected: the next failure starts afresh
    let mut swept = Instant::now();
    loop {
        let (pending, idle) = {
            let mut state = board.state.lock();
            if state.stopping {
                return Ok(());
            }
            let pending = std::mem::take(&mut state.pending);
            let idle = if swept.elapsed() >= SWEEP {
                swept = Instant::now();
                state.take_idle()
            } else {
                Vec::new()
            };
            (pending, idle)
        };
        for key in &pending {
            let channel = format!("{}{key}", board.released);
            pubsub.subscribe(&channel)?;
            if !board.subscribed(key) {
                // Forgotten while we subscribed: nobody will unsubscribe it otherwise.
                pubsub.unsubscribe(&channel)?;
            }
        }
        for key in &idle {
            pubsub.unsubscribe(format!("{}{key}", board.released))?;
        }
        match pubsub.get_message() {
            Ok(msg) => {
                if let Some(key) = msg.get_channel_name().strip_prefix(&board.released) {
                    board.released(key);
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e.into()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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

    fn ticket<'a>(board: &'a Board, names: &[&str], before: Seen) -> Ticket<'a> {
        let keys = keys(names);
        board.register(&keys);
        Ticket::new(board, keys, before)
    }

    #[test]
    fn a_release_heard_before_registration_is_not_missed() {
        let board = Board::default();
        let other = ticket(&board, &["k"], Seen::default());
        assert!(board.subscribed("k"));
        // The waiter notes the key before its attempt, a release is heard while the
        // attempt is in flight, then the waiter registers.
        let before = board.state.lock().observe(&keys(&["k"]));
        board.released("k");
        let mut late = ticket(&board, &["k"], before);
        assert!(returns_early(&mut late));
        drop(other);
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
