//! Where a locker gets its connections, with a bound on every network wait.

use std::ops::{Deref, DerefMut};
use std::time::Duration;

use r2d2::PooledConnection;
use redis::{Client, Connection, ConnectionLike, RedisError, RedisResult};

use crate::Result;

/// The timeouts that bound every wait on the network.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Bounds {
    pub(crate) connect: Duration,
    pub(crate) io: Duration,
    pub(crate) checkout: Duration,
}

/// A pool the locker built itself (connects bounded too), or one the caller handed over.
#[derive(Clone)]
pub(crate) enum Pool {
    Own(r2d2::Pool<BoundedClient>),
    Given {
        pool: r2d2::Pool<Client>,
        io: Duration,
    },
}

impl Pool {
    /// A pool of `size` connections to `client`, all made before this returns, so that a
    /// wrong address or a dead server is reported here.
    pub(crate) fn build(client: Client, size: u32, bounds: Bounds) -> Result<Pool> {
        let pool = r2d2::Pool::builder()
            .max_size(size)
            // r2d2 would PING on every checkout: a round trip more per lock operation.
            // Broken connections are still dropped, through `has_broken`.
            .test_on_check_out(false)
            .connection_timeout(bounds.checkout)
            .build(BoundedClient { client, bounds })?;
        Ok(Pool::Own(pool))
    }

    /// A connection, waiting at most the checkout timeout.
    pub(crate) fn get(&self) -> Result<Conn> {
        Ok(match self {
            Pool::Own(pool) => Conn::Own(pool.get()?),
            Pool::Given { pool, io } => {
                let mut con = pool.get()?;
                // A caller's pool may have no socket timeouts: set ours once per connection.
                if PooledConnection::extensions(&con)
                    .get::<TimeoutsSet>()
                    .is_none()
                {
                    con.set_read_timeout(Some(*io))?;
                    con.set_write_timeout(Some(*io))?;
                    PooledConnection::extensions_mut(&mut con).insert(TimeoutsSet);
                }
                Conn::Given(con)
            }
        })
    }
}

/// Marks a connection of a caller's pool whose socket timeouts we have set.
struct TimeoutsSet;

/// A `redis::Client` whose connects and reads are bounded: r2d2's own manager for
/// `Client` connects without a timeout, which hangs on a frozen server.
pub(crate) struct BoundedClient {
    client: Client,
    bounds: Bounds,
}

impl r2d2::ManageConnection for BoundedClient {
    type Connection = Connection;
    type Error = RedisError;

    fn connect(&self) -> RedisResult<Connection> {
        let con = self
            .client
            .get_connection_with_timeout(self.bounds.connect)?;
        con.set_read_timeout(Some(self.bounds.io))?;
        con.set_write_timeout(Some(self.bounds.io))?;
        Ok(con)
    }

    fn is_valid(&self, con: &mut Connection) -> RedisResult<()> {
        redis::cmd("PING").query(con)
    }

    fn has_broken(&self, con: &mut Connection) -> bool {
        !con.is_open()
    }
}

/// A checked-out connection; back to its pool on drop.
pub(crate) enum Conn {
    Own(PooledConnection<BoundedClient>),
    Given(PooledConnection<Client>),
}

impl Deref for Conn {
    type Target = Connection;

    fn deref(&self) -> &Connection {
        match self {
            Conn::Own(con) => con,
            Conn::Given(con) => con,
        }
    }
}

impl DerefMut for Conn {
    fn deref_mut(&mut self) -> &mut Connection {
        match self {
            Conn::Own(con) => con,
            Conn::Given(con) => con,
        }
    }
}
