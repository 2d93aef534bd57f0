use std::hash::{BuildHasher, Hasher};
use std::time::Duration;

/// How long to wait between attempts to obtain a lock that is held elsewhere.
///
/// A `Retry` is an immutable, `Copy` description; every acquisition builds a fresh
/// sequence of delays from it with [`Retry::delays`], so no state is shared between
/// threads. Only "held elsewhere" is retried: a Redis error ends the attempt at once.
///
/// ```
/// use std::time::Duration;
/// use redguard::Retry;
///
/// let retry = Retry::linear(Duration::from_millis(50)).limit(3);
/// let delays: Vec<_> = retry.delays().collect();
/// assert_eq!(delays, vec![Duration::from_millis(50); 3]);
/// ```
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Retry {
    kind: Kind,
    limit: Option<u32>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Kind {
    None,
    Linear(Duration),
    Exponential { min: Duration, max: Duration },
}

impl Retry {
    /// One attempt only: never wait.
    pub fn none() -> Self {
        Retry {
            kind: Kind::None,
            limit: None,
        }
    }

    /// Whether an attempt that finds the keys held may be followed by another.
    pub(crate) fn waits(&self) -> bool {
        self.kind != Kind::None && self.limit != Some(0)
    }

    /// Wait the same `interval` before every retry.
    pub fn linear(interval: Duration) -> Self {
        Retry {
            kind: Kind::Linear(interval),
            limit: None,
        }
    }

    /// Wait `min`, then twice as long each time up to `max`, each delay drawn at random
    /// from the upper half of that step (jitter, so that waiters do not retry in lockstep).
    /// A `min` under 1 ms is taken as 1 ms (from zero it could never grow), a `max` below
    /// `min` as `min`.
    pub fn exponential(min: Duration, max: Duration) -> Self {
        let min = min.max(Duration::from_millis(1));
        Retry {
            kind: Kind::Exponential {
                min,
                max: max.max(min),
            },
            limit: None,
        }
    }

    /// Retry at most `retries` times after the first attempt.
    pub fn limit(self, retries: u32) -> Self {
        Retry {
            limit: Some(retries),
            ..self
        }
    }

    /// A fresh sequence of delays: the wait before the 1st retry, the 2nd, and so on.
    /// It ends when no more retries are allowed.
    pub fn delays(&self) -> Delays {
        Delays {
            retry: *self,
            retries: 0,
            rng: seed(),
        }
    }
}

/// Exponential backoff in steps from 2 ms up to 100 ms (the first delay 1-2 ms), without a
/// limit: what [`Locker::lock`] uses.
///
/// [`Locker::lock`]: crate::Locker::lock
impl Default for Retry {
    fn default() -> Self {
        Retry::exponential(Duration::from_millis(2), Duration::from_millis(100))
    }
}

/// The delays of one acquisition, built by [`Retry::delays`].
#[derive(Debug)]
pub struct Delays {
    retry: Retry,
    retries: u32,
    rng: u64,
}

impl Iterator for Delays {
    type Item = Duration;

    fn next(&mut self) -> Option<Duration> {
        if self.retry.limit.is_some_and(|limit| self.retries >= limit) {
            return None;
        }
        let delay = match self.retry.kind {
            Kind::None => return None,
            Kind::Linear(interval) => interval,
            Kind::Exponential { min, max } => {
                let step = min.saturating_mul(1 << self.retries.min(31)).min(max);
                let half = step / 2;
                half + half.mul_f64(self.next_unit())
            }
        };
        self.retries = self.retries.saturating_add(1);
        Some(delay)
    }
}

impl Delays {
    /// A random wait up to `max`, for spreading out attempts that collided.
    pub(crate) fn jitter(&mut self, max: Duration) -> Duration {
        max.mul_f64(self.next_unit())
    }

    /// A number in [0, 1) from xorshift64*: jitter needs spread, not secrecy.
    fn next_unit(&mut self) -> f64 {
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let x = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d);
        (x >> 11) as f64 / (1u64 << 53) as f64
    }
}

/// A per-sequence seed from std's randomly keyed hasher; never zero (xorshift's fixed point).
fn seed() -> u64 {
    std::collections::hash_map::RandomState::new()
        .build_hasher()
        .finish()
        | 1
}

#[cfg(test)]
mod tests {
    use super::*;

    const MS: Duration = Duration::from_millis(1);

    #[test]
    fn none_never_retries() {
        assert_eq!(Retry::none().delays().next(), None);
        assert_eq!(Retry::none().limit(5).delays().next(), None);
    }

    #[test]
    fn linear_repeats_its_interval_without_end() {
        let delays: Vec<_> = Retry::linear(50 * MS).delays().take(100).collect();
        assert_eq!(delays, vec![50 * MS; 100]);
    }

    #[test]
    fn limit_counts_retries() {
        assert_eq!(Retry::linear(MS).limit(3).delays().count(), 3);
        assert_eq!(Retry::linear(MS).limit(0).delays().count(), 0);
        assert_eq!(Retry::exponential(MS, 8 * MS).limit(7).delays().count(), 7);
    }

    #[test]
    fn exponential_doubles_within_jitter_and_caps_at_max() {
        for _ in 0..50 {
            let delays: Vec<_> = Retry::exponential(4 * MS, 64 * MS)
                .delays()
                .take(12)
                .collect();
            for (i, delay) in delays.iter().enumerate() {
                let step = (4 * MS * (1 << i)).min(64 * MS);
                assert!(
                    *delay >= step / 2 && *delay <= step,
                    "delay {i} = {delay:?}, step {step:?}"
                );
            }
        }
    }

    #[test]
    fn exponential_jitter_differs_between_sequences() {
        let a: Vec<_> = Retry::default().delays().take(8).collect();
        let b: Vec<_> = Retry::default().delays().take(8).collect();
        assert_ne!(a, b);
    }

    #[test]
    fn exponential_survives_many_retries_and_odd_bounds() {
        let mut delays = Retry::exponential(Duration::MAX, MS).delays();
        assert!(delays.nth(1000).is_some_and(|d| d >= Duration::MAX / 2));
        assert_eq!(
            Retry::exponential(10 * MS, MS),
            Retry::exponential(10 * MS, 10 * MS)
        );
        assert_eq!(
            Retry::exponential(Duration::ZERO, 8 * MS),
            Retry::exponential(MS, 8 * MS)
        );
    }
}
