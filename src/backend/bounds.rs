//! The timeouts that bound every wait on the network: what the pools, the sentinel lookup
//! and the cluster are each built with.

use std::time::Duration;

/// The timeouts that bound every wait on the network.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) connect: Duration,
    pub(crate) io: Duration,
    pub(crate) checkout: Duration,
}
