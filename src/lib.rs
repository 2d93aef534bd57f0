//! Distributed locks on Redis: blocking, multi-key and all-or-nothing, with RAII guards.
//!
//! ```no_run
//! use std::time::Duration;
//! use redguard::{LockOptions, Locker, Retry};
//!
//! # fn main() -> Result<(), redguard::Error> {
//! let locker = Locker::connect("redis://127.0.0.1/")?;
//!
//! // Both keys or neither; waits until held; refreshed in the background; released on drop.
//! let guard = locker.lock(&["account:1", "account:2"])?;
//! assert!(!guard.is_lost());
//! drop(guard);
//!
//! // One attempt only.
//! if let Some(_guard) = locker.try_lock(&["report"])? {
//!     // ...
//! }
//!
//! // Everything spelled out.
//! let guard = locker.lock_with(&["job"], LockOptions::default()
//!     .ttl(Duration::from_millis(500))
//!     .timeout(Duration::from_secs(2))
//!     .retry(Retry::linear(Duration::from_millis(50)))
//!     .metadata("worker-7"))?;
//! guard.release()?;
//! # Ok(()) }
//! ```
//!
//! # How it works
//! Each key stores the owner's token (16 random bytes, hex; a fixed token of another form as
//! `<length>:<token>`) followed by optional metadata, with a TTL in milliseconds. Acquiring runs one Lua script that sets every key with
//! MSETNX or none of them (a single free key is simply `SET NX PX`); refresh, release and TTL checks run scripts that act only when
//! every key still holds exactly the guard's value. One background thread per [`Locker`]
//! refreshes all of its auto-refreshed guards at about a third of their TTL, in one
//! script call (one round trip) per wake-up, and marks a guard lost when its lock is gone.
//!
//! # What this does not guarantee
//! - A lock is a lease: after a pause longer than the TTL (GC, SIGSTOP, a slow network)
//!   another owner may hold the keys while this one still believes it does.
//!   [`LockGuard::is_lost`] tells you when that is known, not before. Use such locks for
//!   efficiency (avoiding duplicate work), or, for correctness, take them with
//!   [`LockOptions::fencing`] and make the protected resource refuse tokens smaller than
//!   the largest it has seen (the tokens rise only while Redis keeps its counters: see there).
//! - One Redis server: if it loses data (restart without persistence, failover to a replica
//!   that had not seen the write) a lock can be granted twice. A quorum of independent
//!   servers ([`LockerBuilder::build_redlock`]) survives a minority of them failing, under
//!   timing assumptions, and gives no fencing tokens; a Redis Cluster
//!   ([`LockerBuilder::build_cluster`]) spreads locks over masters, each slot with the
//!   guarantees of one server. The README's "Scaling out" says what each one guarantees.
//! - Expiry runs on the server's clock; this process counts the TTL from before it sent the
//!   request, less an allowance for a server clock running faster than ours (1% of the TTL
//!   and 2 ms), so it considers a lock lost before the server expires it — unless the
//!   server's clock runs faster than that, or this host is suspended (`Instant` stops while
//!   the server's clock goes on: after a resume the lock may have expired while
//!   [`LockGuard::is_lost`] still says `false` until the next refresh finds it gone), or
//!   the same fixed token re-obtains the keys with a shorter TTL (the old guard does not
//!   know).
//!
//! # Features
//! - `tls`: `rediss://` URLs, through rustls with ring. rustls needs a process-wide crypto
//!   provider, which redis-rs takes as it finds it: when a locker for `rediss://` servers is
//!   built and none is set yet, ring is installed as that default. A provider the
//!   application installed first is kept; a locker without TLS sets nothing. An
//!   application that wants another provider installs it before it builds such a locker.

#![warn(missing_docs)]

mod backend;
mod cluster;
mod error;
mod fence;
mod guard;
mod held;
mod locker;
mod masters;
mod options;
mod pool;
mod quorum;
mod refresher;
mod retry;
mod scripts;
mod slot;
mod subscriber;
#[cfg(feature = "tls")]
mod tls;
mod token;

pub use error::{Error, Result};
pub use guard::LockGuard;
pub use locker::{Locker, LockerBuilder};
pub use options::{LockOptions, MAX_KEYS, MAX_TTL};
pub use pool::SocketTimeouts;
pub use retry::{Delays, Retry};
