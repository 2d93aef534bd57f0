//! Obtaining a hold, whatever its kind: the one waiting loop of every primitive. Attempt;
//! while the hold is taken elsewhere, wait in this locker's line for the keys (woken by a
//! release, a turn, or a hand-over), as the retry policy and timeout allow; attempt again.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Held, Holding, Kind, Timing, later, owner_part, random_token};
use crate::backend::{Acquired, Attempt, Replicas};
use crate::options::{checked_token, checked_ttl};
use crate::shared::Shared;
use crate::wait::{Offer, Seen, Ticket, Wake};
use crate::{Error, LockOptions, Result, stats};

/// On a quorum, a release heard from one node may not have reached the others yet: an
/// attempt right after it that finds only some nodes free ([`Acquired::Partial`]) is
/// tried again after this, doubling each time (and up to as much again, at random), up
/// to [`QUICK_RETRIES`] times per wake-up, without using up a retry: about 60 to 130 ms
/// in all, as a loaded host can hold the release's other requests up that long.
const QUICK_PAUSE: Duration = Duration::from_millis(1);
const QUICK_RETRIES: u32 = 6;

/// How long a waiting lock's intent (recorded where readers share its keys, so that new
/// readers wait behind it) lives unless renewed: the waiting loop renews it by an attempt
/// at a third of this, so a waiter whose process died holds new readers off only so long.
pub(crate) const INTENT_LIFETIME: Duration = Duration::from_secs(2);

/// What to obtain: a hold of some kind on its keys.
pub(crate) struct Request {
    pub(crate) kind: Kind,
    /// The keys as stored in Redis (with the locker's prefix), none empty or repeated.
    pub(crate) keys: Vec<String>,
    /// The caller's names for the keys, when they differ.
    pub(crate) names: Option<Vec<String>>,
}

/// Obtains `request` as `options` say, with `no_quorum` as the error when too few quorum
/// nodes answer.
pub(crate) fn obtain(
    shared: &Arc<Shared>,
    request: Request,
    options: LockOptions,
    no_quorum: impl Fn() -> Error,
) -> Result<Holding> {
    let (kind, started) = (request.kind, Instant::now());
    let obtained = attempts(shared, request, options, no_quorum, started);
    let result = match &obtained {
        Ok(_) => "held",
        Err(Error::NotObtained) => "not_obtained",
        Err(_) => "error",
    };
    stats::acquired(kind, result, started);
    obtained
}

