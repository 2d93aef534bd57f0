use std::fmt;
use std::time::Duration;

use crate::hold::Holding;
use crate::{ReadGuard, Result};

/// A held lock on one or more keys, released when dropped.
///
/// Created by [`Locker::lock`](crate::Locker::lock) and its siblings. Dropping the guard
/// runs the compare-and-delete script (best effort: errors are ignored, the keys then
/// expire with their TTL); [`release`](LockGuard::release) does the same and reports.
/// While Redis is down or frozen, a drop blocks for as long as the locker's bounds allow:
/// about an I/O timeout on a frozen server, at most about two checkout timeouts and an
/// I/O timeout on one server (8 s with the defaults), about one and a half node timeouts
/// on a quorum; and first, if the refresher's refresh of it is in flight, until that one
/// is answered (so that it never applies after the release), within the same bounds.
/// The guard owns what it needs, so it may outlive the `Locker` it came from.
///
/// A guard cannot make Redis keep the lock: check [`is_lost`](LockGuard::is_lost) before
/// acting on the protected resource, and see the crate docs for what is not guaranteed.
#[must_use = "if unused the lock will immediately be released"]
pub struct LockGuard {
    holding: Holding,
}

impl LockGuard {
    pub(crate) fn new(holding: Holding) -> LockGuard {
        LockGuard { holding }
    }

    /// The locked keys, in the order given (without the locker's prefix).
    pub fn keys(&self) -> &[String] {
        self.holding.held().names()
    }

    /// The owner token stored at the start of every key's value.
    pub fn token(&self) -> &str {
        self.holding.held().token()
    }

    /// The fencing token of each key, in key order (empty unless the lock was taken with
    /// [`LockOptions::fencing`](crate::LockOptions::fencing)). Every new acquisition of a
    /// key gets a larger token than any before it, so a resource that remembers the
    /// largest token it has seen can refuse a write from a holder whose lock has since
    /// passed to someone else — as long as Redis keeps the counters (see
    /// [`LockOptions::fencing`](crate::LockOptions::fencing)).
    pub fn fences(&self) -> &[u64] {
        &self.holding.held().fences
    }

    /// The fencing token of the first key; `None` without fencing.
    pub fn fence(&self) -> Option<u64> {
        self.holding.held().fences.first().copied()
    }

    /// Writes `value` at `key` (a plain string other clients can GET, its TTL if any
    /// kept; after the locker's prefix) unless a larger fencing token than this lock's [`fence`](Self::fence) has
    /// written it: `Ok(false)` then, and nothing is changed. The largest token that wrote
    /// `key` is kept beside it (`redguard:fenced:{<key>}`, in its Cluster slot, no TTL).
    /// It checks only the tokens, not the lease: a holder that stalled past its TTL still
    /// writes while no later holder has, which is what fencing allows.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let options = redguard::LockOptions::default().fencing(true);
    /// let guard = locker.lock_with(&["invoice:7"], options)?;
    /// if !guard.fenced_set("invoice:7:total", "42.00")? {
    ///     println!("a later holder wrote it: this one is stale");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a lock taken without
    /// fencing, an empty key, or on a cluster a key whose record could not share its slot
    /// (a `}` without a hash tag); [`Error::WrongType`](crate::Error::WrongType) when `key`
    /// holds another type (it is left untouched); [`Error::Redis`](crate::Error::Redis) or
    /// [`Error::Pool`](crate::Error::Pool) when Redis cannot be asked;
    /// [`Error::NotReplicated`](crate::Error::NotReplicated) for a lock taken with
    /// [`replicas(n)`](crate::LockOptions::replicas) when fewer replicas acknowledged the
    /// write in time (it is on the master, and a failover may forget it).
    pub fn fenced_set(&self, key: &str, value: &str) -> Result<bool> {
        self.holding.fenced_set(key, value)
    }

    /// The metadata stored after the token (empty unless set in
    /// [`LockOptions::metadata`](crate::LockOptions::metadata)).
    pub fn metadata(&self) -> &str {
        self.holding.held().metadata()
    }

