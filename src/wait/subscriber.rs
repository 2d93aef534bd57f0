//! The thread that listens for releases: one connection per locker, subscribed to the
//! channels of the keys its threads wait for.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::board::{Board, SWEEP, Seen};
use super::enrolment::Enrolment;
use super::joins::Joins;
use super::mailbox::{self, Letter, Mailbox};
use super::stop::Sleeper;
use super::ticket::Ticket;
use crate::backend::{Handed, Pool};
use crate::hold::random_token;
use crate::{Error, Result};

/// The channel `lua/release.lua` publishes on for `key` is the locker's prefix, this, and
/// the key.
const RELEASED: &str = "redguard:released:";

pub(crate) struct Subscriber {
    board: Arc<Board>,
    /// The servers it may listen on (several for a quorum, where each hears every
    /// release): it moves to the next one when its connection fails.
    pools: Arc<[Pool]>,
    thread: Mutex<Option<JoinHandle<()>>>,
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

    /// The locker's own channel, where the queue's scripts tell its waiters they were
    /// served (see `lua/queue/queue.lua`).
    pub(crate) fn channel(&self) -> &str {
        &self.board.wake
    }

    /// Registers a waiter that does not queue, for `keys`, who noted `before` of them
    /// before its last attempt. Starts the thread, and has it subscribe to new keys, if
    /// need be.
    pub(crate) fn watch(&self, keys: &[String], before: Seen) -> Ticket<'_> {
        // Without a connection to subscribe with, waiters wait out their delays.
        let watch = self.pools.iter().any(Pool::can_dedicate);
        let (ticket, new_keys) = Ticket::new(&self.board, keys, watch, before);
        if new_keys {
            self.start();
            self.wake_thread();
        }
        ticket
    }

    /// What wakes `ticket`'s wait when its [`Stop`](super::Stop) is set.
    pub(crate) fn sleeper(&self, ticket: &Ticket<'_>) -> Sleeper {
        Sleeper::ticket(&self.board, &ticket.wake)
    }

    /// This locker's locks and the entries that join the queue by their release.
    pub(crate) fn joins(&self) -> &Joins {
        &self.board.joins
    }

    /// Registers a queued waiter whose entry holds `value` (for a lock, on `lock_keys`);
    /// starts the thread, which listens on the locker's channel, if need be.
    pub(crate) fn enrol(&self, value: &str, lock_keys: Option<&[String]>) -> Enrolment<'_> {
        self.enrol_mailbox(value, Arc::new(Mailbox::new(lock_keys)))
    }

    /// [`enrol`](Self::enrol) with a mailbox of the waiter's already.
    pub(crate) fn enrol_mailbox(&self, value: &str, mailbox: Arc<Mailbox>) -> Enrolment<'_> {
        let enrolment = self.board.enrol_mailbox(value, mailbox);
        if self.pools.iter().any(Pool::can_dedicate) {
            self.start();
        }
        enrolment
    }

    /// Waiters of this locker that a script sent at `sent_at` gave their holds to (its
    /// reply said so: no message was sent).
    pub(crate) fn handed(&self, handed: Vec<Handed>, sent_at: Instant) {
        for Handed { wait, fences } in handed {
            let sent_at = Some(sent_at);
            self.board.deliver(
                &wait,
                Letter::Handed {
                    fences,
                    sent_at,
                    counted: false,
                },
            );
        }
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

/// The wait before reconnecting after a first failure (it doubles while they go on).
const FIRST_BACKOFF: Duration = Duration::from_millis(10);

/// How long, beyond a [`SWEEP`], dropping a locker waits for its subscriber thread.
const STOP_GRACE: Duration = Duration::from_secs(3);

/// The thread: (re)connect, subscribe, listen, until the locker is gone.
fn run(board: &Board, pools: &[Pool]) {
    listen_until_stopped(board, pools);
    board.state.lock().finished = true;
    board.changed.notify_all();
}

fn listen_until_stopped(board: &Board, pools: &[Pool]) {
    let mut backoff = FIRST_BACKOFF;
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
            Err(e) => {
                // Once per outage (the backoff starts afresh on each good connection).
                if backoff == FIRST_BACKOFF {
                    log::warn!(
                        "redguard: the subscriber's connection failed ({e}); until it is back, \
                         waiters wait out their retry delays"
                    );
                }
                board.disconnected();
            }
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
    // Through Sentinel: the master it listens on, which a failover makes the old one.
    let master = con.master();
    con.set_read_timeout(Some(SWEEP))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(&board.wake)?;
    // Word sent to the locker's waiters before now may have gone unheard.
    board.own_channel_subscribed();
    *backoff = FIRST_BACKOFF; // connected: the next failure starts afresh
    let mut swept = Instant::now();
    loop {
        let (pending, idle) = {
            let mut state = board.state.lock();
            if state.stopping {
                return Ok(());
            }
            if master.as_ref().is_some_and(|master| !master.is_current()) {
                return Err(Error::Redis(redis::RedisError::from((
                    redis::ErrorKind::Io,
                    "the master it listened on was replaced in a failover",
                ))));
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
                let channel = msg.get_channel_name();
                if channel == board.wake {
                    if let Some((value, letter)) = mailbox::parse(msg.get_payload_bytes()) {
                        board.deliver(&value, letter);
                    }
                } else if let Some(key) = channel.strip_prefix(&board.released) {
                    board.released(key);
                }
            }
            Err(e) if e.is_timeout() => {}
            Err(e) => return Err(e.into()),
        }
    }
}
