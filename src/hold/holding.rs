//! The RAII owner of a hold, whatever its kind: what [`LockGuard`](crate::LockGuard) and
//! [`Permit`](crate::Permit) are made of. It asks the refresher to keep the hold alive,
//! answers `ttl`, `refresh` and `is_lost`, and gives the hold up on release or drop (the
//! release script gives the keys to the waiters next in the server's queue, wherever they
//! run).

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use super::place::millis;
use super::{Held, Kind, Timing};
use crate::backend::{
    Found, Queue, Refresh, Refreshed, Release, fenced_record, fenced_set_call, parse_written,
};
use crate::options::checked_ttl;
use crate::shared::Shared;
use crate::wait::Pending;
use crate::{Error, Result, stats};

pub(crate) struct Holding {
    shared: Arc<Shared>,
    held: Arc<Held>,
    auto_refresh: bool,
    /// When it was taken (for the hold time the metrics report).
    taken_at: Instant,
    /// Set once released, so that `Drop` does nothing more.
    released: bool,
    /// Counted among this locker's locks of its keys, whose release lets in the entries
    /// of its threads that asked for them meanwhile (see `wait::Pending`).
    local: AtomicBool,
}

impl Holding {
    /// Wraps a freshly obtained hold; with `auto_refresh` the refresher takes it on. If
    /// that fails, the hold is given up again. `counted` when the lock was counted among
    /// the locker's locks of its keys as it was handed to this waiter.
    pub(crate) fn new(
        shared: Arc<Shared>,
        held: Held,
        auto_refresh: bool,
        counted: bool,
    ) -> Result<Holding> {
        let local = held.kind == Kind::Lock && shared.backend.queues(&held.keys, &shared.prefix);
        if local && !counted {
            shared.subscriber.joins().hold_began(&held.keys);
        }
        let holding = Holding {
            shared,
            held: Arc::new(held),
            auto_refresh,
            taken_at: Instant::now(),
            released: false,
            local: AtomicBool::new(local),
        };
        stats::hold_began();
        if auto_refresh {
            let held = Arc::clone(&holding.held);
            holding
                .shared
                .refresher
                .add(held)
                .map_err(Error::Refresher)?;
        }
        Ok(holding)
    }

    pub(crate) fn held(&self) -> &Held {
        &self.held
    }

    pub(crate) fn auto_refresh(&self) -> bool {
        self.auto_refresh
    }

    /// The remaining TTL as the server sees it; `None` (and marked lost) when not held.
    pub(crate) fn ttl(&self) -> Result<Option<Duration>> {
        let held = &self.held;
        let ttl = self
            .shared
            .backend
            .ttl(held.kind, &held.keys, &held.value)?;
        if ttl.is_none() {
            held.mark_lost();
        }
        Ok(ttl)
    }

    /// Sets the TTL to `ttl` from now, if still held; later refreshes use it too. Waits for
    /// a refresh of the hold already in flight (the refresher's), so that the two never
    /// overlap and this one is the last the server applies.
    pub(crate) fn refresh(&self, ttl: Duration) -> Result<()> {
        let ttl_ms = checked_ttl(ttl)?;
        self.shared.backend.check_ttl(ttl_ms)?;
        if self.held.is_lost() || !self.held.wait_refresh_turn() {
            return Err(Error::LockLost);
        }
        let refreshed = self.refresh_in_turn(ttl_ms);
        self.held.end_refresh_turn();
        if self.auto_refresh {
            self.shared
                .refresher
                .rescheduled(self.held.id, refreshed.is_ok());
        }
        refreshed
    }

    /// [`refresh`](Self::refresh)'s round trip, while it holds the hold's refresh turn.
    fn refresh_in_turn(&self, ttl_ms: u64) -> Result<()> {
        // From now on the refresher uses the new TTL too.
        self.held.set_ttl(ttl_ms);
        // Never past the longest hold: past it, nothing is left to refresh.
        let ttl_ms = match self.held.lease.capped_ms(ttl_ms, Instant::now()) {
            0 => {
                self.held.mark_lost();
                return Err(Error::LockLost);
            }
            capped => capped,
        };
        let hold = Refresh {
            kind: self.held.kind,
            entry_of: None,
            keys: &self.held.keys,
            value: &self.held.value,
            ttl_ms,
            replicas: self.held.replicas,
        };
        let sent_at = match self.shared.backend.refresh(std::slice::from_ref(&hold))?[..] {
            [Refreshed::Held { sent_at }] => sent_at,
            [Refreshed::Unknown] => return Err(Error::Redis(self.shared.backend.undecided())),
            [
                Refreshed::NotReplicated {
                    acknowledged,
                    wanted,
                },
            ] => {
                return Err(Error::NotReplicated {
                    acknowledged,
                    wanted,
                });
            }
            _ => {
                self.held.mark_lost();
                return Err(Error::LockLost);
            }
        };
        self.held.refreshed(sent_at, ttl_ms);
        Ok(())
    }

