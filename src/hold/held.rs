//! The state of one held lock, shared by its guard and the refresher.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::{Condvar, Mutex};

use super::Lease;
use crate::backend::Replicas;
use crate::wait::{Letter, Mailbox};

/// What a hold is. Every kind shares the same state, refresher, waiting and backends;
/// only the scripts that act on Redis differ.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A lock: every key a string that holds the owner's value.
    Lock,
    /// One of at most `limit` permits of a semaphore. Its one key is the semaphore: a
    /// sorted set of values, each scored by its expiry on the server's clock, and the
    /// limit in use (see `lua/queue/acquire.lua`); with fencing, the acquire script
    /// also gets the semaphore's fencing counter.
    Permit { limit: u32 },
    /// A shared hold of every key (a read lock): each key a sorted set of its readers (see
    /// `lua/queue/queue.lua`).
    Read,
}

pub(crate) struct Held {
    /// Unique within the process: the refresher's handle on this lock.
    pub(crate) id: u64,
    pub(crate) kind: Kind,
    /// The keys as stored in Redis (with the locker's prefix).
    pub(crate) keys: Vec<String>,
    /// The keys as the caller named them, when a prefix makes them differ.
    names: Option<Vec<String>>,
    /// What every key stores: the owner part (see [`owner_part`]), then the metadata.
    ///
    /// [`owner_part`]: crate::hold::owner_part
    pub(crate) value: String,
    /// Where the token is in `value`: it ends the owner part.
    token: std::ops::Range<usize>,
    /// One fencing token per key, in key order; empty without fencing.
    pub(crate) fences: Vec<u64>,
    timing: Mutex<Timing>,
    lost: AtomicBool,
    /// Set once the refresher has told of the loss (logged it, called `on_lost`).
    told: AtomicBool,
    /// Set once its owner gives it up (release, downgrade), before the script
    /// that does it is sent: a refresh that then finds the keys gone found no loss.
    ended: AtomicBool,
    /// Whether a refresh of this hold is in flight. One at a time: of two refreshes on two
    /// connections the server may apply either last, and only one in flight at a time
    /// makes the expiry recorded the one the server applied last.
    refreshing: Mutex<bool>,
    /// Notified when the refresh in flight is done.
    refresh_done: Condvar,
    /// Refreshed only once this many replicas acknowledge it.
    pub(crate) replicas: Option<Replicas>,
    /// Not a hold but a waiter's queue entry on that many keys (see `hold::place`): its
    /// `keys` are the entry's, its `value` the entry, its TTL the entry's lifetime.
    pub(crate) entry_of: Option<usize>,
    /// For an entry: where its waiter hears that the entry is gone.
    mailbox: Option<Arc<Mailbox>>,
    /// How long a release keeps it at least, and the refresher at most.
    pub(crate) lease: Lease,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// The TTL to set at the next refresh.
    pub(crate) ttl_ms: u64,
    /// When the newest acquire or refresh that succeeded was sent.
    sent_at: Instant,
    /// When to count the lock lost, by our clock: the server set each expiry after its
    /// request was sent, so `sent + ttl` is never later than the real expiry, less a
    /// [`drift_ms`] allowance.
    expires_at: Instant,
}

/// How much sooner than its TTL (both in ms) a lock counts as lost, on every backend: 1%
/// of the TTL and 2 ms, as Redlock prescribes, for a server clock running a little faster
/// than ours (a server on a quorum, or the one server).
pub(crate) fn drift_ms(ttl_ms: u64) -> u64 {
    ttl_ms / 100 + 2
}

impl Timing {
    /// The timing of a lock just set with `ttl_ms` by a request sent at `sent_at`.
    pub(crate) fn new(ttl_ms: u64, sent_at: Instant) -> Timing {
        Timing {
            ttl_ms,
            sent_at,
            expires_at: expiry(sent_at, ttl_ms),
        }
    }

    /// A hold given to a waiter by a script, for `claim_ms` counted from `sent_at` (the
    /// last renewal of its queue entry), to be refreshed to `ttl_ms`.
    pub(crate) fn claimed(ttl_ms: u64, sent_at: Instant, claim_ms: u64) -> Timing {
        Timing {
            ttl_ms,
            sent_at,
            expires_at: expiry(sent_at, claim_ms),
        }
    }

    pub(crate) fn expires_at(&self) -> Instant {
        self.expires_at
    }

    /// When the newest acquire or refresh that succeeded was sent.
    pub(crate) fn sent_at(&self) -> Instant {
        self.sent_at
    }

    /// When the refresher should extend the lock: with two thirds of its TTL left, or,
    /// where the expiry lies closer than that after the last refresh (capped as forever,
    /// see [`later`]), a third of the way there: never in the past while the hold is good,
    /// so every TTL costs one refresh per period.
    pub(crate) fn refresh_at(&self) -> Instant {
        let left = Duration::from_millis(self.ttl_ms - self.ttl_ms / 3);
        match self.expires_at.checked_sub(left) {
            Some(at) if at >= self.sent_at => at,
            _ => self.sent_at + self.expires_at.saturating_duration_since(self.sent_at) / 3,
        }
    }
}

