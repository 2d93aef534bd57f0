use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::backend::Refresh;
use crate::backend::{Acquired, Attempt, Refreshed};
use crate::hold::Held;
use crate::locker::Shared;
use crate::options::checked_ttl;
use crate::{Error, Result};

/// A held lock on one or more keys, released when dropped.
///
/// Created by [`Locker::lock`](crate::Locker::lock) and its siblings. Dropping the guard
/// runs the compare-and-delete script (best effort: errors are ignored, the keys then
/// expire with their TTL); [`release`](LockGuard::release) does the same and reports.
/// While Redis is down or frozen, a drop blocks for as long as the locker's bounds allow:
/// about an I/O timeout on a frozen server, at most about two checkout timeouts and an
/// I/O timeout on one server (8 s with the defaults), about one and a half node timeouts
/// on a quorum.
/// The guard owns what it needs, so it may outlive the `Locker` it came from.
///
/// A guard cannot make Redis keep the lock: check [`is_lost`](LockGuard::is_lost) before
/// acting on the protected resource, and see the crate docs for what is not guaranteed.
#[must_use = "if unused the lock will immediately be released"]
pub struct LockGuard {
    shared: Arc<Shared>,
    held: Arc<Held>,
    auto_refresh: bool,
    /// Set once released, so that `Drop` does nothing more.
    released: bool,
}

impl LockGuard {
    /// Wraps a freshly acquired lock; with `auto_refresh` the refresher takes it on. If
    /// that fails, the lock is released again.
    pub(crate) fn new(shared: Arc<Shared>, held: Held, auto_refresh: bool) -> Result<LockGuard> {
        let guard = LockGuard {
            shared,
            held: Arc::new(held),
            auto_refresh,
            released: false,
        };
        if auto_refresh {
            let held = Arc::clone(&guard.held);
            guard.shared.refresher.add(held).map_err(Error::Refresher)?;
        }
        Ok(guard)
    }

    /// The locked keys, in the order given (without the locker's prefix).
    pub fn keys(&self) -> &[String] {
        self.held.names()
    }

    /// The owner token stored at the start of every key's value.
    pub fn token(&self) -> &str {
        self.held.token()
    }

    /// The fencing token of each key, in key order (empty unless the lock was taken with
    /// [`LockOptions::fencing`](crate::LockOptions::fencing)). Every new acquisition of a
    /// key gets a larger token than any before it, so a resource that remembers the
    /// largest token it has seen can refuse a write from a holder whose lock has since
    /// passed to someone else — as long as Redis keeps the counters (see
    /// [`LockOptions::fencing`](crate::LockOptions::fencing)).
    pub fn fences(&self) -> &[u64] {
        &self.held.fences
    }

    /// The fencing token of the first key; `None` without fencing.
    pub fn fence(&self) -> Option<u64> {
        self.held.fences.first().copied()
    }

    /// The metadata stored after the token (empty unless set in
    /// [`LockOptions::metadata`](crate::LockOptions::metadata)).
    pub fn metadata(&self) -> &str {
        self.held.metadata()
    }

    /// The shortest remaining TTL of the keys, as the server sees it; `None` when the lock
    /// is no longer held (the guard is then marked lost), `Some(Duration::MAX)` when no key
    /// has a TTL (someone ran PERSIST). It can be `Some` while [`is_lost`](Self::is_lost)
    /// is already `true`: this process counts the TTL down from before its last refresh was
    /// sent, so it gives the lock up a little before the server does.
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked.
    pub fn ttl(&self) -> Result<Option<Duration>> {
        let ttl = self.shared.backend.ttl(&self.held.keys, &self.held.value)?;
        if ttl.is_none() {
            self.held.mark_lost();
        }
        Ok(ttl)
    }

