use std::fmt;
use std::sync::{Arc, Weak};
use std::time::Instant;

use redis::{Client, IntoConnectionInfo};

use crate::backend::Force;
use crate::hold::{Kind, Request, obtain};
use crate::options::{at_most_once, checked_keys};
use crate::shared::Shared;
use crate::{Election, Error, LockGuard, LockOptions, LockerBuilder, Result, Semaphore};

/// Takes locks on Redis keys. A cheap `Clone` (an `Arc` inside), `Send + Sync`.
///
/// # Threads
/// A locker runs, all gone with it (and its last guard):
/// - `redguard-pool`: one per connection pool, which makes its connections in the
///   background: one on a single server, one per node on a quorum, one for the cluster
///   pool and one per seed on a cluster;
/// - `redguard-refresher`: one, from the first guard with auto-refresh on;
/// - `redguard-subscriber`: one, from the first thread that waits for a held key: it
///   listens on the locker's own channel, where a release tells its waiters they were
///   given their holds;
/// - `redguard-sentinel`: through Sentinel, one that listens for failovers.
///
/// ```no_run
/// # fn main() -> Result<(), redguard::Error> {
/// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
/// let guard = locker.lock(&["invoice:7"])?; // waits until held
/// // ... the critical section ...
/// guard.release()?; // or let it drop
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    shared: Arc<Shared>,
}

impl Locker {
    /// A locker of its own on what it shares with its guards.
    pub(crate) fn new(shared: Shared) -> Locker {
        Locker {
            shared: Arc::new(shared),
        }
    }

    /// A locker on its own connection pool, with the defaults of [`LockerBuilder`]. Short
    /// for `Locker::builder().build(url)`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::Redis`] at once when the first
    /// connection fails (refused, unknown host, wrong password, no such database, or no
    /// answer within the connect and I/O timeouts); [`Error::Pool`] when the others cannot
    /// be made within the checkout timeout.
    pub fn connect<T: IntoConnectionInfo>(url: T) -> Result<Locker> {
        Locker::builder().build(url)
    }

    /// Settings for a new locker.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// A locker on a pool you built, with the defaults of [`LockerBuilder`]; see
    /// [`LockerBuilder::build_with_pool`]. Build the pool with the
    /// [`SocketTimeouts`](crate::SocketTimeouts) customizer, or a frozen server can hang
    /// r2d2's own connection checks.
    pub fn from_pool(pool: r2d2::Pool<Client>) -> Locker {
        // The defaults pass `check`, so this is `build_with_pool` without its `Result`.
        LockerBuilder::default().given_pool(pool)
    }

    /// Locks every key, or none, waiting as long as it takes (like `Mutex::lock`): default
    /// TTL, auto-refresh on, exponential backoff with jitter, no deadline.
    ///
    /// Locks are not reentrant: a thread that locks keys one of its own guards already
    /// holds waits for itself, forever (auto-refresh keeps the first guard's lock alive).
    /// Where that can happen, use [`try_lock`](Self::try_lock), or a
    /// [`timeout`](LockOptions::timeout) with [`lock_with`](Self::lock_with).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty key list, an empty or repeated key;
    /// [`Error::WrongType`] when a key holds another Redis type; [`Error::Redis`] or
    /// [`Error::Pool`] when Redis cannot be asked (returned at once, not retried).
    pub fn lock<K: AsRef<str>>(&self, keys: &[K]) -> Result<LockGuard> {
        self.lock_with(keys, LockOptions::default())
    }

    /// One attempt to lock every key: `Ok(None)` when another owner holds one of them.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); on a quorum of servers, [`Error::Redis`] when fewer than
    /// a majority of them answered.
    pub fn try_lock<K: AsRef<str>>(&self, keys: &[K]) -> Result<Option<LockGuard>> {
        self.try_lock_with(keys, LockOptions::default())
    }

