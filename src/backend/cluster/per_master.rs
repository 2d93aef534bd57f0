//! Sending a request's slot parts master by master: the parts of a master that just
//! failed are skipped, and masters that failed last time are asked last.

use std::collections::HashSet;

use redis::{ErrorKind, RedisError};

use super::connections::ClusterPool;
use crate::{Error, Result};

impl ClusterPool {
    /// Runs `call` on each slot's part of a request, one after another, grouped by master
    /// as far as the slot map knows them: once a part's call fails without an answer (a
    /// timeout, a closed connection; not an error reply, not a busy pool), the other parts
    /// of its master are not sent and get a [`skipped`] error, and the master becomes a
    /// suspect until it answers again. Suspects are asked after the others. So a frozen
    /// master costs a request one failed call, whatever its number of slots, and the
    /// other masters are asked first. Lazy: a caller may stop at a failure.
    pub(super) fn per_master<'a, P, T>(
        &'a self,
        parts: impl IntoIterator<Item = (u16, P)>,
        mut call: impl FnMut(&P) -> Result<T> + 'a,
    ) -> impl Iterator<Item = (P, Result<T>)> + 'a
    where
        P: 'a,
        T: 'a,
    {
        // With each slot's master: suspects last, else in slot order.
        let mut parts: Vec<(Option<String>, P)> = {
            let masters = self.masters.lock();
            parts
                .into_iter()
                .map(|(slot, part)| (masters.of(slot).map(str::to_string), part))
                .collect()
        };
        {
            let suspects = self.suspects.lock();
            parts.sort_by_key(|(master, _)| master.as_ref().is_some_and(|m| suspects.contains(m)));
        }
        let mut failed: HashSet<String> = HashSet::new();
        parts.into_iter().map(move |(master, part)| {
            let Some(master) = master else {
                let outcome = call(&part);
                return (part, outcome);
            };
            if failed.contains(&master) {
                return (part, Err(skipped()));
            }
            let outcome = call(&part);
            match &outcome {
                Err(Error::Redis(e)) if e.code().is_none() => {
                    failed.insert(master.clone());
                    self.suspects.lock().insert(master);
                }
                Ok(_) | Err(Error::Redis(_)) => {
                    self.suspects.lock().remove(&master);
                }
                Err(_) => {}
            }
            (part, outcome)
        })
    }
}

/// A part of a request not sent, as its master had just failed.
fn skipped() -> Error {
    Error::Redis(RedisError::from((
        ErrorKind::Io,
        "not asked: another slot of the same master failed in this request",
    )))
}
