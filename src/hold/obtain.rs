//! Obtaining a hold, whatever its kind: the one waiting loop of every primitive.
//!
//! 1. `Plan` (in `plan.rs`): the checks, the value, the deadline: everything fixed for the
//!    whole wait.
//! 2. `attempt_once`: one script call. With the server's queue, an attempt that finds the
//!    keys held (or others before it) leaves the waiter's entry in each key's queue, in
//!    the same script, and the waiter gets a `Place` (in `place.rs`).
//! 3. `sleep`: until word comes (a script gave the waiter its hold: done, without a
//!    round trip; or it should ask), or until the deadline (a queued waiter sleeps on
//!    through its retry delays: its place keeps its turn); without the queue, until a
//!    release is heard or the next retry delay is over.
//! 4. Again from 2, until the hold is taken, the retries run out or the deadline passes.

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::place::{Place, Word, millis};
use super::plan::{Plan, Request, Taken};
use super::{Holding, Kind, Timing, later, random_token};
use crate::backend::Acquired;
use crate::retry::Delays;
use crate::shared::Shared;
use crate::wait::{Letter, Mailbox, Seen, Ticket, Wake};
use crate::{Error, LockOptions, Result, stats};

/// On a quorum, a release heard from one node may not have reached the others yet: an
/// attempt right after it that finds only some nodes free ([`Acquired::Partial`]) is
/// tried again after this, doubling each time (and up to as much again, at random), up
/// to [`QUICK_RETRIES`] times per wake-up, without using up a retry: about 60 to 130 ms
/// in all, as a loaded host can hold the release's other requests up that long.
const QUICK_PAUSE: Duration = Duration::from_millis(1);
const QUICK_RETRIES: u32 = 6;

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
}

/// How long a waiter that asks for keys another thread of its locker holds waits for that
/// thread's release to let it into the queue, before it asks for itself.
const JOIN_WAIT: Duration = Duration::from_millis(5);

/// How long a waiter taken by a release in flight waits for that release's word before it
/// asks for itself: longer than a release takes within the default timeouts.
const RELEASE_IN_FLIGHT: Duration = Duration::from_secs(5);

/// How a wait for this locker's own release ended (see `Plan::join_by_release`).
enum Joined<'b> {
    /// The release gave the waiter the keys.
    Taken(Taken),
    /// The release put the waiter in the queue.
    Queued(Place<'b>),
    /// The waiter asks for itself.
    Ask,
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
    /// Not taken; `partial` on a quorum that found only some nodes free.
    Wait {
        partial: bool,
    },
}

