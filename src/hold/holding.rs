//! The RAII owner of a hold, whatever its kind: what [`LockGuard`](crate::LockGuard) and
//! [`Permit`](crate::Permit) are made of. It asks the refresher to keep the hold alive,
//! answers `ttl`, `refresh` and `is_lost`, and gives the hold up on release or drop (a
//! lock to the first waiter of this locker in line for the same keys, when there is one).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Held, Kind, Timing};
use crate::backend::{Acquired, Attempt, Refresh, Refreshed};
use crate::options::checked_ttl;
use crate::shared::Shared;
use crate::{Error, Result, stats};

pub(crate) struct Holding {
    shared: Arc<Shared>,
    held: Arc<Held>,
    auto_refresh: bool,
    /// When it was taken (for the hold time the metrics report).
    taken_at: Instant,
    /// Set once released, so that `Drop` does nothing more.
    released: bool,
}

impl Holding {
    /// Wraps a freshly obtained hold; with `auto_refresh` the refresher takes it on. If
    /// that fails, the hold is given up again.
    pub(crate) fn new(shared: Arc<Shared>, held: Held, auto_refresh: bool) -> Result<Holding> {
        let holding = Holding {
            shared,
            held: Arc::new(held),
            auto_refresh,
            taken_at: Instant::now(),
            released: false,
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
        let hold = Refresh {
            kind: self.held.kind,
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
            return Err(Error::LockLost);
        }
        let held = &self.held;
        // From here a refresh that finds the lock gone found the downgrade.
        held.end();
        let ttl_ms = held.timing().ttl_ms;
        let subscriber = &self.shared.subscriber;
        let sent_at = Instant::now();
        let downgraded = self.shared.backend.downgrade(
            &held.keys,
            &held.value,
            ttl_ms,
            subscriber.release_channels(),
        )?;
        // The lock is gone either way: nothing for drop to do.
        self.released = true;
        if self.auto_refresh {
            self.shared.refresher.remove(held.id);
        }
        if !downgraded.held {
            held.mark_lost();
            return Err(Error::LockLost);
        }
        subscriber.released(&held.keys, downgraded.listeners);
        let shared_hold = held.converted(Kind::Read, Timing::new(ttl_ms, sent_at));
        Holding::new(Arc::clone(&self.shared), shared_hold, self.auto_refresh)
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
        Ok(self.give_up()? && !known_lost)
    }

    /// Hands a lock over to the first waiter of this locker in line for the same keys, or
    /// gives the hold up in Redis; `false` when not held.
    fn give_up(&self) -> Result<bool> {
        // Permits and shared holds are not handed over: a release lets the next waiter in
        // line attempt.
        if self.held.kind != Kind::Lock {
            return self.release_for_real();
        }
        let subscriber = &self.shared.subscriber;
        let Some(claim) = subscriber.claim(&self.held.keys) else {
            return self.release_for_real();
        };
        let offer = claim.offer();
        let attempt = Attempt {
            kind: Kind::Lock,
            keys: &offer.keys,
            value: &offer.value,
            owner_len: offer.owner_len,
            ttl_ms: offer.ttl_ms,
            fencing: offer.fencing,
            prefix: &self.shared.prefix,
            fixed_token: offer.fixed_token,
            over: Some(&self.held.value),
            intent: None,
            channels: self.shared.subscriber.release_channels(),
            replicas: offer.replicas,
        };
        let sent_at = Instant::now();
        let failed = match self.shared.backend.hand_over(&attempt) {
            Some(Ok(Acquired::Yes { fences, .. })) => {
                claim.handed(fences, sent_at);
                return Ok(true);
            }
            Some(Err(failed)) => failed,
            // Not handed over (the lock was gone, or the backend cannot): released as
            // usual, and only then is the waiter told to attempt by itself.
            _ => {
                let released = self.release_for_real();
                drop(claim);
                return released;
            }
        };
        // Redis failed: the waiter goes on by itself at once (the claim has kept it a
        // round trip already; it hears the release below, finds the keys free, or finds
        // them its own, re-obtained by its value, should the hand-over have run).
        claim.failed();
        match self.release_for_real() {
            // The keys are not ours: the hand-over may have run without an answer (the
            // waiter holds them) or not (the lock was lost). Say what is known.
            Ok(false) => Err(failed),
            released => released,
        }
    }

    /// The release script of the hold's kind, announcing the release to every waiter.
    fn release_for_real(&self) -> Result<bool> {
        let subscriber = &self.shared.subscriber;
        let held = &self.held;
        let released = self.shared.backend.release(
            held.kind,
            &held.keys,
            &held.value,
            subscriber.release_channels(),
        )?;
        subscriber.released(&held.keys, released.listeners);
        log::debug!("redguard: {:?} of {:?} given up", held.kind, held.names());
        Ok(released.held)
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
