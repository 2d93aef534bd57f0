//! The Lua scripts in `lua/queue/` (taking and giving up every kind of hold, with the
//! waiters' queue), `lua/` (refresh, TTL, and a lock on a quorum or across cluster slots),
//! `lua/semaphore/` and `lua/read/` (the TTL of permits and shared holds), and typed calls
//! to them.
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
use super::fence::{fence_key, queue_keys};
use super::outcome::{Acquired, Handed, Released};
use super::request::{Attempt, Refresh, Release};
use crate::hold::Kind;

static ACQUIRE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/acquire.lua")));
static REFRESH: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/refresh.lua")));
static RELEASE: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/release.lua")));
static TTL: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/ttl.lua")));
static PERMIT_TTL: LazyLock<Lua> =
    LazyLock::new(|| Lua::new(include_str!("../../lua/semaphore/ttl.lua")));
static READ_TTL: LazyLock<Lua> = LazyLock::new(|| Lua::new(include_str!("../../lua/read/ttl.lua")));
/// With the queue: the queue's functions, then the script's own text.
static QUEUE_ACQUIRE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../lua/queue/acquire_alone.lua"),
        include_str!("../../lua/queue/queue.lua"),
        include_str!("../../lua/queue/acquire.lua")
    ))
});
pub(super) static QUEUE_RELEASE: LazyLock<Lua> = LazyLock::new(|| {
    Lua::new(concat!(
        include_str!("../../lua/queue/release_alone.lua"),
        include_str!("../../lua/queue/queue.lua"),
        include_str!("../../lua/queue/release.lua")
    ))
});

/// A queue script's keys: the hold's `keys`, then, `with_queue`, their queues, expiries,
/// tickets and fencing counters (see `lua/queue/queue.lua`).
fn with_queue_keys(keys: &[String], prefix: &str, with_queue: bool) -> Vec<String> {
    let mut all = keys.to_vec();
    if with_queue {
        all.extend(queue_keys(prefix, keys));
    }
    all
}

/// A kind's letter in the queue's scripts (see `lua/queue/queue.lua`).
fn kind_letter(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "l",
        Kind::Read => "r",
        Kind::Permit { .. } => "p",
    }
}

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

/// The acquire script's call for `attempt` (never the plain `SET`): with the queue,
/// `lua/queue/acquire.lua`; without (a lock on a quorum or across cluster slots),
/// `lua/acquire.lua`.
pub(crate) fn acquire_call(attempt: &Attempt<'_>) -> Call {
    let owner_len = attempt.owner_len.to_string();
    let ttl_ms = attempt.ttl_ms.to_string();
    let fencing = if attempt.fencing { "1" } else { "0" };
    let queue = match attempt.queue {
        None if attempt.kind == Kind::Lock => {
            let counters: Vec<String> = match attempt.fencing {
                true => (attempt.keys.iter())
                    .map(|key| format!("{}{}", attempt.prefix, fence_key(key)))
                    .collect(),
                false => Vec::new(),
            };
            let keys: Vec<&str> = attempt
                .keys
                .iter()
                .chain(&counters)
                .map(String::as_str)
                .collect();
            return Call::new(
                &ACQUIRE,
                &keys,
                &[attempt.value, &owner_len, &ttl_ms, fencing],
            );
        }
        queue => queue,
    };
    // A permit or shared hold without the queue: on a cluster, a name whose queue would
    // be in another slot (see `Backend::queues`).
    let all = with_queue_keys(attempt.keys, attempt.prefix, queue.is_some());
    let keys: Vec<&str> = all.iter().map(String::as_str).collect();
    let limit = match attempt.kind {
        Kind::Permit { limit } => limit.to_string(),
        Kind::Lock | Kind::Read => String::new(),
    };
    let lifetime = queue.map_or(1, |queue| queue.lifetime_ms).to_string();
    let args = [
        attempt.value,
        &owner_len,
        &ttl_ms,
        fencing,
        kind_letter(attempt.kind),
        &limit,
        if attempt.fixed_token { "1" } else { "0" },
        queue.and_then(|queue| queue.entry).unwrap_or_default(),
        &lifetime,
        queue.map_or("", |queue| queue.channel),
        if queue.is_some() { "1" } else { "" },
    ];
    Call::new(&QUEUE_ACQUIRE, &keys, &args)
}

