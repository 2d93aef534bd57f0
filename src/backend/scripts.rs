//! The Lua scripts in `lua/` (locks), `lua/semaphore/` (permits) and `lua/read/` (shared
//! holds), and typed calls to them.
//!
//! Each call is one round trip: EVALSHA, or, when the server answers NOSCRIPT (after a
//! restart or SCRIPT FLUSH), EVAL with the script's text, which also caches it there.
//! EVAL goes where EVALSHA went (on a cluster, to the master of the keys' slot), unlike
//! SCRIPT LOAD, which a cluster client sends to every master. Each call is also available
//! as a [`Call`] and a parser, for sending one request to several servers at once.

use std::sync::LazyLock;
use std::time::Duration;

use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, Value};

use super::call::{Call, Lua};
use super::fence::fence_key;
use super::outcome::{Acquired, Released};
use super::request::{Attempt, Refresh};
use crate::hold::{INTENT_LIFETIME, Kind};

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/acquire.lua")));
static REFRESH: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/refresh.lua")));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/release.lua")));
static TTL: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/ttl.lua")));
static PERMIT_ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/semaphore/acquire.lua")));
static PERMIT_RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/semaphore/release.lua")));
static PERMIT_TTL: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/semaphore/ttl.lua")));
static READ_ACQUIRE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/read/acquire.lua")));
static READ_RELEASE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/read/release.lua")));
static READ_TTL: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/read/ttl.lua")));
static WITHDRAW: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/read/withdraw.lua")));
static DOWNGRADE: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/read/downgrade.lua")));

/// One all-or-nothing attempt to take `keys`; see `lua/acquire.lua`. With `fencing`, each
/// key's counter (see [`fence_key`]) gives the acquisition a token.
///
/// With `set_first`, a single free key without fencing is taken with a plain `SET NX PX`
/// instead, which costs the server a fraction of a script call; only when that finds the
/// key set does the script run (to re-obtain for the same owner, or to name a key of
/// another type).
pub(crate) fn acquire(
    con: &mut dyn ConnectionLike,
    attempt: &Attempt<'_>,
    set_first: bool,
) -> RedisResult<Acquired> {
    if let [key] = attempt.keys
        && set_first
        && !attempt.fencing
        && attempt.kind == Kind::Lock
    {
        let set: Option<String> = redis::cmd("SET")
            .arg(key)
            .arg(attempt.value)
            .arg("NX")
            .arg("PX")
            .arg(attempt.ttl_ms)
            .query(con)?;
        if set.is_some() {
            return Ok(Acquired::Yes {
                fences: Vec::new(),
                fresh: true,
            });
        }
    }
    parse_acquired(acquire_call(attempt).run(con)?)
}

/// The acquire script's call for `attempt` (never the plain `SET`).
pub(crate) fn acquire_call(attempt: &Attempt<'_>) -> Call {
    // A counter per key: a semaphore is one key.
    let counters: Vec<String> = if attempt.fencing {
        let prefix = attempt.prefix;
        attempt
            .keys
            .iter()
            .map(|key| format!("{prefix}{}", fence_key(key)))
            .collect()
    } else {
        Vec::new()
    };
    let keys: Vec<&str> = attempt
        .keys
        .iter()
        .chain(&counters)
        .map(String::as_str)
        .collect();
    let owner_len = attempt.owner_len.to_string();
    let ttl_ms = attempt.ttl_ms.to_string();
    let fencing = if attempt.fencing { "1" } else { "0" };
    let mut args = vec![attempt.value, &owner_len, &ttl_ms, fencing];
    match attempt.kind {
        Kind::Lock => {
            let intent_ms = INTENT_LIFETIME.as_millis().to_string();
            args.push(attempt.over.unwrap_or_default());
            args.push(attempt.intent.unwrap_or_default());
            args.push(&intent_ms);
            Call::new(&ACQUIRE, &keys, &args)
        }
        Kind::Read => Call::new(&READ_ACQUIRE, &keys, &[attempt.value, &ttl_ms, fencing]),
        Kind::Permit { limit } => {
            let limit = limit.to_string();
            args.extend([limit.as_str(), if attempt.fixed_token { "1" } else { "0" }]);
            Call::new(&PERMIT_ACQUIRE, &keys, &args)
        }
    }
}

