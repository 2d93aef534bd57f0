//! Taking a connection from a pool: for one request (run again on a fresh connection when
//! the server had closed the old one, or through Sentinel met a replica), for work that
//! may be skipped, within a wait, or for one long-lived user; and never a connection to a
//! master of before a failover.

use std::time::{Duration, Instant};

use r2d2::PooledConnection;
use redis::{Connection, RedisError, RedisResult};

use super::build::Pool;
use super::conn::{Conn, Dedicated, is_readonly};
use super::connector::{BoundedClient, Master, Target};
use super::given::in_step;
use crate::Result;

impl Pool {
    /// Whether [`dedicated`](Self::dedicated) can work at all: a caller's pool of one
    /// connection has none to spare.
    pub(crate) fn can_dedicate(&self) -> bool {
        match self {
            Pool::Own { .. } => true,
            Pool::Given { pool, .. } => pool.max_size() > 1,
        }
    }

    /// A connection for one long-lived user (the subscriber), bounded like the others.
    /// From our own pool's client it comes outside the pool, so it takes no slot from the
    /// lock calls. A caller's pool offers no such way: it is taken from the pool (waiting
    /// at most `max_wait`), and holds one of its slots while in use.
    pub(crate) fn dedicated(&self, max_wait: Duration) -> Result<Dedicated> {
        match self {
            Pool::Own { connector, .. } => {
                let tracked = r2d2::ManageConnection::connect(connector.as_ref())?;
                Ok(Dedicated::Own(tracked.con, tracked.master))
            }
            Pool::Given { pool, io } => {
                let wait = max_wait.min(pool.connection_timeout());
                let con = pool.get_timeout(wait)?;
                Ok(Dedicated::Given(in_step(con, *io)?))
            }
        }
    }

    /// Runs `request` on a pooled connection. A connection the server had closed (after a
    /// restart, `CLIENT KILL`, an idle timeout) fails at once and is thrown away; the
    /// request then runs again on another, up to once per pooled connection. Only for
    /// requests whose repeat does no harm: the server may have run the first one before
    /// the connection closed. Retries stop once a checkout timeout has passed, so the
    /// whole call waits at most about two checkouts and an I/O timeout.
    pub(crate) fn run<T>(
        &self,
        mut request: impl FnMut(&mut Connection) -> RedisResult<T>,
    ) -> Result<T> {
        let started = Instant::now();
        let (max_size, budget) = match self {
            Pool::Own { pool, .. } => (pool.max_size(), pool.connection_timeout()),
            Pool::Given { pool, .. } => (pool.max_size(), pool.connection_timeout()),
        };
        let mut tries = 0;
        loop {
            let mut con = self.get()?;
            match con.run(|con| request(con)) {
                // READONLY through Sentinel: the master of a moment ago is a replica now
                // (a failover); the next connection goes to the new one.
                Err(e)
                    if (e.is_connection_dropped()
                        || (is_readonly(&e) && self.follows_sentinel()))
                        && tries < max_size
                        && started.elapsed() < budget =>
                {
                    tries += 1
                }
                result => return Ok(result?),
            }
        }
    }

    /// Whether its connections go to the master Sentinel names (a replica's refusal then
    /// means a failover, not a wrong address).
    fn follows_sentinel(&self) -> bool {
        matches!(self, Pool::Own { connector, .. } if matches!(connector.target, Target::Sentinel(_)))
    }

    /// Whether the pool holds any connection at all, idle or in use (none: the server has
    /// not been reachable since they were dropped).
    pub(crate) fn has_connections(&self) -> bool {
        match self {
            Pool::Own { pool, .. } => pool.state().connections > 0,
            Pool::Given { pool, .. } => pool.state().connections > 0,
        }
    }

    /// A connection if one is free right now (for work that may be skipped).
    pub(crate) fn try_get(&self) -> Option<Conn> {
        match self {
            Pool::Own { pool, .. } => {
                let con = pool.try_get()?;
                let next = || pool.try_get().ok_or_else(stale);
                current(pool, con, next).ok().map(Conn::Own)
            }
            Pool::Given { pool, io } => pool
                .try_get()
                .and_then(|con| in_step(con, *io).ok())
                .map(Conn::Given),
        }
    }

    /// A connection from our own pool, waiting at most `wait`. With no connection left in
    /// the pool (the server went away) and none made within a moment, it first asks
    /// whether one can be made now: if not, the error that says why comes at once, rather
    /// than after the whole wait with one that blames the pool's size. (That connection is
    /// not kept: r2d2 takes none from outside; and only while the pool is empty.)
    fn checkout(
        pool: &r2d2::Pool<BoundedClient>,
        connector: &BoundedClient,
        wait: Duration,
    ) -> Result<PooledConnection<BoundedClient>> {
        if pool.state().connections == 0 {
            // The server back: r2d2 makes one at once, and no probe is needed.
            if let Ok(con) = pool.get_timeout(PROBE_AFTER.min(wait)) {
                return Ok(con);
            }
            r2d2::ManageConnection::connect(connector)?;
        }
        Ok(pool.get_timeout(wait)?)
    }

    /// A connection, waiting at most `wait` (and never longer than the checkout timeout).
    pub(crate) fn get_within(&self, wait: Duration) -> Result<Conn> {
        if let Some(con) = self.try_get() {
            return Ok(con);
        }
        Ok(match self {
            Pool::Own { pool, connector } => {
                let wait = wait.min(pool.connection_timeout());
                let deadline = Instant::now() + wait;
                let next = || Ok(pool.get_timeout(remaining(deadline))?);
                Conn::Own(current(pool, Pool::checkout(pool, connector, wait)?, next)?)
            }
            Pool::Given { pool, io } => {
                let wait = wait.min(pool.connection_timeout());
                Conn::Given(in_step(pool.get_timeout(wait)?, *io)?)
            }
        })
    }

    /// A connection, waiting at most the checkout timeout.
    pub(crate) fn get(&self) -> Result<Conn> {
        Ok(match self {
            Pool::Own { pool, connector } => {
                // One checkout timeout for the first connection and any after stale ones.
                let wait = pool.connection_timeout();
                let deadline = Instant::now() + wait;
                let next = || Ok(pool.get_timeout(remaining(deadline))?);
                Conn::Own(current(pool, Pool::checkout(pool, connector, wait)?, next)?)
            }
            Pool::Given { pool, io } => Conn::Given(in_step(pool.get()?, *io)?),
        })
    }
}

/// `con`, or, when it was made to a master that is no longer the master (a failover), the
/// next `get` that is current: stale connections are thrown away one by one, a pool's
/// worth at most; then an error, never a connection to the old master.
fn current(
    pool: &r2d2::Pool<BoundedClient>,
    mut con: PooledConnection<BoundedClient>,
    get: impl Fn() -> Result<PooledConnection<BoundedClient>>,
) -> Result<PooledConnection<BoundedClient>> {
    for _ in 0..=pool.max_size() {
        if con.master.as_ref().is_none_or(Master::is_current) {
            return Ok(con);
        }
        con.broken = true;
        drop(con);
        con = get()?;
    }
    Err(stale())
}

/// How long a checkout from an empty pool waits for r2d2 before it asks whether a
/// connection can be made at all.
const PROBE_AFTER: Duration = Duration::from_millis(10);

/// What is left until `deadline` (at least a millisecond: r2d2 then still hands out an
/// idle connection).
fn remaining(deadline: Instant) -> Duration {
    deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1))
}

fn stale() -> crate::Error {
    crate::Error::Redis(RedisError::from((
        redis::ErrorKind::Io,
        "the pooled connections went to the old master (a failover under way)",
    )))
}
