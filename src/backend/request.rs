//! What a hold asks of a backend: one acquisition attempt ([`Attempt`]), one hold to
//! refresh ([`Refresh`]), and how many replicas must acknowledge either ([`Replicas`]).
//! The scripts (`scripts`) send them; `replicas` waits for the replicas they want.

use std::time::Duration;

use crate::hold::Kind;

/// The most replicas a hold may wait for: far more than any master has.
pub(crate) const MAX_REPLICAS: u32 = 100;

/// How many replicas must acknowledge a hold's writes, and how long to wait for them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Replicas {
    pub(crate) wanted: u32,
    /// WAIT's own timeout (at least 1 ms: `WAIT n 0` would block for ever), kept below
    /// the connection's read timeout.
    pub(crate) timeout: Duration,
}

/// What one acquisition attempt asks for.
#[derive(Clone, Copy)]
pub(crate) struct Attempt<'a> {
    pub(crate) kind: Kind,
    pub(crate) keys: &'a [String],
    /// The owner part (see [`owner_part`](crate::hold::owner_part)), then the metadata.
    pub(crate) value: &'a str,
    /// The owner part's length in bytes: a value that starts with it is ours.
    pub(crate) owner_len: usize,
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    /// The locker's prefix, put before each fencing counter too.
    pub(crate) prefix: &'a str,
    /// Whether the token is the caller's own: then the keys may already hold this value
    /// from an earlier acquisition, and a failed attempt must not delete them blindly.
    pub(crate) fixed_token: bool,
    /// With the server's queue (one server, or one cluster hash slot): the locker's
    /// channel and, for a caller that waits, its entry. `None`: no queue (a quorum, a lock
    /// across cluster slots).
    pub(crate) queue: Option<Queue<'a>>,
    /// Where release channels start: a take-back announces the keys it frees.
    pub(crate) channels: &'a str,
    /// Held only once this many replicas acknowledged it (see [`Replicas`]).
    pub(crate) replicas: Option<Replicas>,
}

impl<'a> Attempt<'a> {
    /// Whether keys found holding this attempt's value (taken `fresh` by it, or not) are
    /// this attempt's to take back: a random token's always (a request sent again after a
    /// timeout finds them taken already), a fixed token's only when fresh (the same owner
    /// may have held them before).
    pub(crate) fn owns(&self, fresh: bool) -> bool {
        fresh || !self.fixed_token
    }

    /// What gives back what this attempt took (serving the queue, announcing the keys).
    pub(crate) fn take_back(&self) -> Release<'a> {
        Release {
            kind: self.kind,
            keys: self.keys,
            value: self.value,
            prefix: self.prefix,
            queue: self.queue.map(|queue| Queue {
                entry: None,
                ..queue
            }),
            announce: self.channels,
            joins: &[],
        }
    }
}

/// An attempt's (or a release's) side of the server's queue: see `lua/queue/queue.lua`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Queue<'a> {
    /// The locker's own channel, where the scripts tell its waiters they were served.
    pub(crate) channel: &'a str,
    /// The caller's entry: for an attempt, its place should it have to wait (`None`: it
    /// does not wait); for a release, its place to give up too (a waiter that leaves).
    pub(crate) entry: Option<&'a str>,
    /// How long an entry lives unless its refresher renews it.
    pub(crate) lifetime_ms: u64,
}

/// A hold to give up: see `lua/queue/release.lua`.
#[derive(Clone, Copy)]
pub(crate) struct Release<'a> {
    pub(crate) kind: Kind,
    pub(crate) keys: &'a [String],
    pub(crate) value: &'a str,
    pub(crate) prefix: &'a str,
    /// `None` on a quorum, which has no queue.
    pub(crate) queue: Option<Queue<'a>>,
    /// Where release channels start: each freed key is announced there (for waiters that
    /// do not queue), or nothing when empty.
    pub(crate) announce: &'a str,
    /// Entries of waiters of this locker to put in the queue first (see `wait::Pending`).
    pub(crate) joins: &'a [&'a str],
}

/// One hold to refresh (a refresh batch is a slice of them): its kind, keys, value and
/// the TTL to set.
pub(crate) struct Refresh<'a> {
    pub(crate) kind: Kind,
    /// A waiter's queue entry on that many keys (its `keys` are then the entry's, see
    /// `fence::entry_keys`, and its value the entry), not a hold.
    pub(crate) entry_of: Option<usize>,
    pub(crate) keys: &'a [String],
    pub(crate) value: &'a str,
    pub(crate) ttl_ms: u64,
    /// Held only once this many replicas acknowledged the refresh.
    pub(crate) replicas: Option<Replicas>,
}