    pub(crate) fn is_lost(&self) -> bool {
        self.held.is_lost()
    }

    /// How long the hold still counts as held by this process's clock: zero once lost.
    pub(crate) fn valid_for(&self) -> Duration {
        if self.held.is_lost() {
            return Duration::ZERO;
        }
        self.held
            .timing()
            .expires_at()
            .saturating_duration_since(Instant::now())
    }

    /// Writes `value` at `key` (after the locker's prefix) unless a fencing token larger
    /// than this hold's first one has written it: `false` then, and nothing is changed.
    pub(crate) fn fenced_set(&self, key: &str, value: &str) -> Result<bool> {
        let Some(&token) = self.held.fences.first() else {
            return Err(Error::InvalidInput(
                "fenced_set needs a fencing token: take the lock with LockOptions::fencing(true)"
                    .into(),
            ));
        };
        if key.is_empty() {
            return Err(Error::InvalidInput("fenced_set: the key is empty".into()));
        }
        let prefix = self.shared.prefix.as_str();
        let stored = format!("{prefix}{key}");
        let record = fenced_record(prefix, &stored);
        let call = fenced_set_call(&stored, &record, token, value);
        let keys = [stored.as_str(), record.as_str()];
        let wrote = |found: &Found<bool>| matches!(found, Found::Yes(true));
        let replicas = self.held.replicas;
        match (self.shared.backend).write_in_slot(&keys, &call, parse_written, replicas, wrote)? {
            // Written, but on too few replicas to survive a failover: said, as for a hold.
            (_, Some((wanted, acknowledged))) if acknowledged < wanted.wanted => {
                Err(Error::NotReplicated {
                    acknowledged,
                    wanted: wanted.wanted,
                })
            }
            (Found::Yes(written), _) => Ok(written),
            (Found::WrongType { key: found, kind }, _) => Err(Error::WrongType {
                key: if found == stored {
                    key.to_owned()
                } else {
                    found
                },
                kind,
            }),
        }
    }

    /// Gives the hold up: `LockLost` when it was no longer (or already known not to be)
    /// held.
    pub(crate) fn release(mut self) -> Result<()> {
        self.released = true;
        if !self.unlock()? {
            return Err(Error::LockLost);
        }
        Ok(())
    }

    /// Turns a lock into a shared hold of the same keys, in one step: the new holding, or
    /// `LockLost` when the lock was gone. On an error the lock is released as on drop
    /// (which leaves a shared hold alone, should the downgrade have happened after all).
    pub(crate) fn downgrade(mut self) -> Result<Holding> {
        if self.held.is_lost() {
            self.released = true;
            for pending in self.take_joins() {
                pending.joined(None); // they ask for themselves
            }
            return Err(Error::LockLost);
        }
        let held = &self.held;
        // From here a refresh that finds the lock gone found the downgrade.
        held.end();
        // Never past the longest hold (nothing left of it: at least a millisecond).
        let ttl_ms = held
            .lease
            .capped_ms(held.timing().ttl_ms, Instant::now())
            .max(1);
        // Threads of this locker waiting for the lock's release ask for themselves.
        for pending in self.take_joins() {
            pending.joined(None);
        }
        let sent_at = Instant::now();
        let downgraded = self
            .shared
            .backend
            .downgrade(&self.release_request(&[]), ttl_ms)?;
        // The lock is gone either way: nothing for drop to do.
        self.released = true;
        if self.auto_refresh {
            self.shared.refresher.remove(held.id);
        }
        if !downgraded.held {
            held.mark_lost();
            return Err(Error::LockLost);
        }
        // Readers first in the queue came in with it.
        self.shared.subscriber.handed(downgraded.handed, sent_at);
        let shared_hold = held.converted(Kind::Read, Timing::new(ttl_ms, sent_at));
        Holding::new(
            Arc::clone(&self.shared),
            shared_hold,
            self.auto_refresh,
            false,
        )
    }

