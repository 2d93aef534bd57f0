//! The four Lua scripts in `lua/`, and typed calls to them.
//!
//! Each call is one round trip: EVALSHA, with SCRIPT LOAD and a second try when the
//! server answers NOSCRIPT (after a restart or SCRIPT FLUSH).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ErrorKind, RedisError, RedisResult, Script, Value};

use crate::fence::fence_key;
use crate::pool::Conn;

static ACQUIRE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/acquire.lua")));
static REFRESH: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/refresh.lua")));
static RELEASE: LazyLock<Script> =
    LazyLock::new(|| Script::new(include_str!("../lua/release.lua")));
static TTL: LazyLock<Script> = LazyLock::new(|| Script::new(include_str!("../lua/ttl.lua")));

/// What one acquisition attempt found.
#[derive(Debug, PartialEq, Eq)]
pub(crate) enum Acquired {
    /// Every key now holds our value and the TTL; with fencing, each key's token.
    Yes { fences: Vec<u64> },
    /// Another owner holds at least one key; nothing was changed.
    HeldElsewhere,
    /// `key` holds a Redis `kind` other than a string; nothing was changed.
    WrongType { key: String, kind: String },
}

/// One all-or-nothing attempt to take `keys`; see `lua/acquire.lua`. With `fencing`, each
/// key's counter (see [`fence_key`]) gives the acquisition a token.
///
/// With `set_first`, a single free key without fencing is taken with a plain `SET NX PX`
/// instead, which costs the server a fraction of a script call; only when that finds the
/// key set does the script run (to re-obtain for the same owner, or to name a key of
/// another type).
pub(crate) fn acquire(
    con: &mut Conn,
    attempt: &Attempt<'_>,
    set_first: bool,
) -> RedisResult<Acquired> {
    let Attempt {
        keys,
        value,
        token_len,
        ttl_ms,
        fencing,
        prefix,
    } = *attempt;
    con.run(|con| {
        if let [key] = keys
            && set_first
            && !fencing
        {
            let set: Option<String> = redis::cmd("SET")
                .arg(key)
                .arg(value)
                .arg("NX")
                .arg("PX")
                .arg(ttl_ms)
                .query(con)?;
            if set.is_some() {
                return Ok(Acquired::Yes { fences: Vec::new() });
            }
        }
        let mut invocation = ACQUIRE.prepare_invoke();
        invocation.key(keys);
        if fencing {
            let counters = keys.iter().map(|key| format!("{prefix}{}", fence_key(key)));
            invocation.key(counters.collect::<Vec<_>>());
        }
        invocation
            .arg(value)
            .arg(token_len)
            .arg(ttl_ms)
            .arg(if fencing { "1" } else { "0" });
        let reply: Value = invocation.invoke(con)?;
        Ok(match reply {
            Value::Int(1) => Acquired::Yes { fences: Vec::new() },
            Value::Int(0) => Acquired::HeldElsewhere,
            other => match redis::from_redis_value::<Vec<Value>>(other)?.as_slice() {
                [tag, fences @ ..] if *tag == Value::BulkString(b"fences".to_vec()) => {
                    // A token is at least 1: never let a bad reply wrap around to a huge one.
                    let fences = fences
                        .iter()
                        .map(|fence| match redis::from_redis_value_ref::<i64>(fence)? {
                            fence @ 1.. => Ok(fence.unsigned_abs()),
                            _ => Err(RedisError::from((
                                ErrorKind::UnexpectedReturnType,
                                "acquire script gave a fencing token under 1",
                            ))),
                        })
                        .collect::<RedisResult<_>>()?;
                    Acquired::Yes { fences }
                }
                [_, key, kind] => Acquired::WrongType {
                    key: redis::from_redis_value_ref(key)?,
                    kind: redis::from_redis_value_ref(kind)?,
                },
                _ => {
                    return Err(RedisError::from((
                        ErrorKind::UnexpectedReturnType,
                        "acquire script answered in an unknown shape",
                    )));
                }
            },
        })
    })
}

/// What one acquisition attempt asks for.
#[derive(Clone, Copy)]
pub(crate) struct Attempt<'a> {
    pub(crate) keys: &'a [String],
    /// The token, then the metadata.
    pub(crate) value: &'a str,
    pub(crate) token_len: usize,
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    /// The locker's prefix, put before each fencing counter too.
    pub(crate) prefix: &'a str,
}

/// One lock for [`refresh`]: its keys, its value and the TTL to set.
pub(crate) struct Refresh<'a> {
    pub(crate) keys: &'a [String],
    pub(crate) value: &'a str,
    pub(crate) ttl_ms: u64,
}

/// Sets the TTL of each lock whose keys all still hold its value, in one script call (one
/// reply, so one I/O bound however many locks); one `bool` per lock, `false` when not
/// held. An empty batch sends nothing.
pub(crate) fn refresh(con: &mut Conn, locks: &[Refresh<'_>]) -> RedisResult<Vec<bool>> {
    if locks.is_empty() {
        return Ok(Vec::new());
    }
    let mut invocation = REFRESH.prepare_invoke();
    for lock in locks {
        invocation.key(lock.keys);
        invocation
            .arg(lock.keys.len())
            .arg(lock.value)
            .arg(lock.ttl_ms);
    }
    let held: Vec<bool> = con.run(|con| invocation.invoke(con))?;
    if held.len() != locks.len() {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "refresh script answered for a different number of locks",
        )));
    }
    Ok(held)
}

/// Deletes `keys` if every one still holds `value`, and announces each on
/// `channels` + key; `false` when not held.
pub(crate) fn release(
    con: &mut Conn,
    keys: &[String],
    value: &str,
    channels: &str,
) -> RedisResult<bool> {
    con.run(|con| RELEASE.key(keys).arg(value).arg(channels).invoke(con))
}

/// The shortest remaining TTL of `keys` if every one still holds `value`; `None` when not
/// held. A lock whose keys have no TTL at all (someone ran PERSIST) reports `Duration::MAX`.
pub(crate) fn ttl(con: &mut Conn, keys: &[String], value: &str) -> RedisResult<Option<Duration>> {
    let ms: i64 = con.run(|con| TTL.key(keys).arg(value).invoke(con))?;
    Ok(match ms {
        -2 => None,
        -1 => Some(Duration::MAX),
        ms => Some(Duration::from_millis(ms.unsigned_abs())),
    })
}
