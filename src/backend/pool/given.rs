//! A pool the caller built and handed over: its connections made ready for us (our socket
//! timeouts, replies in step with requests) each time one is checked out, and the
//! [`SocketTimeouts`] a caller can build such a pool with.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use r2d2::PooledConnection;
use redis::{Client, Connection, RedisError, RedisResult, Value};

use crate::Result;

/// A connection from a caller's pool, made ready for us: our socket timeouts set, and its
/// replies in step with its requests.
pub(super) fn in_step(
    mut con: PooledConnection<Client>,
    io: Duration,
) -> Result<PooledConnection<Client>> {
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
pub(super) enum GivenState {
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
