//! What a locker and its guards share: the backend, the refresher, the subscriber and
//! the settings every hold reads. Its own file, so that the waiting loop and the guards
//! (in `hold`) and the public types (in `locker`) both use it without using each other.

use std::time::Duration;

use crate::backend::Backend;
use crate::hold::Refresher;
use crate::lost::OnLost;
use crate::wait::{Alarm, Subscriber};

/// What a locker and its guards share; gone (refresher thread joined) with the last of them.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) default_ttl: Duration,
    /// Put before every key (and fencing counter) in Redis.
    pub(crate) prefix: String,
    pub(crate) refresher: Refresher,
    pub(crate) subscriber: Subscriber,
    /// The longest a hold waits for its replicas' acknowledgement (WAIT's timeout).
    pub(crate) replica_timeout: Duration,
    /// How long a waiter's queue entry lives unless renewed (see `hold::place`).
    pub(crate) waiter_lifetime: Duration,
    /// Rung by [`Locker::close`](crate::Locker::close): every wait of the locker checks
    /// it beside its own `Cancel`, and ends.
    pub(crate) closed: Alarm,
}

impl Shared {
    /// What a locker on `backend` shares, its keys (and channels) starting with `prefix`.
    pub(crate) fn new(
        backend: Backend,
        default_ttl: Duration,
        prefix: String,
        on_lost: Option<OnLost>,
        replica_timeout: Duration,
        waiter_lifetime: Duration,
    ) -> Shared {
        Shared {
            refresher: Refresher::new(backend.clone(), on_lost),
            subscriber: Subscriber::new(backend.listen_pools(), &prefix),
            backend,
            default_ttl,
            prefix,
            replica_timeout,
            waiter_lifetime,
            closed: Alarm::default(),
        }
    }

    /// Where releases announce the keys they free, for waiters that do not queue (see
    /// [`Backend::announces`]); empty where every waiter queues.
    pub(crate) fn announce(&self) -> &str {
        match self.backend.announces() {
            true => self.subscriber.release_channels(),
            false => "",
        }
    }
}
