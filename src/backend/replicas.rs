//! Holds that count only once replicas have them: `WAIT` after the write, on the same
//! connection (WAIT counts the replicas that acknowledged that connection's writes).

use std::time::Instant;

use redis::{ConnectionLike, RedisResult};

use super::outcome::{Acquired, Refreshed};
use super::request::{Attempt, Refresh, Replicas};
use super::scripts;

/// The WAIT command for `replicas`.
pub(crate) fn wait_cmd(replicas: Replicas) -> redis::Cmd {
    let ms = u64::try_from(replicas.timeout.as_millis()).unwrap_or(u64::MAX);
    let mut cmd = redis::cmd("WAIT");
    cmd.arg(replicas.wanted).arg(ms.max(1));
    cmd
}

/// How many replicas acknowledged every write made so far on `con` (one server).
pub(crate) fn wait(con: &mut impl ConnectionLike, replicas: Replicas) -> RedisResult<u32> {
    wait_cmd(replicas).query(con)
}

/// The most replicas any of `holds` wants, if any wants some.
pub(crate) fn most(holds: impl IntoIterator<Item = Option<Replicas>>) -> Option<Replicas> {
    holds.into_iter().flatten().max_by_key(|r| r.wanted)
}

/// After an acquire on `con` that found `acquired`: with replicas wanted and the hold
/// taken, waits for them (`wait`); when too few acknowledge, gives the hold up again on
/// the same connection (a fixed token's re-obtain keeps the owner's earlier hold) and answers
/// [`Acquired::NotReplicated`].
pub(crate) fn confirm<C: ConnectionLike>(
    con: &mut C,
    attempt: &Attempt<'_>,
    acquired: Acquired,
    wait: impl FnOnce(&mut C, Replicas) -> RedisResult<u32>,
) -> RedisResult<Acquired> {
    let (Some(replicas), Acquired::Yes { fresh, .. }) = (attempt.replicas, &acquired) else {
        return Ok(acquired);
    };
    let acknowledged = wait(con, replicas)?;
    if acknowledged >= replicas.wanted {
        return Ok(acquired);
    }
    if attempt.owns(*fresh) {
        // Announced: a waiter may have seen the keys taken.
        scripts::release(con, &attempt.take_back())?;
    }
    Ok(Acquired::NotReplicated {
        acknowledged,
        wanted: replicas.wanted,
    })
}

/// After an acquire that wanted replicas and ended in an error (a WAIT that failed, a reply
/// lost): the keys may be taken with nobody to hold them, so they are given up again
/// (`release`, on another connection; best effort, by value, so never another owner's),
/// if it was `sent` at all.
/// A fixed token's keys are left alone: the same owner may have held them before.
pub(crate) fn unconfirmed<T>(
    attempt: &Attempt<'_>,
    sent: bool,
    acquired: &crate::Result<Acquired>,
    release: impl FnOnce() -> crate::Result<T>,
) {
    // Only when the acquire was sent: after a pool that had no connection (or only stale
    // ones) nothing was, and the release would wait as long again.
    if sent && acquired.is_err() && attempt.replicas.is_some() && attempt.owns(false) {
        let _ = release();
    }
}

/// What a refresh batch found, given each hold's `held` and, when the batch waited for
/// replicas, how many `acknowledged` it.
pub(crate) fn refreshed(
    locks: &[Refresh<'_>],
    held: Vec<bool>,
    acknowledged: Option<u32>,
    sent_at: Instant,
) -> Vec<Refreshed> {
    held.into_iter()
        .zip(locks)
        .map(|(held, lock)| match (held, lock.replicas, acknowledged) {
            (false, ..) => Refreshed::Lost,
            (true, Some(replicas), Some(acknowledged)) if acknowledged < replicas.wanted => {
                Refreshed::NotReplicated {
                    acknowledged,
                    wanted: replicas.wanted,
                }
            }
            (true, ..) => Refreshed::Held { sent_at },
        })
        .collect()
}

/// Refreshes `locks` on `con`, then, when some of them want replicas and any is still
/// held, waits (`wait`) for the most any wants: one WAIT for the whole batch.
pub(crate) fn refresh<C: ConnectionLike>(
    con: &mut C,
    locks: &[Refresh<'_>],
    wait: impl FnOnce(&mut C, Replicas) -> RedisResult<u32>,
) -> RedisResult<Vec<Refreshed>> {
    let sent_at = Instant::now();
    let held = scripts::refresh(con, locks)?;
    let acknowledged = match most(locks.iter().map(|lock| lock.replicas)) {
        Some(replicas) if held.iter().any(|held| *held) => Some(wait(con, replicas)?),
        _ => None,
    };
    Ok(refreshed(locks, held, acknowledged, sent_at))
}