    /// Sets the TTL of every key to `ttl` from now, if the lock is still held. With
    /// auto-refresh on, later refreshes use this TTL too.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the lock is no longer held (nothing is changed then),
    /// [`Error::InvalidInput`] for a TTL under 1 ms or over [`MAX_TTL`](crate::MAX_TTL)
    /// (on a quorum, also one too short for the node timeout),
    /// [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked.
    pub fn refresh(&self, ttl: Duration) -> Result<()> {
        let ttl_ms = checked_ttl(ttl)?;
        self.shared.backend.check_ttl(ttl_ms)?;
        if self.held.is_lost() {
            return Err(Error::LockLost);
        }
        // From now on the refresher uses the new TTL too.
        self.held.set_ttl(ttl_ms);
        let lock = Refresh {
            keys: &self.held.keys,
            value: &self.held.value,
            ttl_ms,
        };
        let sent_at = match self.shared.backend.refresh(std::slice::from_ref(&lock))?[..] {
            [Refreshed::Held { sent_at }] => sent_at,
            [Refreshed::Unknown] => return Err(Error::Redis(self.shared.backend.undecided())),
            _ => {
                self.held.mark_lost();
                return Err(Error::LockLost);
            }
        };
        self.held.refreshed(sent_at, ttl_ms);
        if self.auto_refresh {
            self.shared.refresher.rescheduled(self.held.id);
        }
        Ok(())
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
        self.held.is_lost()
    }

    /// Deletes the keys that still hold this guard's value.
    ///
    /// # Errors
    /// [`Error::LockLost`] when some key no longer held this guard's value (those that did
    /// are deleted all the same; others are left alone), or when the lock was already
    /// known lost. Rarely, after the server closed the connection
    /// mid-request, the release is sent again and reports `LockLost` although the first
    /// one had deleted the keys: a loss is over-reported, never hidden.
    /// [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked (the keys then
    /// expire with their TTL).
    pub fn release(mut self) -> Result<()> {
        self.released = true;
        let known_lost = self.held.is_lost();
        let released = self.unlock()?;
        if known_lost || !released {
            return Err(Error::LockLost);
        }
        Ok(())
    }

    /// Stops refreshing, then hands the lock over to the first waiter of this locker in
    /// line for the same keys, or runs the compare-and-delete script; `false` when not
    /// held.
    fn unlock(&self) -> Result<bool> {
        if self.auto_refresh {
            self.shared.refresher.remove(self.held.id);
        }
        let subscriber = &self.shared.subscriber;
        let Some(claim) = subscriber.claim(&self.held.keys) else {
            return self.release_for_real();
        };
        let offer = claim.offer();
        let attempt = Attempt {
            keys: &offer.keys,
            value: &offer.value,
            owner_len: offer.owner_len,
            ttl_ms: offer.ttl_ms,
            fencing: offer.fencing,
            prefix: &self.shared.prefix,
            fixed_token: offer.fixed_token,
            over: Some(&self.held.value),
        };
        let sent_at = Instant::now();
        if let Some(Ok(Acquired::Yes { fences, .. })) = self.shared.backend.hand_over(&attempt) {
            claim.handed(fences, sent_at);
            return Ok(true);
        }
        // Not handed over (the lock was gone, Redis failed, or the backend cannot): released
        // as usual, and only then is the waiter told to attempt by itself.
        let released = self.release_for_real();
        drop(claim);
        released
    }

    /// The compare-and-delete script, announcing the release to every waiter.
    fn release_for_real(&self) -> Result<bool> {
        let subscriber = &self.shared.subscriber;
        let released = self.shared.backend.release(
            &self.held.keys,
            &self.held.value,
            subscriber.release_channels(),
        )?;
        subscriber.released(&self.held.keys, released.listeners);
        Ok(released.held)
    }
}

impl Drop for LockGuard {
    fn drop(&mut self) {
        if !self.released {
            // Best effort: a lock we cannot delete expires with its TTL.
            let _ = self.unlock();
        }
    }
}

impl fmt::Debug for LockGuard {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("LockGuard")
            .field("keys", &self.held.names())
            .field("metadata", &self.held.metadata())
            .field("auto_refresh", &self.auto_refresh)
            .field("lost", &self.held.is_lost())
            .finish_non_exhaustive()
    }
}
