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
    /// For a hand-over: the releasing guard's value, which every key must still hold and
    /// which this one replaces.
    pub(crate) over: Option<&'a str>,
    /// For a lock that waits when the keys are held: the value its intent is recorded by
    /// on keys that readers share (see `lua/acquire.lua`). The waiter's own, the same for
    /// every attempt, so that one withdrawal takes it back.
    pub(crate) intent: Option<&'a str>,
    /// Where release channels start: a take-back announces the keys it frees.
    pub(crate) channels: &'a str,
    /// Held only once this many replicas acknowledged it (see [`Replicas`]).
    pub(crate) replicas: Option<Replicas>,
}

impl Attempt<'_> {
    /// Whether keys found holding this attempt's value (taken `fresh` by it, or not) are
    /// this attempt's to take back: a random token's always (a request sent again after a
    /// timeout finds them taken already), a fixed token's only when fresh (the same owner
    /// may have held them before).
    pub(crate) fn owns(&self, fresh: bool) -> bool {
        fresh || !self.fixed_token
    }
}

/// One hold to refresh (a refresh batch is a slice of them): its kind, keys, value and
/// the TTL to set.
pub(crate) struct Refresh<'a> {
    pub(crate) kind: Kind,
    pub(crate) keys: &'a [String],
    pub(crate) value: &'a str,
    pub(crate) ttl_ms: u64,
    /// Held only once this many replicas acknowledged the refresh.
    pub(crate) replicas: Option<Replicas>,
}