/// When a lock set with `ttl_ms` by a request sent `at` counts as lost.
fn expiry(at: Instant, ttl_ms: u64) -> Instant {
    later(
        at,
        Duration::from_millis(ttl_ms.saturating_sub(drift_ms(ttl_ms))),
    )
}

/// `at` + `wait`, where 100 years count as forever: some platforms' `Instant` overflows
/// within centuries, and 100 years on from a monotonic clock never does.
pub(crate) fn later(at: Instant, wait: Duration) -> Instant {
    const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
    at.checked_add(wait.min(FOREVER)).unwrap_or(at)
}

impl Held {
    pub(crate) fn new(
        kind: Kind,
        keys: Vec<String>,
        value: String,
        token: std::ops::Range<usize>,
        fences: Vec<u64>,
        timing: Timing,
    ) -> Held {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Held {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            kind,
            keys,
            names: None,
            value,
            token,
            fences,
            timing: Mutex::new(timing),
            lost: AtomicBool::new(false),
            told: AtomicBool::new(false),
            ended: AtomicBool::new(false),
            refreshing: Mutex::new(false),
            refresh_done: Condvar::new(),
            replicas: None,
            entry_of: None,
            mailbox: None,
            lease: Lease::default(),
        }
    }

    /// A waiter's queue entry on `keys` main keys, whose waiter hears at `mailbox` that
    /// the entry is gone (see `hold::place`).
    pub(crate) fn queued(mut self, keys: usize, mailbox: Arc<Mailbox>) -> Held {
        self.entry_of = Some(keys);
        self.mailbox = Some(mailbox);
        self
    }

    /// For an entry the refresher no longer finds queued (or could not renew in time):
    /// its waiter asks Redis (it may have been given its hold). `false` for a hold.
    pub(crate) fn tell_waiter(&self) -> bool {
        match &self.mailbox {
            Some(mailbox) => {
                mailbox.post(Letter::Attempt);
                true
            }
            None => false,
        }
    }

    /// The same keys, value, token and fences, held now as `kind` with `timing` (a new id:
    /// a new hold for the refresher).
    pub(crate) fn converted(&self, kind: Kind, timing: Timing) -> Held {
        let held = Held::new(
            kind,
            self.keys.clone(),
            self.value.clone(),
            self.token.clone(),
            self.fences.clone(),
            timing,
        );
        let held = held.named(self.names.clone()).replicated(self.replicas);
        held.leased(self.lease)
    }

    /// Held as `lease` says: at least, and at most, so long.
    pub(crate) fn leased(mut self, lease: Lease) -> Held {
        self.lease = lease;
        self
    }

    /// Refreshed only once `replicas` acknowledge it.
    pub(crate) fn replicated(mut self, replicas: Option<Replicas>) -> Held {
        self.replicas = replicas;
        self
    }

    /// Keeps the caller's names for the keys, when they differ from the stored ones.
    pub(crate) fn named(mut self, names: Option<Vec<String>>) -> Held {
        self.names = names;
        self
    }

    /// The keys as the caller named them.
    pub(crate) fn names(&self) -> &[String] {
        self.names.as_deref().unwrap_or(&self.keys)
    }

    pub(crate) fn token(&self) -> &str {
        &self.value[self.token.clone()]
    }

    pub(crate) fn metadata(&self) -> &str {
        &self.value[self.token.end..]
    }

    pub(crate) fn timing(&self) -> Timing {
        *self.timing.lock()
    }

    /// Sets the TTL that later refreshes use.
    pub(crate) fn set_ttl(&self, ttl_ms: u64) {
        self.timing.lock().ttl_ms = ttl_ms;
    }

    /// Records a refresh to `ttl_ms` that succeeded, sent at `sent_at`, by the holder of
    /// the refresh turn (so no other refresh of this hold overlapped it).
    pub(crate) fn refreshed(&self, sent_at: Instant, ttl_ms: u64) {
        let mut timing = self.timing.lock();
        timing.sent_at = sent_at;
        timing.expires_at = expiry(sent_at, ttl_ms);
    }

    /// Takes the refresh turn if no refresh of this hold is in flight (the refresher's
    /// way: a hold refreshed by hand just now is not due anyway).
    pub(crate) fn try_refresh_turn(&self) -> bool {
        !std::mem::replace(&mut *self.refreshing.lock(), true)
    }

    /// Takes the refresh turn once the refresh in flight is done (a caller's way); `false`
    /// when the hold ran out meanwhile. The wait is bounded by the hold's expiry, and the
    /// refresh in flight by the backend's timeouts.
    pub(crate) fn wait_refresh_turn(&self) -> bool {
        let mut refreshing = self.refreshing.lock();
        while *refreshing {
            // The refresh in flight may move the expiry on: read again after each wait,
            // and give up only once the hold is lost, so that this and `is_lost` agree.
            let until = self.timing().expires_at();
            let waited = self.refresh_done.wait_until(&mut refreshing, until);
            if waited.timed_out() && self.is_lost() {
                return false;
            }
        }
        *refreshing = true;
        true
    }

