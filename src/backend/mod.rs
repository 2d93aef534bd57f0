//! Where the locks live, and how a request reaches them: one Redis server, a quorum of
//! independent ones (Redlock), or a Redis Cluster. Each operation is the same script
//! everywhere (`scripts`, from `lua/`); only how it reaches Redis differs.
//!
//! - `dispatch.rs`: [`Backend`], which sends each operation where the holds live;
//! - `request.rs`: what a hold asks (an attempt, a refresh, the replicas it waits for);
//! - `outcome.rs`: what every backend answers;
//! - `scripts.rs`, `call.rs`: the scripts, and how one is sent (EVALSHA, EVAL on
//!   NOSCRIPT); `introspect.rs`: asking who holds what; `election.rs`: who leads an
//!   election, a leader's new value, and fenced writes; `force.rs`: a lock removed
//!   whoever holds it (break-glass);
//! - `replicas.rs`: WAIT for the replicas a hold wants;
//! - `pool/`: connections, bounded by the timeouts of `bounds.rs`; `tls.rs`: TLS set-up;
//! - `sentinel/`: the master the sentinels name, followed through failovers;
//! - `quorum/`: a request fanned out to every node, and the votes counted;
//! - `cluster/` (with `slot.rs`, `masters.rs` and `fence.rs`): routing by hash slot.

mod bounds;
mod call;
mod cluster;
mod dispatch;
mod election;
mod fence;
mod force;
mod introspect;
mod masters;
mod outcome;
mod pool;
mod quorum;
mod replicas;
mod request;
mod scripts;
mod sentinel;
mod slot;
#[cfg(feature = "tls")]
pub(crate) mod tls;

pub(crate) use bounds::Bounds;
pub(crate) use cluster::ClusterPool;
pub(crate) use dispatch::Backend;
pub(crate) use election::{
    Found, Led, fenced_set_call, leader_call, parse_leader, parse_written, proclaim_call,
};
pub(crate) use fence::{election_keys, entry_keys, fence_key, fenced_record};
pub(crate) use force::Force;
pub(crate) use introspect::{HeldBy, Holds, KeyHolders};
pub(crate) use outcome::{Acquired, Handed, Refreshed};
pub(crate) use pool::Pool;
pub use pool::SocketTimeouts;
pub(crate) use quorum::Quorum;
pub(crate) use request::{Attempt, Queue, Refresh, Release, Replicas};
pub(crate) use scripts::queue_entry;
pub(crate) use sentinel::Sentinels;
pub(crate) use slot::slot;
