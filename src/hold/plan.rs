//! What the waiting loop (`obtain.rs`) knows before its first attempt and keeps to its
//! end: the checks, the value, the deadline, the waiter's queue entry; and how the hold it
//! gets becomes a [`Holding`].

use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::place::{Place, Waiter, millis};
use super::{Held, Holding, Kind, Lease, Timing, drift_ms, owner_part, random_token};
use crate::backend::{Acquired, Attempt, Queue, Refresh, Refreshed, Replicas};
use crate::options::{checked_token, checked_ttl};
use crate::shared::Shared;
use crate::{Error, LockOptions, Result};

/// What to obtain: a hold of some kind on its keys.
pub(crate) struct Request {
    pub(crate) kind: Kind,
    /// The keys as stored in Redis (with the locker's prefix), none empty or repeated.
    pub(crate) keys: Vec<String>,
    /// The caller's names for the keys, when they differ.
    pub(crate) names: Option<Vec<String>>,
}

/// Everything fixed for the whole wait.
pub(super) struct Plan<'a> {
    pub(super) shared: &'a Arc<Shared>,
    pub(super) kind: Kind,
    pub(super) keys: Vec<String>,
    pub(super) names: Option<Vec<String>>,
    /// The owner part, then the metadata; `token_at` is where the token is in it.
    pub(super) value: String,
    pub(super) token_at: std::ops::Range<usize>,
    pub(super) ttl_ms: u64,
    /// [`LockOptions::hold_at_least`] and [`LockOptions::max_hold`].
    at_least: Option<Duration>,
    at_most: Option<Duration>,
    pub(super) fencing: bool,
    pub(super) fixed_token: bool,
    pub(super) replicas: Option<Replicas>,
    pub(super) started: Instant,
    pub(super) deadline: Option<Instant>,
    /// Whether it waits in the server's queue (else it listens for releases).
    pub(super) queued: bool,
    /// Whether it waits at all: a single attempt (try_lock, a zero timeout) takes no
    /// place in any queue.
    pub(super) waits: bool,
    /// The waiter's queue entry (see `scripts::queue_entry`).
    pub(super) member: String,
    /// The number in it that names this wait in the word to it.
    pub(super) wait: String,
}

