use std::fmt;
use std::sync::Arc;

/// A hold its locker found lost, as [`LockerBuilder::on_lost`](crate::LockerBuilder::on_lost)
/// reports it: a lock, read lock, permit or election term whose keys expired, were deleted, or were
/// taken over before the refresher could extend them.
#[derive(Clone, Debug)]
pub struct Lost {
    keys: Vec<String>,
    metadata: String,
}

impl Lost {
    pub(crate) fn new(keys: Vec<String>, metadata: String) -> Lost {
        Lost { keys, metadata }
    }

    /// Its keys as the caller named them (a semaphore's name, for a permit; for an
    /// election's term, its lock, `redguard:election:{<name>}`).
    pub fn keys(&self) -> &[String] {
        &self.keys
    }

    /// The metadata its owner stored with it (for a term, the value it campaigned with).
    pub fn metadata(&self) -> &str {
        &self.metadata
    }
}

/// The callback of [`LockerBuilder::on_lost`](crate::LockerBuilder::on_lost).
#[derive(Clone)]
pub(crate) struct OnLost(pub(crate) Arc<dyn Fn(&Lost) + Send + Sync>);

impl fmt::Debug for OnLost {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("OnLost(..)")
    }
}
