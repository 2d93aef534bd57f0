//! Distributed locks on Redis: blocking, multi-key and all-or-nothing, with RAII guards.
//!
//! A [`Locker`] holds a pool of connections (to one server, the master Sentinel names, a
//! quorum of independent ones, or a cluster); [`Locker::lock`] returns a [`LockGuard`], which a background thread keeps
//! alive and which releases the lock when it drops.
//!
//! ```no_run
//! use std::time::Duration;
//! use redguard::{Error, LockGuard, LockOptions, Locker, Retry};
//!
//! # fn main() -> Result<(), redguard::Error> {
//! // A pool of 16 connections, default TTL 30 s.
//! let locker = Locker::connect("redis://127.0.0.1/")?;
//! // Or with every setting spelled out (each setter's doc gives its default).
//! let tuned = Locker::builder()
//!     .pool_size(16)
//!     .default_ttl(Duration::from_secs(30))
//!     .connect_timeout(Duration::from_secs(2)) // TCP connect + handshake
//!     .io_timeout(Duration::from_secs(2))      // every read and write
//!     .checkout_timeout(Duration::from_secs(3)) // waiting for a pooled connection
//!     .prefix("locks:")                        // before every key in Redis (for ACLs)
//!     .build("redis://127.0.0.1:6379/")?;
//!
//! // Both keys or neither; waits until held, like Mutex::lock (exponential backoff with
//! // jitter, no deadline); refreshed in the background; released on drop.
//! let guard: LockGuard = locker.lock(&["account:1", "account:2"])?;
//! guard.keys();        // ["account:1", "account:2"]
//! guard.token();       // 32 hex characters, 128 random bits
//! guard.ttl()?;        // Option<Duration>: the server's shortest TTL; None once lost
//! guard.refresh(Duration::from_secs(60))?; // Err(LockLost) when no longer held
//! assert!(!guard.is_lost()); // no round trip: check it before each step
//! guard.release()?;    // or let it drop (best effort, bounded, never panics)
//!
//! // Exactly one attempt: None when another owner holds a key.
//! if let Some(_guard) = tuned.try_lock(&["report"])? {
//!     // ...
//! }
//!
//! // Everything spelled out.
//! let guard = locker.lock_with(&["job"], LockOptions::default()
//!     .ttl(Duration::from_millis(500))
//!     .timeout(Duration::from_secs(2))                 // then Err(NotObtained)
//!     .retry(Retry::linear(Duration::from_millis(50))) // or none(), exponential(..), .limit(n)
//!     .metadata("worker-7")                            // stored after the token
//!     .token("worker-7")                               // a fixed owner: re-obtains its keys
//!     .fencing(true)                                   // guard.fence(): rises per key
//!     .auto_refresh(false))?;
//! match guard.release() {
//!     Err(Error::LockLost) => eprintln!("the lock expired before the work was done"),
//!     other => other?,
//! }
//! # Ok(()) }
//! ```
//!
//! # Read locks
//! [`Locker::read`] gives a [`ReadGuard`]: a shared hold of keys, all or nothing, with any
//! number of other readers; [`Locker::lock`] of those keys waits until the last reader has
//! left, and new readers wait behind a lock that waits (writers first). A lock can
//! [`downgrade`](LockGuard::downgrade) to a read lock. See [read locks](guide::read_locks).
//!
//! ```no_run
//! # fn main() -> Result<(), redguard::Error> {
//! let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
//! let reading = locker.read(&["config"])?;   // shared
//! if locker.try_lock(&["config"])?.is_none() { /* excluded while read */ }
//! drop(reading);
//! let writing = locker.lock(&["config"])?;   // exclusive
//! let reading = writing.downgrade()?;        // shared again, in one step
//! # drop(reading);
//! # Ok(()) }
//! ```
//!
//! # Semaphores
//! [`Locker::semaphore`] gives a [`Semaphore`]: at most N holders of a name at once, each
//! holding a [`Permit`], an RAII guard kept alive by the same refresher thread and woken
//! by the same subscriber as locks. Expiry is counted on the server's clock only; see
//! [semaphores](guide::semaphores).
//!
//! ```no_run
//! # fn main() -> Result<(), redguard::Error> {
//! let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
//! let payments = locker.semaphore("payments", 8)?;
//! let permit = payments.acquire()?; // one of at most 8, in every process
//! println!("{} free", payments.available()?);
//! permit.release()?;
//! # Ok(()) }
//! ```
//!
//! # Elections
//! [`Locker::election`] gives an [`Election`]: candidates of every process
//! [`campaign`](Election::campaign), waiting their turn in the server's queue, and at most
//! one leads at a time, for a lease the refresher keeps. Each [`Leadership`] is a term,
//! larger than every earlier one, to fence the leader's writes
//! ([`fenced_set`](Leadership::fenced_set)); [`Election::observe`] follows each change of
//! leader. See [elections](guide::election).
//!
//! ```no_run
//! # fn main() -> Result<(), redguard::Error> {
//! let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
//! let term = locker.election("scheduler")?.campaign("10.0.0.7:8080")?; // waits its turn
//! while !term.is_lost() {
//!     if !term.fenced_set("scheduler:cursor", "42")? {
//!         break; // a later term wrote: step down
//!     }
//! #   break;
//! }
//! drop(term); // resigns: the next candidate leads
//! # Ok(()) }
//! ```
//!
//! # Operating it
//! - [`Locker::holders`] says who holds a key (metadata, TTL, shared or not, fencing
//!   counter; never a token), for locks, read locks and semaphores alike.
//! - [`LockerBuilder::on_lost`] is called, on the refresher thread, for each hold found
//!   lost; the crate also logs through the [`log`](https://docs.rs/log) facade: `warn`
//!   for a hold lost, a refresh that failed, the subscriber's connection lost; `debug`
//!   for holds taken, not obtained and given up. Tokens are never logged whole.
//!
//! `Locker` is a cheap `Clone` and `Send + Sync`: share it between threads. A `LockGuard` is
//! `Send`, owns what it needs (it may outlive its `Locker`), and has nothing to deref to.
//! [`Error`] keeps apart what callers must handle differently.
//!
//! # How it works
//! Each key stores the owner's token (16 random bytes, hex; a fixed token of another form as
//! `<length>:<token>`) followed by optional metadata, with a TTL in milliseconds. Acquiring
//! runs one Lua script that sets every key with MSETNX or none of them (a single free key
//! is simply `SET NX PX`); refresh and TTL checks run scripts that act only when every key
//! still holds exactly the guard's value, and release deletes the keys that still do. One
//! background thread per [`Locker`] refreshes all of its auto-refreshed guards at about a
//! third of their TTL, in one script call (one round trip) per wake-up, and marks a guard
//! lost when its lock is gone. Waiters wait in one queue per key on the server, in
//! arrival order, whatever process they are in; a release gives the keys to the first
//! and tells it with one message, so it wakes holding them. The whole
//! story is in the [guide]: [semantics](guide::semantics),
//! [read locks](guide::read_locks), [semaphores](guide::semaphores), [fencing](guide::fencing),
//! [elections](guide::election), [security](guide::security),
//! [scaling out](guide::scaling_out) (Sentinel and replicas, Redlock, Cluster),
//! [reliability](guide::reliability) (faults on the wire) and
//! [performance](guide::performance).
//!
//! # Defaults and limits
//! TTL 30 s, auto-refresh on, no deadline, locks not reentrant; 1 to [`MAX_KEYS`] (1024)
//! keys, none empty or repeated; a TTL from 1 ms to [`MAX_TTL`].
//!
//! # What this does not guarantee
//! - A lock is a lease: after a pause longer than the TTL (GC, SIGSTOP, a slow network)
//!   another owner may hold the keys while this one still believes it does.
//!   [`LockGuard::is_lost`] tells you when that is known, not before. Use such locks for
//!   efficiency (avoiding duplicate work), or, for correctness, take them with
//!   [`LockOptions::fencing`] and make the protected resource refuse tokens smaller than
//!   the largest it has seen (the tokens rise only while Redis keeps its counters: see
//!   [fencing](guide::fencing)).
//! - One Redis server: if it loses data (restart without persistence, failover to a replica
//!   that had not seen the write) a lock can be granted twice. Through Sentinel
//!   ([`LockerBuilder::build_sentinel`]) the locker follows a failover at once, and
//!   [`LockOptions::replicas`] holds a lock only once replicas acknowledged it, which
//!   narrows that hole (`WAIT` is not consensus: a replica that restarts without
//!   persistence forgets). A quorum of independent
//!   servers ([`LockerBuilder::build_redlock`]) survives a minority of them failing, under
//!   timing assumptions, and gives no fencing tokens; a Redis Cluster
//!   ([`LockerBuilder::build_cluster`]) spreads locks over masters, each slot with the
//!   guarantees of one server. [Scaling out](guide::scaling_out) says what each one
//!   guarantees.
//! - Expiry runs on the server's clock; this process counts the TTL from before it sent the
//!   request, less an allowance for a server clock running faster than ours (1% of the TTL
//!   and 2 ms), so it considers a lock lost before the server expires it — unless the
//!   server's clock runs faster than that, or this host is suspended (`Instant` stops while
//!   the server's clock goes on: after a resume the lock may have expired while
//!   [`LockGuard::is_lost`] still says `false` until the next refresh finds it gone), or
//!   the same fixed token re-obtains the keys with a shorter TTL (the old guard does not
//!   know).
//! - An acquire whose reply is lost to a timeout may still have taken the keys; they expire
//!   with their TTL.
//! - Two guards with the same fixed token *and* metadata are one lock to Redis: releasing
//!   either releases both.
//! - Arrival order holds on one server, through Sentinel and for a cluster lock in one hash
//!   slot, among waiters for single keys or the same keys; a waiter for several keys may
//!   be passed on some of them while another is held. A lock across cluster slots or on
//!   a quorum takes no place in any queue: the first to attempt after a release wins (see
//!   [semantics](guide::semantics)). A waiter that dies while queued holds the others up
//!   for up to about 2 s ([`LockerBuilder::waiter_lifetime`]).
//!
//! # Features
//! - `testing`: [`testing::Server`], a private `redis-server` on a free loopback port for
//!   your own tests, stopped on drop (and if the test process dies); [`testing::Replicated`],
//!   a master with replicas and sentinels, for failovers.
//! - `metrics`: counters, gauges and histograms through the
//!   [`metrics`](https://docs.rs/metrics) facade, for whichever recorder the application
//!   installs (Prometheus and others). Labels name the kind of hold (`lock`, `read`,
//!   `permit`) and the outcome, never a key:
//!   `redguard_acquisitions_total{kind, result}` (`held`, `not_obtained`, `cancelled`,
//!   `error`),
//!   `redguard_wait_seconds{kind}` and `redguard_hold_seconds{kind}` (histograms),
//!   `redguard_lost_total{kind}`, `redguard_refreshes_total{result}` (`held`, `lost`,
//!   `unknown`, one per hold refreshed), `redguard_refresh_round_trip_seconds`,
//!   `redguard_holds` and `redguard_waiting` (gauges: holds alive, threads waiting),
//!   `redguard_wakeups_total{source}` (`handover`: given the hold by a release; `turn`:
//!   told to ask; `release`: a release heard, without the queue; `timeout`).
//! - `tls`: `rediss://` URLs, through rustls with ring (no OpenSSL); see
//!   [security](guide::security). rustls needs a process-wide crypto provider, which
//!   redis-rs takes as it finds it: when a locker for `rediss://` servers is built and none
//!   is set yet, ring is installed as that default. A provider the application installed
//!   first is kept; a locker without TLS sets nothing. An application that wants another
//!   provider installs it before it builds such a locker.

