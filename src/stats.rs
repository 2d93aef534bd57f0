//! What a locker counts, through the [`metrics`](https://docs.rs/metrics) facade, with the
//! `metrics` feature; without it, nothing (every function here is empty). Labels name the
//! kind of hold and the outcome, never a key: one series per kind, however many keys.
//!
//! | name | type | labels |
//! |---|---|---|
//! | `redguard_acquisitions_total` | counter | `kind` (lock, read, permit), `result` (held, not_obtained, cancelled, error) |
//! | `redguard_wait_seconds` | histogram | `kind`: from the call to the hold taken |
//! | `redguard_hold_seconds` | histogram | `kind`: from taken to given up |
//! | `redguard_lost_total` | counter | `kind`: holds the refresher found lost |
//! | `redguard_refreshes_total` | counter | `result` (held, lost, unknown): one per hold refreshed |
//! | `redguard_refresh_round_trip_seconds` | histogram | one per refresh round trip |
//! | `redguard_holds` | gauge | holds (guards, read guards, permits) alive |
//! | `redguard_waiting` | gauge | threads waiting (in a queue, or for a release) |
//! | `redguard_wakeups_total` | counter | `source` (release, handover, turn, timeout) |

use std::time::{Duration, Instant};

use crate::hold::Kind;

#[cfg(feature = "metrics")]
fn kind_label(kind: Kind) -> &'static str {
    match kind {
        Kind::Lock => "lock",
        Kind::Read => "read",
        Kind::Permit { .. } => "permit",
    }
}

/// An acquisition begun at `started` ended: `result` is `held`, `not_obtained`,
/// `cancelled` or `error`.
/// (Instants, not durations: without the feature, no clock is read.)
pub(crate) fn acquired(kind: Kind, result: &'static str, started: Instant) {
    #[cfg(feature = "metrics")]
    {
        let waited = started.elapsed();
        let kind = kind_label(kind);
        metrics::counter!("redguard_acquisitions_total", "kind" => kind, "result" => result)
            .increment(1);
        if result == "held" {
            metrics::histogram!("redguard_wait_seconds", "kind" => kind)
                .record(waited.as_secs_f64());
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, result, started);
}

/// A hold began (a guard, read guard or permit now exists).
pub(crate) fn hold_began() {
    #[cfg(feature = "metrics")]
    metrics::gauge!("redguard_holds").increment(1.0);
}

/// A hold taken at `taken_at` ended.
pub(crate) fn hold_ended(kind: Kind, taken_at: Instant) {
    #[cfg(feature = "metrics")]
    {
        let held_for = taken_at.elapsed();
        metrics::gauge!("redguard_holds").decrement(1.0);
        metrics::histogram!("redguard_hold_seconds", "kind" => kind_label(kind))
            .record(held_for.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (kind, taken_at);
}

/// The refresher found a hold lost.
pub(crate) fn lost(kind: Kind) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redguard_lost_total", "kind" => kind_label(kind)).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = kind;
}

/// A refresh round trip of `round_trip` ended with these counts of holds.
pub(crate) fn refreshed(held: u64, lost: u64, unknown: u64, round_trip: Duration) {
    #[cfg(feature = "metrics")]
    {
        for (result, n) in [("held", held), ("lost", lost), ("unknown", unknown)] {
            if n > 0 {
                metrics::counter!("redguard_refreshes_total", "result" => result).increment(n);
            }
        }
        metrics::histogram!("redguard_refresh_round_trip_seconds").record(round_trip.as_secs_f64());
    }
    #[cfg(not(feature = "metrics"))]
    let _ = (held, lost, unknown, round_trip);
}

/// A thread began to wait (`true`) or stopped.
pub(crate) fn waiting(joined: bool) {
    #[cfg(feature = "metrics")]
    {
        let gauge = metrics::gauge!("redguard_waiting");
        if joined {
            gauge.increment(1.0);
        } else {
            gauge.decrement(1.0);
        }
    }
    #[cfg(not(feature = "metrics"))]
    let _ = joined;
}

/// A wait ended: `source` is `release`, `handover`, `turn` or `timeout`.
pub(crate) fn woken(source: &'static str) {
    #[cfg(feature = "metrics")]
    metrics::counter!("redguard_wakeups_total", "source" => source).increment(1);
    #[cfg(not(feature = "metrics"))]
    let _ = source;
}
