//! One request to every node of a quorum at once: written to each, then each reply read,
//! under one deadline, without a thread per request.

use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError, Value};

use super::group::Quorum;
use super::node::{Node, not_asked, refused};
use crate::backend::call::{Call, is_noscript};
use crate::backend::pool::Conn;
use crate::{Error, Result};

/// Which nodes a fan-out asks.
#[derive(Clone, Copy)]
pub(super) enum Ask<'a> {
    /// The nodes not resting; every node while fewer than a majority are awake.
    Awake,
    /// Every node, resting or not (a resting one on probation).
    Every,
    /// The nodes marked.
    Only(&'a [bool]),
}

/// What a fan-out got back.
pub(super) struct Replies {
    /// One per node, in node order: an error when the node was not asked, failed, or did
    /// not answer in time.
    pub(super) values: Vec<Result<Value>>,
    /// The connections on which a reply did not come (in time, or at all), the request
    /// written: something written after it runs after the request should the node wake
    /// up. Thrown away when dropped.
    pub(super) unanswered: Vec<Conn>,
}

/// How to read one node's reply in a fan-out.
#[derive(Clone, Copy)]
struct Read<'a> {
    call: &'a Call,
    /// When the fan-out started (the node's reply time counts from then).
    started: Instant,
    /// The latest the reply is waited for.
    by: Instant,
    /// The request went out with less than half the time left: a timeout is then not
    /// the node's fault.
    late: bool,
}

impl Quorum {
    /// Sends `call` to the nodes `ask` names, then reads each reply by `deadline` (see
    /// [`Replies`]).
    ///
    /// Requests are written node after node, each as soon as its connection is there
    /// (waited for until the deadline): a thread never holds a node's connection while
    /// waiting for an earlier node's, so threads sharing busy pools cannot hold each other
    /// up in a circle. While fewer than a majority of nodes are awake, resting ones are
    /// asked too (see [`Ask::Awake`]).
    ///
    /// A node back from a rest is on probation: it only gets a connection its pool has
    /// ready, its reply is read last and waited for only about as long as the others
    /// took, or as it took itself last time it answered (twice that, and 1 ms), unless
    /// the others alone cannot make a majority. So a frozen node costs a request a
    /// millisecond or so each time its rest ends, not the timeout.
    pub(super) fn fan_out(&self, call: &Call, ask: Ask<'_>, deadline: Instant) -> Replies {
        let started = Instant::now();
        let count = self.nodes.len();
        let asked = |i: usize| match ask {
            Ask::Only(only) => only.get(i) == Some(&true),
            Ask::Awake | Ask::Every => true,
        };
        // Per node: resting (left out until its rest ends), on probation (back from a
        // rest, not yet answered), from one look at its health.
        let (resting, probation): (Vec<bool>, Vec<bool>) =
            self.nodes.iter().map(|node| node.standing(started)).unzip();
        let awake = resting.iter().filter(|&&resting| !resting).count();
        let leave_resting = matches!(ask, Ask::Awake) && awake >= self.majority();
        let packed = call.packed();
        // Each request written as soon as its connection is there.
        let mut sent: Vec<Option<Result<(Conn, bool)>>> = (0..count)
            .map(|i| match asked(i) {
                false => None,
                true if resting[i] && leave_resting => Some(Err(self.nodes[i].not_asked())),
                true => Some(self.nodes[i].send(&packed, deadline, probation[i], self.timeout)),
            })
            .collect();
        let mut values: Vec<Result<Value>> = (0..count).map(|_| Err(not_asked())).collect();
        let mut unanswered = Vec::new();
        let mut read = |i: usize, by: Instant| {
            if let Some(con) = sent[i].take() {
                let node = &self.nodes[i];
                values[i] = con.and_then(|(mut con, late)| {
                    let read = Read {
                        call,
                        started,
                        by,
                        late,
                    };
                    let reply = node.receive(&mut con, &read, self.timeout);
                    if matches!(&reply, Err(Error::Redis(e)) if !refused(e)) {
                        unanswered.push(con);
                    }
                    reply
                });
            }
        };
        let standing: Vec<usize> = (0..count).filter(|&i| !probation[i]).collect();
        for &i in &standing {
            read(i, deadline);
        }
        let others_took = started.elapsed();
        for i in (0..count).filter(|&i| probation[i]) {
            let by = if standing.len() >= self.majority() {
                let own = self.nodes[i].reply_time().unwrap_or(self.timeout);
                (started + 2 * others_took.max(own) + Duration::from_millis(1)).min(deadline)
            } else {
                deadline
            };
            read(i, by);
        }
        Replies { values, unanswered }
    }
}

