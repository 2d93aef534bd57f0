//! Redlock: a lock is held when a majority of independent Redis masters hold it.
//!
//! Every request goes to all nodes at once: sent to each, then each reply read, so a
//! request costs about one round trip whatever the number of nodes, and no thread is
//! started per request. One deadline (the node timeout) bounds the replies of all nodes
//! together. A node that failed (no reply in time, or an error reply) is left out for a
//! while (50 ms, doubling up to 1 s while it keeps failing), then tried again on probation
//! (see `fan_out.rs`), so that a dead or frozen node does not cost every request a
//! timeout. A release is still sent to every node.
//!
//! Here, the vote and the four operations; `fan_out.rs`, how one request reaches every
//! node; `node.rs`, each node's health (rests and probation). (Over 400 lines: a third of
//! it is the vote's unit tests, which stay beside it.)

mod fan_out;
mod group;
mod node;

use std::time::{Duration, Instant};

use redis::{ErrorKind, RedisError, Value};

use self::fan_out::{Ask, Replies};
pub(crate) use self::group::Quorum;
use self::node::refused;
use super::call::Call;
use super::introspect::{self, HeldBy, KeyHolders};
use super::outcome::{Acquired, Refreshed};
use super::request::{Attempt, Refresh};
use super::scripts;
use crate::hold::{Kind, drift_ms};
use crate::{Error, Result};

/// What the nodes answered to one acquisition attempt.
#[derive(Debug, Default)]
struct Tally {
    /// Nodes that took every key for us.
    taken: usize,
    /// Nodes where another owner holds a key.
    elsewhere: usize,
    /// A node's report of a key of another Redis type.
    wrong_type: Option<Acquired>,
    /// The first refusal (an error reply: NOPERM, READONLY, OOM...), of a node asked or
    /// of one left out since it gave it.
    refused: Option<RedisError>,
}

/// The outcome of an attempt: held when a majority took it in time.
fn decide(tally: Tally, majority: usize, in_time: bool) -> Result<Acquired> {
    let Tally {
        taken,
        elsewhere,
        wrong_type,
        refused,
    } = tally;
    if taken >= majority && in_time {
        // `fresh` is not used after a quorum vote: the take-back looks at each node.
        return Ok(Acquired::Yes {
            fences: Vec::new(),
            fresh: true,
        });
    }
    if let Some(wrong) = wrong_type {
        return Ok(wrong);
    }
    if taken + elsewhere < majority {
        // Too few nodes answered. A node that refused says why (waiting will not help);
        // else waiting would not help until they are back.
        return match refused {
            Some(refusal) => Err(Error::Redis(refusal)),
            None => Ok(Acquired::NoQuorum),
        };
    }
    Ok(match taken {
        0 => Acquired::HeldElsewhere,
        _ => Acquired::Partial,
    })
}

