//! Redlock: a lock is held when a majority of independent Redis masters hold it.
//!
//! Every request goes to all nodes at once: sent to each, then each reply read, so a
//! request costs about one round trip whatever the number of nodes, and no thread is
//! started per request. One deadline (the node timeout) bounds the replies of all nodes
//! together. A node that failed (no reply in time, or an error reply) is left out for a
//! while (50 ms, doubling up to 1 s while it keeps failing), then tried again on probation
//! (see `fan_out.rs`), so that a dead or frozen node does not cost every request a
//! timeout. A release is still sent to every node.
//!
//! - `group.rs`: the quorum itself (its nodes, the node timeout, the majority);
//! - `node.rs`: each node's health (rests and probation);
//! - `fan_out.rs`: how one request reaches every node;
//! - `count.rs`: how the answers are counted (and the PING that checks a majority is up);
//! - `vote.rs`: what an acquisition attempt's answers make of it;
//! - `acquire.rs`: taking a lock (and taking back what a lost attempt took);
//! - `held.rs`: refresh, release, TTL and holders of a lock once taken.

mod acquire;
mod count;
mod fan_out;
mod group;
mod held;
mod node;
mod vote;

pub(crate) use self::count::undecided;
pub(crate) use self::group::Quorum;
