//! The sentinels of one master name, and what is known of the master: its address, its
//! configuration epoch, and its *generation* (see the `sentinel` module), moved on by
//! what a lookup or an announcement says and by connections that failed or met a replica.

use std::sync::atomic::{AtomicU64, Ordering};

use parking_lot::Mutex;
use redis::{Client, ConnectionAddr, RedisResult};

use crate::backend::bounds::Bounds;

/// Makes a client for a master's address (with the master's credentials, database and
/// TLS settings).
pub(crate) type MasterClient = dyn Fn(ConnectionAddr) -> RedisResult<Client> + Send + Sync;

/// The sentinels of one master name, and what they last said of it.
pub(crate) struct Sentinels {
    pub(super) name: String,
    pub(super) sentinels: Vec<Client>,
    pub(super) master_client: Box<MasterClient>,
    /// Whether the master speaks TLS (as the sentinels do).
    pub(super) tls: bool,
    pub(super) bounds: Bounds,
    pub(super) known: Mutex<Known>,
    /// `known.generation`, readable without the lock: every checkout and return of a
    /// pooled connection asks it.
    generation: AtomicU64,
}

#[derive(Default)]
pub(super) struct Known {
    /// The master's address as last learned.
    pub(super) master: Option<(String, u16)>,
    /// Whether to use it as it is (else look it up first): not after a connection to it
    /// failed.
    pub(super) trusted: bool,
    /// Raised each time the master changes, or the one we had answered as a replica.
    pub(super) generation: u64,
    /// The sentinels' configuration epoch of `master`, as far as we know it.
    pub(super) epoch: u64,
}

impl Sentinels {
    /// The sentinels at `sentinels`, watching the master `name`; nothing is asked yet.
    pub(crate) fn new(
        name: &str,
        sentinels: Vec<Client>,
        master_client: Box<MasterClient>,
        tls: bool,
        bounds: Bounds,
    ) -> Sentinels {
        Sentinels {
            name: name.to_string(),
            sentinels,
            master_client,
            tls,
            bounds,
            known: Mutex::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation: connections made in an older one are not used.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A new generation begins (under the lock of `known`).
    fn next_generation(&self, known: &mut Known) {
        known.generation += 1;
        self.generation.store(known.generation, Ordering::Release);
    }

    /// A sentinel named `master`: from a lookup, with its configuration's `epoch`; from an
    /// announcement of a switch, without. A new generation if it moved. Not backwards
    /// while the master we have works: a lookup's answer older than what we know (the
    /// sentinels have not all heard of the failover yet) is ignored then, and an announced
    /// switch counts as at least one epoch newer than the configuration it replaces. Once
    /// the master we have failed or answered as a replica, the newest answer is believed,
    /// whatever its epoch (sentinels set up afresh start counting again). The master to
    /// use now, and its generation.
    pub(super) fn learned(
        &self,
        master: &(String, u16),
        epoch: Option<u64>,
    ) -> ((String, u16), u64) {
        let mut known = self.known.lock();
        let stale = known.trusted && epoch.is_some_and(|epoch| epoch < known.epoch);
        if let (true, Some(current)) = (stale, &known.master) {
            let current = current.clone();
            return (current, known.generation);
        }
        if known.master.as_ref() != Some(master) {
            if known.master.is_some() {
                log::warn!(
                    "redguard: sentinel master {:?} is now {}:{}",
                    self.name,
                    master.0,
                    master.1
                );
            }
            known.epoch = match epoch {
                Some(epoch) => epoch,
                None if known.master.is_some() => known.epoch + 1,
                None => known.epoch,
            };
            known.master = Some(master.clone());
            self.next_generation(&mut known);
        } else if let Some(epoch) = epoch {
            known.epoch = match known.trusted {
                true => known.epoch.max(epoch),
                false => epoch,
            };
        }
        known.trusted = true;
        (master.clone(), known.generation)
    }

    /// A connection of `generation` to the master failed: look it up again before the
    /// next one (unless a newer generation began meanwhile).
    pub(crate) fn failed(&self, generation: u64) {
        let mut known = self.known.lock();
        if known.generation == generation {
            known.trusted = false;
        }
    }

    /// The server a connection of `generation` went to answered as a replica: every
    /// connection to it is stale, and the master is looked up again (unless a newer
    /// generation began meanwhile: then it is the old master, already left behind).
    pub(crate) fn replica_seen(&self, generation: u64) {
        let mut known = self.known.lock();
        if known.generation == generation {
            known.trusted = false;
            self.next_generation(&mut known);
        }
    }
}
