//! [`Backend`]: the one server, quorum or cluster a locker's holds live on, and each
//! operation sent to whichever it is; and what each refuses before any round trip.

use std::sync::Arc;
use std::time::Duration;

use super::call::Call;
use super::cluster::{self, ClusterPool};
use super::fence::queue_keys;
use super::introspect::{self, KeyHolders};
use super::outcome::{Acquired, Refreshed, Released};
use super::pool::Pool;
use super::quorum::{self, Quorum};
use super::replicas;
use super::request::{Attempt, MAX_REPLICAS, Refresh, Release, Replicas};
use super::scripts;
use super::slot::{self, slot};
use crate::hold::{Kind, drift_ms};
use crate::{Error, LockOptions, Result};

/// Where a locker's holds live.
#[derive(Clone)]
pub(crate) enum Backend {
    Single(Pool),
    Quorum(Arc<Quorum>),
    /// The cluster, and a pool per seed node for the subscriber (any node hears every
    /// PUBLISH in a cluster).
    Cluster(Arc<ClusterPool>, Vec<Pool>),
}

impl Backend {
    /// Refuses, before any round trip, what this backend cannot do. `keys` are the Redis
    /// keys, `names` the caller's (when a prefix makes them differ).
    pub(crate) fn supports(
        &self,
        kind: Kind,
        keys: &[String],
        names: Option<&[String]>,
        prefix: &str,
        options: &LockOptions,
        ttl_ms: u64,
    ) -> Result<()> {
        self.supports_replicas(options.replicas)?;
        if let Kind::Permit { .. } = kind {
            return self.supports_permits(keys, prefix, options.fencing);
        }
        if kind == Kind::Read {
            return self.supports_reads(keys, names, prefix, options);
        }
        match self {
            Backend::Single(_) => Ok(()),
            Backend::Quorum(_) if options.fencing => Err(Error::InvalidInput(
                "fencing tokens need one server or a cluster: independent counters on a \
                 quorum of servers cannot give one rising sequence"
                    .into(),
            )),
            Backend::Quorum(_) => self.check_ttl(ttl_ms),
            Backend::Cluster(..) => {
                let names = names.unwrap_or(keys);
                cluster::check_slots(keys, names, prefix, options.across_slots, options.fencing)
            }
        }
    }

    /// Refuses, before any round trip, waiting for more replicas than any master has, or
    /// for replicas on a quorum (independent masters have none).
    pub(crate) fn supports_replicas(&self, replicas: u32) -> Result<()> {
        if replicas > MAX_REPLICAS {
            return Err(Error::InvalidInput(format!(
                "replicas({replicas}) is more than {MAX_REPLICAS}: no master has that many"
            )));
        }
        if replicas > 0 && matches!(self, Backend::Quorum(_)) {
            return Err(Error::InvalidInput(
                "replicas(n) needs one server, Sentinel or a cluster: the independent masters \
                 of a quorum have no replicas to wait for"
                    .into(),
            ));
        }
        Ok(())
    }

    /// Refuses, before any round trip, a semaphore (whose Redis key is `keys[0]`) where
    /// its permits could not be held: on a quorum, and on a cluster, with `fencing`, when
    /// its counter would not share its slot.
    pub(crate) fn supports_permits(
        &self,
        keys: &[String],
        prefix: &str,
        fencing: bool,
    ) -> Result<()> {
        match self {
            Backend::Single(_) => Ok(()),
            Backend::Quorum(_) => Err(Error::InvalidInput(
                "semaphores need one server or a cluster: on a quorum of independent servers \
                 more holders than the limit could each find a majority below it (with 5 \
                 servers and a limit of 8, up to 13)"
                    .into(),
            )),
            Backend::Cluster(..) => cluster::check_semaphore_slot(keys, prefix, fencing),
        }
    }