#![warn(missing_docs, rustdoc::broken_intra_doc_links)]

// The public primitives and their options.
mod builder; // LockerBuilder: pool, timeouts, prefix, TLS; builds on one server, Redlock, Cluster
mod cancel; // Cancel: ends waits from another thread
mod election; // Election, Leadership, Observer, Leader: campaign for a term, who leads, each change
mod error; // Error: held elsewhere, lost, bad input, wrong type, Redis unavailable
mod guard; // LockGuard: a held lock; refresh, ttl, release, released on drop
mod holder; // Holder: what anyone may see of a live hold; Locker::holders
mod locker; // Locker (and WeakLocker): lock, try_lock, lock_with, read, try_read, read_with, semaphore
mod lost; // Lost: what on_lost is told of a hold found lost
mod options; // LockOptions, and the checks of keys, TTLs and tokens
mod permit; // Permit: a held permit of a semaphore, given back on drop
mod read_guard; // ReadGuard: a shared hold of keys (a read lock), given up on drop
mod retry; // Retry: the delays between attempts
mod semaphore; // Semaphore: at most N holders of a name; acquire, available, holders

// The machinery under them.
mod backend; // how a request reaches Redis: scripts, pools, one server, quorum, cluster
mod hold; // any hold (lock, read lock, permit): the waiting loop, its state, token, refresher
mod shared; // Shared: what a locker and its guards share (backend, refresher, subscriber)
mod stats; // what a locker counts, through the metrics facade (feature `metrics`)
mod wait; // waiters woken by releases: the subscriber thread and its board

pub mod guide; // the manual (docs/*.md): semantics, read locks, semaphores, fencing, security, scaling out, reliability, performance, the command, elections
#[cfg(feature = "testing")]
pub mod testing; // Server, Replicated: private redis-servers for tests (feature `testing`)

pub use backend::SocketTimeouts;
pub use builder::LockerBuilder;
pub use cancel::Cancel;
pub use election::{Election, Leader, Leadership, Observer};
pub use error::{Error, Result};
pub use guard::LockGuard;
pub use holder::Holder;
pub use locker::{Locker, WeakLocker};
pub use lost::Lost;
pub use options::{LockOptions, MAX_KEYS, MAX_TTL};
pub use permit::Permit;
pub use read_guard::ReadGuard;
pub use retry::{Delays, Retry};
pub use semaphore::{MAX_LIMIT, Semaphore};
