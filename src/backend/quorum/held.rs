//! The operations on a lock once taken, each asked of every node and counted (see
//! `count.rs`): refresh, release (also forced), the remaining TTL, and who holds a key.

use std::time::{Duration, Instant};

use super::count::undecided;
use super::fan_out::Ask;
use super::group::Quorum;
use crate::backend::call::Call;
use crate::backend::force::{Forced, parse_forced};
use crate::backend::introspect::{self, HeldBy, KeyHolders};
use crate::backend::outcome::{Refreshed, Released};
use crate::backend::request::{Refresh, Release};
use crate::backend::scripts;
use crate::hold::Kind;
use crate::{Error, Result};

impl Quorum {
    /// Refreshes a batch on every node: a lock is held when a majority refreshed it, lost
    /// when too few did even if every node that did not answer had, and unknown between.
    pub(crate) fn refresh(&self, locks: &[Refresh<'_>]) -> Result<Vec<Refreshed>> {
        if locks.is_empty() {
            return Ok(Vec::new());
        }
        let sent_at = Instant::now();
        let (answers, silent) =
            self.answers(&scripts::refresh_call(locks), Ask::Awake, |reply| {
                Ok(scripts::parse_refreshed(reply, locks.len())?)
            })?;
        let mut held = vec![0; locks.len()];
        for answer in &answers {
            for (count, refreshed) in held.iter_mut().zip(answer) {
                *count += usize::from(*refreshed);
            }
        }
        Ok(held
            .into_iter()
            .map(|held| match self.count(held, silent) {
                Some(true) => Refreshed::Held { sent_at },
                Some(false) => Refreshed::Lost,
                None => Refreshed::Unknown,
            })
            .collect())
    }

    /// Releases on every node, resting ones too (on probation: see
    /// [`fan_out`](Self::fan_out)), as a node back from a short failure may hold the lock;
    /// `true` when a majority still held it, `false` when too few did even counting the
    /// nodes that did not answer.
    pub(crate) fn release(&self, release: &Release<'_>) -> Result<bool> {
        let release = scripts::release_call(release, None);
        let (answers, silent) = self.answers(&release, Ask::Every, |reply| {
            Ok(scripts::parse_released(reply)?.held)
        })?;
        let held = answers.into_iter().filter(|&held| held).count();
        self.count(held, silent)
            .ok_or_else(|| Error::Redis(undecided()))
    }

    /// A forced release (see `backend::force`) on every node, resting ones too (as
    /// [`release`](Self::release)): removed when a majority of the nodes removed a live
    /// hold; any node's refusal (a key of another type there) is the answer, though the
    /// other nodes may have removed theirs. An error when the nodes that did not answer
    /// could make it either.
    pub(crate) fn force_release(&self, call: &Call) -> Result<Forced> {
        let (answers, silent) = self.answers(call, Ask::Every, |reply| Ok(parse_forced(reply)?))?;
        let mut removed = 0;
        for answer in answers {
            match answer {
                Forced::Done(released) => removed += usize::from(released.held),
                refused @ Forced::Refused { .. } => return Ok(refused),
            }
        }
        let held = self
            .count(removed, silent)
            .ok_or_else(|| Error::Redis(undecided()))?;
        Ok(Forced::Done(Released {
            held,
            handed: Vec::new(),
        }))
    }

    /// How long a majority of the nodes will still hold the lock: the TTL of the node at
    /// which fewer than a majority would remain. `None` when too few hold it, even counting
    /// the nodes that did not answer.
    pub(crate) fn ttl(&self, kind: Kind, keys: &[String], value: &str) -> Result<Option<Duration>> {
        let (answers, silent) =
            self.answers(&scripts::ttl_call(kind, keys, value), Ask::Awake, |reply| {
                Ok(scripts::parse_ttl(reply)?)
            })?;
        let mut ttls: Vec<Duration> = answers.into_iter().flatten().collect();
        ttls.sort_unstable_by(|a, b| b.cmp(a));
        match self.count(ttls.len(), silent) {
            Some(true) => Ok(ttls.get(self.majority() - 1).copied()),
            Some(false) => Ok(None),
            None => Err(Error::Redis(undecided())),
        }
    }

    /// Who holds a key, as a majority of the nodes see it: each value found on a majority
    /// of them, with the TTL a majority will still hold it for; the counter is `None` (a
    /// quorum gives no fencing tokens). An error when the nodes that did not answer could
    /// make a value held or not (as for [`ttl`](Self::ttl)). (Locks only: a quorum has no
    /// read locks or semaphores, so no counting.)
    pub(crate) fn key_holders(&self, call: &Call) -> Result<KeyHolders> {
        let (answers, silent) = self.answers(call, Ask::Awake, |reply| {
            Ok(introspect::parse_key_holders(reply, false)?)
        })?;
        let mut seen: Vec<(String, Vec<Option<Duration>>)> = Vec::new();
        let mut held_by = HeldBy::Nobody;
        for answer in answers {
            match answer {
                KeyHolders::Held {
                    held_by: on_node,
                    holds,
                    ..
                } => {
                    if on_node != HeldBy::Nobody {
                        held_by = on_node;
                    }
                    for (value, ttl) in holds {
                        match seen.iter_mut().find(|(seen, _)| *seen == value) {
                            Some((_, ttls)) => ttls.push(ttl),
                            None => seen.push((value, vec![ttl])),
                        }
                    }
                }
                wrong @ KeyHolders::WrongType { .. } => return Ok(wrong),
            }
        }
        let majority = self.majority();
        if seen
            .iter()
            .any(|(_, ttls)| self.count(ttls.len(), silent).is_none())
        {
            return Err(Error::Redis(undecided()));
        }
        let holds = seen
            .into_iter()
            .filter(|(_, ttls)| ttls.len() >= majority)
            .map(|(value, mut ttls)| {
                // `None` (no TTL) sorts first: the longest.
                ttls.sort_unstable_by(|a, b| {
                    b.unwrap_or(Duration::MAX).cmp(&a.unwrap_or(Duration::MAX))
                });
                (value, ttls[majority - 1])
            })
            .collect::<Vec<_>>();
        Ok(KeyHolders::Held {
            held_by: if holds.is_empty() {
                HeldBy::Nobody
            } else {
                held_by
            },
            fence: None,
            count: holds.len(),
            holds,
        })
    }
}
