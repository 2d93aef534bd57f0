//! A connection once checked out: [`Conn`] for one request (thrown away, or marked for a
//! resync, when the request leaves it out of step), [`Dedicated`] for one long-lived user.

use std::ops::{Deref, DerefMut};

use r2d2::PooledConnection;
use redis::{Client, Connection, RedisError, RedisResult};

use super::connector::{BoundedClient, Master};
use super::given::GivenState;

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

/// Whether `e` is a replica's refusal to write: `READONLY`, or before Redis 7 a script's
/// error that carries it.
pub(super) fn is_readonly(e: &RedisError) -> bool {
    e.code() == Some("READONLY") || (e.code() == Some("ERR") && e.to_string().contains("READONLY"))
}
