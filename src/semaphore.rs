use std::fmt;
use std::sync::Arc;

use crate::backend::{HeldBy, Holds, KeyHolders};
use crate::hold::{Kind, Request, obtain};
use crate::options::at_most_once;
use crate::shared::Shared;
use crate::{Error, Holder, LockOptions, Permit, Result};

/// The largest limit a [`Semaphore`] may have.
pub const MAX_LIMIT: u32 = 1_000_000;

/// At most [`limit`](Semaphore::limit) holders of a name at once, across every process
/// that uses it: each holds a [`Permit`], an RAII guard like a [`LockGuard`](crate::LockGuard).
///
/// Made by [`Locker::semaphore`](crate::Locker::semaphore), without a round trip. A cheap
/// `Clone` (an `Arc` inside), `Send + Sync`.
///
/// ```no_run
/// use std::time::Duration;
/// use redguard::{LockOptions, Locker, Permit, Semaphore};
///
/// # fn main() -> Result<(), redguard::Error> {
/// let locker = Locker::connect("redis://127.0.0.1/")?;
/// let payments: Semaphore = locker.semaphore("payments", 8)?;
/// let permit: Permit = payments.acquire()?; // waits, as lock() does
/// // ... at most 8 of these run at once, in every process ...
/// permit.release()?; // or let it drop
///
/// // One attempt: None when all 8 permits are held.
/// if let Some(_permit) = payments.try_acquire()? { /* ... */ }
///
/// // The options of locks apply.
/// let permit = payments.acquire_with(LockOptions::default()
///     .ttl(Duration::from_secs(10))
///     .timeout(Duration::from_secs(2))  // then Err(NotObtained)
///     .metadata("worker-7")             // shown by holders()
///     .fencing(true))?;                 // permit.fence(): rises per semaphore
/// println!("{} of {} free", payments.available()?, payments.limit());
/// for holder in payments.holders()? {
///     println!("{} for {:?} more", holder.metadata(), holder.ttl());
/// }
/// # drop(permit);
/// # Ok(()) }
/// ```
///
/// # How it is kept
/// A semaphore lives in Redis under its name (with the locker's prefix) as a sorted set:
/// each permit's value (its token, then its metadata) scored by when it expires, on the
/// **server's** clock (`TIME` inside the scripts; no client's clock is ever compared with
/// another's), and the member `""` scored by minus the limit in use. Every script first
/// drops the holders that have expired, so a holder that died without releasing frees its
/// permit when its TTL runs out, and a waiter told how long that is takes the permit then,
/// not a retry delay later. There is no separate counter that could drift from the
/// holders. The key expires with its last holder, and is deleted when the last one gives
/// its permit back. With fencing, the counter is that of a lock on the same key (for
/// `payments` with prefix `app:`, `app:redguard:fence:{app:payments}`), in the same
/// Cluster hash slot. A sorted set without the limit member is not a semaphore: it is
/// left untouched, and [`Error::WrongType`] says so.
///
/// A semaphore and a lock of the same name share one Redis key: the second of them to be
/// used gets [`Error::WrongType`].
///
/// # Permits
/// Auto-refreshed by the locker's one refresher thread, in the same round trip as its
/// locks; a refresh never revives an expired permit (it is then lost). Waiters of every
/// locker wait in the semaphore's one queue on the server, in arrival order: a permit
/// given back goes to the first of them, who wakes holding it (see
/// [semantics](crate::guide::semantics)).
///
/// # Options
/// [`LockOptions`] apply as to locks, with these meanings:
/// - [`fencing`](LockOptions::fencing): each new permit gets a number larger than every
///   earlier permit of this semaphore (one counter per semaphore);
/// - [`token`](LockOptions::token): a fixed owner that re-obtains the permit it already
///   holds, with the new TTL, instead of taking a second one (with fencing, the re-obtained
///   permit gets a new number);
/// - [`across_slots`](LockOptions::across_slots) has no effect: a semaphore's keys are
///   always in one slot.
///
/// # The limit
/// Stored with the holders on first use. A permit asked for with another limit while
/// holders live is refused with [`Error::InvalidInput`], which names both limits (nothing
/// is taken); once no holder is left, the new limit is used.
///
/// # Deployments
/// One server and Redis Cluster. A quorum of servers
/// ([`build_redlock`](crate::LockerBuilder::build_redlock)) is refused by
/// [`Locker::semaphore`](crate::Locker::semaphore): on independent servers, more holders
/// than the limit could each find a majority of servers below it (with five servers and a
/// limit of 8, up to 13). Needs Redis 3.2 or newer (scripts that call `TIME` before they
/// write; tested on Redis 7).
#[derive(Clone)]
pub struct Semaphore {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    name: String,
    limit: u32,
    /// The semaphore's one key, as stored in Redis (with the locker's prefix).
    keys: Vec<String>,
}

