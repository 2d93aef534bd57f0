use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::{Client, IntoConnectionInfo};

use crate::backend::Backend;
use crate::backend::{Acquired, Attempt};
use crate::hold::{Held, Refresher, Timing, later, owner_part, random_token};
use crate::options::{checked_keys, checked_token, checked_ttl};
use crate::wait::{Offer, Seen, Subscriber, Ticket, Wake};
use crate::{Error, LockGuard, LockOptions, LockerBuilder, Result, Retry};

/// On a quorum, a release heard from one node may not have reached the others yet: an
/// attempt right after it that finds only some nodes free ([`Acquired::Partial`]) is
/// tried again after this (and up to four times this, at random), up to
/// [`QUICK_RETRIES`] times per wake-up, without using up a retry.
const QUICK_PAUSE: Duration = Duration::from_millis(1);
const QUICK_RETRIES: u32 = 3;

/// Takes locks on Redis keys. A cheap `Clone` (an `Arc` inside), `Send + Sync`.
///
/// # Threads
/// A locker runs, all gone with it (and its last guard):
/// - `redguard-pool`: one per connection pool, which makes its connections in the
///   background: one on a single server, one per node on a quorum, one for the cluster
///   pool and one per seed on a cluster;
/// - `redguard-refresher`: one, from the first guard with auto-refresh on;
/// - `redguard-subscriber`: one, from the first thread that waits for a held key.
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

/// What a locker and its guards share; gone (refresher thread joined) with the last of them.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) default_ttl: Duration,
    /// Put before every key (and fencing counter) in Redis.
    pub(crate) prefix: String,
    pub(crate) refresher: Refresher,
    pub(crate) subscriber: Subscriber,
}