impl Node {
    /// Writes `packed` on a connection (see [`checkout`](Self::checkout)); with it, whether
    /// it went out with less than half the `timeout` left before `deadline` (a busy pool
    /// before it), so that a late reply is not the node's fault.
    fn send(
        &self,
        packed: &[u8],
        deadline: Instant,
        probation: bool,
        timeout: Duration,
    ) -> Result<(Conn, bool)> {
        let mut con = self.checkout(deadline, probation)?;
        self.write(&mut con, packed)?;
        Ok((con, left(deadline) < timeout / 2))
    }

    /// A connection: on probation only one the pool has ready (making one to a frozen
    /// server would take the whole wait; the pool keeps trying in the background, and has
    /// one ready once the server answers), else waiting until `deadline`.
    fn checkout(&self, deadline: Instant, probation: bool) -> Result<Conn> {
        if probation {
            return self.pool.try_get().ok_or_else(|| self.not_asked());
        }
        self.pool.get_within(left(deadline)).inspect_err(|e| {
            // A busy pool is not the node's fault; a pool left with no connection is.
            if !self.pool.has_connections() {
                self.failed(&match e {
                    Error::Redis(e) => e.clone(),
                    _ => RedisError::from((
                        ErrorKind::Io,
                        "no connection to the node",
                        e.to_string(),
                    )),
                });
            }
        })
    }

    /// Writes a request; bounded by the connection's write timeout (the node timeout).
    fn write(&self, con: &mut Conn, packed: &[u8]) -> Result<()> {
        con.run(|con| con.send_packed_command(packed))
            .inspect_err(|e| self.failed(e))?;
        Ok(())
    }

    /// Reads the reply to what was sent, by `read.by`. Connections keep the node timeout
    /// as their read timeout; only when less than half of it is left (an earlier node was
    /// slow, or this one is on probation) is the read bounded more tightly, and the
    /// timeout then put back: so the usual reply costs no extra system call, and a fan-out
    /// ends within one and a half node timeouts (plus, on a node that answers NOSCRIPT
    /// after a restart, one more round trip to send the script).
    fn receive(&self, con: &mut Conn, read: &Read<'_>, timeout: Duration) -> Result<Value> {
        let Read {
            call,
            started,
            by: deadline,
            late,
        } = *read;
        let reply = con.run(|con| {
            let left = left(deadline);
            let tighter = left < timeout / 2;
            if tighter {
                con.set_read_timeout(Some(left))?;
            }
            let reply = con.recv_response()?.extract_error();
            if tighter {
                con.set_read_timeout(Some(timeout))?;
            }
            reply
        });
        let reply = match reply {
            Err(e) if is_noscript(&e) => con.run(|con| call.reload_and_run(con)),
            reply => reply,
        };
        match &reply {
            Ok(_) => self.answered(started.elapsed()),
            // A refusal too: the node answered, but cannot do what it is asked.
            Err(e) if !(late && e.is_timeout()) => self.failed(e),
            Err(_) => {}
        }
        Ok(reply?)
    }
}

/// What is left until `deadline`, at least 1 ms (a zero socket timeout means none).
fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}
