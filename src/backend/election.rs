//! The scripts of elections and fenced writes (`lua/election/`, `lua/fenced_set.lua`):
//! who leads, a leader's new value, and a write refused to an older term. Each is one
//! script on the election's (or the written key's) one slot.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, Value};

use super::call::{Call, Lua};
use crate::hold::metadata_of;

static LEADER: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/election/leader.lua")));
static PROCLAIM: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/election/proclaim.lua")));
static FENCED_SET: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/fenced_set.lua")));

/// What a script of this file found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Found<T> {
    Yes(T),
    /// A key holds another Redis type: nothing was changed.
    WrongType {
        key: String,
        kind: String,
    },
}

/// An election's leader as Redis has it: its term, what it advertises, how long its lease
/// has left (`Duration::MAX`: no TTL).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Led {
    pub(crate) term: u64,
    pub(crate) value: String,
    pub(crate) ttl: Duration,
}

/// Who leads the election whose `keys` are those of `fence::election_keys`.
pub(crate) fn leader_call(keys: &[String; 3]) -> Call {
    Call::new(&LEADER, &[&keys[0], &keys[1], &keys[2]], &[])
}

/// The leader script's answer: `None` when nobody leads.
pub(crate) fn parse_leader(reply: Value) -> RedisResult<Found<Option<Led>>> {
    let reply: Vec<Value> = redis::from_redis_value(reply)?;
    Ok(match reply.as_slice() {
        [] => Found::Yes(None),
        [term, ms, value] if matches!(term, Value::Int(_)) => {
            let value: String = redis::from_redis_value_ref(value)?;
            let value = match value.split_at_checked(1) {
                Some(("p", proclaimed)) => proclaimed.to_owned(),
                Some(("s", stored)) => metadata_of(stored).to_owned(),
                _ => return Err(shape("leader")),
            };
            let ms: i64 = redis::from_redis_value_ref(ms)?;
            Found::Yes(Some(Led {
                term: redis::from_redis_value_ref(term)?,
                value,
                ttl: u64::try_from(ms).map_or(Duration::MAX, Duration::from_millis),
            }))
        }
        other => wrong_type(other, "leader")?,
    })
}

/// Has the leader whose lock holds `stored` advertise `value` for the rest of `term`,
/// and tells the observers on `channel`.
pub(crate) fn proclaim_call(
    keys: &[String; 3],
    stored: &str,
    term: u64,
    value: &str,
    channel: &str,
) -> Call {
    let term = term.to_string();
    Call::new(
        &PROCLAIM,
        &[&keys[0], &keys[2]],
        &[stored, &term, value, channel],
    )
}

/// Writes `value` at `key` unless a token larger than `token` wrote it, recording the
/// token at `record` (see [`fence::fenced_record`](super::fence::fenced_record)).
pub(crate) fn fenced_set_call(key: &str, record: &str, token: u64, value: &str) -> Call {
    Call::new(&FENCED_SET, &[key, record], &[&token.to_string(), value])
}

/// The answer of the proclaim or fenced-set script: whether it wrote.
pub(crate) fn parse_written(reply: Value) -> RedisResult<Found<bool>> {
    match reply {
        Value::Int(n) => Ok(Found::Yes(n == 1)),
        other => wrong_type(
            redis::from_redis_value::<Vec<Value>>(other)?.as_slice(),
            "write",
        ),
    }
}

/// `{'wrongtype', key, type}`, as every script of this file answers a key of another type.
fn wrong_type<T>(reply: &[Value], script: &str) -> RedisResult<Found<T>> {
    match reply {
        [Value::BulkString(tag), key, kind] if tag == b"wrongtype" => Ok(Found::WrongType {
            key: redis::from_redis_value_ref(key)?,
            kind: redis::from_redis_value_ref(kind)?,
        }),
        _ => Err(shape(script)),
    }
}

fn shape(script: &str) -> RedisError {
    RedisError::from((
        ErrorKind::UnexpectedReturnType,
        "an election script answered in an unknown shape",
        script.to_owned(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn bulk(s: &str) -> Value {
        Value::BulkString(s.as_bytes().to_vec())
    }

    #[test]
    fn a_leader_is_read_with_its_proclaimed_or_stored_value() {
        let token = "0123456789abcdef0123456789abcdef";
        let stored = Value::Array(vec![
            Value::Int(7),
            Value::Int(1500),
            bulk(&format!("s{token}v1")),
        ]);
        let Found::Yes(Some(led)) = parse_leader(stored).unwrap() else {
            panic!("a leader")
        };
        assert_eq!((led.term, led.value.as_str()), (7, "v1"));
        assert_eq!(led.ttl, Duration::from_millis(1500));
        let proclaimed = Value::Array(vec![Value::Int(8), Value::Int(-1), bulk("pv2")]);
        let Found::Yes(Some(led)) = parse_leader(proclaimed).unwrap() else {
            panic!("a leader")
        };
        assert_eq!((led.term, led.value.as_str()), (8, "v2"));
        assert_eq!(led.ttl, Duration::MAX, "no TTL");
        assert_eq!(
            parse_leader(Value::Array(vec![])).unwrap(),
            Found::Yes(None)
        );
    }

    #[test]
    fn another_type_is_named() {
        let reply = Value::Array(vec![bulk("wrongtype"), bulk("k"), bulk("list")]);
        assert_eq!(
            parse_written(reply).unwrap(),
            Found::WrongType {
                key: "k".into(),
                kind: "list".into()
            }
        );
        assert!(parse_written(Value::Array(vec![bulk("x")])).is_err());
    }
}