    /// Refuses, before any round trip, an election whose keys (see
    /// `fence::election_keys`, the lock's first) this backend cannot keep: on a quorum (no
    /// one counter of terms), and on a cluster when they, and the lock's queue, would not
    /// share one slot.
    pub(crate) fn supports_elections(&self, keys: &[String; 3], prefix: &str) -> Result<()> {
        match self {
            Backend::Single(_) => Ok(()),
            Backend::Quorum(_) => Err(Error::InvalidInput(
                "elections need one server, Sentinel or a cluster: a term must come from one \
                 counter, and the independent servers of a quorum each have their own"
                    .into(),
            )),
            Backend::Cluster(..) => {
                let lock = std::slice::from_ref(&keys[0]);
                let first = slot(&keys[0]);
                match keys.iter().all(|key| slot(key) == first) && self.queues(lock, prefix) {
                    true => Ok(()),
                    false => Err(Error::InvalidInput(format!(
                        "the election's keys ({keys:?}) would not share one cluster hash slot: \
                         give it a name without braces, or a prefix without an unmatched `{{`"
                    ))),
                }
            }
        }
    }

    /// Runs `call` on `keys` where they live (the one server, or the master of their
    /// slot); refused on a quorum, and on a cluster when the keys do not share a slot. Only
    /// for calls whose repeat does no harm (see [`Pool::run`]).
    pub(crate) fn run_in_slot<T>(
        &self,
        keys: &[&str],
        call: &Call,
        parse: impl Fn(redis::Value) -> redis::RedisResult<T>,
    ) -> Result<T> {
        let written = self.write_in_slot(keys, call, parse, None, |_| false)?;
        Ok(written.0)
    }

    /// Like [`run_in_slot`](Self::run_in_slot), then, with `replicas` wanted and a reply
    /// that says it `wrote`, `WAIT` on the same connection: how many replicas
    /// acknowledged the write.
    pub(crate) fn write_in_slot<T>(
        &self,
        keys: &[&str],
        call: &Call,
        parse: impl Fn(redis::Value) -> redis::RedisResult<T>,
        replicas: Option<Replicas>,
        wrote: impl Fn(&T) -> bool,
    ) -> Result<(T, Option<(Replicas, u32)>)> {
        match self {
            Backend::Single(pool) => pool.run(|con| {
                let written = parse(call.run(con)?)?;
                let acknowledged = match replicas {
                    Some(wanted) if wrote(&written) => Some((wanted, replicas::wait(con, wanted)?)),
                    _ => None,
                };
                Ok((written, acknowledged))
            }),
            Backend::Cluster(..) if keys.iter().any(|key| slot(key) != slot(keys[0])) => {
                Err(Error::InvalidInput(format!(
                    "keys {keys:?} would not share one cluster hash slot: use a key without \
                     braces, or with a hash tag of its own"
                )))
            }
            Backend::Cluster(cluster, _) => cluster.run(|con| {
                let written = parse(call.run(con)?)?;
                let at = keys.first().map_or(0, |key| slot(key));
                let acknowledged = match replicas {
                    Some(wanted) if wrote(&written) => {
                        Some((wanted, cluster::wait_on_slot(con, at, wanted)?))
                    }
                    _ => None,
                };
                Ok((written, acknowledged))
            }),
            Backend::Quorum(_) => Err(Error::InvalidInput(
                "fenced writes and elections need one server, Sentinel or a cluster".into(),
            )),
        }
    }

    /// Tells whoever listens on `channel` (any node of a cluster hears it) that something
    /// changed.
    pub(crate) fn publish(&self, channel: &str) -> Result<()> {
        let mut publish = redis::cmd("PUBLISH");
        publish.arg(channel).arg("");
        let call = Call::command(publish);
        self.run_in_slot(&[], &call, |_| Ok(()))
    }

    /// Refuses, before any round trip, a shared hold of `keys` this backend cannot give: on
    /// a quorum, and on a cluster across slots.
    fn supports_reads(
        &self,
        keys: &[String],
        names: Option<&[String]>,
        prefix: &str,
        options: &LockOptions,
    ) -> Result<()> {
        match self {
            Backend::Single(_) => Ok(()),
            Backend::Quorum(_) => Err(Error::InvalidInput(
                "read locks need one server or a cluster: on a quorum of independent \
                 servers, readers and writers could each win a different majority"
                    .into(),
            )),
            // One script per read lock: never across slots.
            Backend::Cluster(..) => {
                cluster::check_slots(keys, names.unwrap_or(keys), prefix, false, options.fencing)
            }
        }
    }

