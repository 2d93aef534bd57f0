//! How our own pools make their connections: bounded connects and socket timeouts, to a
//! server or to the master the sentinels name (each connection then tagged with the
//! master's generation, and thrown away once it is stale).

use std::io;
use std::sync::Arc;

use redis::{Client, Connection, ConnectionLike, RedisError, RedisResult};

use crate::backend::bounds::Bounds;
use crate::backend::sentinel::Sentinels;

/// A `redis::Client` whose connects and reads are bounded: r2d2's own manager for
/// `Client` connects without a timeout, which hangs on a frozen server.
#[derive(Clone)]
pub(crate) struct BoundedClient {
    pub(super) target: Target,
    pub(super) bounds: Bounds,
}

/// Where a pool's connections go.
#[derive(Clone)]
pub(super) enum Target {
    Server(Box<Client>),
    /// The master the sentinels name, whichever server that is now.
    Sentinel(Arc<Sentinels>),
}

/// A connection of our own pool, whether it must be thrown away, and (through Sentinel)
/// which master it was made to.
pub(crate) struct Tracked {
    pub(super) con: Connection,
    pub(super) broken: bool,
    pub(super) master: Option<Master>,
}

/// The master a connection was made to, as the sentinels named it then.
#[derive(Clone)]
pub(crate) struct Master {
    pub(super) sentinels: Arc<Sentinels>,
    pub(super) generation: u64,
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
                let con = client
                    .get_connection_with_timeout(self.bounds.connect)
                    .map_err(|e| at_address(e, client))?;
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

/// `e` naming the address it was met at, where it is the socket's (refused, timed out,
/// unreachable, a TLS handshake): "nothing listens" must say where, as a URL from
/// `$REDIS_URL` or the default port may not be the one the user thinks. The kind of
/// error stays the same, and the socket's error stays its cause.
pub(crate) fn at_address(e: RedisError, client: &Client) -> RedisError {
    let kind = if e.is_connection_refusal() {
        io::ErrorKind::ConnectionRefused
    } else if e.is_timeout() {
        io::ErrorKind::TimedOut
    } else if e.is_connection_dropped() {
        io::ErrorKind::ConnectionReset
    } else {
        io::ErrorKind::Other
    };
    // redis-rs keeps the socket's error in an `Arc`, which is what its `source` gives.
    let cause = std::error::Error::source(&e).and_then(|cause| cause.downcast_ref::<Cause>());
    match cause {
        Some(cause) if e.is_io_error() => {
            let addr = client.get_connection_info().addr().to_string();
            let cause = Arc::clone(cause);
            RedisError::from(io::Error::new(kind, AtAddress { addr, cause }))
        }
        _ => e,
    }
}

type Cause = Arc<dyn std::error::Error + Send + Sync>;

/// A socket's error and the address it was met at.
#[derive(Debug)]
struct AtAddress {
    addr: String,
    cause: Cause,
}

impl std::fmt::Display for AtAddress {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.addr, self.cause)
    }
}

impl std::error::Error for AtAddress {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        Some(&self.cause)
    }
}
