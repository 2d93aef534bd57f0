use std::time::Duration;

use crate::backend::{Holds, KeyHolders, entry_keys, fence_key, slot};
use crate::hold::metadata_of;
use crate::options::checked_keys;
use crate::{Error, Locker, Result};

/// One live hold as Redis shows it to anyone (from [`Locker::holders`] or
/// [`Semaphore::holders`](crate::Semaphore::holders)): what its owner stored as metadata,
/// how long it has left, whether it is shared. Never its token: whoever has the token can
/// release the hold.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    metadata: String,
    ttl: Option<Duration>,
    shared: bool,
    waiting: bool,
    fence: Option<u64>,
}

impl Holder {
    /// The holders a holders script listed (their values and TTLs): each one's metadata,
    /// never its token. A value marked `!` is a lock queued for the
    /// readers, not shared.
    pub(crate) fn listed(holds: Holds, shared: bool, fence: Option<u64>) -> Vec<Holder> {
        holds
            .into_iter()
            .map(|(value, ttl)| {
                let queued = value.strip_prefix('!');
                Holder {
                    metadata: metadata_of(queued.unwrap_or(&value)).to_owned(),
                    ttl,
                    shared: shared && queued.is_none(),
                    waiting: queued.is_some(),
                    fence,
                }
            })
            .collect()
    }

    /// The metadata its owner gave in [`LockOptions::metadata`](crate::LockOptions::metadata)
    /// (empty if none).
    pub fn metadata(&self) -> &str {
        &self.metadata
    }

    /// The time it has left, on the server's clock; `None` when it has no TTL (someone
    /// ran PERSIST on a lock's key).
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }

    /// Whether others may hold the key with it: a reader (of a read lock), or a permit of
    /// a semaphore; `false` for a lock.
    pub fn shared(&self) -> bool {
        self.shared
    }

    /// Whether this is no holder yet but a lock waiting for the readers of the key to
    /// leave: new readers wait behind it. Listed after the readers, in queue order, for as
    /// long as its place lives (its locker's refresher renews it; one whose process died
    /// is gone within the [waiter lifetime](crate::LockerBuilder::waiter_lifetime), 1.5 s by
    /// default). Its `ttl` is what its place has left.
    pub fn waiting(&self) -> bool {
        self.waiting
    }

    /// The key's fencing counter as it is now, when it has one: for a lock taken with
    /// fencing, its own token; for a reader, the token of the last lock taken on the key.
    /// `None` without a counter, for a permit, and on a quorum of servers.
    pub fn fence(&self) -> Option<u64> {
        self.fence
    }
}

/// Introspection: who holds a key. (Beside [`Holder`], which it returns.)
impl Locker {
    /// Who holds `key` now, for an operator: empty when it is free (but for a lock still
    /// waiting, see below, as when its readers have just left); one [`Holder`] for a
    /// lock; one per live reader for a read lock, or per live permit when `key` is a
    /// semaphore; after the readers, each lock waiting for them ([`Holder::waiting`]). One
    /// round trip (a read-only script); on a quorum of servers, the
    /// holders a majority of them agree on.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// for holder in locker.holders("payments:7")? {
    ///     println!("{} for {:?} more", holder.metadata(), holder.ttl());
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty key; [`Error::WrongType`] when the key holds
    /// another Redis type; [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked.
    pub fn holders(&self, key: &str) -> Result<Vec<Holder>> {
        checked_keys(&[key])?;
        let shared = self.shared();
        let stored = format!("{}{key}", shared.prefix);
        let counter = format!("{}{}", shared.prefix, fence_key(&stored));
        let mut beside = vec![counter];
        beside.extend(
            entry_keys(&shared.prefix, std::slice::from_ref(&stored))
                .into_iter()
                .skip(1)
                .take(2),
        );
        // One script reads them only where they share a slot (always, but for a key
        // with an unmatched brace on a cluster).
        if beside.iter().any(|key| slot(key) != slot(&stored)) {
            beside.clear();
        }
        match shared.backend.key_holders(&stored, &beside, false)? {
            KeyHolders::WrongType { kind } => Err(Error::WrongType {
                key: key.to_owned(),
                kind,
            }),
            KeyHolders::Held {
                held_by,
                fence,
                holds,
                ..
            // The script lists a read lock's readers, then the locks queued for them
            // (marked '!').
            } => Ok(Holder::listed(holds, held_by.shared(), fence)),
        }
    }
}