    /// Gives the refresh turn back, after the outcome was recorded.
    pub(crate) fn end_refresh_turn(&self) {
        *self.refreshing.lock() = false;
        self.refresh_done.notify_all();
    }

    /// Its owner gives it up from now on: what refreshes find is no loss any more.
    pub(crate) fn end(&self) {
        self.ended.store(true, Ordering::SeqCst);
    }

    /// Whether its owner has given it up (see [`end`](Self::end)).
    pub(crate) fn has_ended(&self) -> bool {
        self.ended.load(Ordering::SeqCst)
    }

    /// Whether the loss is still to be told (`true` once only).
    pub(crate) fn first_to_tell(&self) -> bool {
        !self.told.swap(true, Ordering::AcqRel)
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// Lost once anyone saw a key gone, or once the TTL has run out by our clock. Sticky:
    /// a lock reported lost is never reported held again.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if Instant::now() >= self.timing().expires_at() {
            self.mark_lost();
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    fn held(ttl_ms: u64, sent_at: Instant) -> Held {
        let value = "8:0123abcdmeta".to_string();
        Held::new(
            Kind::Lock,
            vec!["k".into()],
            value,
            2..10,
            Vec::new(),
            Timing::new(ttl_ms, sent_at),
        )
    }

    #[test]
    fn token_and_metadata_split_the_value() {
        let held = held(1000, Instant::now());
        assert_eq!(held.token(), "0123abcd");
        assert_eq!(held.metadata(), "meta");
    }

    #[test]
    fn lost_once_the_ttl_has_run_out_and_stays_lost() {
        let held = held(1, Instant::now());
        std::thread::sleep(2 * MS);
        assert!(held.is_lost());
        held.refreshed(Instant::now(), 60_000);
        assert!(held.is_lost(), "lost is sticky");
    }

    #[test]
    fn refresh_is_due_with_two_thirds_of_the_ttl_left() {
        let start = Instant::now();
        let timing = Timing::new(3000, start);
        // Less the drift allowance: 1% and 2 ms.
        assert_eq!(timing.expires_at(), start + 2968 * MS);
        assert_eq!(timing.refresh_at(), start + 968 * MS);
    }

    #[test]
    fn a_newer_refresh_sets_the_expiry() {
        let start = Instant::now();
        let held = held(1000, start);
        held.refreshed(start + 10 * MS, 5000);
        assert_eq!(held.timing().expires_at(), start + (5010 - 52) * MS);
    }

    #[test]
    fn one_refresh_of_a_hold_at_a_time() {
        let held = std::sync::Arc::new(held(60_000, Instant::now()));
        assert!(held.try_refresh_turn());
        assert!(
            !held.try_refresh_turn(),
            "the refresher skips a hold in flight"
        );
        let done = std::sync::Arc::new(AtomicBool::new(false));
        let waiter = {
            let (held, done) = (std::sync::Arc::clone(&held), std::sync::Arc::clone(&done));
            std::thread::spawn(move || {
                assert!(held.wait_refresh_turn());
                done.load(Ordering::SeqCst)
            })
        };
        std::thread::sleep(50 * MS);
        done.store(true, Ordering::SeqCst);
        held.end_refresh_turn();
        assert!(
            waiter.join().unwrap(),
            "a caller waits for the refresh in flight"
        );
        assert!(!held.try_refresh_turn(), "and then holds the turn");
        held.end_refresh_turn();
        assert!(held.try_refresh_turn());
    }

    #[test]
    fn waiting_for_the_refresh_turn_ends_with_the_hold() {
        let held = held(30, Instant::now());
        assert!(held.try_refresh_turn());
        let waited = Instant::now();
        assert!(!held.wait_refresh_turn());
        assert!(waited.elapsed() < 1000 * MS);
    }

    #[test]
    fn a_huge_ttl_is_refreshed_once_a_period_not_at_once() {
        let start = Instant::now();
        for ttl_ms in [
            1000 * 365 * 24 * 3600 * 1000,
            crate::MAX_TTL.as_millis() as u64,
        ] {
            let timing = Timing::new(ttl_ms, start);
            // The expiry is capped at 100 years; the refresh is due a third of the way.
            assert!(timing.refresh_at() > start + Duration::from_secs(30 * 365 * 24 * 3600));
        }
    }

    #[test]
    fn drift_makes_the_lock_count_lost_sooner_on_every_backend() {
        let start = Instant::now();
        let timing = Timing::new(1000, start);
        assert_eq!(timing.expires_at(), start + 988 * MS);
        let held = Held::new(
            Kind::Lock,
            vec!["k".into()],
            "t".into(),
            0..1,
            Vec::new(),
            timing,
        );
        held.refreshed(start + 10 * MS, 2000);
        assert_eq!(held.timing().expires_at(), start + 1988 * MS);
    }

    #[test]
    fn ids_are_unique() {
        let now = Instant::now();
        assert_ne!(held(1, now).id, held(1, now).id);
    }
}
