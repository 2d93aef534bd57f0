//! Taking a lock on a cluster: one script call on one slot, or, across slots, slot by slot
//! in ascending slot order, with what was taken taken back when a slot is not.

use std::collections::HashMap;

use redis::{ErrorKind, ServerErrorKind};

use super::connections::{ClusterPool, wait_on_slot};
use crate::backend::outcome::Acquired;
use crate::backend::replicas;
use crate::backend::request::Attempt;
use crate::backend::scripts;
use crate::backend::slot::{by_slot, slot};
use crate::{Error, Result};

impl ClusterPool {
    /// One attempt to take every key: one script call per slot.
    pub(crate) fn acquire(&self, attempt: &Attempt<'_>, set_first: bool) -> Result<Acquired> {
        let groups = by_slot(attempt.keys);
        if groups.len() == 1 {
            return self.acquire_slot(attempt, set_first, true);
        }
        // Ascending slot order: two owners after overlapping keys meet at their lowest
        // shared slot first, so at most one of them gets past it.
        let mut fences = HashMap::new();
        let mut taken: Vec<&[String]> = Vec::new();
        let mut fresh = true;
        for (_, keys) in &groups {
            let part = Attempt { keys, ..*attempt };
            // What a failed part took is taken back below, with the rest.
            match self.acquire_slot(&part, set_first, false) {
                Ok(Acquired::Yes {
                    fences: part_fences,
                    fresh: part_fresh,
                }) => {
                    fences.extend(keys.iter().zip(part_fences));
                    if attempt.owns(part_fresh) {
                        taken.push(keys);
                    }
                    fresh &= part_fresh;
                }
                failed => {
                    // Take back what this attempt took (not what the same owner held
                    // before), and the failed slot too when its reply may have been lost
                    // after it was taken, unless a fixed token may have held it before.
                    // Best effort: what cannot be taken back expires with its TTL.
                    let reply_lost = failed.is_err() && attempt.owns(false);
                    for keys in taken
                        .into_iter()
                        .chain(reply_lost.then_some(keys.as_slice()))
                    {
                        // Served: a waiter may have queued behind what this took.
                        let part = Attempt { keys, ..*attempt };
                        let _ = self.run(|con| scripts::release(con, &part.take_back()));
                    }
                    return failed;
                }
            }
        }
        let fences = if attempt.fencing {
            attempt
                .keys
                .iter()
                .filter_map(|key| fences.get(key).copied())
                .collect()
        } else {
            Vec::new()
        };
        Ok(Acquired::Yes { fences, fresh })
    }

    /// One attempt on the keys of one slot, on its master; with replicas wanted, waited for
    /// there, on the same connection. With `take_back`, what such an attempt took when it
    /// failed is given up (see `replicas::unconfirmed`).
    fn acquire_slot(
        &self,
        attempt: &Attempt<'_>,
        set_first: bool,
        take_back: bool,
    ) -> Result<Acquired> {
        let slot = slot(&attempt.keys[0]); // never empty: checked before any attempt
        let mut sent = false;
        let acquired = moving(self.run(|con| {
            sent = true;
            let acquired = scripts::acquire(con, attempt, set_first)?;
            replicas::confirm(con, attempt, acquired, |con, wanted| {
                wait_on_slot(con, slot, wanted)
            })
        }));
        replicas::unconfirmed(attempt, sent && take_back, &acquired, || {
            self.run(|con| scripts::release(con, &attempt.take_back()))
        });
        acquired
    }
}

/// A slot being moved (TRYAGAIN: a multi-key request while its keys are split between
/// two masters): nothing ran, so wait and try again, as for a lock held elsewhere. (A
/// cluster that is down stays an error: `try_lock`'s `None` means held elsewhere.)
fn moving(outcome: Result<Acquired>) -> Result<Acquired> {
    match outcome {
        Err(Error::Redis(e)) if e.kind() == ErrorKind::Server(ServerErrorKind::TryAgain) => {
            Ok(Acquired::HeldElsewhere)
        }
        other => other,
    }
}
