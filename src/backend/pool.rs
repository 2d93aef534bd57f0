//! Where a locker gets its connections, with a bound on every network wait, and never a
//! connection that lost track of its replies.

use std::ops::{Deref, DerefMut};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{Duration, Instant};

use r2d2::PooledConnection;
use redis::{Client, Connection, ConnectionLike, RedisError, RedisResult, Value};
use scheduled_thread_pool::{OnPoolDropBehavior, ScheduledThreadPool};

use super::bounds::Bounds;
use super::sentinel::Sentinels;
use crate::Result;

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
        // that it timed out).
        r2d2::ManageConnection::connect(&connector)?;
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

    /// A connection, waiting at most `wait` (and never longer than the checkout timeout).
    pub(crate) fn get_within(&self, wait: Duration) -> Result<Conn> {
        if let Some(con) = self.try_get() {
            return Ok(con);
        }
        Ok(match self {
            Pool::Own { pool, .. } => {
                let wait = wait.min(pool.connection_timeout());
                let deadline = Instant::now() + wait;
                let next = || Ok(pool.get_timeout(remaining(deadline))?);
                Conn::Own(current(pool, pool.get_timeout(wait)?, next)?)
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
            Pool::Own { pool, .. } => {
                // One checkout timeout for the first connection and any after stale ones.
                let deadline = Instant::now() + pool.connection_timeout();
                let next = || Ok(pool.get_timeout(remaining(deadline))?);
                Conn::Own(current(pool, pool.get()?, next)?)
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

/// Whether `e` is a replica's refusal to write: `READONLY`, or before Redis 7 a script's
/// error that carries it.
fn is_readonly(e: &RedisError) -> bool {
    e.code() == Some("READONLY") || (e.code() == Some("ERR") && e.to_string().contains("READONLY"))
}

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

/// A connection from a caller's pool, made ready for us: our socket timeouts set, and its
/// replies in step with its requests.
fn in_step(mut con: PooledConnection<Client>, io: Duration) -> Result<PooledConnection<Client>> {
    let state = PooledConnection::extensions(&con)
        .get::<GivenState>()
        .copied();
    match state {
        Some(GivenState::Ready) => {}
        // We cannot take it out of a pool we did not build: use it again only once its
        // replies are back in step with its requests (and its timeouts ours again).
        Some(GivenState::Broken) => {
            resync(&mut con)?;
            set_timeouts(&con, io)?;
        }
        // A caller's pool may have no socket timeouts: set ours once.
        None => set_timeouts(&con, io)?,
    }
    PooledConnection::extensions_mut(&mut con).insert(GivenState::Ready);
    Ok(con)
}

fn set_timeouts(con: &Connection, io: Duration) -> RedisResult<()> {
    con.set_read_timeout(Some(io))?;
    con.set_write_timeout(Some(io))
}

/// What we know of a connection of a caller's pool (kept in its r2d2 extensions).
#[derive(Clone, Copy)]
enum GivenState {
    /// Our socket timeouts are set and its replies are in step with its requests.
    Ready,
    /// A request failed mid-way: a reply or part of a request may still be in flight.
    Broken,
}

/// Sends `ECHO <unique nonce>` and reads until the nonce comes back: whatever was in flight
/// before it has then been read. Each read is bounded by the socket timeout.
fn resync(con: &mut Connection) -> RedisResult<()> {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let nonce = format!("redguard-resync-{}", NEXT.fetch_add(1, Ordering::Relaxed));
    con.send_packed_command(&redis::cmd("ECHO").arg(&nonce).get_packed_command())?;
    // Anything more than a few stale replies means something else is wrong.
    for _ in 0..16 {
        if con.recv_response()? == Value::BulkString(nonce.clone().into_bytes()) {
            return Ok(());
        }
    }
    Err(RedisError::from(std::io::Error::other(
        "a pooled connection stayed out of step after an earlier failure",
    )))
}

/// A `redis::Client` whose connects and reads are bounded: r2d2's own manager for
/// `Client` connects without a timeout, which hangs on a frozen server.
#[derive(Clone)]
pub(crate) struct BoundedClient {
    target: Target,
    bounds: Bounds,
}

/// Where a pool's connections go.
#[derive(Clone)]
enum Target {
    Server(Box<Client>),
    /// The master the sentinels name, whichever server that is now.
    Sentinel(Arc<Sentinels>),
}

/// A connection of our own pool, whether it must be thrown away, and (through Sentinel)
/// which master it was made to.
pub(crate) struct Tracked {
    con: Connection,
    broken: bool,
    master: Option<Master>,
}

/// The master a connection was made to, as the sentinels named it then.
#[derive(Clone)]
pub(crate) struct Master {
    sentinels: Arc<Sentinels>,
    generation: u64,
}

impl Master {
    /// Whether the sentinels still name the master the connection was made to.
    pub(crate) fn is_current(&self) -> bool {
        self.sentinels.generation() == self.generation
    }
}

impl r2d2::ManageConnection for BoundedClient {
    type Connection = Tracked;
    type Error = RedisError;

    fn connect(&self) -> RedisResult<Tracked> {
        match &self.target {
            Target::Server(client) => {
                let con = client.get_connection_with_timeout(self.bounds.connect)?;
                con.set_read_timeout(Some(self.bounds.io))?;
                con.set_write_timeout(Some(self.bounds.io))?;
                Ok(Tracked {
                    con,
                    broken: false,
                    master: None,
                })
            }
            Target::Sentinel(sentinels) => {
                let (con, generation) = sentinels.connect()?;
                Ok(Tracked {
                    con,
                    broken: false,
                    master: Some(Master {
                        sentinels: Arc::clone(sentinels),
                        generation,
                    }),
                })
            }
        }
    }

    fn is_valid(&self, tracked: &mut Tracked) -> RedisResult<()> {
        redis::cmd("PING").query(&mut tracked.con)
    }

    fn has_broken(&self, tracked: &mut Tracked) -> bool {
        tracked.broken
            || !tracked.con.is_open()
            || tracked.master.as_ref().is_some_and(|m| !m.is_current())
    }
}

/// A checked-out connection; back to its pool on drop.
pub(crate) enum Conn {
    Own(PooledConnection<BoundedClient>),
    Given(PooledConnection<Client>),
}

impl Conn {
    /// Runs one request. Any failure other than an error reply from the server (a
    /// timeout, a half-written request, a reply of the wrong shape) may leave replies out
    /// of step with requests, so the connection is never used again as it is.
    pub(crate) fn run<T>(
        &mut self,
        request: impl FnOnce(&mut Connection) -> RedisResult<T>,
    ) -> RedisResult<T> {
        let con = match self {
            Conn::Own(tracked) => &mut tracked.con,
            Conn::Given(con) => &mut **con,
        };
        let result = request(con);
        let Err(e) = &result else {
            return result;
        };
        // Through Sentinel, a replica's refusal: the connection is fine, but goes to the
        // wrong server (elsewhere it is the server the caller named: an error reply).
        let replica =
            is_readonly(e) && matches!(self, Conn::Own(tracked) if tracked.master.is_some());
        if e.code().is_none() || replica {
            match self {
                Conn::Own(tracked) => {
                    tracked.broken = true;
                    if let Some(master) = &tracked.master {
                        match replica {
                            true => master.sentinels.replica_seen(master.generation),
                            false => master.sentinels.failed(master.generation),
                        }
                    }
                }
                Conn::Given(con) if !replica => {
                    PooledConnection::extensions_mut(con).insert(GivenState::Broken);
                }
                Conn::Given(_) => {}
            }
        }
        result
    }
}

/// A connection held by one long-lived user.
pub(crate) enum Dedicated {
    Own(Connection, Option<Master>),
    Given(PooledConnection<Client>),
}

impl Dedicated {
    /// Through Sentinel, the master it was made to.
    pub(crate) fn master(&self) -> Option<Master> {
        match self {
            Dedicated::Own(_, master) => master.clone(),
            Dedicated::Given(_) => None,
        }
    }
}

impl Deref for Dedicated {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        match self {
            Dedicated::Own(con, _) => con,
            Dedicated::Given(con) => con,
        }
    }
}

impl DerefMut for Dedicated {
    fn deref_mut(&mut self) -> &mut Connection {
        match self {
            Dedicated::Own(con, _) => con,
            Dedicated::Given(con) => con,
        }
    }
}

impl Drop for Dedicated {
    fn drop(&mut self) {
        // It may go back to the caller's pool in any state: check it before reuse.
        if let Dedicated::Given(con) = self {
            PooledConnection::extensions_mut(con).insert(GivenState::Broken);
        }
    }
}

/// Socket timeouts for the connections of a pool you build yourself for
/// [`Locker::from_pool`](crate::Locker::from_pool): set from the moment each connection is
/// made, so that even r2d2's own checkout PING cannot hang on a frozen server.
///
/// ```no_run
/// use std::time::Duration;
///
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// let client = redis::Client::open("redis://127.0.0.1/")?;
/// let pool = r2d2::Pool::builder()
///     .connection_customizer(Box::new(redguard::SocketTimeouts(Duration::from_secs(2))))
///     .build(client)?;
/// let locker = redguard::Locker::from_pool(pool);
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct SocketTimeouts(pub Duration);

impl r2d2::CustomizeConnection<Connection, RedisError> for SocketTimeouts {
    fn on_acquire(&self, con: &mut Connection) -> RedisResult<()> {
        con.set_read_timeout(Some(self.0))?;
        con.set_write_timeout(Some(self.0))
    }
}