    /// One attempt to lock every key as `options` say (TTL, metadata, token, fencing,
    /// auto-refresh; their retry policy and timeout do not apply): `Ok(None)` when another
    /// owner holds one of them.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redguard::LockOptions;
    ///
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let options = LockOptions::default().ttl(Duration::from_secs(5)).metadata("cron");
    /// match locker.try_lock_with(&["nightly-report"], options)? {
    ///     Some(_guard) => { /* ... run the report ... */ }
    ///     None => println!("another run holds it"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with), but never [`Error::NotObtained`]; on a quorum of
    /// servers, [`Error::Redis`] when fewer than a majority of them answered.
    pub fn try_lock_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
    ) -> Result<Option<LockGuard>> {
        // `None` must mean "held elsewhere": too few quorum nodes answering is an error.
        let no_quorum = || {
            Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "fewer than a majority of the servers answered",
            )))
        };
        at_most_once(self.lock_until(keys, options.once(), no_quorum))
    }

    /// Locks every key, or none, as `options` say.
    ///
    /// Each attempt is one round trip (two when a plain `SET` finds a single key taken
    /// and the script runs after it). While another owner holds a key, it waits as the
    /// retry policy says, never past the timeout, and tries again as soon as a release of
    /// one of the keys is heard; a Redis error ends it at once.
    ///
    /// # Errors
    /// [`Error::NotObtained`] when the retries or the timeout ran out;
    /// [`Error::Cancelled`] when its [`cancel`](LockOptions::cancel) or the locker's
    /// [`close`](crate::Locker::close) ended the wait;
    /// [`Error::InvalidInput`] for bad keys, TTL or token (before any round trip); otherwise
    /// as [`lock`](Self::lock).
    pub fn lock_with<K: AsRef<str>>(&self, keys: &[K], options: LockOptions) -> Result<LockGuard> {
        self.lock_until(keys, options, || Error::NotObtained)
    }

    /// Cancels every wait of this locker and its clones, now and later, as a cancelled
    /// [`Cancel`](crate::Cancel) given to each would:
    /// - a thread waiting in [`lock`](Self::lock), [`read`](Self::read),
    ///   [`Semaphore::acquire`], [`Election::campaign`] or their `_with` forms is woken at
    ///   once and returns [`Error::Cancelled`] as soon as its round trip in flight, if any,
    ///   is answered, after one more to take its queue entry out: no entry, no key is left
    ///   of it, and a hold handed to it at that moment is passed on to the next in line;
    /// - every later call that would obtain a hold, the `try_` forms included, returns
    ///   [`Error::Cancelled`] at once, without a round trip.
    ///
    /// Guards, read guards, permits and terms obtained before are left alone: they stay
    /// held, the refresher goes on refreshing those with auto-refresh, and their `release`,
    /// `refresh` and drop work as before (a release still hands the keys to the next in
    /// line, in any process). Nothing else changes either: no connection is closed, no
    /// thread stopped (they go with the locker's last clone and guard), and
    /// [`holders`](Self::holders), [`force_release`](Self::force_release),
    /// [`Election::leader`] and observers work as before. For a shutdown: close, then
    /// release or drop the guards. It cannot be undone (build another locker to wait
    /// again); calling it again does nothing more. No round trip: each call checks it with
    /// one atomic load.
    pub fn close(&self) {
        self.shared.closed.ring();
    }

    /// A semaphore of `name` (a Redis key, after the locker's prefix) with at most `limit`
    /// holders at once, each holding a [`Permit`](crate::Permit). No round trip: the limit
    /// is checked against the one stored in Redis when a permit is taken.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let payments = locker.semaphore("payments", 8)?;
    /// let _permit = payments.acquire()?; // one of at most 8, in every process
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty name, a limit of 0 or over
    /// [`MAX_LIMIT`](crate::MAX_LIMIT), and on a quorum of servers (see
    /// [`Semaphore`](crate::Semaphore#deployments)).
    pub fn semaphore(&self, name: &str, limit: u32) -> Result<Semaphore> {
        Semaphore::new(Arc::clone(&self.shared), name, limit)
    }

    /// The election `name`: candidates of every process campaign for it, at most one leads
    /// at a time, and each leader's term is larger than every earlier one (see
    /// [`Election`]). No round trip. Its keys (after the locker's prefix) are
    /// `redguard:election:{<name>}` (the leader's lock, with the candidates' queue beside
    /// it), its fencing counter (the terms) and `redguard:proclaimed:…` (the value the
    /// leader proclaimed last), all in one Cluster hash slot.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let election = locker.election("scheduler")?;
    /// let term = election.campaign("10.0.0.7:8080")?; // waits until it leads
    /// println!("term {}", term.term());
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty name; on a quorum of servers (a term needs one
    /// counter); on a cluster, for a name whose keys would not share a slot (an unmatched
    /// brace).
    pub fn election(&self, name: &str) -> Result<Election> {
        Election::new(Arc::clone(&self.shared), name)
    }

    /// Break-glass, for an operator: removes the lock on `keys`, or every reader of a read
    /// lock, **whoever holds it**, and gives the keys to the waiters first in their queues
    /// as a release does (the first in line gets them at once; with fencing, a token higher
    /// than the removed holder's: the counters are never deleted). `true` when a live hold
    /// was removed, `false` when nothing held the keys. All the keys or none, in one
    /// script; like [`holders`](Self::holders), it takes the caller's key names.
    ///
    /// # Danger
    /// The holder is neither asked nor told. If it still runs, it goes on believing it
    /// holds the lock until its next refresh (at about a third of its TTL; without
    /// auto-refresh, its own `refresh`, `ttl` or `release`, or its TTL running out) finds
    /// the keys gone and marks its guard lost ([`is_lost`](LockGuard::is_lost), `on_lost`,
    /// [`release`](LockGuard::release) returns [`Error::LockLost`]). Until then it and the
    /// next holder both act: only a resource that checks [fencing
    /// tokens](crate::guide::fencing) refuses the older one. Use it on a holder known to be
    /// dead whose TTL is long, or one stuck but alive (its refresher keeps the lock) once
    /// it is stopped; a dead holder's lock otherwise expires with its TTL anyway.
    ///
    /// A semaphore's key is refused (its permits are not removed: all of them gone would let
    /// in as many new holders beside those still running). On a cluster the keys must
    /// share a hash slot (call it slot by slot, or key by key). On a quorum of servers it
    /// runs on every node, and answers `true` when a majority of them removed a lock.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// for holder in locker.holders("nightly-report")? {
    ///     println!("removing the hold of {:?}", holder.metadata());
    /// }
    /// if !locker.force_release(&["nightly-report"])? {
    ///     println!("nothing held it");
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty key list, an empty or repeated key, a
    /// semaphore's key, or keys across cluster hash slots; [`Error::WrongType`] when a key
    /// holds another Redis type (nothing is removed then, from any of the keys; on a quorum,
    /// from no key of the node that found it); [`Error::Redis`] or [`Error::Pool`] when
    /// Redis cannot be asked (on a quorum, also when too few nodes answered to tell).
    pub fn force_release<K: AsRef<str>>(&self, keys: &[K]) -> Result<bool> {
        let request = self.request(Kind::Lock, keys)?;
        let shared = &self.shared;
        let force = Force {
            keys: &request.keys,
            names: request.names.as_deref(),
            prefix: &shared.prefix,
            channel: shared.subscriber.channel(),
            lifetime_ms: u64::try_from(shared.waiter_lifetime.as_millis()).unwrap_or(u64::MAX),
            announce: shared.announce(),
        };
        let sent_at = Instant::now();
        let released = shared.backend.force_release(&force)?;
        // Waiters of this locker given the keys hear it from here (no message was sent).
        shared.subscriber.handed(released.handed, sent_at);
        Ok(released.held)
    }

    /// [`lock_with`](Self::lock_with), with `no_quorum` as the error when too few quorum
    /// nodes answer.
    fn lock_until<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
        no_quorum: impl Fn() -> Error,
    ) -> Result<LockGuard> {
        let request = self.request(Kind::Lock, keys)?;
        obtain(&self.shared, request, options, no_quorum).map(LockGuard::new)
    }

    /// A request for a hold of `kind` on `keys`, checked, as Redis knows them.
    pub(crate) fn request<K: AsRef<str>>(&self, kind: Kind, keys: &[K]) -> Result<Request> {
        let names = checked_keys(keys)?;
        let prefix = self.shared.prefix.as_str();
        // The keys as Redis knows them; the caller's names are kept only when they differ.
        let (keys, names) = if prefix.is_empty() {
            (names, None)
        } else {
            (
                names.iter().map(|k| format!("{prefix}{k}")).collect(),
                Some(names),
            )
        };
        Ok(Request { kind, keys, names })
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// A handle on this locker that does not keep it alive: for an
    /// [`on_lost`](LockerBuilder::on_lost) callback that needs the locker (see there).
    pub fn downgrade(&self) -> WeakLocker {
        WeakLocker {
            shared: Arc::downgrade(&self.shared),
        }
    }
}

/// A [`Locker`] that does not keep it alive, made by [`Locker::downgrade`], as `Weak` is
/// to `Arc`. An [`on_lost`](LockerBuilder::on_lost) callback that held a `Locker` would
/// keep it alive for ever (its refresher holds the callback), with its threads.
#[derive(Clone)]
pub struct WeakLocker {
    shared: Weak<Shared>,
}

impl WeakLocker {
    /// The locker, while a [`Locker`] or one of its guards still lives.
    pub fn upgrade(&self) -> Option<Locker> {
        self.shared.upgrade().map(|shared| Locker { shared })
    }
}

impl fmt::Debug for WeakLocker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WeakLocker").finish_non_exhaustive()
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("default_ttl", &self.shared.default_ttl)
            .finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn locker_is_clone_send_sync_and_guard_is_send() {
        fn send_sync<T: Clone + Send + Sync + 'static>() {}
        fn send<T: Send + 'static>() {}
        send_sync::<Locker>();
        send::<LockGuard>();
    }
}
