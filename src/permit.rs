use std::fmt;
use std::time::Duration;

use crate::Result;
use crate::hold::Holding;

/// One of a [`Semaphore`](crate::Semaphore)'s permits, given back when dropped.
///
/// Created by [`Semaphore::acquire`](crate::Semaphore::acquire) and its siblings. Like a
/// [`LockGuard`](crate::LockGuard): auto-refreshed by the locker's refresher thread unless
/// [`LockOptions::auto_refresh`](crate::LockOptions::auto_refresh) says otherwise, `Send`,
/// owning what it needs (it may outlive its `Semaphore` and `Locker`). Dropping it gives
/// the permit back (best effort, bounded as a guard's drop is; never panics);
/// [`release`](Permit::release) does the same and reports.
///
/// A permit is a lease: check [`is_lost`](Permit::is_lost) before acting, as for locks.
#[must_use = "if unused the permit will immediately be given back"]
pub struct Permit {
    holding: Holding,
}

impl Permit {
    pub(crate) fn new(holding: Holding) -> Permit {
        Permit { holding }
    }

    /// The name of the semaphore it is a permit of.
    pub fn semaphore(&self) -> &str {
        self.holding
            .held()
            .names()
            .first()
            .map_or("", String::as_str)
    }

    /// The owner token stored at the start of the permit's value.
    pub fn token(&self) -> &str {
        self.holding.held().token()
    }

    /// The metadata stored after the token (empty unless set in
    /// [`LockOptions::metadata`](crate::LockOptions::metadata)).
    pub fn metadata(&self) -> &str {
        self.holding.held().metadata()
    }

    /// With [`LockOptions::fencing`](crate::LockOptions::fencing): a number larger than that
    /// of every earlier permit of this semaphore (see the [fencing](crate::guide::fencing)
    /// guide for how to use it). `None` without fencing.
    pub fn fence(&self) -> Option<u64> {
        self.holding.held().fences.first().copied()
    }

    /// The permit's remaining TTL, on the server's clock; `None` when it is no longer held
    /// (it is then marked lost).
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when
    /// Redis cannot be asked.
    pub fn ttl(&self) -> Result<Option<Duration>> {
        self.holding.ttl()
    }

    /// Sets the permit's TTL to `ttl` from now, if it is still held (an expired permit is
    /// never revived). With auto-refresh on, later refreshes use this TTL too.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when the permit is no longer held;
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a TTL under 1 ms or over
    /// [`MAX_TTL`](crate::MAX_TTL); [`Error::Redis`](crate::Error::Redis) or
    /// [`Error::Pool`](crate::Error::Pool) when Redis cannot be asked.
    pub fn refresh(&self, ttl: Duration) -> Result<()> {
        self.holding.refresh(ttl)
    }

    /// `true` once the permit is known to be gone, exactly as
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost) says. Sends nothing to Redis.
    pub fn is_lost(&self) -> bool {
        self.holding.is_lost()
    }

    /// How long this process still counts the permit as held, by its own clock and without
    /// asking Redis: the time until [`is_lost`](Self::is_lost) turns `true` unless a
    /// refresh succeeds first (counted from before the last successful request was sent,
    /// less the drift allowance, so never past the server's expiry); zero once lost. What
    /// a caller with a deadline of its own (stop work before the hold can expire) needs.
    pub fn valid_for(&self) -> Duration {
        self.holding.valid_for()
    }

    /// Gives the permit back, and wakes the semaphore's waiters.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when the permit had expired (or was
    /// already known lost): it was not counted any more, and nothing is given back twice.
    /// Rarely, after the server closed the connection mid-request, the release is sent
    /// again and reports `LockLost` although the first one had given the permit back: a
    /// loss is over-reported, never hidden.
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when
    /// Redis cannot be asked (the permit then expires with its TTL).
    pub fn release(self) -> Result<()> {
        self.holding.release()
    }
}

impl fmt::Debug for Permit {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.holding.held();
        f.debug_struct("Permit")
            .field("semaphore", &self.semaphore())
            .field("metadata", &held.metadata())
            .field("auto_refresh", &self.holding.auto_refresh())
            .field("lost", &held.is_lost())
            .finish_non_exhaustive()
    }
}
