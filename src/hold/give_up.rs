//! A hold obtained as its wait was stopped (by its `Cancel`, or its locker's `close`): a
//! hand-over that raced the cancel, or an attempt answered after it. It is never kept: the
//! release script gives it to the next in line at once.

use std::time::Instant;

use super::plan::{Plan, Taken};
use crate::wait::Stop;
use crate::{Error, Result};

impl Plan<'_> {
    /// `taken`, unless `stop` is set: then it is given up, and the wait ends in
    /// [`Error::Cancelled`]. A hold that was not `fresh` (a fixed token re-obtaining what
    /// it held already, say by another guard) is not this wait's to give up: it is left
    /// as it was.
    pub(super) fn kept(&self, taken: Taken, fresh: bool, stop: Stop<'_>) -> Result<Taken> {
        if !stop.is_set() {
            return Ok(taken);
        }
        match fresh {
            true => self.give_up(taken),
            false => self.uncount(taken.counted),
        }
        log::debug!(
            "redguard: the wait for {:?} was cancelled after {:?}",
            self.keys,
            self.started.elapsed()
        );
        Err(Error::Cancelled)
    }

    /// Releases `taken` (the release script passes it to the next in line), then ends its
    /// count among the locker's locks. Best effort, as a waiter's leaving is: a hold that
    /// cannot be given up now lapses with its TTL (a hand-over, with its short claim).
    fn give_up(&self, taken: Taken) {
        let attempt = self.attempt(taken.value.as_deref(), None);
        let release = attempt.take_back();
        let sent_at = Instant::now();
        match self.shared.backend.release(&release) {
            // Waiters of this locker it served hear it from here.
            Ok(released) => self.shared.subscriber.handed(released.handed, sent_at),
            Err(e) => log::warn!(
                "redguard: a hold of {:?} obtained as its wait was cancelled could not be \
                 given up ({e}): it lapses with its TTL",
                self.names.as_ref().unwrap_or(&self.keys)
            ),
        }
        // Threads of this locker that waited for its release ask for themselves.
        self.uncount(taken.counted);
    }
}
