//! The quorum itself: its nodes and the node timeout, and what follows from them alone
//! (the majority, the longest attempt).

use std::time::Duration;

use super::node::Node;
use crate::backend::pool::Pool;

/// Independent Redis masters, a majority of which must agree.
pub(crate) struct Quorum {
    pub(super) nodes: Vec<Node>,
    /// The longest the replies to one request may take, all nodes together.
    pub(super) timeout: Duration,
}

impl Quorum {
    pub(crate) fn new(pools: Vec<Pool>, timeout: Duration) -> Quorum {
        let nodes = pools.into_iter().map(Node::new).collect();
        Quorum { nodes, timeout }
    }

    /// How many nodes make a majority.
    pub(crate) fn majority(&self) -> usize {
        self.nodes.len() / 2 + 1
    }

    /// Every node's pool, in the order requests are sent.
    pub(crate) fn pools(&self) -> Vec<Pool> {
        self.nodes.iter().map(|node| node.pool.clone()).collect()
    }

    /// The longest an acquisition may take, reply wait and a slow node's retry included
    /// (see [`Node::receive`]); a TTL must leave room for it.
    pub(crate) fn longest_attempt(&self) -> Duration {
        self.timeout * 3 / 2
    }
}
