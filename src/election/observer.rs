//! [`Observer`]: each change of an election's leader, as an iterator.
//!
//! Campaigns, resignations and proclamations publish on the release channel of the
//! election's lock, which an observer watches through its locker's one subscriber, as a
//! waiter that does not queue watches its keys. A message only makes it read the election
//! again: what it yields is always what the server said when asked. Expiries publish
//! nothing, so it also reads at each leader's expiry, and at least every [`REREAD`].

use std::fmt;
use std::time::{Duration, Instant};

use super::{Election, Leader};
use crate::Result;
use crate::hold::later;
use crate::wait::Stop;

/// The longest an observer goes without reading the election (a message may be lost: a
/// leader that died right after it was made never published).
const REREAD: Duration = Duration::from_secs(1);

/// The changes of an election's leader: the leader at the start, then each new leader,
/// each new value proclaimed, and `None` when nobody leads. Made by
/// [`Election::observe`]; see there. As an [`Iterator`], `next` waits as long as it takes;
/// [`next_timeout`](Self::next_timeout) waits at most as long as it is told.
pub struct Observer {
    election: Election,
    /// What was yielded last (`None` before the first).
    yielded: Option<Option<Leader>>,
    /// The largest term yielded: an older one is never yielded after it.
    highest: u64,
    /// When a read failed last (cleared by the next read): the next waits [`REREAD`]
    /// after it, so that a caller who carries on after errors does not hammer Redis.
    failed_at: Option<Instant>,
}

impl Observer {
    pub(super) fn new(election: Election) -> Observer {
        Observer {
            election,
            yielded: None,
            highest: 0,
            failed_at: None,
        }
    }

    /// The next change, waiting at most `wait`: `None` when nothing changed meanwhile.
    /// The first call yields the leader as it is (or `None` inside `Some` for no leader).
    /// An error when the election could not be read; the next call then reads again only a
    /// second after it (a loop that carries on after errors does not hammer Redis).
    pub fn next_timeout(&mut self, wait: Duration) -> Option<Result<Option<Leader>>> {
        let deadline = later(Instant::now(), wait);
        if let Some(failed_at) = self.failed_at {
            let resume = failed_at + REREAD;
            std::thread::sleep(
                resume
                    .min(deadline)
                    .saturating_duration_since(Instant::now()),
            );
            if deadline < resume {
                return None;
            }
            self.failed_at = None;
        }
        let election = self.election.clone();
        let subscriber = &election.shared().subscriber;
        let lock = std::slice::from_ref(&election.keys()[0]);
        loop {
            // Noted before the read: a message heard after it wakes the wait below.
            let seen = subscriber.seen(lock);
            let leader = match election.leader() {
                Ok(leader) => leader,
                Err(e) => {
                    self.failed_at = Some(Instant::now());
                    return Some(Err(e));
                }
            };
            // The next read: at this leader's expiry (plus a little, for our clock), at
            // least every REREAD, and never past the caller's deadline.
            let mut next = REREAD;
            if let Some(leader) = &leader {
                next = next.min(leader.ttl().saturating_add(Duration::from_millis(2)));
            }
            if let Some(change) = self.news(leader) {
                return Some(Ok(change));
            }
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return None;
            }
            // Wakes on a message, or once (re)subscribed: one may have gone unheard.
            let mut ticket = subscriber.watch(lock, seen);
            ticket.wait_until(Instant::now() + next.min(left), Stop::never());
        }
    }
    /// `leader` as a change to yield (recorded as yielded), or `None` when it is no change:
    /// the same leader and value as last yielded, or a term older than one yielded.
    fn news(&mut self, leader: Option<Leader>) -> Option<Option<Leader>> {
        let same = match (&self.yielded, &leader) {
            (Some(Some(last)), Some(now)) => last.term == now.term && last.value == now.value,
            (Some(None), None) => true,
            _ => false,
        };
        let stale = leader.as_ref().is_some_and(|now| now.term < self.highest);
        if same || stale {
            return None;
        }
        if let Some(now) = &leader {
            self.highest = now.term;
        }
        self.yielded = Some(leader.clone());
        Some(leader)
    }
}

impl Iterator for Observer {
    type Item = Result<Option<Leader>>;

    /// The next change, however long it takes (an error when the election cannot be read).
    fn next(&mut self) -> Option<Self::Item> {
        loop {
            if let Some(change) = self.next_timeout(Duration::from_secs(3600)) {
                return Some(change);
            }
        }
    }
}

impl fmt::Debug for Observer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Observer")
            .field("election", &self.election.name())
            .finish_non_exhaustive()
    }
}
