//! The state of one held lock, shared by its guard and the refresher.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

pub(crate) struct Held {
    /// Unique within the process: the refresher's handle on this lock.
    pub(crate) id: u64,
    pub(crate) keys: Vec<String>,
    /// What every key stores: the token, then the metadata.
    pub(crate) value: String,
    pub(crate) token_len: usize,
    timing: Mutex<Timing>,
    lost: AtomicBool,
}

#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    pub(crate) ttl_ms: u64,
    /// When the last acquire or refresh that succeeded was sent. The server set the
    /// expiry after this, so `set_at + ttl` is never later than the real expiry.
    pub(crate) set_at: Instant,
}

impl Timing {
    /// The earliest the keys may expire, by our clock.
    pub(crate) fn expires_at(&self) -> Instant {
        self.after(self.ttl_ms)
    }

    /// When the refresher should extend the lock: a third into its TTL.
    pub(crate) fn refresh_at(&self) -> Instant {
        self.after(self.ttl_ms / 3)
    }

    fn after(&self, ms: u64) -> Instant {
        // Some platforms' `Instant` overflows within centuries, so a lock held for 100
        // years is held "forever" by our clock; 100 years on never overflows.
        const FOREVER: Duration = Duration::from_secs(100 * 365 * 24 * 3600);
        let wait = Duration::from_millis(ms).min(FOREVER);
        self.set_at.checked_add(wait).unwrap_or(self.set_at)
    }
}

impl Held {
    pub(crate) fn new(keys: Vec<String>, value: String, token_len: usize, timing: Timing) -> Held {
        static NEXT_ID: AtomicU64 = AtomicU64::new(0);
        Held {
            id: NEXT_ID.fetch_add(1, Ordering::Relaxed),
            keys,
            value,
            token_len,
            timing: Mutex::new(timing),
            lost: AtomicBool::new(false),
        }
    }

    pub(crate) fn token(&self) -> &str {
        &self.value[..self.token_len]
    }

    pub(crate) fn metadata(&self) -> &str {
        &self.value[self.token_len..]
    }

    pub(crate) fn timing(&self) -> Timing {
        *self.timing.lock()
    }

    /// Records a refresh that succeeded, sent at `sent_at` with `ttl_ms`.
    pub(crate) fn refreshed(&self, sent_at: Instant, ttl_ms: u64) {
        let mut timing = self.timing.lock();
        // A slower round trip may finish after a newer one: keep the newest.
        if sent_at >= timing.set_at {
            *timing = Timing {
                ttl_ms,
                set_at: sent_at,
            };
        }
    }

    pub(crate) fn mark_lost(&self) {
        self.lost.store(true, Ordering::Release);
    }

    /// Lost once anyone saw a key gone, or once the TTL has run out by our clock. Sticky:
    /// a lock reported lost is never reported held again.
    pub(crate) fn is_lost(&self) -> bool {
        if self.lost.load(Ordering::Acquire) {
            return true;
        }
        if Instant::now() >= self.timing().expires_at() {
            self.mark_lost();
            return true;
        }
        false
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn held(ttl_ms: u64, set_at: Instant) -> Held {
        let value = "0123abcdmeta".to_string();
        Held::new(vec!["k".into()], value, 8, Timing { ttl_ms, set_at })
    }

    #[test]
    fn token_and_metadata_split_the_value() {
        let held = held(1000, Instant::now());
        assert_eq!(held.token(), "0123abcd");
        assert_eq!(held.metadata(), "meta");
    }

    #[test]
    fn lost_once_the_ttl_has_run_out_and_stays_lost() {
        let start = Instant::now();
        let held = held(1, start);
        std::thread::sleep(Duration::from_millis(2));
        assert!(held.is_lost());
        held.refreshed(Instant::now(), 60_000);
        assert!(held.is_lost(), "lost is sticky");
    }

    #[test]
    fn an_older_refresh_does_not_overwrite_a_newer_one() {
        let start = Instant::now();
        let held = held(1000, start);
        let later = start + Duration::from_millis(10);
        held.refreshed(later, 5000);
        held.refreshed(start, 1);
        assert_eq!(held.timing().ttl_ms, 5000);
        assert_eq!(held.timing().set_at, later);
        assert!(!held.is_lost());
    }

    #[test]
    fn ids_are_unique() {
        let now = Instant::now();
        assert_ne!(held(1, now).id, held(1, now).id);
    }
}
