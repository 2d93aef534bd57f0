//! The pool type, and how a pool is built: ours (connections made bounded, to a server or
//! to the master the sentinels name), eagerly or lazily, each with a worker thread of its
//! own.

use std::sync::Arc;
use std::time::Duration;

use redis::Client;
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};

use super::connector::{BoundedClient, Target};
use crate::Result;
use crate::backend::bounds::Bounds;
use crate::backend::sentinel::Sentinels;

/// A pool the locker built itself (connects bounded too), or one the caller handed over.
#[derive(Clone)]
pub(crate) enum Pool {
    Own {
        pool: r2d2::Pool<BoundedClient>,
        /// For connections outside the pool (the subscriber's).
        connector: Box<BoundedClient>,
    },
    Given {
        pool: r2d2::Pool<Client>,
        io: Duration,
    },
}

/// The thread that makes a pool's connections in the background: one per pool (r2d2 would
/// start three). Not one shared by a locker's pools: making a connection to a frozen
/// server holds a thread for the connect timeout, and must not hold up another server's.
pub(crate) fn worker() -> Arc<ScheduledThreadPool> {
    Arc::new(
        ScheduledThreadPool::builder()
            .num_threads(1)
            .thread_name_pattern("redguard-pool")
            // Its jobs (connects, reaping idle connections) are the pool's: gone with it.
            .on_drop_behavior(OnPoolDropBehavior::DiscardPendingScheduled)
            .build(),
    )
}

impl Pool {
    /// A pool of `size` connections to `client`, all made before this returns, so that a
    /// wrong address or a dead server is reported here.
    pub(crate) fn build(client: Client, size: u32, bounds: Bounds) -> Result<Pool> {
        Pool::build_to(Target::Server(Box::new(client)), size, bounds)
    }

    /// A pool of `size` connections to the master `sentinels` name, following it through
    /// failovers; built as [`build`](Self::build) is.
    pub(crate) fn build_sentinel(
        sentinels: Arc<Sentinels>,
        size: u32,
        bounds: Bounds,
    ) -> Result<Pool> {
        Pool::build_to(Target::Sentinel(sentinels), size, bounds)
    }

    fn build_to(target: Target, size: u32, bounds: Bounds) -> Result<Pool> {
        let connector = BoundedClient { target, bounds };
        // One connection first, to report what went wrong at once (r2d2 would retry a
        // refused port or a wrong password until its checkout timeout, then report only
        // that it timed out). A PING on it, as a server that wants a password the URL
        // does not give accepts the connection and refuses every command (NOAUTH), and a
        // listener that is not Redis answers in no shape Redis has.
        let mut first = r2d2::ManageConnection::connect(&connector)?;
        redis::cmd("PING").query::<()>(&mut first.con)?;
        let pool = r2d2::Pool::builder()
            .max_size(size)
            // r2d2 would PING on every checkout: a round trip more per lock operation.
            // Connections that failed are dropped instead, through `has_broken`.
            .test_on_check_out(false)
            .connection_timeout(bounds.checkout)
            .thread_pool(worker())
            .build(connector.clone())?;
        let connector = Box::new(connector);
        Ok(Pool::Own { pool, connector })
    }

    /// A pool of up to `size` connections to `client`, made as they are needed: for one of
    /// several servers, where one that is down must not stop the others from being used.
    pub(crate) fn build_lazy(client: Client, size: u32, bounds: Bounds) -> Pool {
        let connector = BoundedClient {
            target: Target::Server(Box::new(client)),
            bounds,
        };
        let pool = r2d2::Pool::builder()
            .max_size(size)
            .test_on_check_out(false)
            .connection_timeout(bounds.checkout)
            .thread_pool(worker())
            .build_unchecked(connector.clone());
        let connector = Box::new(connector);
        Pool::Own { pool, connector }
    }
}