impl Locker {
    /// A locker on `backend`, whose keys (and channels) start with `prefix`.
    pub(crate) fn new(backend: Backend, default_ttl: Duration, prefix: String) -> Locker {
        Locker {
            shared: Arc::new(Shared {
                refresher: Refresher::new(backend.clone()),
                subscriber: Subscriber::new(backend.listen_pools(), &prefix),
                backend,
                default_ttl,
                prefix,
            }),
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
        let once = LockOptions {
            retry: Retry::none(),
            timeout: None,
            ..options
        };
        // `None` must mean "held elsewhere": too few quorum nodes answering is an error.
        let no_quorum = || {
            Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "fewer than a majority of the servers answered",
            )))
        };
        match self.lock_until(keys, once, no_quorum) {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::NotObtained) => Ok(None),
            Err(e) => Err(e),
        }
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
    /// [`Error::InvalidInput`] for bad keys, TTL or token (before any round trip); otherwise
    /// as [`lock`](Self::lock).
    pub fn lock_with<K: AsRef<str>>(&self, keys: &[K], options: LockOptions) -> Result<LockGuard> {
        self.lock_until(keys, options, || Error::NotObtained)
    }

    /// [`lock_with`](Self::lock_with), with `no_quorum` as the error when too few quorum
    /// nodes answer.
    fn lock_until<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
        no_quorum: impl Fn() -> Error,
    ) -> Result<LockGuard> {
        let started = Instant::now();
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
        let ttl_ms = checked_ttl(options.ttl.unwrap_or(self.shared.default_ttl))?;
        self.shared
            .backend
            .supports(&keys, names.as_deref(), prefix, &options, ttl_ms)?;
        let fixed_token = options.token.is_some();
        let token = match options.token {
            Some(token) => {
                checked_token(&token)?;
                token
            }
            None => random_token()?,
        };
        let owner = owner_part(&token);
        // The token ends the owner part; the metadata follows it.
        let token_at = owner.len() - token.len()..owner.len();
        let value = owner + &options.metadata;
        // A timeout too long for the clock is no deadline at all.
        let deadline = options.timeout.and_then(|t| started.checked_add(t));
        let mut delays = options.retry.delays();
        let subscriber = &self.shared.subscriber;
        // What a releasing guard of this locker needs to hand the lock over to us.
        let offer = Arc::new(Offer {
            keys,
            value,
            owner_len: token_at.end,
            ttl_ms,
            fencing: options.fencing,
            fixed_token,
        });
        let keys = &offer.keys;
        // In line once an attempt found the keys held; at once, without an attempt, while
        // they pass between threads of this locker by hand-overs (or others have their
        // head start).
        let mut ticket: Option<Ticket<'_>> = subscriber
            .defers(keys)
            .then(|| subscriber.wait_for(Arc::clone(&offer), Seen::default()));
        // A value of its own for each attempt after the first, where a late take-back of
        // an earlier one could otherwise delete what a later one took (random tokens only:
        // a fixed token's attempts are never taken back blindly).
        let renew = !fixed_token && self.shared.backend.takes_back(keys);
        let mut attempt_value: Option<String> = None;
        // Set when the wait is over (timeout, retries) and this waiter, not first in line,
        // has not asked Redis since it last waited: one attempt of its own before it gives
        // up, as the first in line may be asleep for its whole retry delay.
        let mut last_try = false;
        // The end of the current retry delay: a wake-up before it gives an attempt, not a
        // retry, so `limit` and the backoff keep counting delays served.
        let mut wake_at: Option<Instant> = None;
        // Quick attempts left since a release was last heard.
        let mut quick = 0;

        let (fences, sent_at) = loop {
            let mut partial = false;
            // Only the first in line talks to Redis; the others wait their turn.
            let first = last_try || ticket.as_ref().is_none_or(Ticket::is_first);
            // What a waiter has seen of the keys, noted before the attempt: a release heard
            // while the attempt is in flight then ends the next wait at once.
            let mut before = Seen::default();
            if first {
                match &mut ticket {
                    None => before = subscriber.seen(keys),
                    Some(ticket) => ticket.mark(),
                }
                if renew && ticket.is_some() {
                    attempt_value = Some(random_token()? + &options.metadata);
                }
                let sent_at = Instant::now();
                // A plain SET first only where the key is likely free: on a first attempt,
                // and not while threads of ours wait for it.
                let set_first = ticket.is_none() && !subscriber.is_watched(&keys[0]);
                let attempt = Attempt {
                    keys,
                    value: attempt_value.as_deref().unwrap_or(&offer.value),
                    owner_len: offer.owner_len,
                    ttl_ms,
                    fencing: options.fencing,
                    prefix,
                    fixed_token,
                    over: None,
                };
                match self.shared.backend.acquire(&attempt, set_first)? {
                    Acquired::Yes { fences, .. } => {
                        if let Some(ticket) = &mut ticket {
                            ticket.got_lock();
                        }
                        break (fences, sent_at);
                    }
                    Acquired::WrongType { key, kind } => {
                        // Name a lock key as the caller did; a fencing counter by its Redis
                        // name.
                        let named = keys
                            .iter()
                            .position(|k| *k == key)
                            .and_then(|i| names.as_ref().and_then(|names| names.get(i).cloned()));
                        let key = named.unwrap_or(key);
                        return Err(Error::WrongType { key, kind });
                    }
                    Acquired::HeldElsewhere => {}
                    Acquired::Partial => partial = true,
                    Acquired::NoQuorum => return Err(no_quorum()),
                }
            }
            let now = Instant::now();
            let next = match wake_at {
                _ if deadline.is_some_and(|deadline| now >= deadline) => None,
                Some(at) if at > now => Some(at),
                _ => delays.next().map(|delay| later(now, delay)),
            };
            let Some(mut until) = next else {
                if first {
                    return Err(Error::NotObtained);
                }
                last_try = true;
                continue;
            };
            if let Some(deadline) = deadline {
                // One last attempt at the deadline itself.
                until = until.min(deadline);
            }
            wake_at = Some(until);
            if partial && quick > 0 {
                quick -= 1;
                // At a random moment, so that the woken waiters do not collide again.
                until = until.min(now + QUICK_PAUSE + delays.jitter(QUICK_PAUSE * 4));
            }
            let ticket =
                ticket.get_or_insert_with(|| subscriber.wait_for(Arc::clone(&offer), before));
            match ticket.wait_until(until) {
                Wake::Handed { fences, sent_at } => {
                    ticket.got_lock();
                    attempt_value = None; // handed the offer's value
                    break (fences, sent_at);
                }
                Wake::Released => quick = QUICK_RETRIES,
                Wake::Turn | Wake::Timeout => {}
            }
        };
        // Out of line first: the offer is then this thread's alone, and moves into the guard.
        drop(ticket);
        let Offer { keys, value, .. } = Arc::try_unwrap(offer).unwrap_or_else(|shared| Offer {
            keys: shared.keys.clone(),
            value: shared.value.clone(),
            ..*shared
        });
        // A random token of this attempt's own has the same place in the value.
        let value = attempt_value.unwrap_or(value);
        let held = Held::new(keys, value, token_at, fences, Timing::new(ttl_ms, sent_at));
        LockGuard::new(
            Arc::clone(&self.shared),
            held.named(names),
            options.auto_refresh,
        )
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
