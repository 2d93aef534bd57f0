//! One node of a quorum and how it has been doing: a node that failed (no reply in time,
//! or an error reply) rests for a while, 50 ms doubling up to 1 s while it keeps failing,
//! then is on probation until it answers again.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ErrorKind, RedisError};

use crate::Error;
use crate::backend::pool::Pool;

pub(super) struct Node {
    pub(super) pool: Pool,
    health: Mutex<Health>,
}

/// How a node has been doing.
struct Health {
    /// Left out until then after a failure; `Some` (even once passed) until it answers.
    rest_until: Option<Instant>,
    next_rest: Duration,
    /// How long its last reply took, from the start of its request.
    reply_time: Option<Duration>,
    /// Why it last failed, until it answers: what a request that leaves it out reports.
    last_error: Option<RedisError>,
}

const FIRST_REST: Duration = Duration::from_millis(50);
const LONGEST_REST: Duration = Duration::from_secs(1);

/// The error of a node that was not asked, when it has no failure of its own to tell.
pub(super) fn not_asked() -> Error {
    Error::Redis(RedisError::from((
        ErrorKind::Io,
        "node not asked: left out for a while after a failure, or no connection ready",
    )))
}

/// Whether a node refused the request: an error reply (NOPERM, READONLY, OOM, MISCONF,
/// LOADING...), as opposed to no reply (a timeout, a closed connection) or a bad one.
/// The server answered, but cannot do what it is asked: the node counts as failing.
pub(super) fn refused(e: &RedisError) -> bool {
    // Only a server's error reply has a code (OOM, MISCONF and other codes unknown to
    // redis-rs have `ErrorKind::Extension`, not `ErrorKind::Server`).
    e.code().is_some()
}

impl Node {
    pub(super) fn new(pool: Pool) -> Node {
        Node {
            pool,
            health: Mutex::new(Health {
                rest_until: None,
                next_rest: FIRST_REST,
                reply_time: None,
                last_error: None,
            }),
        }
    }

    /// The error of a request that left the node out: why it last failed, if it has not
    /// answered since.
    pub(super) fn not_asked(&self) -> Error {
        match &self.health.lock().last_error {
            Some(e) => Error::Redis(e.clone()),
            None => not_asked(),
        }
    }

    /// Whether the node is resting at `now` (left out after a failure), and whether it is
    /// on probation (back from a rest, or resting, and not yet shown to answer again).
    pub(super) fn standing(&self, now: Instant) -> (bool, bool) {
        let rest_until = self.health.lock().rest_until;
        (
            rest_until.is_some_and(|until| now < until),
            rest_until.is_some(),
        )
    }

    /// How long its last reply took, from the start of its request.
    pub(super) fn reply_time(&self) -> Option<Duration> {
        self.health.lock().reply_time
    }

    /// Rests the node after `error`, longer each time in a row.
    pub(super) fn failed(&self, error: &RedisError) {
        let mut health = self.health.lock();
        health.rest_until = Some(Instant::now() + health.next_rest);
        health.next_rest = (health.next_rest * 2).min(LONGEST_REST);
        health.last_error = Some(error.clone());
    }

    pub(super) fn answered(&self, took: Duration) {
        let mut health = self.health.lock();
        health.rest_until = None;
        health.next_rest = FIRST_REST;
        health.reply_time = Some(took);
        health.last_error = None;
    }
}