    /// The shortest remaining TTL of the keys, as the server sees it; `None` when the lock
    /// is no longer held (the guard is then marked lost), `Some(Duration::MAX)` when no key
    /// has a TTL (someone ran PERSIST). It can be `Some` while [`is_lost`](Self::is_lost)
    /// is already `true`: this process counts the TTL down from before its last refresh was
    /// sent, so it gives the lock up a little before the server does.
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when Redis cannot be asked.
    pub fn ttl(&self) -> Result<Option<Duration>> {
        self.holding.ttl()
    }

    /// Sets the TTL of every key to `ttl` from now, if the lock is still held. With
    /// auto-refresh on, later refreshes use this TTL too.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when the lock is no longer held (nothing is changed then),
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a TTL under 1 ms or over [`MAX_TTL`](crate::MAX_TTL)
    /// (on a quorum, also one too short for the node timeout),
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when Redis cannot be asked.
    pub fn refresh(&self, ttl: Duration) -> Result<()> {
        self.holding.refresh(ttl)
    }

    /// `true` once the lock is known to be gone: the refresher or a call on this guard
    /// found a key missing or overwritten, or the TTL ran out before a refresh succeeded
    /// (by this process's clock, counted from before the request was sent, less 1% of the
    /// TTL and 2 ms for a server clock running a little fast). Never goes back to `false`.
    /// Sends nothing to Redis.
    ///
    /// While this host is suspended, this process's clock stops and the server's does not:
    /// after a resume, this can say `false` for a lock the server has already expired,
    /// until the refresher (or [`ttl`](Self::ttl)) finds it gone.
    pub fn is_lost(&self) -> bool {
        self.holding.is_lost()
    }

    /// How long this process still counts the lock as held, by its own clock and without
    /// asking Redis: the time until [`is_lost`](Self::is_lost) turns `true` unless a
    /// refresh succeeds first (counted from before the last successful request was sent,
    /// less the drift allowance, so never past the server's expiry); zero once lost. What
    /// a caller with a deadline of its own (stop work before the hold can expire) needs.
    /// Right after a `lock` that was handed the keys by a release, it is what the
    /// waiter's place in the queue had left (at most the waiter lifetime) until the
    /// refresher lengthens it, soon after: see [semantics](crate::guide::semantics).
    pub fn valid_for(&self) -> Duration {
        self.holding.valid_for()
    }

    /// Deletes the keys that still hold this guard's value.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when some key no longer held this guard's value (those that did
    /// are deleted all the same; others are left alone), or when the lock was already
    /// known lost. Rarely, after the server closed the connection
    /// mid-request, the release is sent again and reports `LockLost` although the first
    /// one had deleted the keys: a loss is over-reported, never hidden.
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when Redis cannot be asked (the keys then
    /// expire with their TTL).
    pub fn release(self) -> Result<()> {
        self.holding.release()
    }

    /// Turns this lock into a shared hold of the same keys (a read lock), in one atomic
    /// step: no other lock can take the keys in between, and readers that wait may enter
    /// at once. The reader keeps the token, metadata, fences, TTL and auto-refresh. There
    /// is no upgrade back.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let writing = locker.lock(&["config"])?;
    /// // ... write the config ...
    /// let reading = writing.downgrade()?; // others may read it now; no one writes
    /// // ... go on reading it ...
    /// # drop(reading);
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when the lock was no longer held;
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a lock across cluster slots
    /// or on a quorum of servers (no read locks there; refused before any round trip);
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when
    /// Redis cannot be asked. The guard is consumed either way: on any of these errors
    /// its lock is released, as on drop.
    pub fn downgrade(self) -> Result<ReadGuard> {
        self.holding.downgrade().map(ReadGuard::new)
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.holding.held();
        f.debug_struct("LockGuard")
            .field("keys", &held.names())
            .field("metadata", &held.metadata())
            .field("auto_refresh", &self.holding.auto_refresh())
            .field("lost", &held.is_lost())
            .finish_non_exhaustive()
    }
}