/// [`obtain`]'s attempts and waits. Over 80 lines: the one waiting loop of every
/// primitive, whose state (ticket, intent, delays, deadline) lives across its turns; the
/// server-side queue (the next issue) turns it into a few named steps.
fn attempts(
    shared: &Arc<Shared>,
    request: Request,
    options: LockOptions,
    no_quorum: impl Fn() -> Error,
    started: Instant,
) -> Result<Holding> {
    let Request { kind, keys, names } = request;
    let prefix = shared.prefix.as_str();
    let ttl_ms = checked_ttl(options.ttl.unwrap_or(shared.default_ttl))?;
    shared
        .backend
        .supports(kind, &keys, names.as_deref(), prefix, &options, ttl_ms)?;
    let replicas = (options.replicas > 0).then_some(Replicas {
        wanted: options.replicas,
        timeout: shared.replica_timeout,
    });
    let fixed_token = options.token.is_some();
    let token = match options.token {
        Some(token) => {
            checked_token(&token)?;
            token
        }
        None => random_token()?,
    };
    let owner = owner_part(&token);
    // The token ends the owner part; the metadata follows it.
    let token_at = owner.len() - token.len()..owner.len();
    let value = owner + &options.metadata;
    // A timeout too long for the clock is no deadline at all.
    let deadline = options.timeout.and_then(|t| started.checked_add(t));
    let mut delays = options.retry.delays();
    let subscriber = &shared.subscriber;
    // What a releasing guard of this locker needs to hand the lock over to us.
    let offer = Arc::new(Offer {
        kind,
        keys,
        value,
        owner_len: token_at.end,
        ttl_ms,
        fencing: options.fencing,
        fixed_token,
        replicas,
    });
    let keys = &offer.keys;
    // In line once an attempt found the keys held; at once, without an attempt, while
    // they pass between threads of this locker by hand-overs (or others have their
    // head start).
    let mut ticket: Option<Ticket<'_>> = subscriber
        .defers(&offer)
        .then(|| subscriber.wait_for(Arc::clone(&offer), Seen::default()));
    // A value of its own for each attempt after the first, where a late take-back of
    // an earlier one could otherwise delete what a later one took (random tokens only:
    // a fixed token's attempts are never taken back blindly).
    let renew = !fixed_token && shared.backend.takes_back(keys);
    // A lock that may wait records its intent where readers share a key, so that new
    // readers wait behind it; taken back if it gives up (else it expires with its TTL).
    // One that makes a single attempt (try_lock, a zero timeout) records none: it would
    // only be taken back again, waking every waiting reader.
    let waits = kind == Kind::Lock
        && options.retry.waits()
        && options.timeout.is_none_or(|timeout| !timeout.is_zero());
    let mut intent = Withdrawal {
        shared,
        keys,
        value: None,
    };
    let offer_value = offer.value.as_str();
    let mut attempt_value: Option<String> = None;
    // Set when the wait is over (timeout, retries) and this waiter, not first in line,
    // has not asked Redis since it last waited: one attempt of its own before it gives
    // up, as the first in line may be asleep for its whole retry delay.
    let mut last_try = false;
    // The end of the current retry delay: a wake-up before it gives an attempt, not a
    // retry, so `limit` and the backoff keep counting delays served.
    let mut wake_at: Option<Instant> = None;
    // Quick attempts left since a release was last heard.
    let mut quick = 0;

    let (fences, sent_at) = loop {
        let mut partial = false;
        // When what holds the keys expires, should it have died (no release will be
        // heard then); behind readers, also when the intent must be renewed.
        let mut expires_in = None;
        // Only the first in line talks to Redis; the others wait their turn.
        let first = last_try || ticket.as_ref().is_none_or(Ticket::is_first);
        // What a waiter has seen of the keys, noted before the attempt: a release heard
        // while the attempt is in flight then ends the next wait at once.
        let mut before = Seen::default();
        if first {
            match &mut ticket {
                None => before = subscriber.seen(keys),
                Some(ticket) => ticket.mark(),
            }
            if renew && ticket.is_some() {
                attempt_value = Some(random_token()? + &options.metadata);
            }
            let sent_at = Instant::now();
            // A plain SET first only where the key is likely free: on a first attempt,
            // and not while threads of ours wait for it.
            let set_first = ticket.is_none() && !subscriber.is_watched(&keys[0]);
            let attempt = Attempt {
                kind,
                keys,
                value: attempt_value.as_deref().unwrap_or(&offer.value),
                owner_len: offer.owner_len,
                ttl_ms,
                fencing: options.fencing,
                prefix,
                fixed_token,
                over: None,
                intent: waits.then_some(offer_value),
                channels: subscriber.release_channels(),
                replicas,
            };
            match shared.backend.acquire(&attempt, set_first)? {
                Acquired::Yes { fences, .. } => {
                    if let Some(ticket) = &mut ticket {
                        ticket.got_lock();
                    }
                    break (fences, sent_at);
                }
                Acquired::WrongType { key, kind: found } => {
                    // Name a lock key as the caller did; a fencing counter by its Redis
                    // name.
                    let named = keys
                        .iter()
                        .position(|k| *k == key)
                        .and_then(|i| names.as_ref().and_then(|names| names.get(i).cloned()));
                    let key = named.unwrap_or(key);
                    return Err(Error::WrongType { key, kind: found });
                }
                Acquired::OtherLimit { limit: stored } => {
                    let name = names.as_ref().and_then(|names| names.first());
                    let asked = match kind {
                        Kind::Permit { limit } => limit,
                        Kind::Lock | Kind::Read => 0,
                    };
                    return Err(Error::InvalidInput(format!(
                        "semaphore {:?} is held with a limit of {stored}, not {asked}: every \
                         user of a semaphore must give the same limit (another is accepted once \
                         no permit is held)",
                        name.unwrap_or(&keys[0])
                    )));
                }
                Acquired::HeldElsewhere => {}
                Acquired::BehindReaders { retry_in } => {
                    intent.value = Some(offer_value);
                    // Then the readers are gone, if they died; and the intent is renewed
                    // by the next attempt well before it expires.
                    let lifetime = INTENT_LIFETIME.min(Duration::from_millis(ttl_ms));
                    expires_in = Some(retry_in.min(lifetime / 3));
                }
                Acquired::Busy { retry_in } => expires_in = Some(retry_in),
                Acquired::Partial => partial = true,
                Acquired::NoQuorum => return Err(no_quorum()),
                Acquired::NotReplicated {
                    acknowledged,
                    wanted,
                } => {
                    return Err(Error::NotReplicated {
                        acknowledged,
                        wanted,
                    });
                }
            }
        }
        let now = Instant::now();
        let next = match wake_at {
            _ if deadline.is_some_and(|deadline| now >= deadline) => None,
            Some(at) if at > now => Some(at),
            _ => delays.next().map(|delay| later(now, delay)),
        };
        let Some(mut until) = next else {
            if first {
                log::debug!(
                    "redguard: {keys:?} not obtained after {:?}",
                    started.elapsed()
                );
                return Err(Error::NotObtained);
            }
            last_try = true;
            continue;
        };
        if let Some(deadline) = deadline {
            // One last attempt at the deadline itself.
            until = until.min(deadline);
        }
        wake_at = Some(until);
        if let Some(expires_in) = expires_in {
            // A holder that died frees its permit then, without any release to hear.
            until = until.min(later(now, expires_in));
        }
        if partial && quick > 0 {
            let pause = QUICK_PAUSE * (1 << (QUICK_RETRIES - quick));
            quick -= 1;
            // At a random moment, so that the woken waiters do not collide again.
            until = until.min(now + pause + delays.jitter(pause));
        }
        let ticket = ticket.get_or_insert_with(|| {
            log::debug!("redguard: {kind:?} of {keys:?} held elsewhere: waiting in line");
            subscriber.wait_for(Arc::clone(&offer), before)
        });
        let wake = ticket.wait_until(until);
        log::debug!("redguard: a waiter for {keys:?} woke: {wake:?}");
        match wake {
            Wake::Handed { fences, sent_at } => {
                stats::woken("handover");
                ticket.got_lock();
                attempt_value = None; // handed the offer's value
                break (fences, sent_at);
            }
            Wake::Released => {
                stats::woken("release");
                quick = QUICK_RETRIES;
            }
            Wake::Turn => stats::woken("turn"),
            Wake::Declined { failed } => {
                stats::woken("turn");
                // Kept past the deadline by a hand-over that could not be made: no attempt
                // now, or the call would wait out a second round trip (a frozen server).
                if deadline.is_some_and(|deadline| Instant::now() >= deadline) {
                    log::debug!("redguard: {keys:?} not obtained: a hand-over failed");
                    // Redis failed: the keys may be in this waiter's name (until its TTL),
                    // which "held elsewhere" would hide.
                    return Err(match failed {
                        true => Error::Redis(handover_failed()),
                        false => Error::NotObtained,
                    });
                }
            }
            Wake::Timeout => stats::woken("timeout"),
        }
    };
    log::debug!(
        "redguard: {kind:?} of {keys:?} taken after {:?}",
        started.elapsed()
    );
    // Taken with the keys: nothing to take back.
    intent.value = None;
    drop(intent);
    // Out of line first: the offer is then this thread's alone, and moves into the guard.
    drop(ticket);
    let Offer { keys, value, .. } = Arc::try_unwrap(offer).unwrap_or_else(|shared| Offer {
        keys: shared.keys.clone(),
        value: shared.value.clone(),
        ..*shared
    });
    // A random token of this attempt's own has the same place in the value.
    let value = attempt_value.unwrap_or(value);
    let timing = Timing::new(ttl_ms, sent_at);
    let held = Held::new(kind, keys, value, token_at, fences, timing);
    let held = held.named(names).replicated(replicas);
    Holding::new(Arc::clone(shared), held, options.auto_refresh)
}

/// What a waiter is told when Redis failed while a lock was handed over to it.
fn handover_failed() -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "redis failed while the lock was handed over to this waiter",
        "the hand-over may have run: its keys may be held in this waiter's name until \
         their TTL"
            .to_string(),
    ))
}

/// The intent a waiting lock recorded on keys that readers share, taken back (best
/// effort) when the wait ends without the lock, so that readers need not wait for it to
/// expire.
struct Withdrawal<'a> {
    shared: &'a Shared,
    keys: &'a [String],
    /// The value the intent was recorded by (the waiter's), once it was.
    value: Option<&'a str>,
}

impl Drop for Withdrawal<'_> {
    fn drop(&mut self) {
        if let Some(value) = self.value.take() {
            let channels = self.shared.subscriber.release_channels();
            let _ = self.shared.backend.withdraw(self.keys, value, channels);
        }
    }
}
