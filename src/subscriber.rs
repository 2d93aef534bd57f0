//! Waiters woken by releases instead of polling: one subscriber connection per locker.
//!
//! `lua/release.lua` publishes on `redguard:released:<key>` for each key it deletes. One
//! thread per locker (started with its first waiter) holds one connection subscribed to
//! the channels of the keys its threads wait for, and counts the releases it hears. A
//! waiter holds a [`Ticket`] and sleeps until a release of one of its keys is counted, its
//! subscription becomes active, or its retry delay ends, whichever comes first; then it
//! tries again. No notification is needed for correctness: it only cuts the wait short.
//!
//! Race-free by construction: a waiter tries again once its subscription is confirmed, so
//! a release before that is seen by the attempt and one after it by the subscription. A
//! lost notification (a reconnect) or an expiry without release ends in the retry delay.

use std::collections::HashMap;
use std::sync::Arc;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use crate::Result;
use crate::pool::Pool;
use crate::token::random_token;

/// The channel `lua/release.lua` publishes on for `key`.
const RELEASED: &str = "redguard:released:";

/// How often the thread looks up from its connection: to stop, and to drop channels no
/// one has waited on for a while.
const SWEEP: Duration = Duration::from_secs(1);

pub(crate) struct Subscriber {
    board: Arc<Board>,
    pool: Pool,
    thread: Mutex<Option<JoinHandle<()>>>,
}

/// What the thread and the waiters share.
struct Board {
    state: Mutex<State>,
    changed: Condvar,
    /// This locker's own channel: a message there wakes the thread to (un)subscribe or stop.
    wake: String,
}

#[derive(Default)]
struct State {
    keys: HashMap<String, Watch>,
    /// Keys whose channel the thread has yet to subscribe to.
    pending: Vec<String>,
    stopping: bool,
}

struct Watch {
    waiters: usize,
    /// Releases heard on this key's channel.
    releases: u64,
    /// SUBSCRIBE confirmed on the thread's current connection.
    subscribed: bool,
    /// Since when no one waits for this key.
    idle_since: Instant,
}

impl Subscriber {
    pub(crate) fn new(pool: Pool) -> Subscriber {
        // A random channel name: lockers in other processes must not wake ours.
        let id = random_token().unwrap_or_else(|_| format!("{:p}", &pool));
        Subscriber {
            board: Arc::new(Board {
                state: Mutex::new(State::default()),
                changed: Condvar::new(),
                wake: format!("redguard:wake:{id}"),
            }),
            pool,
            thread: Mutex::new(None),
        }
    }

    /// Registers a waiter for `keys`. The thread starts, and subscribes to their channels,
    /// if need be; without a thread (it could not start) the waiter simply polls.
    pub(crate) fn wait_for(&self, keys: &[String]) -> Ticket<'_> {
        let mut state = self.board.state.lock();
        let mut new_keys = false;
        for key in keys {
            let is_new = !state.keys.contains_key(key);
            let watch = state.keys.entry(key.clone()).or_insert_with(|| Watch {
                waiters: 0,
                releases: 0,
                subscribed: false,
                idle_since: Instant::now(),
            });
            watch.waiters += 1;
            if is_new {
                state.pending.push(key.clone());
                new_keys = true;
            }
        }
        let seen = state.observe(keys);
        drop(state);
        if new_keys {
            self.start();
            self.wake_thread();
        }
        Ticket {
            subscriber: self,
            keys: keys.to_vec(),
            seen,
        }
    }

    fn start(&self) {
        let mut thread = self.thread.lock();
        if thread.is_none() {
            let board = Arc::clone(&self.board);
            let pool = self.pool.clone();
            // If the thread cannot start, waiters poll: slower, still correct.
            *thread = thread::Builder::new()
                .name("redguard-subscriber".into())
                .spawn(move || run(&board, &pool))
                .ok();
        }
    }

    /// Interrupts the thread's read with a message on its own channel (best effort: it
    /// looks up every [`SWEEP`] anyway).
    fn wake_thread(&self) {
        if let Ok(mut con) = self.pool.get() {
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
            // Bounded: the thread looks up at least every SWEEP plus an I/O timeout.
            let _ = handle.join();
        }
    }
}

