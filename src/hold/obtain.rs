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
//!
//! A wait whose `Cancel` is cancelled, or whose locker is closed, ends too: before any
//! round trip if it was so from the start; else at once from its sleep (the alarm wakes
//! it, see `wait::Stop`), or as soon as its round trip in flight is answered. Leaving
//! drops its place, whose script takes the entry out and passes on a hold handed to it
//! meanwhile; a hold it got as the cancel came is given up (`give_up.rs`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::join::Joined;
use super::place::{Place, Word};
use super::plan::{Plan, Request, Taken};
use super::{Holding, Timing, later, random_token};
use crate::backend::Acquired;
use crate::retry::Delays;
use crate::shared::Shared;
use crate::wait::{Seen, Sleeper, Stop, Ticket, Wake};
use crate::{Cancel, Error, LockOptions, Result, stats};

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
    let stop = Stop::new(&shared.closed, options.cancel.as_ref().map(Cancel::alarm));
    // Cancelled (or closed) before it starts: at once, before any round trip.
    let obtained = match stop.is_set() {
        true => Err(Error::Cancelled),
        false => Plan::new(shared, request, &options, started)
            .and_then(|plan| plan.obtain(&options, stop, &no_quorum)),
    };
    let result = match &obtained {
        Ok(_) => "held",
        Err(Error::NotObtained) => "not_obtained",
        Err(Error::Cancelled) => "cancelled",
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
    /// What ends the wait early: its `Cancel`, its locker's close.
    stop: Stop<'b>,
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
    /// Its `Cancel` was cancelled, or its locker closed.
    Stopped,
}

/// What one attempt ended in.
enum Step {
    Taken {
        fences: Vec<u64>,
        timing: Timing,
        /// Not a fixed token's re-obtain of what it held already.
        fresh: bool,
    },
    /// Not taken; `partial` on a quorum that found only some nodes free.
    Wait { partial: bool },
}

impl Plan<'_> {
    /// The waiting loop, then the hold.
    fn obtain(
        self,
        options: &LockOptions,
        stop: Stop<'_>,
        no_quorum: &impl Fn() -> Error,
    ) -> Result<Holding> {
        let (taken, fresh) = self.wait(options.retry.delays(), stop, no_quorum)?;
        // A hold got as the cancel came (a hand-over that raced it) is passed on.
        let taken = self.kept(taken, fresh, stop)?;
        log::debug!(
            "redguard: {:?} of {:?} taken after {:?}",
            self.kind,
            self.keys,
            self.started.elapsed()
        );
        self.into_holding(taken, options.auto_refresh)
    }

    /// Attempt, sleep, until held (and whether `fresh`), out of retries, past the
    /// deadline or stopped.
    fn wait<'b>(
        &'b self,
        delays: Delays,
        stop: Stop<'b>,
        no_quorum: &impl Fn() -> Error,
    ) -> Result<(Taken, bool)> {
        let mut waiting = Waiting {
            delays,
            wake_at: None,
            place: None,
            ticket: None,
            before: Seen::default(),
            attempt_value: None,
            quick: 0,
            stop,
        };
        // A lock of this locker on these keys lets this waiter in by its release.
        let mut ask = match self.join_by_release(stop)? {
            Joined::Taken(taken) => match self.confirmed(taken)? {
                Some(taken) => return Ok((taken, true)),
                None => true,
            },
            Joined::Queued(place) => {
                waiting.place = Some(place);
                false
            }
            Joined::Ask => true,
        };
        loop {
            // Leaving drops the place (its script takes the entry out) and the ticket.
            if stop.is_set() {
                return Err(Error::Cancelled);
            }
            let step = match ask {
                true => self.attempt_once(&mut waiting, no_quorum)?,
                false => Step::Wait { partial: false },
            };
            ask = true;
            let partial = match step {
                Step::Taken {
                    fences,
                    timing,
                    fresh,
                } => {
                    let value = waiting.attempt_value.take();
                    let taken = Taken {
                        fences,
                        timing,
                        value,
                        handed: false,
                        counted: false,
                    };
                    // A reply that came after the TTL ran out (by this clock): kept only
                    // if a refresh finds it still ours, else this waits again.
                    match self.confirmed(taken)? {
                        Some(taken) => return Ok((taken, fresh)),
                        None => false,
                    }
                }
                Step::Wait { partial } => partial,
            };
            loop {
                let Some(until) = self.next_wake(&mut waiting, partial) else {
                    return self.out_of_time(&mut waiting);
                };
                match self.sleep(&mut waiting, until)? {
                    Woke::Taken(taken) => match self.confirmed(taken)? {
                        Some(taken) => return Ok((taken, true)),
                        None => break, // gone already: its place is gone too
                    },
                    Woke::Attempt | Woke::Stopped => break,
                    Woke::DelayServed => {}
                }
            }
        }
    }

    /// The end of a wait out of retries or past its deadline: [`Error::NotObtained`],
    /// unless a hold was given to it just now (then it is its own all the same).
    fn out_of_time(&self, waiting: &mut Waiting<'_>) -> Result<(Taken, bool)> {
        if let Some(place) = &mut waiting.place
            && let Some((fences, sent_at, counted)) = place.handed_meanwhile()
            && let Some(taken) = self.confirmed(self.handed(place, fences, sent_at, counted))?
        {
            return Ok((taken, true));
        }
        log::debug!(
            "redguard: {:?} not obtained after {:?}",
            self.keys,
            self.started.elapsed()
        );
        Err(Error::NotObtained)
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
            Acquired::Yes { fences, fresh } => {
                if let Some(place) = &mut waiting.place {
                    place.served();
                }
                let timing = Timing::new(self.ttl_ms, sent_at);
                return Ok(Step::Taken {
                    fences,
                    timing,
                    fresh,
                });
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

    /// Sleeps until `until` or until woken (by word, a release, or its `Stop`).
    fn sleep<'b>(&'b self, waiting: &mut Waiting<'b>, until: Instant) -> Result<Woke> {
        let stop = waiting.stop;
        if let Some(place) = &mut waiting.place {
            let _listening = stop.listen(Sleeper::mailbox(place.mailbox()));
            return Ok(match place.wait_until(until, stop)? {
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
                Word::Stopped => Woke::Stopped,
            });
        }
        let before = waiting.before;
        let ticket = waiting
            .ticket
            .get_or_insert_with(|| self.shared.subscriber.watch(&self.keys, before));
        let _listening = stop.listen(self.shared.subscriber.sleeper(ticket));
        match ticket.wait_until(until, stop) {
            Wake::Released => {
                stats::woken("release");
                waiting.quick = QUICK_RETRIES;
            }
            Wake::Subscribed => stats::woken("turn"),
            Wake::Timeout => stats::woken("timeout"),
            Wake::Stopped => return Ok(Woke::Stopped),
        }
        Ok(Woke::Attempt)
    }
}
