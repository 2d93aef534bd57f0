//! What the backends answer, whichever one asked Redis: the types the dispatcher
//! ([`Backend`](super::Backend)) and each backend share, so that none imports another.

use std::time::Instant;

/// What one acquisition attempt found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// Every key now holds our value and the TTL; with fencing, each key's token.
    /// `fresh` unless the keys already held our value (a re-obtain with a fixed token):
    /// only a fresh acquisition may be taken back without taking the owner's lock away.
    Yes { fences: Vec<u64>, fresh: bool },
    /// Another owner holds at least one key; nothing was changed.
    HeldElsewhere,
    /// Held (by another owner, readers or every permit), or others wait before us: with
    /// the queue, our entry has its place now (if we wait); `handed` are the waiters of
    /// this locker the attempt served meanwhile (see `lua/queue/acquire.lua`).
    Queued { handed: Vec<Handed> },
    /// On a quorum: some nodes were free but not a majority (a release still on its way
    /// to the others, another owner taking them at the same time, or a node that lost its
    /// keys); what was taken has been taken back.
    Partial,
    /// On a quorum: fewer than a majority of the nodes answered; what was taken has been
    /// taken back. Waiting would not help until they are back.
    NoQuorum,
    /// `key` holds a Redis `kind` other than a string; nothing was changed.
    WrongType { key: String, kind: String },
    /// A semaphore's live holders use this other limit; nothing was taken.
    OtherLimit { limit: u32 },
    /// Taken, but fewer than `wanted` replicas acknowledged it within the replica timeout:
    /// given up again (unless the same owner held it before).
    NotReplicated { acknowledged: u32, wanted: u32 },
}

/// What a refresh found of one lock.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Refreshed {
    /// Held, with its TTL set again by requests sent no earlier than `sent_at`.
    Held { sent_at: Instant },
    /// No longer held (nothing was changed).
    Lost,
    /// Not known: part of it could not be asked (on a cluster, one master failing does
    /// not stop the others).
    Unknown,
    /// Held, with its TTL set again, but fewer than `wanted` replicas acknowledged that
    /// within the replica timeout: not known to survive a failover (retried, as unknown).
    NotReplicated { acknowledged: u32, wanted: u32 },
}

/// What a release found: whether every key still held the hold (all are given up now),
/// and the waiters of this locker the release gave their holds to.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Released {
    pub(crate) held: bool,
    pub(crate) handed: Vec<Handed>,
}

/// A waiter of this locker a script gave its hold to: its wait number (see
/// `lua/queue/queue.lua`) and fencing tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Handed {
    pub(crate) wait: String,
    pub(crate) fences: Vec<u64>,
}