    /// Refuses a TTL this backend cannot hold a lock for: on a quorum, one that leaves no
    /// validity after the longest attempt and the drift allowance.
    pub(crate) fn check_ttl(&self, ttl_ms: u64) -> Result<()> {
        let Backend::Quorum(quorum) = self else {
            return Ok(());
        };
        let attempt = quorum.longest_attempt().as_millis();
        let needed = attempt + u128::from(drift_ms(ttl_ms));
        if u128::from(ttl_ms) <= needed {
            return Err(Error::InvalidInput(format!(
                "ttl of {ttl_ms} ms leaves no time to hold a quorum lock after the longest \
                 attempt ({attempt} ms, 1.5 node timeouts) and the clock drift allowance: use \
                 a longer ttl or a shorter node_timeout"
            )));
        }
        Ok(())
    }

    /// One attempt to take every key; see [`scripts::acquire`] and [`Quorum::acquire`].
    pub(crate) fn acquire(&self, attempt: &Attempt<'_>, set_first: bool) -> Result<Acquired> {
        match self {
            // Safe to repeat: taking keys that already hold our value again is a no-op.
            Backend::Single(pool) => {
                let mut sent = false;
                let acquired = pool.run(|con| {
                    sent = true;
                    let acquired = scripts::acquire(con, attempt, set_first)?;
                    replicas::confirm(con, attempt, acquired, replicas::wait)
                });
                replicas::unconfirmed(attempt, sent, &acquired, || {
                    pool.run(|con| scripts::release(con, &attempt.take_back()))
                });
                acquired
            }
            Backend::Quorum(quorum) => quorum.acquire(attempt, set_first),
            Backend::Cluster(cluster, _) => cluster.acquire(attempt, set_first),
        }
    }

    /// Whether holds of `kind` on `keys` wait in the server's queue (see
    /// `lua/queue/queue.lua`): everywhere but on a quorum (independent servers, each with
    /// a queue of its own, could not agree on one order) and for a lock across cluster
    /// slots (one script could not see all its queues).
    /// On a cluster, the queue's keys must share the hold's slot too (`prefix` comes
    /// before them): not for a name with an unmatched brace.
    pub(crate) fn queues(&self, keys: &[String], prefix: &str) -> bool {
        match self {
            Backend::Single(_) => true,
            Backend::Cluster(..) => {
                let first = keys.first().map(|key| slot(key));
                let mut all = keys.iter().cloned().chain(queue_keys(prefix, keys));
                all.all(|key| Some(slot(&key)) == first)
            }
            Backend::Quorum(_) => false,
        }
    }

    /// Whether releases announce the keys they free on the release channels, for waiters
    /// that do not queue: on a quorum, and on a cluster (locks across slots).
    pub(crate) fn announces(&self) -> bool {
        !matches!(self, Backend::Single(_))
    }

    /// Whether a failed attempt on `keys` is taken back by a request that may still run
    /// after a later attempt's (a late node's take-back on a quorum, a timed-out one
    /// across cluster slots): each attempt then needs a value of its own, or an old
    /// take-back could delete what a later attempt counted as taken.
    pub(crate) fn takes_back(&self, keys: &[String]) -> bool {
        match self {
            Backend::Single(_) => false,
            Backend::Quorum(_) => true,
            Backend::Cluster(..) => slot::by_slot(keys).len() > 1,
        }
    }

