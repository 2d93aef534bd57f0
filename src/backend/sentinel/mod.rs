//! Redis Sentinel: the master the sentinels name, found through any of them that answers,
//! and followed through a failover.
//!
//! Our own lookup, not redis-rs's `sentinel` module: its blocking calls connect to the
//! sentinels and the master, and read from them, without a timeout, and one frozen
//! sentinel must not hang a lock call. Every wait here is bounded by the locker's connect
//! and I/O timeouts (the watcher's by a one-second slice, then a PING). A lookup asks
//! every sentinel at once and believes the newest configuration.
//!
//! Each connection to the master carries the *generation* of the master it was made to. A
//! new master starts a new one: heard from a sentinel (`+switch-master` or
//! `+promoted-slave`, at once), or found by a lookup after a connection to the old one
//! failed or answered as a replica (`READONLY`). The pools then drop connections of older
//! generations instead of using them: after a forced failover the old master stays
//! writable for seconds, and a lock taken there would be one the new master has never
//! seen.
//!
//! - `known.rs`: the sentinels, and what is known of the master (its generation);
//! - `lookup.rs`: asking every sentinel where the master is;
//! - `connect.rs`: connecting to the master they name;
//! - `watch.rs`: the thread that hears of failovers as the sentinels announce them.

mod connect;
mod known;
mod lookup;
#[cfg(test)]
mod tests;
mod watch;

pub(crate) use self::known::Sentinels;
