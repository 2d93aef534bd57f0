//! The vote on one acquisition attempt: what the nodes answered ([`Tally`], from [`tally`]),
//! and what that makes of the attempt ([`decide`]).

use redis::RedisError;

use super::node::refused;
use crate::backend::outcome::Acquired;
use crate::{Error, Result};

/// What the nodes answered to one acquisition attempt.
#[derive(Debug, Default)]
pub(super) struct Tally {
    /// Nodes that took every key for us.
    pub(super) taken: usize,
    /// Nodes where another owner holds a key.
    pub(super) elsewhere: usize,
    /// A node's report of a key of another Redis type.
    pub(super) wrong_type: Option<Acquired>,
    /// The first refusal (an error reply: NOPERM, READONLY, OOM...), of a node asked or
    /// of one left out since it gave it.
    pub(super) refused: Option<RedisError>,
}

/// What the nodes' answers to an attempt add up to (`found`: one per node, in node order),
/// and which nodes took the keys fresh (theirs to take back should the attempt be lost).
pub(super) fn tally(found: Vec<Result<Acquired>>) -> (Tally, Vec<bool>) {
    let mut tally = Tally::default();
    let mut taken = vec![false; found.len()];
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
    (tally, taken)
}

/// The outcome of an attempt: held when a majority took it in time.
pub(super) fn decide(tally: Tally, majority: usize, in_time: bool) -> Result<Acquired> {
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

#[cfg(test)]
mod tests {
    use redis::Value;

    use super::*;
    use crate::backend::quorum::count::undecided;

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