impl<'a> Plan<'a> {
    pub(super) fn new(
        shared: &'a Arc<Shared>,
        request: Request,
        options: &LockOptions,
        started: Instant,
    ) -> Result<Plan<'a>> {
        let Request { kind, keys, names } = request;
        let ttl_ms = checked_ttl(options.ttl.unwrap_or(shared.default_ttl))?;
        // No TTL, the first one included, may outlast the longest hold.
        let ttl_ms = match options.max_hold {
            Some(at_most) => ttl_ms.min(checked_lease(at_most, options.hold_at_least)?),
            None => ttl_ms,
        };
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
            at_least: options.hold_at_least,
            at_most: options.max_hold,
            fencing: options.fencing,
            fixed_token: options.token.is_some(),
            replicas,
            started,
            // A timeout too long for the clock is no deadline at all.
            deadline: options.timeout.and_then(|t| started.checked_add(t)),
            waits: options.retry.waits() && options.timeout.is_none_or(|t| !t.is_zero()),
            member: String::new(),
            wait: String::new(),
        };
        if plan.queued && plan.waits {
            // Unique among this process's waits: word to a waiter names it (two waiters of
            // one fixed token have the same value).
            static NEXT_WAIT: AtomicU64 = AtomicU64::new(1);
            plan.wait = NEXT_WAIT.fetch_add(1, Ordering::Relaxed).to_string();
            let channel = shared.subscriber.channel();
            plan.member =
                crate::backend::queue_entry(&plan.attempt(None, None), channel, &plan.wait);
        }
        Ok(plan)
    }

    /// Who waits, for its place in the queue.
    pub(super) fn waiter(&self) -> Waiter<'_> {
        Waiter {
            kind: self.kind,
            keys: &self.keys,
            value: &self.value,
            member: &self.member,
            wait: &self.wait,
        }
    }

    /// The request of one attempt, with `value` (else the plan's) and, with the queue,
    /// the caller's `entry` should it have to wait.
    pub(super) fn attempt<'b>(
        &'b self,
        value: Option<&'b str>,
        entry: Option<&'b str>,
    ) -> Attempt<'b> {
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

    /// A hold a script gave the waiter: it lasts what the waiter's entry had left.
    pub(super) fn handed(
        &self,
        place: &Place<'_>,
        fences: Vec<u64>,
        sent_at: Option<Instant>,
        counted: bool,
    ) -> Taken {
        Taken {
            fences,
            timing: place.claim(self.ttl_ms, sent_at),
            value: None,
            handed: true,
            counted,
        }
    }

    /// A hold taken or given to the waiter, if it is still sure to last by this process's
    /// clock; else (a short TTL, a reply or word that came late) refreshed here first:
    /// `None` when it is gone already. A caller is never handed a guard lost already.
    pub(super) fn confirmed(&self, taken: Taken) -> Result<Option<Taken>> {
        // A TTL within the drift allowance (2 ms or less) has no validity however soon its
        // reply comes: an attempt's hold is returned as it is (waiting again would never end).
        let no_validity = !taken.handed && self.ttl_ms <= drift_ms(self.ttl_ms);
        if no_validity || taken.timing.expires_at() > Instant::now() {
            return Ok(Some(taken));
        }
        let counted = taken.counted;
        let confirmed = self.refreshed(taken);
        if !matches!(confirmed, Ok(Some(_))) {
            self.uncount(counted);
        }
        confirmed
    }

    /// A hold given to this waiter that will not become its `Holding`: when it was
    /// counted among the locker's locks of its keys, the count ends here, and the threads
    /// that waited for its release ask for themselves.
    pub(super) fn uncount(&self, counted: bool) {
        if counted {
            for pending in self.shared.subscriber.joins().hold_ending(&self.keys) {
                pending.joined(None);
            }
        }
    }

    /// [`confirmed`](Self::confirmed)'s refresh of a hold whose claim ran out.
    fn refreshed(&self, taken: Taken) -> Result<Option<Taken>> {
        let hold = Refresh {
            kind: self.kind,
            entry_of: None,
            keys: &self.keys,
            // An attempt's value of its own, when it had one (see `Backend::takes_back`).
            value: taken.value.as_deref().unwrap_or(&self.value),
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
    pub(super) fn into_holding(self, taken: Taken, auto_refresh: bool) -> Result<Holding> {
        let Taken {
            fences,
            timing,
            value,
            handed,
            counted,
        } = taken;
        let (kind, ttl_ms, replicas) = (self.kind, self.ttl_ms, self.replicas);
        // A random token of this attempt's own has the same place in the value.
        let value = value.unwrap_or(self.value);
        let lease = Lease::new(
            self.at_least,
            self.at_most,
            timing.sent_at(),
            Instant::now(),
        );
        let held = Held::new(kind, self.keys, value, self.token_at, fences, timing);
        let held = held.named(self.names).replicated(replicas).leased(lease);
        let holding = Holding::new(Arc::clone(self.shared), held, auto_refresh, counted)?;
        if handed && (!auto_refresh || replicas.is_some()) {
            holding.refresh(Duration::from_millis(ttl_ms))?;
        }
        Ok(holding)
    }

    /// The error an attempt's answer (not held, not waited for) stands for; `no_quorum`
    /// when too few quorum nodes answered.
    pub(super) fn refusal(&self, acquired: Acquired, no_quorum: &impl Fn() -> Error) -> Error {
        match acquired {
            Acquired::WrongType { key, kind } => Error::WrongType {
                key: self.name_of(key),
                kind,
            },
            Acquired::OtherLimit { limit } => self.other_limit(limit),
            Acquired::NotReplicated {
                acknowledged,
                wanted,
            } => Error::NotReplicated {
                acknowledged,
                wanted,
            },
            // Held, queued or partial never come here; no quorum is what is left.
            _ => no_quorum(),
        }
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
pub(super) struct Taken {
    pub(super) fences: Vec<u64>,
    pub(super) timing: Timing,
    pub(super) value: Option<String>,
    pub(super) handed: bool,
    /// Counted among the locker's locks of its keys already (see `wait::Pending`).
    pub(super) counted: bool,
}

/// The longest hold in ms (at least 1 ms, at most [`MAX_TTL`](crate::MAX_TTL)), checked
/// against the shortest.
fn checked_lease(at_most: Duration, at_least: Option<Duration>) -> Result<u64> {
    if at_least.is_some_and(|at_least| at_least > at_most) {
        return Err(Error::InvalidInput(format!(
            "hold_at_least ({:?}) is longer than max_hold ({at_most:?})",
            at_least.unwrap_or_default()
        )));
    }
    checked_ttl(at_most).map_err(|_| {
        Error::InvalidInput(format!(
            "max_hold of {at_most:?}: it must be 1 ms to MAX_TTL (whole milliseconds)"
        ))
    })
}
