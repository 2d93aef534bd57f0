//! Redlock: a lock is held when a majority of independent Redis masters hold it.
//!
//! Every request goes to all nodes at once: sent to each, then each reply read, so a
//! request costs about one round trip whatever the number of nodes, and no thread is
//! started per request. One deadline (the node timeout) bounds checkout and replies on
//! every node together. A node that failed is left out for a while (50 ms, doubling up to
//! 1 s while it keeps failing), then tried again on probation (see [`Quorum::fan_out`]),
//! so that a dead or frozen node does not cost every request a timeout.

use std::time::{Duration, Instant};

use parking_lot::Mutex;
use redis::{ErrorKind, RedisError, Value};

use crate::pool::{Conn, Pool};
use crate::scripts::{self, Acquired, Attempt, Call, Refresh};
use crate::{Error, Result};

pub(crate) struct Quorum {
    nodes: Vec<Node>,
    /// The longest one request to every node may take: checkout, send and reply.
    timeout: Duration,
}

struct Node {
    pool: Pool,
    rest: Mutex<Rest>,
}

/// Left out after failures: until when, and for how long next time.
struct Rest {
    until: Option<Instant>,
    next: Duration,
}

const FIRST_REST: Duration = Duration::from_millis(50);
const LONGEST_REST: Duration = Duration::from_secs(1);

/// How much sooner than the TTL a lock counts as lost, for the clocks of the servers
/// running a little faster than ours: 1% of the TTL and 2 ms, as Redlock prescribes.
pub(crate) fn drift_ms(ttl_ms: u64) -> u64 {
    ttl_ms / 100 + 2
}

impl Quorum {
    pub(crate) fn new(pools: Vec<Pool>, timeout: Duration) -> Quorum {
        let nodes = pools
            .into_iter()
            .map(|pool| Node {
                pool,
                rest: Mutex::new(Rest {
                    until: None,
                    next: FIRST_REST,
                }),
            })
            .collect();
        Quorum { nodes, timeout }
    }

    /// How many nodes make a majority.
    pub(crate) fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Every node's pool, in the order given (the subscriber listens on one of them).
    pub(crate) fn pools(&self) -> Vec<Pool> {
        self.nodes.iter().map(|node| node.pool.clone()).collect()
    }

    /// `Ok` when a majority of the nodes answer a PING; else the first failure.
    pub(crate) fn ping(&self) -> Result<()> {
        let ping = Call::command(redis::cmd("PING"));
        let (_, failure) = self.answers(&ping, Ok);
        failure.map_or(Ok(()), Err)
    }

    /// Takes the lock on every node that can; held when a majority took it with time to
    /// spare (what is left of the TTL after the attempt and the clock drift allowance).
    /// Otherwise whatever was taken is taken back (without waking anyone).
    ///
    /// # Errors
    /// [`Error::NotObtained`] when fewer than a majority of the nodes answered: waiting
    /// would not help until they are back.
    pub(crate) fn acquire(&self, attempt: &Attempt<'_>) -> Result<Acquired> {
        let started = Instant::now();
        let (outcomes, failure) = self.answers(&scripts::acquire_call(attempt), |reply| {
            Ok(scripts::parse_acquired(reply)?)
        });
        let taken = outcomes
            .iter()
            .filter(|outcome| matches!(outcome, Acquired::Yes { .. }))
            .count();
        let ttl = Duration::from_millis(attempt.ttl_ms);
        let margin = Duration::from_millis(drift_ms(attempt.ttl_ms));
        let in_time = started.elapsed() + margin < ttl;
        if taken >= self.majority() && in_time {
            return Ok(Acquired::Yes { fences: Vec::new() });
        }
        if taken > 0 {
            // Best effort: what is not taken back expires with its TTL.
            let _ = self.release(attempt.keys, attempt.value, "");
        }
        if let Some(wrong) = outcomes
            .into_iter()
            .find(|outcome| matches!(outcome, Acquired::WrongType { .. }))
        {
            return Ok(wrong);
        }
        match failure {
            Some(_) => Err(Error::NotObtained),
            None if taken > 0 => Ok(Acquired::Split),
            None => Ok(Acquired::HeldElsewhere),
        }
    }