impl Plan<'_> {
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
        };
        // A lock of this locker on these keys lets this waiter in by its release.
        let mut ask = match self.join_by_release()? {
            Joined::Taken(taken) => match self.confirmed(taken)? {
                Some(taken) => return Ok(taken),
                None => true,
            },
            Joined::Queued(place) => {
                waiting.place = Some(place);
                false
            }
            Joined::Ask => true,
        };
        loop {
            let step = match ask {
                true => self.attempt_once(&mut waiting, no_quorum)?,
                false => Step::Wait { partial: false },
            };
            ask = true;
            let partial = match step {
                Step::Taken { fences, timing } => {
                    let value = waiting.attempt_value.take();
                    return Ok(Taken {
                        fences,
                        timing,
                        value,
                        handed: false,
                        counted: false,
                    });
                }
                Step::Wait { partial } => partial,
            };
            loop {
                let Some(until) = self.next_wake(&mut waiting, partial) else {
                    // Out of time: a hold given to it just now is its own all the same.
                    if let Some(place) = &mut waiting.place
                        && let Some((fences, sent_at, counted)) = place.handed_meanwhile()
                        && let Some(taken) =
                            self.confirmed(self.handed(place, fences, sent_at, counted))?
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
                match self.sleep(&mut waiting, until)? {
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
        let partial = match self.shared.backend.acquire(&attempt, first)? {
            Acquired::Yes { fences, .. } => {
                if let Some(place) = &mut waiting.place {
                    place.served();
                }
                let timing = Timing::new(self.ttl_ms, sent_at);
                return Ok(Step::Taken { fences, timing });
            }
            // No timer for what holds the keys to die: the waiter's renewals find them
            // free then (see `lua/refresh.lua`), and have it ask.
            Acquired::Queued { handed } => {
                self.shared.subscriber.handed(handed, sent_at);
                false
            }
            Acquired::HeldElsewhere => false,
            Acquired::Partial => true,
            refused => return Err(self.refusal(refused, no_quorum)),
        };
        if entry.is_some() {
            match &mut waiting.place {
                Some(place) => place.requeued(sent_at)?,
                None => {
                    log::debug!("redguard: {:?} of {:?} held: queued", self.kind, self.keys);
                    let place = Place::new(self.shared, self.waiter(), sent_at, None)?;
                    waiting.place = Some(place);
                }
            }
        }
        Ok(Step::Wait { partial })
    }

    /// With a lock of this locker on exactly these keys, the waiter's entry is left for its
    /// release, which puts it at the back of the queue (or gives it the keys) in its own
    /// script: no round trip of the waiter's. [`Joined::Ask`] when there is no such lock,
    /// or none released within [`JOIN_WAIT`] (the waiter then asks, as a newcomer).
    fn join_by_release(&self) -> Result<Joined<'_>> {
        if !(self.queued && self.waits && self.kind == Kind::Lock) {
            return Ok(Joined::Ask);
        }
        let subscriber = &self.shared.subscriber;
        let mailbox = Arc::new(Mailbox::new(Some(&self.keys)));
        // Any release that puts the entry in the queue runs after this.
        let deferred_at = Instant::now();
        if !subscriber.joins().defer(&self.keys, &self.member, &mailbox) {
            return Ok(Joined::Ask);
        }
        // Word of a hand-over that came before this waits for it (see `Board::deliver`).
        let enrolment = subscriber.enrol_mailbox(&self.wait, mailbox);
        let mut until = later(deferred_at, JOIN_WAIT);
        let mut in_flight = false;
        if let Some(deadline) = self.deadline {
            until = until.min(deadline);
        }
        loop {
            match enrolment.mailbox.wait_until(until) {
                Some(Letter::Handed {
                    fences,
                    sent_at: _,
                    counted,
                }) => {
                    // Given what its new place had: the lifetime from when the release that
                    // queued it ran (after `deferred_at`; this word may be a later one's),
                    // at most the TTL.
                    let from = deferred_at;
                    let claim = millis(self.shared.waiter_lifetime).min(self.ttl_ms);
                    let timing = Timing::claimed(self.ttl_ms, from, claim);
                    let (value, handed) = (None, true);
                    return Ok(Joined::Taken(Taken {
                        fences,
                        timing,
                        value,
                        handed,
                        counted,
                    }));
                }
                Some(Letter::Queued { sent_at }) => {
                    let enrolment = Some(enrolment);
                    let place = Place::new(self.shared, self.waiter(), sent_at, enrolment)?;
                    return Ok(Joined::Queued(place));
                }
                letter @ (Some(Letter::Attempt) | None) => {
                    // Taken back, or told by the release that took it that it failed:
                    // the waiter asks for itself.
                    let withdrawn = subscriber.joins().withdraw(&self.keys, &self.member);
                    if withdrawn || letter.is_some() || in_flight {
                        return Ok(Joined::Ask);
                    }
                    // Taken by a release in flight: its word comes when its call ends
                    // (bounded by the pool's timeouts; past that, the waiter asks: its
                    // attempt finds its place, or the keys its own).
                    in_flight = true;
                    until = later(Instant::now(), RELEASE_IN_FLIGHT);
                    if let Some(deadline) = self.deadline {
                        until = until.min(deadline.max(Instant::now()));
                    }
                }
            }
        }
    }

    /// When to wake at the latest: at the end of the current retry delay (the next one if
    /// it is over), at the deadline, and soon after a quorum found only some nodes free.
    /// `None`: the wait is over.
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
        if partial && waiting.quick > 0 {
            let pause = QUICK_PAUSE * (1 << (QUICK_RETRIES - waiting.quick));
            waiting.quick -= 1;
            // At a random moment, so that the woken waiters do not collide again.
            until = until.min(now + pause + waiting.delays.jitter(pause));
        }
        Some(until)
    }

    /// Sleeps until `until` or until woken.
    fn sleep<'b>(&'b self, waiting: &mut Waiting<'b>, until: Instant) -> Result<Woke> {
        if let Some(place) = &mut waiting.place {
            return Ok(match place.wait_until(until)? {
                Word::Handed(fences, sent_at, counted) => {
                    stats::woken("handover");
                    Woke::Taken(self.handed(place, fences, sent_at, counted))
                }
                Word::Attempt => {
                    stats::woken("turn");
                    Woke::Attempt
                }
                Word::Timeout => {
                    stats::woken("timeout");
                    Woke::DelayServed
                }
            });
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
        Ok(Woke::Attempt)
    }
}
