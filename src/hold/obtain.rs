//! Obtaining a hold, whatever its kind: the one waiting loop of every primitive.
//!
//! 1. [`Plan`]: the checks, the value, the deadline: everything fixed for the whole wait.
//! 2. [`attempt`]: one script call. With the server's queue, an attempt that finds the
//!    keys held (or others before it) leaves the waiter's entry in each key's queue, in
//!    the same script, and the waiter gets a [`Place`].
//! 3. [`sleep`]: until word comes (a script gave the waiter its hold: done, without a
//!    round trip; or it should ask), until what holds the keys may have expired, or until
//!    the next retry delay; without the queue, until a release is heard.
//! 4. Again from 2, until the hold is taken, the retries run out or the deadline passes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::place::{Place, Word, millis};
use super::{Held, Holding, Kind, Timing, later, owner_part, random_token};
use crate::backend::{Acquired, Attempt, Queue, Refresh, Refreshed, Replicas};
use crate::options::{checked_token, checked_ttl};
use crate::retry::Delays;
use crate::shared::Shared;
use crate::wait::{Seen, Ticket, Wake};
use crate::{Error, LockOptions, Result, stats};

/// On a quorum, a release heard from one node may not have reached the others yet: an
/// attempt right after it that finds only some nodes free ([`Acquired::Partial`]) is
/// tried again after this, doubling each time (and up to as much again, at random), up
/// to [`QUICK_RETRIES`] times per wake-up, without using up a retry: about 60 to 130 ms
/// in all, as a loaded host can hold the release's other requests up that long.
const QUICK_PAUSE: Duration = Duration::from_millis(1);
const QUICK_RETRIES: u32 = 6;

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
    let obtained = Plan::new(shared, request, &options, started)
        .and_then(|plan| plan.obtain(&options, &no_quorum));
    let result = match &obtained {
        Ok(_) => "held",
        Err(Error::NotObtained) => "not_obtained",
        Err(_) => "error",
    };
    stats::acquired(kind, result, started);
    obtained
}

/// Everything fixed for the whole wait.
struct Plan<'a> {
    shared: &'a Arc<Shared>,
    kind: Kind,
    keys: Vec<String>,
    names: Option<Vec<String>>,
    /// The owner part, then the metadata; `token_at` is where the token is in it.
    value: String,
    token_at: std::ops::Range<usize>,
    ttl_ms: u64,
    fencing: bool,
    fixed_token: bool,
    replicas: Option<Replicas>,
    started: Instant,
    deadline: Option<Instant>,
    /// Whether it waits in the server's queue (else it listens for releases).
    queued: bool,
    /// Whether it waits at all: a single attempt (try_lock, a zero timeout) takes no
    /// place in any queue.
    waits: bool,
    /// The waiter's queue entry (see `scripts::queue_entry`).
    member: String,
}

/// What changes from one attempt to the next.
struct Waiting<'b> {
    delays: Delays,
    /// The end of the current retry delay: a wake-up before it gives an attempt, not a
    /// retry, so `limit` and the backoff keep counting delays served.
    wake_at: Option<Instant>,
    /// With the queue: the waiter's place, once an attempt gave it one.
    place: Option<Place<'b>>,
    /// Without the queue: the waiter's registration for the keys' releases.
    ticket: Option<Ticket<'b>>,
    /// Without the queue: what the waiter had seen of its keys before its last attempt.
    before: Seen,
    /// On a quorum, an attempt of its own for each attempt after the first (see
    /// `Backend::takes_back`): its value.
    attempt_value: Option<String>,
    /// Quick attempts left since a release was last heard (on a quorum).
    quick: u32,
    /// When what holds the keys expires, should it have died: a queued waiter, which
    /// otherwise waits for word, attempts then.
    expires_at: Option<Instant>,
}

/// How a sleep ended.
enum Woke {
    /// A script gave the waiter its hold.
    Taken(Taken),
    /// Attempt now.
    Attempt,
    /// A retry delay passed: a queued waiter sleeps on (its place keeps its turn), one
    /// that is not attempts.
    DelayServed,
}

/// What one attempt ended in.
enum Step {
    Taken {
        fences: Vec<u64>,
        timing: Timing,
    },
    /// Not taken: what holds the keys expires in this long, should it have died (`None`:
    /// not known); `partial` on a quorum that found only some nodes free.
    Wait {
        expires_in: Option<Duration>,
        partial: bool,
    },
}

