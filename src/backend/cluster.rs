//! Redis Cluster: each lock's keys on the master that serves their hash slot, through
//! redis-rs's cluster client (which follows MOVED and ASK redirections).
//!
//! A script runs on one slot, so a lock whose keys share a slot (a common hash tag) is
//! one atomic script call, as on one server. A lock across slots (only with
//! [`LockOptions::across_slots`](crate::LockOptions::across_slots)) is taken slot by slot,
//! in ascending slot order, and what was taken is taken back when a slot is held
//! elsewhere: all-or-nothing in effect, but not atomic.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::time::Duration;

use parking_lot::Mutex;
use redis::cluster::{ClusterClient, ClusterConnection};
use redis::cluster_routing::{Route, RoutingInfo, SingleNodeRoutingInfo, SlotAddr};
use redis::{ConnectionLike, ErrorKind, RedisError, RedisResult, ServerErrorKind, Value};

use super::bounds::Bounds;
use super::fence::fence_key;
use super::masters::Masters;
use super::outcome::{Acquired, Refreshed, Released};
use super::replicas;
use super::request::{Attempt, Refresh, Replicas};
use super::scripts;
use super::slot::{by_slot, slot};
use crate::hold::Kind;
use crate::{Error, Result};

/// A pool of cluster connections (each one a connection to every master).
pub(crate) struct ClusterPool {
    pool: r2d2::Pool<ClusterConnector>,
    masters: Mutex<Masters>,
    /// Masters whose last call failed without an answer: asked last (see `per_master`).
    suspects: Mutex<HashSet<String>>,
}

/// Makes cluster connections for the pool, and throws away those that failed mid-request.
struct ClusterConnector {
    client: ClusterClient,
}

struct Tracked {
    con: ClusterConnection,
    broken: bool,
}

impl r2d2::ManageConnection for ClusterConnector {
    type Connection = Tracked;
    type Error = RedisError;

    fn connect(&self) -> RedisResult<Tracked> {
        let con = self.client.get_connection()?;
        Ok(Tracked { con, broken: false })
    }

    fn is_valid(&self, tracked: &mut Tracked) -> RedisResult<()> {
        redis::cmd("PING").query(&mut tracked.con)
    }

    fn has_broken(&self, tracked: &mut Tracked) -> bool {
        tracked.broken || !tracked.con.is_open()
    }
}

impl ClusterPool {
    /// A pool of `size` connections to the cluster `client` points at, all made before
    /// this returns (so that unreachable seeds are reported here).
    pub(crate) fn build(client: ClusterClient, size: u32, bounds: Bounds) -> Result<ClusterPool> {
        let pool = r2d2::Pool::builder()
            .max_size(size)
            // A PING on every checkout would cost a round trip per lock operation.
            .test_on_check_out(false)
            .connection_timeout(bounds.checkout)
            .thread_pool(super::pool::worker())
            .build(ClusterConnector { client })?;
        let cluster = ClusterPool {
            pool,
            masters: Mutex::default(),
            suspects: Mutex::default(),
        };
        cluster.ask_for_masters();
        Ok(cluster)
    }

    /// Asks for the slot map again (best effort: a failure keeps the old one).
    fn ask_for_masters(&self) {
        let reply = self.run(|con| redis::cmd("CLUSTER").arg("SLOTS").query::<Value>(con));
        let mut masters = self.masters.lock();
        match reply {
            Ok(reply) => *masters = Masters::parse(&reply),
            Err(_) => masters.touched(),
        }
    }

