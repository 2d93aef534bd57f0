//! Introspection: the live holders of a semaphore, and who holds any key (read-only
//! scripts: `lua/semaphore/holders.lua`, `lua/holders.lua`).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, Value};

use super::call::{Call, Lua};

static HOLDERS: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/semaphore/holders.lua")));
static KEY_HOLDERS: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/holders.lua")));

/// The live holders of the semaphore at `key`: how many, or each one's
/// value and remaining TTL, the first to expire first.
pub(crate) fn holders(
    con: &mut dyn ConnectionLike,
    key: &str,
    count_only: bool,
) -> RedisResult<Holders> {
    let what = if count_only { "count" } else { "list" };
    let reply = Call::new(&HOLDERS, &[key], &[what]).run(con)?;
    let shape = || {
        RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "holders script answered in an unknown shape",
        ))
    };
    Ok(
        match redis::from_redis_value::<Vec<Value>>(reply)?.as_slice() {
            [Value::BulkString(tag), n] if tag == b"count" => {
                Holders::Count(redis::from_redis_value_ref(n)?)
            }
            [Value::BulkString(tag), pairs @ ..] if tag == b"holders" && pairs.len() % 2 == 0 => {
                Holders::List(
                    pairs
                        .chunks_exact(2)
                        .map(|pair| match pair {
                            [value, ms] => Ok((
                                redis::from_redis_value_ref(value)?,
                                Duration::from_millis(redis::from_redis_value_ref(ms)?),
                            )),
                            _ => Err(shape()),
                        })
                        .collect::<RedisResult<_>>()?,
                )
            }
            [Value::BulkString(tag), _key, kind] if tag == b"wrongtype" => Holders::WrongType {
                kind: redis::from_redis_value_ref(kind)?,
            },
            _ => return Err(shape()),
        },
    )
}

/// What [`holders`] found.
#[derive(Debug)]
pub(crate) enum Holders {
    Count(u32),
    /// Each live holder's value and remaining TTL.
    List(Vec<(String, Duration)>),
    /// The holders' key holds this other Redis type.
    WrongType {
        kind: String,
    },
}

/// Who holds `key` (see `lua/holders.lua`), with its fencing counter at `counter`.
pub(crate) fn key_holders_call(key: &str, counter: Option<&str>) -> Call {
    let mut keys = vec![key];
    keys.extend(counter);
    Call::new(&KEY_HOLDERS, &keys, &[])
}

/// The holders script's answer.
pub(crate) fn parse_key_holders(reply: Value) -> RedisResult<KeyHolders> {
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
    if what == b"wrongtype" {
        let [_, kind] = rest else {
            return Err(shape());
        };
        return Ok(KeyHolders::WrongType {
            kind: redis::from_redis_value_ref(kind)?,
        });
    }
    let [fence, pairs @ ..] = rest else {
        return Err(shape());
    };
    let fence: i64 = redis::from_redis_value_ref(fence)?;
    let holds = pairs
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
    Ok(KeyHolders::Held {
        shared: what != b"lock" && what != b"free",
        fence: u64::try_from(fence).ok(),
        holds,
    })
}

/// What [`parse_key_holders`] found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum KeyHolders {
    /// Its holders (none when free): each one's value and remaining TTL (`None`: no TTL);
    /// `shared` for readers and permits; the key's fencing counter as it is.
    Held {
        shared: bool,
        fence: Option<u64>,
        holds: Vec<(String, Option<Duration>)>,
    },
    /// The key holds this other Redis type.
    WrongType { kind: String },
}
