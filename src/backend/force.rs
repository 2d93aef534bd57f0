//! Break-glass ([`Locker::force_release`](crate::Locker::force_release)): the lock, or a
//! read lock's readers, on some keys removed whoever holds them, and the keys given to the
//! waiters first in their queues as a release gives them. It is the release script
//! (`lua/queue/release.lua`) in its mode `f`: one queue logic for both.

use redis::{RedisResult, Value};

use super::call::Call;
use super::dispatch::Backend;
use super::fence::queue_keys;
use super::outcome::Released;
use super::request::Queue;
use super::scripts::{QUEUE_RELEASE, parse_released};
use super::slot::slot;
use crate::{Error, Result};

/// What a forced release found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Forced {
    /// `held` when a live hold was removed; the waiters of this locker given their holds.
    Done(Released),
    /// `key` holds something else (`what`: a Redis type, or `semaphore`): nothing changed.
    Refused { key: String, what: String },
}

/// The keys to force open: as Redis knows them, the caller's names for them (when they
/// differ), and what the script needs to serve and announce as a release does.
pub(crate) struct Force<'a> {
    pub(crate) keys: &'a [String],
    pub(crate) names: Option<&'a [String]>,
    pub(crate) prefix: &'a str,
    /// The locker's channel, and how long a queue entry lives (the queue is used only
    /// where [`Backend::queues`] says so).
    pub(crate) channel: &'a str,
    pub(crate) lifetime_ms: u64,
    /// Where release channels start (see [`Release::announce`](super::Release)).
    pub(crate) announce: &'a str,
}

impl Backend {
    /// Removes the lock (or every reader) on `force.keys` whoever holds it, serving the
    /// queue: whether a live hold was removed (on a quorum: from a majority of the nodes),
    /// and the waiters of this locker served. On a cluster the keys must share a slot.
    ///
    /// # Errors
    /// `WrongType` for a key of another Redis type, `InvalidInput` for a semaphore's key
    /// or keys across cluster slots (nothing changed); a failure to reach Redis.
    pub(crate) fn force_release(&self, force: &Force<'_>) -> Result<Released> {
        let keys = force.keys;
        let queue = self.queues(keys, force.prefix).then_some(Queue {
            channel: force.channel,
            entry: None,
            lifetime_ms: force.lifetime_ms,
        });
        let call = force_call(keys, force.prefix, queue, force.announce);
        let forced = match self {
            // Sent again only when the connection was found closed: a removal the first
            // one made would then be reported as nothing held.
            Backend::Single(pool) => pool.run(|con| parse_forced(call.run(con)?))?,
            Backend::Cluster(..) if keys.iter().any(|key| slot(key) != slot(&keys[0])) => {
                return Err(Error::InvalidInput(format!(
                    "force_release: keys {:?} are in different cluster hash slots: release \
                     them slot by slot (or key by key)",
                    force.names.unwrap_or(keys)
                )));
            }
            Backend::Cluster(cluster, _) => cluster.run(|con| parse_forced(call.run(con)?))?,
            Backend::Quorum(quorum) => quorum.force_release(&call)?,
        };
        match forced {
            Forced::Done(released) => Ok(released),
            Forced::Refused { key, what } => Err(refusal(force, &key, what)),
        }
    }
}

/// The error for `key` (a Redis key among `force.keys`) found holding `what`.
fn refusal(force: &Force<'_>, key: &str, what: String) -> Error {
    let name = match force.names {
        Some(names) => (force.keys.iter().position(|stored| stored == key))
            .and_then(|i| names.get(i))
            .map_or(key, String::as_str),
        None => key,
    };
    match what.as_str() {
        "semaphore" => Error::InvalidInput(format!(
            "force_release: {name:?} is a semaphore, whose permits it does not remove (all of \
             them gone would let in as many new holders beside those still running); nothing \
             was removed"
        )),
        _ => Error::WrongType {
            key: name.to_owned(),
            kind: what,
        },
    }
}

/// The release script in mode `f` on `keys` (with `queue`, their queues' keys too).
pub(crate) fn force_call(
    keys: &[String],
    prefix: &str,
    queue: Option<Queue<'_>>,
    announce: &str,
) -> Call {
    let mut all = keys.to_vec();
    if queue.is_some() {
        all.extend(queue_keys(prefix, keys));
    }
    let all: Vec<&str> = all.iter().map(String::as_str).collect();
    let lifetime = queue.map_or(1, |queue| queue.lifetime_ms).to_string();
    let args = [
        "",
        "f",
        queue.map_or("", |queue| queue.channel),
        "",
        announce,
        "",
        if queue.is_some() { "1" } else { "" },
        &lifetime,
    ];
    Call::new(&QUEUE_RELEASE, &all, &args)
}

/// The script's answer in mode `f`: a release's, or `{'refused', key, what}`.
pub(crate) fn parse_forced(reply: Value) -> RedisResult<Forced> {
    if let Value::Array(items) = &reply
        && let [Value::BulkString(tag), key, what] = items.as_slice()
        && tag == b"refused"
    {
        return Ok(Forced::Refused {
            key: redis::from_redis_value_ref(key)?,
            what: redis::from_redis_value_ref(what)?,
        });
    }
    parse_released(reply).map(Forced::Done)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::backend::Handed;

    fn bulk(text: &str) -> Value {
        Value::BulkString(text.as_bytes().to_vec())
    }

    #[test]
    fn a_forced_release_answers_removed_served_or_refused() {
        let removed = |held| {
            Forced::Done(Released {
                held,
                handed: Vec::new(),
            })
        };
        assert_eq!(parse_forced(Value::Int(1)).unwrap(), removed(true));
        assert_eq!(parse_forced(Value::Int(0)).unwrap(), removed(false));
        let served = Value::Array(vec![Value::Int(1), bulk("7"), bulk("12")]);
        assert_eq!(
            parse_forced(served).unwrap(),
            Forced::Done(Released {
                held: true,
                handed: vec![Handed {
                    wait: "7".into(),
                    fences: vec![12],
                }],
            })
        );
        let refused = Value::Array(vec![bulk("refused"), bulk("p:jobs"), bulk("list")]);
        assert_eq!(
            parse_forced(refused).unwrap(),
            Forced::Refused {
                key: "p:jobs".into(),
                what: "list".into(),
            }
        );
        assert!(parse_forced(Value::Array(vec![bulk("what")])).is_err());
    }

    #[test]
    fn a_refusal_names_the_callers_key() {
        let keys = ["p:a".to_string(), "p:b".to_string()];
        let names = ["a".to_string(), "b".to_string()];
        let force = Force {
            keys: &keys,
            names: Some(&names),
            prefix: "p:",
            channel: "",
            lifetime_ms: 1,
            announce: "",
        };
        match refusal(&force, "p:b", "hash".into()) {
            Error::WrongType { key, kind } => {
                assert_eq!((key.as_str(), kind.as_str()), ("b", "hash"))
            }
            other => panic!("{other:?}"),
        }
        match refusal(&force, "p:a", "semaphore".into()) {
            Error::InvalidInput(why) => assert!(why.contains("\"a\" is a semaphore"), "{why}"),
            other => panic!("{other:?}"),
        }
    }
}