    /// Runs one request on a pooled connection (it goes to the master of its keys' slot).
    /// A connection whose request failed other than by an error reply may be out of step
    /// with its replies: it is not used again.
    pub(crate) fn run<T>(
        &self,
        request: impl FnOnce(&mut ClusterConnection) -> RedisResult<T>,
    ) -> Result<T> {
        let mut tracked = self.pool.get()?;
        let result = request(&mut tracked.con);
        if let Err(e) = &result
            && e.code().is_none()
        {
            tracked.broken = true;
        }
        Ok(result?)
    }

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
                        // Announced: a reader may have seen the key taken, and waits.
                        let _ = self.run(|con| {
                            let channels = attempt.channels;
                            scripts::release(con, attempt.kind, keys, attempt.value, channels)
                        });
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
            let (kind, keys, value) = (attempt.kind, attempt.keys, attempt.value);
            self.run(|con| scripts::release(con, kind, keys, value, attempt.channels))
        });
        acquired
    }

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

    /// Runs `call` on each slot's part of a request, one after another, grouped by master
    /// as far as the slot map knows them: once a part's call fails without an answer (a
    /// timeout, a closed connection; not an error reply, not a busy pool), the other parts
    /// of its master are not sent and get a [`skipped`] error, and the master becomes a
    /// suspect until it answers again. Suspects are asked after the others. So a frozen
    /// master costs a request one failed call, whatever its number of slots, and the
    /// other masters are asked first. Lazy: a caller may stop at a failure.
    fn per_master<'a, P, T>(
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

    /// One slot's part of a refresh round: what was found of each lock's part.
    fn refresh_part(&self, locks: &[Refresh<'_>], part: &Part) -> Result<Vec<Refreshed>> {
        let batch: Vec<Refresh<'_>> = part
            .iter()
            .map(|(i, keys)| Refresh {
                kind: locks[*i].kind,
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
    pub(crate) fn release(
        &self,
        kind: Kind,
        keys: &[String],
        value: &str,
        channels: &str,
    ) -> Result<Released> {
        let mut released = Released {
            held: true,
            listeners: 0,
        };
        let mut failure = None;
        let release =
            |keys: &Vec<String>| self.run(|con| scripts::release(con, kind, keys, value, channels));
        for (_, outcome) in self.per_master(by_slot(keys), release) {
            match outcome {
                Ok(part) => released.held &= part.held,
                // The first: later ones may just be skipped parts.
                Err(e) => {
                    failure.get_or_insert(e);
                }
            }
        }
        // A PUBLISH counts only the listeners of the node that ran it, which need not be
        // ours: tell "others may listen" (the hand-over streak's stricter bound).
        released.listeners = u64::MAX;
        failure.map_or(Ok(released), Err)
    }

    /// The shortest remaining TTL over all slots' parts; `None` when a part is not held.
    /// Stops at the first part that cannot be asked (suspect masters are asked last).
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

/// `WAIT` on the master of `slot`, on the connection the slot's writes went over (the
/// cluster client would send a plain WAIT to every master and answer the least count).
/// Never on a connection made again meanwhile: a new one has no writes to wait for, and
/// WAIT would count every replica at once.
fn wait_on_slot(con: &mut ClusterConnection, slot: u16, replicas: Replicas) -> RedisResult<u32> {
    let master = Route::new(slot, SlotAddr::Master);
    let route = RoutingInfo::SingleNode(SingleNodeRoutingInfo::SpecificNode(master));
    con.set_auto_reconnect(false);
    let acknowledged = con.route_command(&replicas::wait_cmd(replicas), route);
    con.set_auto_reconnect(true);
    Ok(redis::from_redis_value(acknowledged?)?)
}

/// A part of a request not sent, as its master had just failed.
fn skipped() -> Error {
    Error::Redis(RedisError::from((
        ErrorKind::Io,
        "not asked: another slot of the same master failed in this request",
    )))
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

/// On a cluster: the keys must share a hash slot unless `across_slots`, and with
/// `fencing` each counter (`prefix` + its name) must share its key's slot.
pub(crate) fn check_slots(
    keys: &[String],
    names: &[String],
    prefix: &str,
    across_slots: bool,
    fencing: bool,
) -> Result<()> {
    let groups = by_slot(keys);
    if groups.len() > 1 && !across_slots {
        let listed: Vec<String> = keys
            .iter()
            .zip(names)
            .map(|(key, name)| format!("{name:?} (slot {})", slot(key)))
            .collect();
        return Err(Error::InvalidInput(format!(
            "keys in different cluster hash slots: {}; one atomic lock needs one slot: give \
             the keys a common hash tag (like {{order42}}:a, {{order42}}:b), or allow \
             LockOptions::across_slots",
            listed.join(", ")
        )));
    }
    if fencing {
        for (key, name) in keys.iter().zip(names) {
            if slot(&format!("{prefix}{}", fence_key(key))) != slot(key) {
                return Err(Error::InvalidInput(format!(
                    "the fencing counter of {name:?} would be in another hash slot (a key or \
                     prefix with an unmatched brace): use a key with a hash tag"
                )));
            }
        }
    }
    Ok(())
}

/// On a cluster, with `fencing`: a semaphore's counter (`prefix` + its name) must share
/// the slot of the semaphore's key, which is `keys[0]`.
pub(crate) fn check_semaphore_slot(keys: &[String], prefix: &str, fencing: bool) -> Result<()> {
    let Some(key) = keys.first().filter(|_| fencing) else {
        return Ok(());
    };
    if slot(&format!("{prefix}{}", fence_key(key))) != slot(key) {
        return Err(Error::InvalidInput(format!(
            "the fencing counter of semaphore {key:?} would be in another hash slot (a name \
             or prefix with an unmatched brace): use a name with a hash tag"
        )));
    }
    Ok(())
}
