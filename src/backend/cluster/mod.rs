//! Redis Cluster: each lock's keys on the master that serves their hash slot, through
//! redis-rs's cluster client (which follows MOVED and ASK redirections).
//!
//! A script runs on one slot, so a lock whose keys share a slot (a common hash tag) is
//! one atomic script call, as on one server. A lock across slots (only with
//! [`LockOptions::across_slots`](crate::LockOptions::across_slots)) is taken slot by slot,
//! in ascending slot order, and what was taken is taken back when a slot is held
//! elsewhere: all-or-nothing in effect, but not atomic.
//!
//! - `connections.rs`: the pool of cluster connections, and the slot map it keeps;
//! - `per_master.rs`: sending a request's slot parts master by master;
//! - `acquire.rs`: taking a lock, on one slot or across slots;
//! - `held.rs`: refresh, release and TTL of a lock once taken;
//! - `checks.rs`: what a cluster refuses before any round trip.

mod acquire;
mod checks;
mod connections;
mod held;
mod per_master;

pub(crate) use self::checks::{check_semaphore_slot, check_slots};
pub(crate) use self::connections::{ClusterPool, wait_on_slot};