/// The acquire script's answer.
pub(crate) fn parse_acquired(reply: Value) -> RedisResult<Acquired> {
    Ok(match reply {
        Value::Int(n @ (1 | 2)) => Acquired::Yes {
            fences: Vec::new(),
            fresh: n == 1,
        },
        Value::Int(0) => Acquired::HeldElsewhere,
        other => match redis::from_redis_value::<Vec<Value>>(other)?.as_slice() {
            [Value::BulkString(tag), fences @ ..] if tag == b"fences" || tag == b"kept" => {
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
                Acquired::Yes {
                    fences,
                    fresh: tag == b"fences",
                }
            }
            // A shared hold's counters as they are: 0 where no lock took one yet.
            [Value::BulkString(tag), fences @ ..] if tag == b"read" => Acquired::Yes {
                fences: fences
                    .iter()
                    .map(|fence| Ok(redis::from_redis_value_ref::<u64>(fence)?))
                    .collect::<RedisResult<_>>()?,
                fresh: true,
            },
            [Value::BulkString(tag), ms] if tag == b"full" || tag == b"busy" => Acquired::Busy {
                retry_in: Duration::from_millis(redis::from_redis_value_ref(ms)?),
            },
            [Value::BulkString(tag), ms] if tag == b"readers" => Acquired::BehindReaders {
                retry_in: Duration::from_millis(redis::from_redis_value_ref(ms)?),
            },
            [Value::BulkString(tag), limit] if tag == b"limit" => Acquired::OtherLimit {
                limit: redis::from_redis_value_ref(limit)?,
            },
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
}

/// Sets the TTL of each lock whose keys all still hold its value, in one script call (one
/// reply, so one I/O bound however many locks); one `bool` per lock, `false` when not
/// held. An empty batch sends nothing.
pub(crate) fn refresh(
    con: &mut dyn ConnectionLike,
    locks: &[Refresh<'_>],
) -> RedisResult<Vec<bool>> {
    if locks.is_empty() {
        return Ok(Vec::new());
    }
    parse_refreshed(refresh_call(locks).run(con)?, locks.len())
}

/// The refresh script's call for a non-empty batch.
pub(crate) fn refresh_call(locks: &[Refresh<'_>]) -> Call {
    let keys: Vec<&str> = locks
        .iter()
        .flat_map(|lock| lock.keys.iter().map(String::as_str))
        .collect();
    // A lock's shape is its number of keys; a permit's is `p` (see `lua/refresh.lua`).
    let numbers: Vec<(String, String)> = locks
        .iter()
        .map(|lock| {
            let shape = match lock.kind {
                Kind::Lock => lock.keys.len().to_string(),
                Kind::Permit { .. } => "p".to_string(),
                Kind::Read => format!("r{}", lock.keys.len()),
            };
            (shape, lock.ttl_ms.to_string())
        })
        .collect();
    let args: Vec<&str> = locks
        .iter()
        .zip(&numbers)
        .flat_map(|(lock, (shape, ttl))| [shape.as_str(), lock.value, ttl.as_str()])
        .collect();
    Call::new(&REFRESH, &keys, &args)
}

/// The refresh script's answer for a batch of `len` locks.
pub(crate) fn parse_refreshed(reply: Value, len: usize) -> RedisResult<Vec<bool>> {
    let held: Vec<bool> = redis::from_redis_value(reply)?;
    if held.len() != len {
        return Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "refresh script answered for a different number of locks",
        )));
    }
    Ok(held)
}

/// Deletes those of `keys` that still hold `value`, and announces each free key on
/// `channels` + key (nothing is announced when `channels` is empty); not `held` when some
/// key no longer held `value`.
pub(crate) fn release(
    con: &mut dyn ConnectionLike,
    kind: Kind,
    keys: &[String],
    value: &str,
    channels: &str,
) -> RedisResult<Released> {
    parse_released(release_call(kind, keys, value, channels).run(con)?)
}

/// The release script's answer: whether the lock was held (and is now deleted), in the
/// lowest bit; above it, how many listeners the most-heard announcement reached.
pub(crate) fn parse_released(reply: Value) -> RedisResult<Released> {
    let n: u64 = redis::from_redis_value(reply)?;
    Ok(Released {
        held: n & 1 == 1,
        listeners: n >> 1,
    })
}

pub(crate) fn release_call(kind: Kind, keys: &[String], value: &str, channels: &str) -> Call {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let script = match kind {
        Kind::Lock => &RELEASE,
        Kind::Permit { .. } => &PERMIT_RELEASE,
        Kind::Read => &READ_RELEASE,
    };
    Call::new(script, &keys, &[value, channels])
}

/// The shortest remaining TTL of `keys` if every one still holds `value`; `None` when not
/// held. A lock whose keys have no TTL at all (someone ran PERSIST) reports `Duration::MAX`.
pub(crate) fn ttl(
    con: &mut dyn ConnectionLike,
    kind: Kind,
    keys: &[String],
    value: &str,
) -> RedisResult<Option<Duration>> {
    parse_ttl(ttl_call(kind, keys, value).run(con)?)
}

pub(crate) fn ttl_call(kind: Kind, keys: &[String], value: &str) -> Call {
    let script = match kind {
        Kind::Lock => &TTL,
        Kind::Permit { .. } => &PERMIT_TTL,
        Kind::Read => &READ_TTL,
    };
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    Call::new(script, &keys, &[value])
}

/// The TTL script's answer.
pub(crate) fn parse_ttl(reply: Value) -> RedisResult<Option<Duration>> {
    let ms: i64 = redis::from_redis_value(reply)?;
    Ok(match ms {
        -2 => None,
        -1 => Some(Duration::MAX),
        ms => Some(Duration::from_millis(ms.unsigned_abs())),
    })
}

/// Takes back the intent a writer with `value` recorded on those of `keys` that readers
/// share (see `lua/read/withdraw.lua`), announcing each on `channels` + key.
pub(crate) fn withdraw(
    con: &mut dyn ConnectionLike,
    keys: &[String],
    value: &str,
    channels: &str,
) -> RedisResult<()> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    Call::new(&WITHDRAW, &keys, &[value, channels])
        .run(con)
        .map(drop)
}

/// Turns the lock `value` holds on `keys` into a shared hold with `ttl_ms`, in one step
/// (see `lua/read/downgrade.lua`); not `held` when some key no longer held the lock.
pub(crate) fn downgrade(
    con: &mut dyn ConnectionLike,
    keys: &[String],
    value: &str,
    ttl_ms: u64,
    channels: &str,
) -> RedisResult<Released> {
    let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
    let ttl_ms = ttl_ms.to_string();
    parse_released(Call::new(&DOWNGRADE, &keys, &[value, &ttl_ms, channels]).run(con)?)
}
