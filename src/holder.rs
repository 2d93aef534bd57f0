use std::time::Duration;

/// One live hold as Redis shows it to anyone (from [`Semaphore::holders`](crate::Semaphore::holders)):
/// what its owner stored as metadata, and how long it has left. Never its token.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Holder {
    metadata: String,
    ttl: Option<Duration>,
}

impl Holder {
    pub(crate) fn new(metadata: String, ttl: Option<Duration>) -> Holder {
        Holder { metadata, ttl }
    }

    /// The metadata its owner gave in [`LockOptions::metadata`](crate::LockOptions::metadata)
    /// (empty if none).
    pub fn metadata(&self) -> &str {
        &self.metadata
    }

    /// The time it has left, on the server's clock; `None` when it has no TTL.
    pub fn ttl(&self) -> Option<Duration> {
        self.ttl
    }
}
