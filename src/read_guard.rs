use std::fmt;
use std::time::Duration;

use crate::hold::{Holding, Kind, obtain};
use crate::options::at_most_once;
use crate::{Error, LockOptions, Locker, Result};

/// The shared side of a [`Locker`]: read locks. (Beside [`ReadGuard`], which they return.)
impl Locker {
    /// A shared hold of every key, or of none (a read lock), waiting as long as it takes:
    /// any number of readers share a key, while no lock holds it or waits for it. Default
    /// TTL, auto-refresh on, exponential backoff with jitter, no deadline; woken when the
    /// lock that holds a key is released.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let reading = locker.read(&["config", "schema"])?; // with any other readers
    /// // ... read them; lock(&["config"]) elsewhere waits until every reader is gone ...
    /// reading.release()?; // or let it drop
    /// # Ok(()) }
    /// ```
    ///
    /// A reader that waits for a key it already reads with another guard of its own
    /// waits for ever once a lock waits for that key (writers go first): like locks, read
    /// locks are not reentrant.
    ///
    /// # Errors
    /// As [`lock`](Locker::lock); [`Error::InvalidInput`] on a quorum of servers, or for
    /// keys in different cluster hash slots.
    pub fn read<K: AsRef<str>>(&self, keys: &[K]) -> Result<ReadGuard> {
        self.read_with(keys, LockOptions::default())
    }

    /// One attempt at a shared hold of every key: `Ok(None)` when a lock holds one of
    /// them or waits for it.
    ///
    /// # Errors
    /// As [`read`](Locker::read).
    pub fn try_read<K: AsRef<str>>(&self, keys: &[K]) -> Result<Option<ReadGuard>> {
        self.try_read_with(keys, LockOptions::default())
    }

    /// A shared hold of every key, or of none, as `options` say: TTL, timeout, retry,
    /// metadata, fencing (each key's counter as it is: see [`ReadGuard::fences`]),
    /// auto-refresh. A fixed [`token`](LockOptions::token) is stored as for locks; a
    /// reader with the same token and metadata as another is the same reader to Redis.
    ///
    /// # Errors
    /// [`Error::NotObtained`] when the retries or the timeout ran out;
    /// [`Error::Cancelled`] when its [`cancel`](LockOptions::cancel) or the locker's
    /// [`close`](crate::Locker::close) ended the wait; otherwise as
    /// [`read`](Locker::read).
    pub fn read_with<K: AsRef<str>>(&self, keys: &[K], options: LockOptions) -> Result<ReadGuard> {
        let request = self.request(Kind::Read, keys)?;
        obtain(self.shared(), request, options, || Error::NotObtained).map(ReadGuard::new)
    }

    /// One attempt at a shared hold as `options` say (their retry policy and timeout do
    /// not apply): `Ok(None)` when a lock holds a key or waits for it.
    ///
    /// # Errors
    /// As [`read_with`](Locker::read_with), but never [`Error::NotObtained`].
    pub fn try_read_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
    ) -> Result<Option<ReadGuard>> {
        at_most_once(self.read_with(keys, options.once()))
    }
}

/// A shared hold of one or more keys (a read lock), given up when dropped.
///
/// Created by [`Locker::read`](crate::Locker::read) and its siblings, or by
/// [`LockGuard::downgrade`](crate::LockGuard::downgrade). Any number of readers may share
/// a key; a [`lock`](crate::Locker::lock) of it waits until the last of them has left,
/// and new readers wait behind a lock that waits (see [read locks](crate::guide::read_locks)).
/// Like a [`LockGuard`](crate::LockGuard): auto-refreshed by the locker's refresher thread
/// unless [`LockOptions::auto_refresh`](crate::LockOptions::auto_refresh) says otherwise,
/// `Send`, owning what it needs; dropping it gives the hold up (best effort, bounded,
/// never panics), [`release`](ReadGuard::release) does the same and reports.
#[must_use = "if unused the read lock will immediately be released"]
pub struct ReadGuard {
    holding: Holding,
}