impl Semaphore {
    /// A semaphore of `name` with at most `limit` holders; see
    /// [`Locker::semaphore`](crate::Locker::semaphore).
    pub(crate) fn new(shared: Arc<Shared>, name: &str, limit: u32) -> Result<Semaphore> {
        if name.is_empty() {
            return Err(Error::InvalidInput("semaphore name is empty".into()));
        }
        if limit == 0 || limit > MAX_LIMIT {
            return Err(Error::InvalidInput(format!(
                "semaphore limit {limit}: it must be 1 to {MAX_LIMIT}"
            )));
        }
        let keys = vec![format!("{}{name}", shared.prefix)];
        shared
            .backend
            .supports_permits(&keys, &shared.prefix, false)?;
        Ok(Semaphore {
            inner: Arc::new(Inner {
                shared,
                name: name.to_owned(),
                limit,
                keys,
            }),
        })
    }

    /// The name given to [`Locker::semaphore`](crate::Locker::semaphore).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The most holders at once.
    pub fn limit(&self) -> u32 {
        self.inner.limit
    }

    /// Takes a permit, waiting as long as it takes (like [`Locker::lock`](crate::Locker::lock)):
    /// default TTL, auto-refresh on, exponential backoff with jitter, no deadline; woken by
    /// a release, or when the first permit held expires.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] when the holders use another limit; [`Error::WrongType`]
    /// when a key of the semaphore holds another Redis type; [`Error::Redis`] or
    /// [`Error::Pool`] when Redis cannot be asked (returned at once, not retried).
    pub fn acquire(&self) -> Result<Permit> {
        self.acquire_with(LockOptions::default())
    }

    /// One attempt to take a permit: `Ok(None)` when every permit is held.
    ///
    /// # Errors
    /// As [`acquire`](Self::acquire).
    pub fn try_acquire(&self) -> Result<Option<Permit>> {
        self.try_acquire_with(LockOptions::default())
    }

    /// Takes a permit as `options` say (see [Options](Semaphore#options)).
    ///
    /// # Errors
    /// [`Error::NotObtained`] when the retries or the timeout ran out;
    /// [`Error::Cancelled`] when its [`cancel`](LockOptions::cancel) or the locker's
    /// [`close`](crate::Locker::close) ended the wait;
    /// [`Error::InvalidInput`] for a bad TTL or token (before any round trip); otherwise as
    /// [`acquire`](Self::acquire).
    pub fn acquire_with(&self, options: LockOptions) -> Result<Permit> {
        let inner = &self.inner;
        let request = Request {
            kind: Kind::Permit { limit: inner.limit },
            keys: inner.keys.clone(),
            names: Some(vec![inner.name.clone()]),
        };
        obtain(&inner.shared, request, options, || Error::NotObtained).map(Permit::new)
    }

    /// One attempt to take a permit as `options` say (their retry policy and timeout do
    /// not apply): `Ok(None)` when every permit is held.
    ///
    /// # Errors
    /// As [`acquire_with`](Self::acquire_with), but never [`Error::NotObtained`].
    pub fn try_acquire_with(&self, options: LockOptions) -> Result<Option<Permit>> {
        at_most_once(self.acquire_with(options.once()))
    }

    /// How many permits are free now: the limit less the live holders (0 when more hold
    /// than this limit, under another one). One round trip.
    ///
    /// # Errors
    /// [`Error::WrongType`] when the name holds another Redis type; [`Error::Redis`] or
    /// [`Error::Pool`] when Redis cannot be asked.
    pub fn available(&self) -> Result<u32> {
        let (held, _) = self.holders_of(true)?;
        Ok(self.inner.limit.saturating_sub(held as u32))
    }

    /// Each live permit's metadata and remaining TTL, the first to expire first; never
    /// the tokens. One round trip.
    ///
    /// # Errors
    /// As [`available`](Self::available).
    pub fn holders(&self) -> Result<Vec<Holder>> {
        let (_, holds) = self.holders_of(false)?;
        Ok(Holder::listed(holds, true, None))
    }

    /// How many hold a permit, and (unless `count_only`) who: what `Locker::holders`
    /// asks, with anything but a semaphore (or nothing) at the name as [`Error::WrongType`].
    fn holders_of(&self, count_only: bool) -> Result<(usize, Holds)> {
        let inner = &self.inner;
        // The one key that `new` made; a semaphore has no counter value of its own to show.
        let found = inner
            .shared
            .backend
            .key_holders(&inner.keys[0], &[], count_only)?;
        let kind = match found {
            KeyHolders::Held {
                held_by: HeldBy::Permits | HeldBy::Nobody,
                count,
                holds,
                ..
            } => return Ok((count, holds)),
            KeyHolders::Held {
                held_by: HeldBy::Lock,
                ..
            } => "string".to_string(),
            KeyHolders::Held { .. } => "zset, not a semaphore".to_string(),
            KeyHolders::WrongType { kind } if kind.starts_with("zset") => {
                "zset, not a semaphore".to_string()
            }
            KeyHolders::WrongType { kind } => kind,
        };
        Err(Error::WrongType {
            key: inner.name.clone(),
            kind,
        })
    }
}

impl fmt::Debug for Semaphore {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Semaphore")
            .field("name", &self.inner.name)
            .field("limit", &self.inner.limit)
            .finish_non_exhaustive()
    }
}