/// One waiter's registration; unregisters on drop.
pub(crate) struct Ticket<'a> {
    subscriber: &'a Subscriber,
    keys: Vec<String>,
    seen: Seen,
}

/// What a waiter last saw of its keys.
#[derive(Clone, Copy, PartialEq, Eq)]
struct Seen {
    releases: u64,
    subscribed: bool,
}

impl Ticket<'_> {
    /// Sleeps until one of the keys was released, the subscription to all of them became
    /// active (so a release before it may have been missed), or `timeout` passed.
    pub(crate) fn wait(&mut self, timeout: Duration) {
        let board = &self.subscriber.board;
        let deadline = Instant::now().checked_add(timeout);
        let mut state = board.state.lock();
        loop {
            let now = state.observe(&self.keys);
            if now != self.seen {
                let woken = now.releases != self.seen.releases || now.subscribed;
                self.seen = now;
                if woken {
                    return;
                }
            }
            match deadline {
                Some(deadline) => {
                    if board.changed.wait_until(&mut state, deadline).timed_out() {
                        self.seen = state.observe(&self.keys);
                        return;
                    }
                }
                None => board.changed.wait(&mut state),
            }
        }
    }
}

impl Drop for Ticket<'_> {
    fn drop(&mut self) {
        let mut state = self.subscriber.board.state.lock();
        for key in &self.keys {
            if let Some(watch) = state.keys.get_mut(key) {
                watch.waiters -= 1;
                if watch.waiters == 0 {
                    watch.idle_since = Instant::now();
                }
            }
        }
    }
}

impl State {
    /// Releases heard on `keys` so far, and whether all of them are subscribed.
    fn observe(&self, keys: &[String]) -> Seen {
        let mut seen = Seen {
            releases: 0,
            subscribed: true,
        };
        for watch in keys.iter().filter_map(|key| self.keys.get(key)) {
            seen.releases += watch.releases;
            seen.subscribed &= watch.subscribed;
        }
        seen
    }
}

/// The thread: (re)connect, subscribe, listen, until the locker is gone.
fn run(board: &Board, pool: &Pool) {
    let mut backoff = Duration::from_millis(10);
    loop {
        if board.state.lock().stopping {
            return;
        }
        if listen(board, pool).is_ok() {
            return; // stopped
        }
        // The connection failed: every subscription is gone, and subscribes taken from
        // `pending` may not have been sent. Subscribe to every key again on the next one.
        let mut state = board.state.lock();
        let State { keys, pending, .. } = &mut *state;
        pending.clear();
        for (key, watch) in keys.iter_mut() {
            watch.subscribed = false;
            pending.push(key.clone());
        }
        board.changed.notify_all();
        board.changed.wait_for(&mut state, backoff);
        backoff = (backoff * 2).min(SWEEP);
    }
}

/// Listens on one connection; `Ok` when asked to stop, `Err` when the connection failed.
fn listen(board: &Board, pool: &Pool) -> Result<()> {
    let mut con = pool.dedicated()?;
    con.set_read_timeout(Some(SWEEP))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(&board.wake)?;
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
            pubsub.subscribe(format!("{RELEASED}{key}"))?;
            if let Some(watch) = board.state.lock().keys.get_mut(key) {
                watch.subscribed = true;
            }
            board.changed.notify_all();
        }
        for key in &idle {
            pubsub.unsubscribe(format!("{RELEASED}{key}"))?;
        }
        match pubsub.get_message() {
            Ok(msg) => {
                if let Some(key) = msg.get_channel_name().strip_prefix(RELEASED)
                    && let Some(watch) = board.state.lock().keys.get_mut(key)
                {
                    watch.releases += 1;
                    board.changed.notify_all();
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e.into()),
        }
    }
}

impl State {
    /// Forgets keys no one has waited on for a [`SWEEP`]; returns them to unsubscribe.
    fn take_idle(&mut self) -> Vec<String> {
        let mut idle = Vec::new();
        self.keys.retain(|key, watch| {
            let keep = watch.waiters > 0 || watch.idle_since.elapsed() < SWEEP;
            if !keep && watch.subscribed {
                idle.push(key.clone());
            }
            keep
        });
        idle
    }
}
