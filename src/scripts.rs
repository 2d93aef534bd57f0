//! The four Lua scripts in `lua/`, and typed calls to them.
//!
//! Each call is one round trip: EVALSHA, with SCRIPT LOAD and a second try when the
//! server answers NOSCRIPT (after a restart or SCRIPT FLUSH).

use std::sync::LazyLock;
use std::time::Duration;

use redis::{Connection, ErrorKind, RedisResult, Script, ServerErrorKind, Value};

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
    /// Every key now holds our value and the TTL.
    Yes,
    /// Another owner holds at least one key; nothing was changed.
    HeldElsewhere,
    /// `key` holds a Redis `kind` other than a string; nothing was changed.
    WrongType { key: String, kind: String },
}

/// One all-or-nothing attempt to take `keys`; see `lua/acquire.lua`.
pub(crate) fn acquire(
    con: &mut Connection,
    keys: &[String],
    value: &str,
    token_len: usize,
    ttl_ms: u64,
) -> RedisResult<Acquired> {
    let reply: Value = ACQUIRE
        .key(keys)
        .arg(value)
        .arg(token_len)
        .arg(ttl_ms)
        .invoke(con)?;
    Ok(match reply {
        Value::Int(1) => Acquired::Yes,
        Value::Int(0) => Acquired::HeldElsewhere,
        other => {
            let (key, kind) = redis::from_redis_value(other)?;
            Acquired::WrongType { key, kind }
        }
    })
}

/// Sets the TTL of `keys` if every one still holds `value`; `false` when not held.
pub(crate) fn refresh(
    con: &mut Connection,
    keys: &[String],
    value: &str,
    ttl_ms: u64,
) -> RedisResult<bool> {
    REFRESH.key(keys).arg(value).arg(ttl_ms).invoke(con)
}

/// Refreshes many locks in one pipelined round trip; one `bool` per lock, as in
/// [`refresh`]. An empty batch sends nothing.
pub(crate) fn refresh_batch<'a>(
    con: &mut Connection,
    locks: impl Iterator<Item = (&'a [String], &'a str, u64)>,
) -> RedisResult<Vec<bool>> {
    let mut pipe = redis::pipe();
    for (keys, value, ttl_ms) in locks {
        pipe.cmd("EVALSHA")
            .arg(REFRESH.get_hash())
            .arg(keys.len())
            .arg(keys)
            .arg(value)
            .arg(ttl_ms);
    }
    if pipe.is_empty() {
        return Ok(Vec::new());
    }
    // A pipeline does not load scripts on NOSCRIPT by itself: load, then send it again.
    match pipe.query(con) {
        Err(e) if e.kind() == ErrorKind::Server(ServerErrorKind::NoScript) => {
            REFRESH.load(con)?;
            pipe.query(con)
        }
        result => result,
    }
}

/// Deletes `keys` if every one still holds `value`; `false` when not held.
pub(crate) fn release(con: &mut Connection, keys: &[String], value: &str) -> RedisResult<bool> {
    RELEASE.key(keys).arg(value).invoke(con)
}

/// The shortest remaining TTL of `keys` if every one still holds `value`; `None` when not
/// held. A lock whose keys have no TTL at all (someone ran PERSIST) reports `Duration::MAX`.
pub(crate) fn ttl(
    con: &mut Connection,
    keys: &[String],
    value: &str,
) -> RedisResult<Option<Duration>> {
    let ms: i64 = TTL.key(keys).arg(value).invoke(con)?;
    Ok(match ms {
        -2 => None,
        -1 => Some(Duration::MAX),
        ms => Some(Duration::from_millis(ms.unsigned_abs())),
    })
}
