//! Where a locker gets its connections, with a bound on every network wait, and never a
//! connection that lost track of its replies.
//!
//! - `build.rs`: the pool type, and how our own pools are built;
//! - `connector.rs`: how our own pools make connections (to a server, or through Sentinel);
//! - `given.rs`: a pool the caller handed over, and [`SocketTimeouts`] for it;
//! - `checkout.rs`: taking connections from a pool, and running requests on them;
//! - `conn.rs`: a connection once taken.

mod build;
mod checkout;
mod conn;
mod connector;
mod given;

pub(crate) use self::build::{Pool, worker};
pub(crate) use self::conn::Conn;
pub use self::given::SocketTimeouts;