impl Quorum {
    /// `Ok` when a majority of the nodes answer a PING; else one of the failures.
    pub(crate) fn ping(&self) -> Result<()> {
        let ping = Call::command(redis::cmd("PING"));
        self.answers(&ping, Ask::Awake, Ok).map(drop)
    }

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
        let take_back = || scripts::release_call(attempt.kind, attempt.keys, attempt.value, "");
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
        let mut tally = Tally::default();
        let mut taken = vec![false; self.nodes.len()];
        for (i, found) in found.into_iter().enumerate() {
            match found {
                Ok(Acquired::Yes { fresh, .. }) => {
                    tally.taken += 1;
                    // A re-obtain is the owner's lock from before: never taken back.
                    taken[i] = fresh;
                }
                Ok(wrong @ Acquired::WrongType { .. }) => {
                    tally.elsewhere += 1;
                    tally.wrong_type = Some(wrong);
                }
                Ok(_) => tally.elsewhere += 1,
                Err(Error::Redis(e)) if refused(&e) => {
                    tally.refused.get_or_insert(e);
                }
                Err(_) => {}
            }
        }
        let ttl = Duration::from_millis(attempt.ttl_ms);
        let margin = Duration::from_millis(drift_ms(attempt.ttl_ms));
        let in_time = started.elapsed() + margin < ttl;
        let outcome = decide(tally, self.majority(), in_time);
        if matches!(outcome, Ok(Acquired::Yes { .. })) {
            // The late nodes' connections are thrown away, their requests left to run.
            return outcome;
        }
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
                Ask::Only(&taken),
                Instant::now() + self.timeout,
            );
        }
        outcome
    }

    /// Refreshes a batch on every node: a lock is held when a majority refreshed it, lost
    /// when too few did even if every node that did not answer had, and unknown between.
    pub(crate) fn refresh(&self, locks: &[Refresh<'_>]) -> Result<Vec<Refreshed>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let sent_at = Instant::now();
        let (answers, silent) =
            self.answers(&scripts::refresh_call(locks), Ask::Awake, |reply| {
                Ok(scripts::parse_refreshed(reply, locks.len())?)
            })?;
        let mut held = vec![0; locks.len()];
        for answer in &answers {
            for (count, refreshed) in held.iter_mut().zip(answer) {
                *count += usize::from(*refreshed);
            }
        }
        Ok(held
            .into_iter()
            .map(|held| match self.count(held, silent) {
                Some(true) => Refreshed::Held { sent_at },
                Some(false) => Refreshed::Lost,
                None => Refreshed::Unknown,
            })
            .collect())
    }

    /// Releases on every node, resting ones too (on probation: see
    /// [`fan_out`](Self::fan_out)), as a node back from a short failure may hold the lock;
    /// `true` when a majority still held it, `false` when too few did even counting the
    /// nodes that did not answer.
    pub(crate) fn release(
        &self,
        kind: Kind,
        keys: &[String],
        value: &str,
        channels: &str,
    ) -> Result<bool> {
        let release = scripts::release_call(kind, keys, value, channels);
        let (answers, silent) = self.answers(&release, Ask::Every, |reply| {
            Ok(scripts::parse_released(reply)?.held)
        })?;
        let held = answers.into_iter().filter(|&held| held).count();
        self.count(held, silent)
            .ok_or_else(|| Error::Redis(undecided()))
    }

    /// How long a majority of the nodes will still hold the lock: the TTL of the node at
    /// which fewer than a majority would remain. `None` when too few hold it, even counting
    /// the nodes that did not answer.
    pub(crate) fn ttl(&self, kind: Kind, keys: &[String], value: &str) -> Result<Option<Duration>> {
        let (answers, silent) =
            self.answers(&scripts::ttl_call(kind, keys, value), Ask::Awake, |reply| {
                Ok(scripts::parse_ttl(reply)?)
            })?;
        let mut ttls: Vec<Duration> = answers.into_iter().flatten().collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        match self.count(ttls.len(), silent) {
            Some(true) => Ok(ttls.get(self.majority() - 1).copied()),
            Some(false) => Ok(None),
            None => Err(Error::Redis(undecided())),
        }
    }

    /// Who holds a key, as a majority of the nodes see it: each value found on a majority
    /// of them, with the TTL a majority will still hold it for; the counter is `None` (a
    /// quorum gives no fencing tokens). An error when the nodes that did not answer could
    /// make a value held or not (as for [`ttl`](Self::ttl)). (Locks only: a quorum has no
    /// read locks or semaphores, so no counting.)
    pub(crate) fn key_holders(&self, call: &Call) -> Result<KeyHolders> {
        let (answers, silent) = self.answers(call, Ask::Awake, |reply| {
            Ok(introspect::parse_key_holders(reply, false)?)
        })?;
        let mut seen: Vec<(String, Vec<Option<Duration>>)> = Vec::new();
        let mut held_by = HeldBy::Nobody;
        for answer in answers {
            match answer {
                KeyHolders::Held {
                    held_by: on_node,
                    holds,
                    ..
                } => {
                    if on_node != HeldBy::Nobody {
                        held_by = on_node;
                    }
                    for (value, ttl) in holds {
                        match seen.iter_mut().find(|(seen, _)| *seen == value) {
                            Some((_, ttls)) => ttls.push(ttl),
                            None => seen.push((value, vec![ttl])),
                        }
                    }
                }
                wrong @ KeyHolders::WrongType { .. } => return Ok(wrong),
            }
        }
        let majority = self.majority();
        if seen
            .iter()
            .any(|(_, ttls)| self.count(ttls.len(), silent).is_none())
        {
            return Err(Error::Redis(undecided()));
        }
        let holds = seen
            .into_iter()
            .filter(|(_, ttls)| ttls.len() >= majority)
            .map(|(value, mut ttls)| {
                // `None` (no TTL) sorts first: the longest.
                ttls.sort_unstable_by(|a, b| {
                    b.unwrap_or(Duration::MAX).cmp(&a.unwrap_or(Duration::MAX))
                });
                (value, ttls[majority - 1])
            })
            .collect::<Vec<_>>();
        Ok(KeyHolders::Held {
            held_by: if holds.is_empty() {
                HeldBy::Nobody
            } else {
                held_by
            },
            fence: None,
            count: holds.len(),
            holds,
        })
    }

    /// Whether `held` nodes make a majority: `Some(true)` when they do, `Some(false)` when
    /// they could not even with every one of the `silent` nodes, `None` in between.
    fn count(&self, held: usize, silent: usize) -> Option<bool> {
        if held >= self.majority() {
            Some(true)
        } else if held + silent < self.majority() {
            Some(false)
        } else {
            None
        }
    }

    /// The parsed answers of the nodes that gave one, and how many did not; an error when
    /// fewer than a majority answered: the first refusal (see [`refused`]) if any, as it
    /// says what to fix, else the first failure.
    fn answers<T>(
        &self,
        call: &Call,
        ask: Ask<'_>,
        parse: impl Fn(Value) -> Result<T>,
    ) -> Result<(Vec<T>, usize)> {
        let mut answers = Vec::with_capacity(self.nodes.len());
        let mut failure = None;
        for reply in self
            .fan_out(call, ask, Instant::now() + self.timeout)
            .values
        {
            match reply.and_then(&parse) {
                Ok(answer) => answers.push(answer),
                Err(e) => {
                    let refusal =
                        |e: &Option<Error>| matches!(e, Some(Error::Redis(e)) if refused(e));
                    let e = Some(e);
                    if failure.is_none() || (refusal(&e) && !refusal(&failure)) {
                        failure = e;
                    }
                }
            }
        }
        let silent = self.nodes.len() - answers.len();
        match failure {
            Some(failure) if answers.len() < self.majority() => Err(failure),
            _ => Ok((answers, silent)),
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

/// The error of a lock whose state the nodes that answered cannot settle.
pub(crate) fn undecided() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "too few nodes answered to tell whether a majority holds the lock",
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn outcome(taken: usize, elsewhere: usize, in_time: bool) -> String {
        let tally = Tally {
            taken,
            elsewhere,
            ..Tally::default()
        };
        format!("{:?}", decide(tally, 3, in_time))
    }

    #[test]
    fn a_majority_in_time_holds_the_lock() {
        assert_eq!(outcome(3, 2, true), "Ok(Yes { fences: [], fresh: true })");
        assert_eq!(
            outcome(3, 0, true),
            "Ok(Yes { fences: [], fresh: true })",
            "two nodes silent"
        );
    }

    #[test]
    fn a_majority_out_of_time_is_not_held() {
        assert_eq!(outcome(5, 0, false), "Ok(Partial)");
    }

    #[test]
    fn too_few_answers_is_not_obtained_at_once() {
        assert_eq!(outcome(2, 0, true), "Ok(NoQuorum)");
        assert_eq!(outcome(0, 2, true), "Ok(NoQuorum)");
    }

    #[test]
    fn some_nodes_free_is_partial_none_is_held_elsewhere() {
        assert_eq!(outcome(2, 3, true), "Ok(Partial)");
        assert_eq!(outcome(1, 4, true), "Ok(Partial)");
        assert_eq!(outcome(0, 5, true), "Ok(HeldElsewhere)");
    }

    #[test]
    fn a_key_of_another_type_is_reported_unless_a_majority_took_the_lock() {
        let wrong = || Tally {
            taken: 1,
            elsewhere: 3,
            wrong_type: Some(Acquired::WrongType {
                key: "k".into(),
                kind: "list".into(),
            }),
            refused: None,
        };
        assert!(format!("{:?}", decide(wrong(), 3, true)).contains("WrongType"));
        let held = Tally {
            taken: 3,
            ..wrong()
        };
        assert!(matches!(decide(held, 3, true), Ok(Acquired::Yes { .. })));
    }

    /// A server's error reply, as a fan-out gets it.
    fn reply_error(reply: &[u8]) -> RedisError {
        match redis::parse_redis_value(reply).and_then(Value::extract_error) {
            Err(e) => e,
            Ok(value) => panic!("not an error reply: {value:?}"),
        }
    }

    #[test]
    fn a_refusal_among_too_few_answers_is_the_error() {
        let noperm = || Some(reply_error(b"-NOPERM no permissions to run 'evalsha'\r\n"));
        let tally = Tally {
            taken: 2,
            refused: noperm(),
            ..Tally::default()
        };
        let outcome = decide(tally, 3, true);
        assert!(
            matches!(&outcome, Err(Error::Redis(e)) if e.code() == Some("NOPERM")),
            "{outcome:?}"
        );
        // Enough answers to vote: another owner, not the refusal, stands in the way.
        let tally = Tally {
            taken: 2,
            elsewhere: 1,
            refused: noperm(),
            ..Tally::default()
        };
        assert!(matches!(decide(tally, 3, true), Ok(Acquired::Partial)));
    }

    #[test]
    fn error_replies_are_refusals_and_silence_is_not() {
        for reply in [
            &b"-NOPERM x\r\n"[..],
            b"-READONLY x\r\n",
            b"-OOM x\r\n",
            b"-MISCONF x\r\n",
            b"-LOADING x\r\n",
            b"-ERR x\r\n",
        ] {
            assert!(
                refused(&reply_error(reply)),
                "{}",
                String::from_utf8_lossy(reply)
            );
        }
        let timeout = RedisError::from(std::io::Error::from(std::io::ErrorKind::TimedOut));
        assert!(!refused(&timeout));
        assert!(!refused(&undecided()));
    }
}