impl<'a> Plan<'a> {
    fn new(
        shared: &'a Arc<Shared>,
        request: Request,
        options: &LockOptions,
        started: Instant,
    ) -> Result<Plan<'a>> {
        let Request { kind, keys, names } = request;
        let ttl_ms = checked_ttl(options.ttl.unwrap_or(shared.default_ttl))?;
        let prefix = shared.prefix.as_str();
        shared
            .backend
            .supports(kind, &keys, names.as_deref(), prefix, options, ttl_ms)?;
        let replicas = (options.replicas > 0).then_some(Replicas {
            wanted: options.replicas,
            timeout: shared.replica_timeout,
        });
        let token = match &options.token {
            Some(token) => {
                checked_token(token)?;
                token.clone()
            }
            None => random_token()?,
        };
        let owner = owner_part(&token);
        // The token ends the owner part; the metadata follows it.
        let token_at = owner.len() - token.len()..owner.len();
        let mut plan = Plan {
            shared,
            kind,
            queued: shared.backend.queues(&keys, prefix),
            keys,
            names,
            value: owner + &options.metadata,
            token_at,
            ttl_ms,
            fencing: options.fencing,
            fixed_token: options.token.is_some(),
            replicas,
            started,
            // A timeout too long for the clock is no deadline at all.
            deadline: options.timeout.and_then(|t| started.checked_add(t)),
            waits: options.retry.waits() && options.timeout.is_none_or(|t| !t.is_zero()),
            member: String::new(),
        };
        if plan.queued && plan.waits {
            plan.member =
                crate::backend::queue_entry(&plan.attempt(None, None), shared.subscriber.channel());
        }
        Ok(plan)
    }

    /// The request of one attempt, with `value` (else the plan's) and, with the queue,
    /// the caller's `entry` should it have to wait.
    fn attempt<'b>(&'b self, value: Option<&'b str>, entry: Option<&'b str>) -> Attempt<'b> {
        Attempt {
            kind: self.kind,
            keys: &self.keys,
            value: value.unwrap_or(&self.value),
            owner_len: self.token_at.end,
            ttl_ms: self.ttl_ms,
            fencing: self.fencing,
            prefix: &self.shared.prefix,
            fixed_token: self.fixed_token,
            queue: self.queued.then(|| Queue {
                channel: self.shared.subscriber.channel(),
                entry,
                lifetime_ms: millis(self.shared.waiter_lifetime),
            }),
            channels: self.shared.announce(),
            replicas: self.replicas,
        }
    }

    /// The waiting loop, then the hold.
    fn obtain(self, options: &LockOptions, no_quorum: &impl Fn() -> Error) -> Result<Holding> {
        let taken = self.wait(options.retry.delays(), no_quorum)?;
        log::debug!(
            "redguard: {:?} of {:?} taken after {:?}",
            self.kind,
            self.keys,
            self.started.elapsed()
        );
        self.into_holding(taken, options.auto_refresh)
    }

    /// Attempt, sleep, until held, out of retries or past the deadline.
    fn wait(&self, delays: Delays, no_quorum: &impl Fn() -> Error) -> Result<Taken> {
        let mut waiting = Waiting {
            delays,
            wake_at: None,
            place: None,
            ticket: None,
            before: Seen::default(),
            attempt_value: None,
            quick: 0,
            expires_at: None,
        };
        loop {
            let (expires_in, partial) = match self.attempt_once(&mut waiting, no_quorum)? {
                Step::Taken { fences, timing } => {
                    let value = waiting.attempt_value.take();
                    return Ok(Taken {
                        fences,
                        timing,
                        value,
                        handed: false,
                    });
                }
                Step::Wait {
                    expires_in,
                    partial,
                } => (expires_in, partial),
            };
            waiting.expires_at = expires_in.map(|wait| later(Instant::now(), wait));
            loop {
                let Some(until) = self.next_wake(&mut waiting, partial) else {
                    // Out of time: a hold given to it just now is its own all the same.
                    if let Some(place) = &mut waiting.place
                        && let Some((fences, sent_at)) = place.handed_meanwhile()
                        && let Some(taken) = self.confirmed(self.handed(place, fences, sent_at))?
                    {
                        return Ok(taken);
                    }
                    log::debug!(
                        "redguard: {:?} not obtained after {:?}",
                        self.keys,
                        self.started.elapsed()
                    );
                    return Err(Error::NotObtained);
                };
                match self.sleep(&mut waiting, until) {
                    Woke::Taken(taken) => match self.confirmed(taken)? {
                        Some(taken) => return Ok(taken),
                        None => break, // gone already: its place is gone too
                    },
                    Woke::Attempt => break,
                    Woke::DelayServed => {}
                }
            }
        }
    }

    /// One attempt; with the queue, a place for the waiter when it has to wait.
    fn attempt_once<'b>(
        &'b self,
        waiting: &mut Waiting<'b>,
        no_quorum: &impl Fn() -> Error,
    ) -> Result<Step> {
        // What the waiter has seen of its keys, noted before the attempt: a release heard
        // while it is in flight then ends the next wait at once.
        match &mut waiting.ticket {
            Some(ticket) => ticket.mark(),
            None if !self.queued => waiting.before = self.shared.subscriber.seen(&self.keys),
            None => {}
        }
        let renew = self.shared.backend.takes_back(&self.keys) && !self.fixed_token;
        if renew && waiting.ticket.is_some() {
            waiting.attempt_value = Some(random_token()? + &self.value[self.token_at.end..]);
        }
        let entry = (self.waits && self.queued).then_some(self.member.as_str());
        let attempt = self.attempt(waiting.attempt_value.as_deref(), entry);
        // A plain SET first only on a first attempt, where the key is likely free, and,
        // with the queue, only for a caller that does not wait: one that does asks the
        // script at once, which finds the key free as cheaply or takes its place (a SET
        // that fails would cost a round trip more).
        let first =
            waiting.place.is_none() && waiting.ticket.is_none() && !(self.queued && self.waits);
        let sent_at = Instant::now();
        let (expires_in, partial) = match self.shared.backend.acquire(&attempt, first)? {
            Acquired::Yes { fences, .. } => {
                if let Some(place) = &mut waiting.place {
                    place.served();
                }
                let timing = Timing::new(self.ttl_ms, sent_at);
                return Ok(Step::Taken { fences, timing });
            }
            // No timer: the waiter's renewals find the keys free should what holds them
            // die (see `lua/refresh.lua`), and have it ask.
            Acquired::Queued { handed, .. } => {
                self.shared.subscriber.handed(handed, sent_at);
                (None, false)
            }
            Acquired::HeldElsewhere => (None, false),
            Acquired::Partial => (None, true),
            Acquired::WrongType { key, kind } => {
                return Err(Error::WrongType {
                    key: self.name_of(key),
                    kind,
                });
            }
            Acquired::OtherLimit { limit } => return Err(self.other_limit(limit)),
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
        };
        if let Some(entry) = entry {
            match &mut waiting.place {
                Some(place) => place.requeued(sent_at)?,
                None => {
                    log::debug!("redguard: {:?} of {:?} held: queued", self.kind, self.keys);
                    let place = Place::new(
                        self.shared,
                        self.kind,
                        &self.keys,
                        &self.value,
                        entry,
                        sent_at,
                    )?;
                    waiting.place = Some(place);
                }
            }
        }
        Ok(Step::Wait {
            expires_in,
            partial,
        })
    }

    /// When to wake at the latest: at the end of the current retry delay (the next one if
    /// it is over), at the deadline, when what holds the keys expires should it have died,
    /// and soon after a quorum found only some nodes free. `None`: the wait is over.
    fn next_wake(&self, waiting: &mut Waiting<'_>, partial: bool) -> Option<Instant> {
        if !self.waits {
            return None;
        }
        let now = Instant::now();
        let mut until = match waiting.wake_at {
            _ if self.deadline.is_some_and(|deadline| now >= deadline) => return None,
            Some(at) if at > now => at,
            _ => later(now, waiting.delays.next()?),
        };
        if let Some(deadline) = self.deadline {
            until = until.min(deadline); // one last attempt at the deadline itself
        }
        waiting.wake_at = Some(until);
        if let Some(expires_at) = waiting.expires_at {
            until = until.min(expires_at.max(now));
        }
        if partial && waiting.quick > 0 {
            let pause = QUICK_PAUSE * (1 << (QUICK_RETRIES - waiting.quick));
            waiting.quick -= 1;
            // At a random moment, so that the woken waiters do not collide again.
            until = until.min(now + pause + waiting.delays.jitter(pause));
        }
        Some(until)
    }

    /// Sleeps until `until` or until woken.
    fn sleep<'b>(&'b self, waiting: &mut Waiting<'b>, until: Instant) -> Woke {
        if let Some(place) = &mut waiting.place {
            return match place.wait_until(until) {
                Word::Handed(fences, sent_at) => {
                    stats::woken("handover");
                    Woke::Taken(self.handed(place, fences, sent_at))
                }
                Word::Attempt => {
                    stats::woken("turn");
                    Woke::Attempt
                }
                // What held the keys may have died: its expiry frees them, and no release
                // serves the queue then.
                Word::Timeout if waiting.expires_at.is_some_and(|at| Instant::now() >= at) => {
                    stats::woken("timeout");
                    Woke::Attempt
                }
                Word::Timeout => {
                    stats::woken("timeout");
                    Woke::DelayServed
                }
            };
        }
        let before = waiting.before;
        let ticket = waiting
            .ticket
            .get_or_insert_with(|| self.shared.subscriber.watch(&self.keys, before));
        match ticket.wait_until(until) {
            Wake::Released => {
                stats::woken("release");
                waiting.quick = QUICK_RETRIES;
            }
            Wake::Subscribed => stats::woken("turn"),
            Wake::Timeout => stats::woken("timeout"),
        }
        Woke::Attempt
    }

    /// A hold a script gave the waiter: it lasts what the waiter's entry had left.
    fn handed(&self, place: &Place<'_>, fences: Vec<u64>, sent_at: Option<Instant>) -> Taken {
        Taken {
            fences,
            timing: place.claim(self.ttl_ms, sent_at),
            value: None,
            handed: true,
        }
    }

    /// A hold a script gave the waiter, if it is still sure to last by this process's
    /// clock; else (a short TTL, a waiter that heard late) refreshed here first: `None`
    /// when it is gone already.
    fn confirmed(&self, taken: Taken) -> Result<Option<Taken>> {
        if !taken.handed || taken.timing.expires_at() > Instant::now() {
            return Ok(Some(taken));
        }
        let hold = Refresh {
            kind: self.kind,
            entry_of: None,
            keys: &self.keys,
            value: &self.value,
            ttl_ms: self.ttl_ms,
            replicas: self.replicas,
        };
        match self.shared.backend.refresh(std::slice::from_ref(&hold))?[..] {
            [Refreshed::Held { sent_at }] => Ok(Some(Taken {
                timing: Timing::new(self.ttl_ms, sent_at),
                handed: false,
                ..taken
            })),
            [
                Refreshed::NotReplicated {
                    acknowledged,
                    wanted,
                },
            ] => Err(Error::NotReplicated {
                acknowledged,
                wanted,
            }),
            [Refreshed::Lost] => Ok(None),
            _ => Err(Error::Redis(self.shared.backend.undecided())),
        }
    }

    /// The hold, refreshed from here on (when it is auto-refreshed). One given by a script
    /// has only what the waiter's entry had left: without auto-refresh, or with replicas
    /// to wait for, it is refreshed to its TTL here, at once.
    fn into_holding(self, taken: Taken, auto_refresh: bool) -> Result<Holding> {
        let Taken {
            fences,
            timing,
            value,
            handed,
        } = taken;
        let (kind, ttl_ms, replicas) = (self.kind, self.ttl_ms, self.replicas);
        // A random token of this attempt's own has the same place in the value.
        let value = value.unwrap_or(self.value);
        let held = Held::new(kind, self.keys, value, self.token_at, fences, timing);
        let held = held.named(self.names).replicated(replicas);
        let holding = Holding::new(Arc::clone(self.shared), held, auto_refresh)?;
        if handed && (!auto_refresh || replicas.is_some()) {
            holding.refresh(Duration::from_millis(ttl_ms))?;
        }
        Ok(holding)
    }

    /// A key as the caller named it (a fencing counter by its Redis name).
    fn name_of(&self, key: String) -> String {
        let named = self.keys.iter().position(|k| *k == key);
        let names = self.names.as_ref();
        named
            .and_then(|i| names.and_then(|names| names.get(i).cloned()))
            .unwrap_or(key)
    }

    fn other_limit(&self, stored: u32) -> Error {
        let name = self.names.as_ref().and_then(|names| names.first());
        let asked = match self.kind {
            Kind::Permit { limit } => limit,
            Kind::Lock | Kind::Read => 0,
        };
        Error::InvalidInput(format!(
            "semaphore {:?} is held with a limit of {stored}, not {asked}: every user of a \
             semaphore must give the same limit (another is accepted once no permit is held)",
            name.unwrap_or(&self.keys[0])
        ))
    }
}

/// A hold taken: by an attempt (`value` when the attempt had a value of its own), or given
/// by a script (`handed`).
struct Taken {
    fences: Vec<u64>,
    timing: Timing,
    value: Option<String>,
    handed: bool,
}