    /// Refreshes a batch: what was found of each lock. An error when nothing could be
    /// asked at all.
    pub(crate) fn refresh(&self, locks: &[Refresh<'_>]) -> Result<Vec<Refreshed>> {
        match self {
            // Safe to repeat: setting the same TTL twice is the same as once.
            Backend::Single(pool) => pool.run(|con| replicas::refresh(con, locks, replicas::wait)),
            Backend::Quorum(quorum) => quorum.refresh(locks),
            Backend::Cluster(cluster, _) => cluster.refresh(locks),
        }
    }

    /// What happened when a refresh found a lock [`Refreshed::Unknown`].
    pub(crate) fn undecided(&self) -> redis::RedisError {
        match self {
            Backend::Quorum(_) => quorum::undecided(),
            // On a cluster, a lock across slots some of whose masters could not be asked.
            Backend::Single(_) | Backend::Cluster(..) => redis::RedisError::from((
                redis::ErrorKind::Io,
                "some of the lock's hash slots could not be refreshed",
            )),
        }
    }

    /// Gives the hold up (deletes a lock's keys, a permit from its holders) if it is still
    /// `value`'s, serving the waiters next in the queue; `held` is `false` when it was not
    /// held.
    pub(crate) fn release(&self, release: &Release<'_>) -> Result<Released> {
        match self {
            // Repeated only when the connection was found closed: should the server have run
            // the first one after all, the second reports the lock lost (never the reverse).
            Backend::Single(pool) => pool.run(|con| scripts::release(con, release)),
            Backend::Quorum(quorum) => quorum.release(release).map(|held| Released {
                held,
                handed: Vec::new(),
            }),
            Backend::Cluster(cluster, _) => cluster.release(release),
        }
    }

    /// The hold's remaining TTL; `None` when it is not held.
    pub(crate) fn ttl(&self, kind: Kind, keys: &[String], value: &str) -> Result<Option<Duration>> {
        match self {
            Backend::Single(pool) => pool.run(|con| scripts::ttl(con, kind, keys, value)),
            Backend::Quorum(quorum) => quorum.ttl(kind, keys, value),
            Backend::Cluster(cluster, _) => cluster.ttl(kind, keys, value),
        }
    }

    /// Who holds `key` (with its fencing counter at `counter`), or with `count_only` how
    /// many; on a quorum, the holders a majority of the nodes agree on.
    pub(crate) fn key_holders(
        &self,
        key: &str,
        beside: &[String],
        count_only: bool,
    ) -> Result<KeyHolders> {
        let call = introspect::key_holders_call(key, beside, count_only);
        let parse = |reply| introspect::parse_key_holders(reply, count_only);
        match self {
            // Read only: safe to repeat.
            Backend::Single(pool) => pool.run(|con| parse(call.run(con)?)),
            Backend::Cluster(cluster, _) => cluster.run(|con| parse(call.run(con)?)),
            Backend::Quorum(quorum) => quorum.key_holders(&call),
        }
    }

    /// Turns the lock `release.value` holds on its keys into a shared hold, in one step
    /// (one slot).
    pub(crate) fn downgrade(&self, release: &Release<'_>, ttl_ms: u64) -> Result<Released> {
        let keys = release.keys;
        // Keys are never empty here: the lock holds them.
        let one_slot = || keys.iter().all(|key| slot(key) == slot(&keys[0]));
        match self {
            Backend::Single(pool) => pool.run(|con| scripts::downgrade(con, release, ttl_ms)),
            Backend::Cluster(cluster, _) if one_slot() => {
                cluster.run(|con| scripts::downgrade(con, release, ttl_ms))
            }
            Backend::Cluster(..) | Backend::Quorum(_) => Err(Error::InvalidInput(
                "a downgrade needs the lock on one server, or in one cluster hash slot".into(),
            )),
        }
    }

    /// The servers a subscriber may listen on for releases (any one of them hears every
    /// release it is told of).
    pub(crate) fn listen_pools(&self) -> Vec<Pool> {
        match self {
            Backend::Single(pool) => vec![pool.clone()],
            // Last node first: requests go out in node order, so by the time the last node
            // announces a release the others have most likely run it too.
            Backend::Quorum(quorum) => quorum.pools().into_iter().rev().collect(),
            Backend::Cluster(_, seeds) => seeds.clone(),
        }
    }
}
