//! Introspection: who holds a key, whatever holds it (a lock, readers, a semaphore's
//! permits); one read-only script, `lua/holders.lua`.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, Value};

use super::call::{Call, Lua};

static KEY_HOLDERS: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/holders.lua")));

/// Who holds `key` (see `lua/holders.lua`), with its fencing counter, queue and the
/// queue's expiries in `beside` (or none of them); with `count_only`, only how many.
pub(crate) fn key_holders_call(key: &str, beside: &[String], count_only: bool) -> Call {
    let mut keys = vec![key];
    keys.extend(beside.iter().map(String::as_str));
    Call::new(
        &KEY_HOLDERS,
        &keys,
        &[if count_only { "count" } else { "list" }],
    )
}

/// The holders script's answer (to a call with `count_only` or not).
pub(crate) fn parse_key_holders(reply: Value, count_only: bool) -> RedisResult<KeyHolders> {
    let shape = || {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "holders script answered in an unknown shape",
        ))
    };
    let reply: Vec<Value> = redis::from_redis_value(reply)?;
    let [Value::BulkString(what), rest @ ..] = reply.as_slice() else {
        return Err(shape());
    };
    let held_by = match what.as_slice() {
        b"wrongtype" => {
            let [_, kind] = rest else {
                return Err(shape());
            };
            return Ok(KeyHolders::WrongType {
                kind: redis::from_redis_value_ref(kind)?,
            });
        }
        b"free" => HeldBy::Nobody,
        b"lock" => HeldBy::Lock,
        b"read" => HeldBy::Readers,
        b"semaphore" => HeldBy::Permits,
        _ => return Err(shape()),
    };
    let [fence, rest @ ..] = rest else {
        return Err(shape());
    };
    let fence = u64::try_from(redis::from_redis_value_ref::<i64>(fence)?).ok();
    let (count, holds) = match rest {
        [n] if count_only => (redis::from_redis_value_ref(n)?, Vec::new()),
        pairs => {
            let holds: Holds = pairs
                .chunks(2)
                .map(|pair| match pair {
                    [value, ms] => {
                        let ms: i64 = redis::from_redis_value_ref(ms)?;
                        let ttl = u64::try_from(ms).ok().map(Duration::from_millis);
                        Ok((redis::from_redis_value_ref(value)?, ttl))
                    }
                    _ => Err(shape()),
                })
                .collect::<RedisResult<_>>()?;
            (holds.len(), holds)
        }
    };
    Ok(KeyHolders::Held {
        held_by,
        fence,
        count,
        holds,
    })
}

/// Each holder's value and remaining TTL (`None`: no TTL), the first to expire first.
pub(crate) type Holds = Vec<(String, Option<Duration>)>;

/// What holds a key.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum HeldBy {
    Nobody,
    Lock,
    Readers,
    Permits,
}

impl HeldBy {
    /// Whether its holders share the key (readers, a semaphore's permits).
    pub(crate) fn shared(self) -> bool {
        matches!(self, HeldBy::Readers | HeldBy::Permits)
    }
}

/// What [`parse_key_holders`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyHolders {
    /// Its holders: how many, and (unless only counted) each one's value and remaining
    /// TTL (`None`: no TTL); the key's fencing counter as it is (none for a semaphore).
    Held {
        held_by: HeldBy,
        fence: Option<u64>,
        count: usize,
        holds: Holds,
    },
    /// The key holds this other Redis type.
    WrongType { kind: String },
}