    /// Refreshes a batch on every node; a lock stays held when a majority refreshed it.
    pub(crate) fn refresh(&self, locks: &[Refresh<'_>]) -> Result<Vec<bool>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let (answers, failure) = self.answers(&scripts::refresh_call(locks), |reply| {
            Ok(scripts::parse_refreshed(reply, locks.len())?)
        });
        if let Some(failure) = failure {
            return Err(failure);
        }
        let mut held = vec![0; locks.len()];
        for answer in &answers {
            for (count, refreshed) in held.iter_mut().zip(answer) {
                *count += usize::from(*refreshed);
            }
        }
        Ok(held.into_iter().map(|n| n >= self.majority()).collect())
    }

    /// Releases on every node; `true` when a majority still held the lock.
    pub(crate) fn release(&self, keys: &[String], value: &str, channels: &str) -> Result<bool> {
        let (answers, failure) = self
            .answers(&scripts::release_call(keys, value, channels), |reply| {
                Ok(scripts::parse_released(reply)?)
            });
        match failure {
            Some(failure) => Err(failure),
            None => Ok(answers.into_iter().filter(|&held| held).count() >= self.majority()),
        }
    }

    /// How long a majority of the nodes will still hold the lock: the TTL of the node at
    /// which fewer than a majority would remain. `None` when a majority does not hold it.
    pub(crate) fn ttl(&self, keys: &[String], value: &str) -> Result<Option<Duration>> {
        let (answers, failure) = self.answers(&scripts::ttl_call(keys, value), |reply| {
            Ok(scripts::parse_ttl(reply)?)
        });
        if let Some(failure) = failure {
            return Err(failure);
        }
        let mut ttls: Vec<Duration> = answers.into_iter().flatten().collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        Ok(ttls.get(self.majority() - 1).copied())
    }

    /// The parsed answers of the nodes that gave one, and, when fewer than a majority did,
    /// one of the failures.
    fn answers<T>(
        &self,
        call: &Call,
        parse: impl Fn(Value) -> Result<T>,
    ) -> (Vec<T>, Option<Error>) {
        let mut answers = Vec::with_capacity(self.nodes.len());
        let mut failure = None;
        for reply in self.fan_out(call) {
            match reply.and_then(&parse) {
                Ok(answer) => answers.push(answer),
                Err(e) => failure = Some(e),
            }
        }
        if answers.len() >= self.majority() {
            failure = None;
        }
        (answers, failure)
    }

    /// Sends `call` to every node not resting, then reads each reply: one answer per node,
    /// in node order, each an error when the node was left out, failed, or did not answer
    /// in time.
    ///
    /// A node back from a rest is on probation: its reply is read last, and waited for
    /// only about as long as the others took (twice that, and 1 ms), unless the others
    /// alone cannot make a majority. So a frozen node costs a request a millisecond or so
    /// each time its rest ends, not the node timeout.
    fn fan_out(&self, call: &Call) -> Vec<Result<Value>> {
        let started = Instant::now();
        let deadline = started + self.timeout;
        let packed = call.packed();
        let probation: Vec<bool> = self.nodes.iter().map(Node::on_probation).collect();
        let mut sent: Vec<Option<Result<Conn>>> = self
            .nodes
            .iter()
            .zip(&probation)
            .map(|(node, &probation)| Some(node.send(&packed, deadline, probation)))
            .collect();
        let mut replies: Vec<Option<Result<Value>>> = self.nodes.iter().map(|_| None).collect();
        let mut read = |i: usize, by: Instant| {
            if let Some(con) = sent[i].take() {
                let node = &self.nodes[i];
                replies[i] =
                    Some(con.and_then(|mut con| node.receive(&mut con, call, by, self.timeout)));
            }
        };
        let standing: Vec<usize> = (0..self.nodes.len()).filter(|&i| !probation[i]).collect();
        for &i in &standing {
            read(i, deadline);
        }
        let probe_by = if standing.len() >= self.majority() {
            (started + started.elapsed() * 2 + Duration::from_millis(1)).min(deadline)
        } else {
            deadline
        };
        for i in (0..self.nodes.len()).filter(|&i| probation[i]) {
            read(i, probe_by);
        }
        replies
            .into_iter()
            // Every node was read above: one pass for those in good standing, one for
            // those on probation.
            .map(|reply| reply.unwrap_or_else(|| Err(left_out())))
            .collect()
    }
}

/// The error of a node that was not asked.
fn left_out() -> Error {
    Error::Redis(RedisError::from((
        ErrorKind::Io,
        "node left out for a while after a failure",
    )))
}

impl Node {
    /// Sends `packed` on a pooled connection. On probation, only a connection the pool
    /// has ready will do: making one to a frozen server would wait for the whole timeout
    /// (the pool keeps trying in the background, and has one once the server answers).
    fn send(&self, packed: &[u8], deadline: Instant, probation: bool) -> Result<Conn> {
        if self
            .rest
            .lock()
            .until
            .is_some_and(|until| Instant::now() < until)
        {
            return Err(left_out());
        }
        let con = if probation {
            self.pool.try_get().ok_or_else(left_out)
        } else {
            self.pool.get_within(left(deadline))
        };
        let mut con = con.inspect_err(|_| self.failed())?;
        // Bounded by the connection's own write timeout (the node timeout).
        con.run(|con| con.send_packed_command(packed))
            .inspect_err(|_| self.failed())?;
        Ok(con)
    }

    /// Reads the reply to what [`send`](Self::send) sent. Connections keep the node timeout
    /// as their read timeout; only when less than half of it is left before `deadline`
    /// (an earlier node was slow) is the read bounded more tightly, to what is left, and
    /// then the timeout put back: so the usual reply costs no extra system call, and the
    /// whole fan-out ends within one and a half node timeouts.
    fn receive(
        &self,
        con: &mut Conn,
        call: &Call,
        deadline: Instant,
        timeout: Duration,
    ) -> Result<Value> {
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
            // Rare (after a restart or SCRIPT FLUSH): one more round trip to this node.
            Err(e) if scripts::is_noscript(&e) => con.run(|con| call.reload_and_run(con)),
            reply => reply,
        };
        match &reply {
            Err(e) if !matches!(e.kind(), ErrorKind::Server(_)) => self.failed(),
            _ => self.answered(),
        }
        Ok(reply?)
    }

    /// Back from a rest, and not yet shown to answer again.
    fn on_probation(&self) -> bool {
        self.rest.lock().until.is_some()
    }

    fn failed(&self) {
        let mut rest = self.rest.lock();
        rest.until = Some(Instant::now() + rest.next);
        rest.next = (rest.next * 2).min(LONGEST_REST);
    }

    fn answered(&self) {
        let mut rest = self.rest.lock();
        if rest.until.is_some() {
            rest.until = None;
            rest.next = FIRST_REST;
        }
    }
}

/// What is left until `deadline`, at least 1 ms (a zero socket timeout means none).
fn left(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}
