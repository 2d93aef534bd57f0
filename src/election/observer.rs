//! [`Observer`]: each change of an election's leader, as an iterator.
//!
//! It listens on the election's channel on a connection of its own, where campaigns,
//! resignations and proclamations publish, but a message only makes it read the election
//! again: what it yields is always what the server said when asked. Expiries publish
//! nothing, so it also reads at each leader's expiry, and at least every [`REREAD`].

use std::fmt;
use std::time::{Duration, Instant};

use super::{Election, Leader};
use crate::Result;
use crate::backend::Dedicated;

/// The longest an observer goes without reading the election (a message may be lost: a
/// leader that died right after it was made never published).
const REREAD: Duration = Duration::from_secs(1);

/// The longest it waits for its own connection to be made.
const CONNECT_WAIT: Duration = Duration::from_secs(1);

/// The changes of an election's leader: the leader at the start, then each new leader,
/// each new value proclaimed, and `None` when nobody leads. Made by
/// [`Election::observe`]; see there. As an [`Iterator`], `next` waits as long as it takes;
/// [`next_timeout`](Self::next_timeout) waits at most as long as it is told.
pub struct Observer {
    election: Election,
    /// Subscribed to the election's channel; `None` until (re)connected.
    subscription: Option<Dedicated>,
    /// Which of the backend's listening servers to connect to next.
    server: usize,
    /// What was yielded last (`None` before the first).
    yielded: Option<Option<Leader>>,
    /// The largest term yielded: an older one is never yielded after it.
    highest: u64,
}

impl Observer {
    pub(super) fn new(election: Election) -> Result<Observer> {
        let mut observer = Observer {
            election,
            subscription: None,
            server: 0,
            yielded: None,
            highest: 0,
        };
        observer.subscribe()?;
        Ok(observer)
    }

    /// The next change, waiting at most `wait`: `None` when nothing changed meanwhile.
    /// The first call yields the leader as it is (or `None` inside `Some` for no leader).
    pub fn next_timeout(&mut self, wait: Duration) -> Option<Result<Option<Leader>>> {
        let deadline = crate::hold::later(Instant::now(), wait);
        loop {
            if self.subscription.is_none() {
                // Best effort: without a connection it reads the election every REREAD.
                let _ = self.subscribe();
            }
            let leader = match self.election.leader() {
                Ok(leader) => leader,
                Err(e) => return Some(Err(e)),
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
            self.wait(next.min(left));
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

    /// Waits up to `wait` for a message on the election's channel (any message, or none).
    fn wait(&mut self, wait: Duration) {
        let Some(con) = self.subscription.as_mut() else {
            std::thread::sleep(wait);
            return;
        };
        // A zero read timeout would mean none at all.
        let heard = con
            .set_read_timeout(Some(wait.max(Duration::from_millis(1))))
            .and_then(|()| con.recv_response());
        match heard {
            Ok(_) => {}
            Err(e) if e.is_timeout() => {}
            Err(e) => {
                log::debug!("redguard: an observer's connection failed ({e}); reconnecting");
                self.subscription = None;
                self.server += 1;
            }
        }
    }

    /// A connection of its own, subscribed to the election's channel.
    fn subscribe(&mut self) -> Result<()> {
        let pools = self.election.shared().backend.listen_pools();
        let pool = pools.get(self.server % pools.len().max(1));
        let Some(pool) = pool.filter(|pool| pool.can_dedicate()) else {
            return Ok(()); // none to spare (a caller's pool of one): it reads every REREAD
        };
        let mut con = pool.dedicated(CONNECT_WAIT)?;
        let mut subscribe = redis::cmd("SUBSCRIBE");
        subscribe.arg(self.election.channel());
        con.send_packed_command(&subscribe.get_packed_command())?;
        // The confirmation, within the connection's I/O timeout.
        con.recv_response()?;
        self.subscription = Some(con);
        Ok(())
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
            .field("subscribed", &self.subscription.is_some())
            .finish_non_exhaustive()
    }
}
