//! A waiter that asks for keys a lock of its own locker holds: it leaves its queue entry
//! for that lock's release, which puts it at the back of the server's queue (or gives it
//! the keys) in its own script, with no round trip of the waiter's (see `wait::Pending`).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::place::{Place, millis};
use super::plan::{Plan, Taken};
use super::{Kind, Timing, later};
use crate::Result;
use crate::wait::{Letter, Mailbox, Sleeper, Stop};

/// How long a waiter that asks for keys another thread of its locker holds waits for that
/// thread's release to let it into the queue, before it asks for itself.
const JOIN_WAIT: Duration = Duration::from_millis(5);

/// How long a waiter taken by a release in flight waits for that release's word before it
/// asks for itself: longer than a release takes within the default timeouts.
const RELEASE_IN_FLIGHT: Duration = Duration::from_secs(5);

/// How a wait for this locker's own release ended (see `Plan::join_by_release`).
pub(super) enum Joined<'b> {
    /// The release gave the waiter the keys.
    Taken(Taken),
    /// The release put the waiter in the queue.
    Queued(Place<'b>),
    /// The waiter asks for itself.
    Ask,
}

impl Plan<'_> {
    /// With a lock of this locker on exactly these keys, the waiter's entry is left for its
    /// release, which puts it at the back of the queue (or gives it the keys) in its own
    /// script: no round trip of the waiter's. [`Joined::Ask`] when there is no such lock,
    /// or none released within [`JOIN_WAIT`] (the waiter then asks, as a newcomer), or
    /// when `stop` was set first.
    pub(super) fn join_by_release(&self, stop: Stop<'_>) -> Result<Joined<'_>> {
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
        let _listening = stop.listen(Sleeper::mailbox(&enrolment.mailbox));
        let mut until = later(deferred_at, JOIN_WAIT);
        let mut in_flight = false;
        if let Some(deadline) = self.deadline {
            until = until.min(deadline);
        }
        loop {
            // Once a release in flight took the entry, its word is awaited even when
            // stopped: the waiter must learn whether it has a place to take out, or a
            // hold to pass on.
            let stop = if in_flight { Stop::never() } else { stop };
            match enrolment.mailbox.wait_until(until, stop) {
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
}