impl ReadGuard {
    pub(crate) fn new(holding: Holding) -> ReadGuard {
        ReadGuard { holding }
    }

    /// The keys held, in the order given (without the locker's prefix).
    pub fn keys(&self) -> &[String] {
        self.holding.held().names()
    }

    /// The owner token at the start of this reader's value.
    pub fn token(&self) -> &str {
        self.holding.held().token()
    }

    /// The metadata stored after the token (empty unless set in
    /// [`LockOptions::metadata`](crate::LockOptions::metadata)).
    pub fn metadata(&self) -> &str {
        self.holding.held().metadata()
    }

    /// With [`LockOptions::fencing`](crate::LockOptions::fencing): each key's fencing
    /// counter as this reader found it, the token of the last lock taken on it (0 where
    /// none was), in key order. A resource can refuse a reader whose number is below the
    /// newest write it has seen (see [fencing](crate::guide::fencing)). Empty without
    /// fencing.
    pub fn fences(&self) -> &[u64] {
        &self.holding.held().fences
    }

    /// The first key's entry of [`fences`](Self::fences); `None` without fencing.
    pub fn fence(&self) -> Option<u64> {
        self.holding.held().fences.first().copied()
    }

    /// The shortest time this reader has left on any of its keys, on the server's clock;
    /// `None` when it no longer holds them all (it is then marked lost).
    ///
    /// # Errors
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when
    /// Redis cannot be asked.
    pub fn ttl(&self) -> Result<Option<Duration>> {
        self.holding.ttl()
    }

    /// Sets this reader's TTL on every key to `ttl` from now, if it still holds them all
    /// (an expired reader is never revived). With auto-refresh on, later refreshes use
    /// this TTL too.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when it no longer holds them all;
    /// [`Error::InvalidInput`](crate::Error::InvalidInput) for a TTL under 1 ms or over
    /// [`MAX_TTL`](crate::MAX_TTL); [`Error::Redis`](crate::Error::Redis) or
    /// [`Error::Pool`](crate::Error::Pool) when Redis cannot be asked.
    pub fn refresh(&self, ttl: Duration) -> Result<()> {
        self.holding.refresh(ttl)
    }

    /// `true` once this reader is known to be gone, exactly as
    /// [`LockGuard::is_lost`](crate::LockGuard::is_lost) says. Sends nothing to Redis.
    pub fn is_lost(&self) -> bool {
        self.holding.is_lost()
    }

    /// How long this process still counts the read lock as held, by its own clock and without
    /// asking Redis: the time until [`is_lost`](Self::is_lost) turns `true` unless a
    /// refresh succeeds first (counted from before the last successful request was sent,
    /// less the drift allowance, so never past the server's expiry); zero once lost. What
    /// a caller with a deadline of its own (stop work before the hold can expire) needs.
    pub fn valid_for(&self) -> Duration {
        self.holding.valid_for()
    }

    /// Gives up the shared hold of every key; the last reader to leave a key wakes the
    /// locks that wait for it.
    ///
    /// # Errors
    /// [`Error::LockLost`](crate::Error::LockLost) when some key no longer had this reader
    /// (the others are given up all the same), or it was already known lost.
    /// [`Error::Redis`](crate::Error::Redis) or [`Error::Pool`](crate::Error::Pool) when
    /// Redis cannot be asked (the hold then expires with its TTL).
    pub fn release(self) -> Result<()> {
        self.holding.release()
    }
}

impl fmt::Debug for ReadGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let held = self.holding.held();
        f.debug_struct("ReadGuard")
            .field("keys", &held.names())
            .field("metadata", &held.metadata())
            .field("auto_refresh", &self.holding.auto_refresh())
            .field("lost", &held.is_lost())
            .finish_non_exhaustive()
    }
}
