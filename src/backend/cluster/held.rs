//! The operations on a lock once taken, slot part by slot part (see `per_master.rs`):
//! refresh, release, and the remaining TTL.

use std::collections::BTreeMap;
use std::time::Duration;

use super::connections::{ClusterPool, wait_on_slot};
use crate::Result;
use crate::backend::outcome::{Refreshed, Released};
use crate::backend::replicas;
use crate::backend::request::{Refresh, Release};
use crate::backend::scripts;
use crate::backend::slot::{by_slot, slot};
use crate::hold::Kind;

impl ClusterPool {
    /// Refreshes a batch with one script call per slot its locks use, one slot after
    /// another, [`per_master`](Self::per_master): a frozen master costs a round one
    /// timeout, and does not hold up the other masters' locks. A lock is held when every
    /// part of it was, since its earliest part was sent. Locks with a part not answered are
    /// unknown (retried); an error only when nothing was answered.
    pub(crate) fn refresh(&self, locks: &[Refresh<'_>]) -> Result<Vec<Refreshed>> {
        let mut parts: BTreeMap<u16, Part> = BTreeMap::new();
        for (i, lock) in locks.iter().enumerate() {
            for (slot, keys) in by_slot(lock.keys) {
                parts.entry(slot).or_default().push((i, keys));
            }
        }
        // Per lock: `None` until a part is answered.
        let mut found: Vec<Option<Refreshed>> = vec![None; locks.len()];
        let mut failure = None;
        let mut answered = parts.is_empty();
        for (part, refreshed) in self.per_master(parts, |part| self.refresh_part(locks, part)) {
            answered |= refreshed.is_ok();
            for (n, (i, _)) in part.iter().enumerate() {
                let this = match &refreshed {
                    Ok(parts) => parts.get(n).copied().unwrap_or(Refreshed::Lost),
                    Err(_) => Refreshed::Unknown,
                };
                found[*i] = Some(match (found[*i], this) {
                    (None, this) => this,
                    // Lost if any part is, else unknown, else short of replicas if any
                    // part is; else held since its earliest part was sent.
                    (Some(Refreshed::Lost), _) | (_, Refreshed::Lost) => Refreshed::Lost,
                    (Some(Refreshed::Unknown), _) | (_, Refreshed::Unknown) => Refreshed::Unknown,
                    (Some(short @ Refreshed::NotReplicated { .. }), _)
                    | (_, short @ Refreshed::NotReplicated { .. }) => short,
                    (Some(earlier), Refreshed::Held { .. }) => earlier,
                });
            }
            if let Err(e) = refreshed {
                // The first failure: later ones may just be skipped parts.
                failure.get_or_insert(e);
            }
        }
        // After the round, so that asking (a random node, maybe the frozen one) never
        // delays the refreshes themselves.
        if self.masters.lock().is_stale() {
            self.ask_for_masters();
        }
        match failure {
            Some(e) if !answered => Err(e),
            _ => Ok(found
                .into_iter()
                .map(|found| found.unwrap_or(Refreshed::Unknown))
                .collect()),
        }
    }

    /// One slot's part of a refresh round: what was found of each lock's part.
    fn refresh_part(&self, locks: &[Refresh<'_>], part: &Part) -> Result<Vec<Refreshed>> {
        let batch: Vec<Refresh<'_>> = part
            .iter()
            .map(|(i, keys)| Refresh {
                kind: locks[*i].kind,
                entry_of: locks[*i].entry_of,
                keys,
                value: locks[*i].value,
                ttl_ms: locks[*i].ttl_ms,
                replicas: locks[*i].replicas,
            })
            .collect();
        // Never empty: a part exists because a lock has keys in its slot.
        let slot = part
            .first()
            .and_then(|(_, keys)| keys.first())
            .map_or(0, |key| slot(key));
        // Safe to repeat: setting the same TTL twice is the same as once.
        self.run(|con| {
            replicas::refresh(con, &batch, |con, wanted| wait_on_slot(con, slot, wanted))
        })
    }

    /// Releases every slot's part, [`per_master`](Self::per_master): what a frozen
    /// master's other slots hold is not asked for, and expires with its TTL. `false` when
    /// some part was no longer held; the first error when a part could not be released.
    /// Gives a hold up, slot by slot (a lock across slots; every other hold is in one).
    /// The waiters of this locker served are those of every slot.
    pub(crate) fn release(&self, release: &Release<'_>) -> Result<Released> {
        let mut released = Released {
            held: true,
            handed: Vec::new(),
        };
        let mut failure = None;
        let part = |keys: &Vec<String>| {
            let part = Release { keys, ..*release };
            self.run(|con| scripts::release(con, &part))
        };
        for (_, outcome) in self.per_master(by_slot(release.keys), part) {
            match outcome {
                Ok(part) => {
                    released.held &= part.held;
                    released.handed.extend(part.handed);
                }
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        failure.map_or(Ok(released), Err)
    }

    pub(crate) fn ttl(&self, kind: Kind, keys: &[String], value: &str) -> Result<Option<Duration>> {
        let mut shortest = Some(Duration::MAX);
        let ttl = |keys: &Vec<String>| self.run(|con| scripts::ttl(con, kind, keys, value));
        for (_, ttl) in self.per_master(by_slot(keys), ttl) {
            shortest = shortest.zip(ttl?).map(|(a, b)| a.min(b));
        }
        Ok(shortest)
    }
}

/// One slot's part of a refresh round: for each lock with keys in the slot, its index in
/// the batch and those keys.
type Part = Vec<(usize, Vec<String>)>;
