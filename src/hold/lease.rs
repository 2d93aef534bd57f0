//! A hold's lease policies ([`LockOptions::hold_at_least`] and [`LockOptions::max_hold`]):
//! how long a release keeps it held at least, and how long the refresher may keep it at
//! most.
//!
//! [`LockOptions::hold_at_least`]: crate::LockOptions::hold_at_least
//! [`LockOptions::max_hold`]: crate::LockOptions::max_hold

use std::time::{Duration, Instant};

use super::later;

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Lease {
    /// A release before this leaves the hold to expire then (counted from when the waiter
    /// had it: never sooner than the option asked).
    pub(crate) at_least_until: Option<Instant>,
    /// No refresh sets an expiry past this (counted from when the script that gave the
    /// hold was sent: never later than the option allows).
    pub(crate) at_most_until: Option<Instant>,
}

impl Lease {
    /// The policies of a hold obtained by a request sent at `sent_at` and had by the waiter
    /// at `had_at`.
    pub(crate) fn new(
        at_least: Option<Duration>,
        at_most: Option<Duration>,
        sent_at: Instant,
        had_at: Instant,
    ) -> Lease {
        Lease {
            at_least_until: at_least.map(|d| later(had_at, d)),
            at_most_until: at_most.map(|d| later(sent_at, d)),
        }
    }

    /// The TTL a refresh sent at `now` may set: `ttl_ms`, or what is left of the longest
    /// hold when that is shorter (0: none is left).
    pub(crate) fn capped_ms(&self, ttl_ms: u64, now: Instant) -> u64 {
        match self.at_most_until {
            Some(until) => ttl_ms.min(millis(until.saturating_duration_since(now))),
            None => ttl_ms,
        }
    }

    /// How long a release at `now` must leave the hold held still; `None` when it may go
    /// (less than a millisecond left, the smallest TTL).
    pub(crate) fn kept_after_release(&self, now: Instant) -> Option<u64> {
        let left = millis(self.at_least_until?.saturating_duration_since(now));
        (left >= 1).then_some(left)
    }
}

fn millis(d: Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn a_refresh_never_sets_an_expiry_past_the_longest_hold() {
        let start = Instant::now();
        let lease = Lease::new(None, Some(1000 * MS), start, start);
        assert_eq!(lease.capped_ms(300, start), 300);
        assert_eq!(lease.capped_ms(300, start + 800 * MS), 200);
        assert_eq!(lease.capped_ms(300, start + 1000 * MS), 0);
        assert_eq!(Lease::default().capped_ms(300, start), 300);
    }

    #[test]
    fn a_release_before_the_shortest_hold_keeps_it_for_what_is_left() {
        let start = Instant::now();
        let lease = Lease::new(Some(500 * MS), None, start, start + 10 * MS);
        assert_eq!(lease.kept_after_release(start + 110 * MS), Some(400));
        assert_eq!(lease.kept_after_release(start + 510 * MS), None);
        assert_eq!(Lease::default().kept_after_release(start), None);
    }
}