/// A waiter's queue entry (see `lua/queue/queue.lua`): everything a script needs to give
/// it its hold and tell its locker (on `channel`) that `wait` was served.
pub(crate) fn queue_entry(attempt: &Attempt<'_>, channel: &str, wait: &str) -> String {
    let kind = match attempt.kind {
        Kind::Permit { limit } => format!("p{limit}"),
        kind => format!("{}{}", kind_letter(kind), attempt.keys.len()),
    };
    let mut entry = format!(
        "{kind},{},{},{wait},{},{}:{channel}{}",
        attempt.ttl_ms,
        u8::from(attempt.fencing),
        channel.len(),
        attempt.value.len(),
        attempt.value
    );
    if attempt.keys.len() > 1 {
        for key in attempt.keys {
            entry.push_str(&format!("{}:{key}", key.len()));
        }
    }
    entry
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
            [Value::BulkString(tag), handed @ ..] if tag == b"queued" => Acquired::Queued {
                handed: parse_handed(handed)?,
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
                _ if lock.entry_of.is_some() => format!("w{}", lock.entry_of.unwrap_or(0)),
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

/// Gives a hold up (see `lua/queue/release.lua`, or without the queue
/// `lua/release.lua`): whether it was whole, and the waiters of this locker given theirs.
pub(crate) fn release(
    con: &mut dyn ConnectionLike,
    release: &Release<'_>,
) -> RedisResult<Released> {
    parse_released(release_call(release, None).run(con)?)
}

/// The release script's answer: 1 or 0 (whether the hold was whole), or that followed by
/// each waiter of this locker given its hold (its value, then its fences joined by ',').
pub(crate) fn parse_released(reply: Value) -> RedisResult<Released> {
    if let Value::Int(n) = reply {
        return Ok(Released {
            held: n == 1,
            handed: Vec::new(),
        });
    }
    match redis::from_redis_value::<Vec<Value>>(reply)?.as_slice() {
        [held, handed @ ..] => Ok(Released {
            held: redis::from_redis_value_ref::<i64>(held)? == 1,
            handed: parse_handed(handed)?,
        }),
        [] => Err(RedisError::from((
            ErrorKind::UnexpectedReturnType,
            "release script answered with nothing",
        ))),
    }
}

/// Pairs of a value and its fences (joined by ','), as the queue's scripts list the
/// waiters of the caller's locker they served.
pub(crate) fn parse_handed(items: &[Value]) -> RedisResult<Vec<Handed>> {
    items
        .chunks(2)
        .map(|pair| {
            let [value, fences] = pair else {
                return Err(RedisError::from((
                    ErrorKind::UnexpectedReturnType,
                    "a served waiter without its fences",
                )));
            };
            let fences: String = redis::from_redis_value_ref(fences)?;
            let fences = fences
                .split(',')
                .filter(|fence| !fence.is_empty())
                .map(|fence| fence.parse::<u64>().ok().filter(|fence| *fence >= 1))
                .collect::<Option<Vec<u64>>>()
                .ok_or_else(|| {
                    RedisError::from((ErrorKind::UnexpectedReturnType, "a bad fencing token"))
                })?;
            Ok(Handed {
                wait: redis::from_redis_value_ref(value)?,
                fences,
            })
        })
        .collect()
}

/// The release script's call; with `downgrade_ms`, the lock becomes a shared hold with
/// that TTL instead (with the queue only).
pub(crate) fn release_call(release: &Release<'_>, downgrade_ms: Option<u64>) -> Call {
    let queue = match release.queue {
        None if release.kind == Kind::Lock && downgrade_ms.is_none() => {
            let keys: Vec<&str> = release.keys.iter().map(String::as_str).collect();
            return Call::new(&RELEASE, &keys, &[release.value, release.announce]);
        }
        queue => queue,
    };
    let all = with_queue_keys(release.keys, release.prefix, queue.is_some());
    let keys: Vec<&str> = all.iter().map(String::as_str).collect();
    let ttl = downgrade_ms.map(|ms| ms.to_string()).unwrap_or_default();
    let kind = if downgrade_ms.is_some() {
        "d"
    } else {
        kind_letter(release.kind)
    };
    let lifetime = queue.map_or(1, |queue| queue.lifetime_ms).to_string();
    let mut args = vec![
        release.value,
        kind,
        queue.map_or("", |queue| queue.channel),
        queue.and_then(|queue| queue.entry).unwrap_or_default(),
        release.announce,
        &ttl,
        if queue.is_some() { "1" } else { "" },
        &lifetime,
    ];
    args.extend(release.joins.iter().copied());
    Call::new(&QUEUE_RELEASE, &keys, &args)
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

/// Turns the lock `release.value` holds on its keys into a shared hold with `ttl_ms`, in
/// one step, letting in the readers first in the queue; not `held` when some key no longer
/// held the lock (nothing changed then).
pub(crate) fn downgrade(
    con: &mut dyn ConnectionLike,
    release: &Release<'_>,
    ttl_ms: u64,
) -> RedisResult<Released> {
    parse_released(release_call(release, Some(ttl_ms)).run(con)?)
}
