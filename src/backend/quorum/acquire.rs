//! Taking a lock on a quorum: one fan-out of the acquire (or of a plain `SET NX PX` first),
//! the vote, and the take-back of what a lost attempt took.

use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError, Value};

use super::fan_out::{Ask, Replies};
use super::group::Quorum;
use super::vote::{decide, tally};
use crate::backend::call::Call;
use crate::backend::outcome::Acquired;
use crate::backend::pool::Conn;
use crate::backend::request::{Attempt, Release};
use crate::backend::scripts;
use crate::hold::drift_ms;
use crate::{Error, Result};

impl Quorum {
    /// Takes the lock on every node that can; held when a majority took it with time to
    /// spare (what is left of the TTL after the attempt and the clock drift allowance).
    /// Otherwise whatever was taken is taken back, without waking anyone, and a node whose
    /// reply did not come in time is sent the take-back on the same connection, so that
    /// it runs after the acquire should the node wake up. A lock that was won keeps the
    /// late nodes: what they take when they wake is the lock's.
    ///
    /// With `set_first`, a single key without fencing is first taken with a plain
    /// `SET NX PX` (a fraction of a script call's cost to each server); only the nodes
    /// where it finds the key set are then asked the script (to re-obtain for the same
    /// owner, or to name a key of another type), and only when the plain `SET`s did not
    /// win: so that second round trip comes within the same longest attempt.
    ///
    /// When fewer than a majority of the nodes answered: the first refusal among them (an
    /// error reply, or the last one of a node left out since) as [`Error::Redis`], else
    /// [`Acquired::NoQuorum`] (none could be reached in time).
    pub(crate) fn acquire(&self, attempt: &Attempt<'_>, set_first: bool) -> Result<Acquired> {
        let started = Instant::now();
        let script = || scripts::acquire_call(attempt);
        let plain = set_first.then(|| plain_set(attempt)).flatten();
        let Replies {
            values,
            mut unanswered,
        } = match &plain {
            Some(set) => self.fan_out(set, Ask::Awake, started + self.timeout),
            None => self.fan_out(&script(), Ask::Awake, started + self.timeout),
        };
        let mut found: Vec<Result<Acquired>> = match plain {
            Some(_) => values.into_iter().map(|reply| parse_set(reply?)).collect(),
            None => values
                .into_iter()
                .map(|reply| Ok(scripts::parse_acquired(reply?)?))
                .collect(),
        };
        // `HeldElsewhere` from a plain `SET`: the key is set, by whoever.
        let set_before: Vec<bool> = found
            .iter()
            .map(|found| plain.is_some() && matches!(found, Ok(Acquired::HeldElsewhere)))
            .collect();
        let won = found
            .iter()
            .filter(|found| matches!(found, Ok(Acquired::Yes { .. })))
            .count()
            >= self.majority();
        if !won && set_before.contains(&true) {
            let deadline = started + self.longest_attempt();
            let again = self.fan_out(&script(), Ask::Only(&set_before), deadline);
            for (i, reply) in again.values.into_iter().enumerate() {
                if set_before[i] {
                    found[i] = reply.and_then(|reply| Ok(scripts::parse_acquired(reply)?));
                }
            }
            unanswered.extend(again.unanswered);
        }
        let (tally, taken) = tally(found);
        let ttl = Duration::from_millis(attempt.ttl_ms);
        let margin = Duration::from_millis(drift_ms(attempt.ttl_ms));
        let in_time = started.elapsed() + margin < ttl;
        let outcome = decide(tally, self.majority(), in_time);
        if matches!(outcome, Ok(Acquired::Yes { .. })) {
            // The late nodes' connections are thrown away, their requests left to run.
            return outcome;
        }
        self.take_back(attempt, unanswered, &taken);
        outcome
    }

    /// Takes back what a lost attempt took: sent after the acquire on each `unanswered`
    /// connection, and to the nodes that took the keys fresh (`taken`).
    fn take_back(&self, attempt: &Attempt<'_>, unanswered: Vec<Conn>, taken: &[bool]) {
        // Announcing nothing: nobody waits for this attempt's keys.
        let release = Release {
            announce: "",
            ..attempt.take_back()
        };
        let take_back = || scripts::release_call(&release, None);
        // Not with a fixed token, whose keys may be the same owner's from before.
        if !unanswered.is_empty() && !attempt.fixed_token {
            // As EVAL: the node may not know the release script.
            let undo = take_back().eval_packed();
            for mut con in unanswered {
                // The connection is thrown away after this; the server runs what it has
                // received, in order, should it wake up.
                let _ = con.run(|con| con.send_packed_command(&undo));
            }
        }
        if taken.contains(&true) {
            // Best effort: what is not taken back expires with its TTL.
            let _ = self.fan_out(
                &take_back(),
                Ask::Only(taken),
                Instant::now() + self.timeout,
            );
        }
    }
}

/// A plain `SET NX PX` for an attempt on one key without fencing.
fn plain_set(attempt: &Attempt<'_>) -> Option<Call> {
    let [key] = attempt.keys else {
        return None;
    };
    if attempt.fencing {
        return None;
    }
    let mut set = redis::cmd("SET");
    set.arg(key)
        .arg(attempt.value)
        .arg("NX")
        .arg("PX")
        .arg(attempt.ttl_ms);
    Some(Call::command(set))
}

/// A plain `SET NX`'s answer: taken, or (`HeldElsewhere`) the key was set already.
fn parse_set(reply: Value) -> Result<Acquired> {
    match reply {
        Value::Okay => Ok(Acquired::Yes {
            fences: Vec::new(),
            fresh: true,
        }),
        Value::Nil => Ok(Acquired::HeldElsewhere),
        _ => Err(Error::Redis(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "SET NX answered neither OK nor nil",
        )))),
    }
}