    /// Stops refreshing, then gives the hold up: `false` when it was not held to the end
    /// (known lost before, or found gone by the release). A loss known before is told of
    /// (the refresher no longer can); a release that goes well never is.
    fn unlock(&self) -> Result<bool> {
        let known_lost = self.held.is_lost();
        // From here a refresh that finds the keys gone found this release (or hand-over).
        self.held.end();
        if self.auto_refresh {
            self.shared.refresher.remove(self.held.id);
            if known_lost {
                self.shared.refresher.tell_lost(Arc::clone(&self.held));
            }
        }
        // After a refresh in flight (the refresher's), so that none is applied after this
        // release (to a newer hold of the same value, say) or after a shorter TTL it sets.
        // `false` once the hold ran out meanwhile: it is given up all the same.
        let turn = self.held.wait_refresh_turn();
        let kept = match known_lost || !turn {
            true => None,
            false => self.kept_after_release(),
        };
        let given_up = match kept {
            Some(kept_ms) => self.keep_for(kept_ms),
            None => self.release_for_real().map(|held| held && !known_lost),
        };
        if turn {
            self.held.end_refresh_turn();
        }
        given_up
    }

    /// For a hold with [`hold_at_least`](crate::LockOptions::hold_at_least) given up
    /// before that time: how long (ms) it stays held still (without auto-refresh, no
    /// longer than its own TTL would have kept it). `None` when it may go now.
    fn kept_after_release(&self) -> Option<u64> {
        // No clock read on the common path: most holds have no such policy.
        self.held.lease.at_least_until?;
        let now = Instant::now();
        let mut kept = self.held.lease.kept_after_release(now)?;
        if !self.auto_refresh {
            let own = self.held.timing().expires_at();
            let own = own.saturating_duration_since(now).as_millis();
            kept = kept.min(u64::try_from(own).unwrap_or(u64::MAX));
        }
        (kept >= 1).then_some(kept)
    }

    /// Leaves the hold to expire in `kept_ms` instead of giving it up (its refresh turn
    /// held): `false` when it was not held any more. Threads of this locker that wait for its release ask for
    /// themselves (they queue, and are served when it expires).
    fn keep_for(&self, kept_ms: u64) -> Result<bool> {
        for pending in self.take_joins() {
            pending.joined(None);
        }
        let hold = Refresh {
            kind: self.held.kind,
            entry_of: None,
            keys: &self.held.keys,
            value: &self.held.value,
            ttl_ms: kept_ms,
            replicas: None,
        };
        match self.shared.backend.refresh(std::slice::from_ref(&hold))?[..] {
            [Refreshed::Held { .. }] => Ok(true),
            [Refreshed::Lost] => Ok(false),
            _ => Err(Error::Redis(self.shared.backend.undecided())),
        }
    }

    /// The release script of the hold's kind, which gives the keys to the waiters first
    /// in the queue (or, without it, announces them).
    fn release_for_real(&self) -> Result<bool> {
        // Threads of this locker that asked for these keys meanwhile join the queue by
        // this release, at its back, in the order they asked.
        let joins = self.take_joins();
        let members: Vec<&str> = joins
            .iter()
            .map(|pending| pending.member.as_str())
            .collect();
        let sent_at = Instant::now();
        let released = self.shared.backend.release(&self.release_request(&members));
        let joined = released.as_ref().ok().map(|_| sent_at);
        let released = released.inspect_err(|_| {
            for pending in &joins {
                pending.joined(None);
            }
        })?;
        // Waiters of this locker served by it hear it from here, not from a message.
        self.shared.subscriber.handed(released.handed, sent_at);
        for pending in &joins {
            pending.joined(joined);
        }
        log::debug!(
            "redguard: {:?} of {:?} given up",
            self.held.kind,
            self.held.names()
        );
        Ok(released.held)
    }

    /// The entries of this locker's threads waiting for this lock's release (once).
    fn take_joins(&self) -> Vec<Pending> {
        match self.local.swap(false, Ordering::SeqCst) {
            true => self.shared.subscriber.joins().hold_ending(&self.held.keys),
            false => Vec::new(),
        }
    }

    /// What gives the hold up, letting `joins` into the queue first.
    fn release_request<'a>(&'a self, joins: &'a [&'a str]) -> Release<'a> {
        let (shared, held) = (&self.shared, &self.held);
        Release {
            kind: held.kind,
            keys: &held.keys,
            value: &held.value,
            prefix: &shared.prefix,
            queue: shared
                .backend
                .queues(&held.keys, &shared.prefix)
                .then(|| Queue {
                    channel: shared.subscriber.channel(),
                    entry: None,
                    lifetime_ms: millis(shared.waiter_lifetime),
                }),
            announce: shared.announce(),
            joins,
        }
    }
}

impl Drop for Holding {
    fn drop(&mut self) {
        if !self.released {
            // Best effort: a hold we cannot give up expires with its TTL.
            let _ = self.unlock();
        }
        stats::hold_ended(self.held.kind, self.taken_at);
    }
}
