//! `LockerBuilder`: every setting of a locker, each setter with its default and bounds, and
//! the checks that refuse bad ones before any connection. The ways to build a locker on
//! them (one server, a caller's pool, Sentinel, a quorum, a cluster) are in `build`.

mod build;

use std::sync::Arc;
use std::time::Duration;

use crate::backend::Bounds;
use crate::lost::OnLost;
use crate::options::checked_ttl;
use crate::{Error, Lost, Result};

/// The longest [`LockerBuilder::node_timeout`]: far longer than any sensible one, short
/// enough for the clock arithmetic.
const MAX_NODE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Settings for a [`Locker`](crate::Locker); every setter's doc says its default.
///
/// ```no_run
/// use std::time::Duration;
///
/// # fn main() -> Result<(), redguard::Error> {
/// let locker = redguard::Locker::builder()
///     .pool_size(16)
///     .default_ttl(Duration::from_secs(30))
///     .io_timeout(Duration::from_millis(500))
///     .build("redis://127.0.0.1:6379/")?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct LockerBuilder {
    pool_size: u32,
    default_ttl: Duration,
    prefix: String,
    bounds: Bounds,
    /// For a quorum: how long one request to all nodes may take.
    node_timeout: Duration,
    /// Root certificate (PEM) that `rediss://` servers must chain to, instead of the
    /// system's roots.
    #[cfg(feature = "tls")]
    tls_root: Option<Vec<u8>>,
    on_lost: Option<OnLost>,
    /// `None`: a quarter of the I/O timeout.
    replica_timeout: Option<Duration>,
    waiter_lifetime: Duration,
    /// For Sentinel: how to log in to the master.
    master: MasterLogin,
}

/// The master's credentials and database, for Sentinel (whose URLs are the sentinels').
#[derive(Clone, Debug, Default)]
struct MasterLogin {
    username: Option<String>,
    password: Option<String>,
    db: i64,
}

impl Default for LockerBuilder {
    fn default() -> Self {
        LockerBuilder {
            pool_size: 16,
            default_ttl: Duration::from_secs(30),
            prefix: String::new(),
            bounds: Bounds {
                connect: Duration::from_secs(2),
                io: Duration::from_secs(2),
                checkout: Duration::from_secs(3),
            },
            node_timeout: Duration::from_millis(250),
            #[cfg(feature = "tls")]
            tls_root: None,
            on_lost: None,
            replica_timeout: None,
            waiter_lifetime: Duration::from_millis(1500),
            master: MasterLogin::default(),
        }
    }
}

impl LockerBuilder {
    /// How many connections the pool keeps open (all opened by [`build`](Self::build)).
    ///
    /// Defaults to 16.
    pub fn pool_size(mut self, size: u32) -> Self {
        self.pool_size = size;
        self
    }

    /// The TTL of locks whose options set none.
    ///
    /// Defaults to 30 s.
    pub fn default_ttl(mut self, ttl: Duration) -> Self {
        self.default_ttl = ttl;
        self
    }

    /// Text put before every key in Redis (and before each fencing counter), so that all
    /// of the locker's keys share it: `prefix("locks:")` turns `lock(&["a"])` into the Redis
    /// key `locks:a`, which makes an ACL rule like `~locks:*` enough. Guards report the
    /// keys as given, without it.
    ///
    /// Defaults to none.
    pub fn prefix(mut self, prefix: impl Into<String>) -> Self {
        self.prefix = prefix.into();
        self
    }

    /// For `rediss://` URLs: the root certificate (PEM) the server's certificate must chain
    /// to, for servers whose certificate a private CA signed. Needs the `tls` feature.
    /// Used by [`build`](Self::build) only: a pool you build has its own client.
    ///
    /// Defaults to the system's root certificates.
    #[cfg(feature = "tls")]
    pub fn tls_root_cert(mut self, pem: impl Into<Vec<u8>>) -> Self {
        self.tls_root = Some(pem.into());
        self
    }

    /// The longest a new connection may take, TCP connect and handshake together.
    ///
    /// Defaults to 2 s.
    pub fn connect_timeout(mut self, timeout: Duration) -> Self {
        self.bounds.connect = timeout;
        self
    }

    /// The longest one read or write on a connection may block (a frozen server gives an
    /// error after this).
    ///
    /// Defaults to 2 s.
    pub fn io_timeout(mut self, timeout: Duration) -> Self {
        self.bounds.io = timeout;
        self
    }

    /// Calls `f` each time the refresher thread finds one of this locker's auto-refreshed
    /// holds (lock, read lock, permit) lost: once per hold, with its keys and metadata.
    /// A loss is also logged (`warn`, through the `log` facade) with or without it.
    ///
    /// `f` runs on the refresher thread, which keeps every other hold of the locker alive:
    /// it must return quickly (hand the news to another thread if there is work to do).
    /// A panic in `f` is caught; the refresher goes on.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::builder()
    ///     .on_lost(|lost| eprintln!("lost {:?} ({})", lost.keys(), lost.metadata()))
    ///     .build("redis://127.0.0.1/")?;
    /// # Ok(()) }
    /// ```
    ///
    /// `f` must not own the [`Locker`](crate::Locker) (or a guard): the locker owns `f`, so neither would
    /// ever be dropped, and its threads would never stop. A callback that needs the
    /// locker holds a [`WeakLocker`](crate::WeakLocker) instead:
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// use std::sync::{Arc, OnceLock};
    /// let weak: Arc<OnceLock<redguard::WeakLocker>> = Arc::default();
    /// let locker = redguard::Locker::builder()
    ///     .on_lost({
    ///         let weak = Arc::clone(&weak);
    ///         move |lost| {
    ///             if let Some(locker) = weak.get().and_then(|weak| weak.upgrade()) {
    ///                 // Say who holds the keys now (quickly: this is the refresher).
    ///                 eprintln!("{:?}: {:?}", lost.keys(), locker.holders(&lost.keys()[0]));
    ///             }
    ///         }
    ///     })
    ///     .build("redis://127.0.0.1/")?;
    /// let _ = weak.set(locker.downgrade());
    /// # Ok(()) }
    /// ```
    pub fn on_lost(mut self, f: impl Fn(&Lost) + Send + Sync + 'static) -> Self {
        self.on_lost = Some(OnLost(Arc::new(f)));
        self
    }

    /// The longest a call waits for a free connection from the pool (including making one).
    ///
    /// Defaults to 3 s.
    pub fn checkout_timeout(mut self, timeout: Duration) -> Self {
        self.bounds.checkout = timeout;
        self
    }

    /// For [`build_redlock`](Self::build_redlock): how long one request to every node may
    /// take, connection checkout and replies together (each node's connections also use it
    /// as their read and write timeout, in place of [`io_timeout`](Self::io_timeout)). A
    /// node that has not answered by then (give or take half of it) counts as not having
    /// the lock, and is left out for a while (50 ms, doubling up to 1 s while it keeps
    /// failing). Keep it far below the TTL: time spent acquiring is taken off the lock's
    /// validity.
    ///
    /// Defaults to 250 ms.
    pub fn node_timeout(mut self, timeout: Duration) -> Self {
        self.node_timeout = timeout;
        self
    }

    /// How long a waiter's place in a key's queue lasts unless the locker's refresher
    /// renews it (at a third of this, in the same round trip as its holds'). A waiter
    /// whose process died (or froze) holds the others up by at most this and a third
    /// more (the next waiter's renewal notices), also when a release had just given it
    /// the keys: a hold given to a waiter lasts only what its place had left until its
    /// own refresher lengthens it. See [semantics](crate::guide::semantics). From 30 ms
    /// to 1 hour; keep it well above the longest pause the process may take (a waiter
    /// paused past it loses its place, and joins again at the back).
    ///
    /// Defaults to 1.5 s: a dead waiter costs the others at most about 2 s.
    pub fn waiter_lifetime(mut self, lifetime: Duration) -> Self {
        self.waiter_lifetime = lifetime;
        self
    }

    /// How long a hold taken with [`LockOptions::replicas`](crate::LockOptions::replicas)
    /// waits for its replicas' acknowledgement, on acquire and on each refresh round
    /// (`WAIT`'s timeout; the connection is busy meanwhile). Must be below the
    /// [`io_timeout`](Self::io_timeout), which bounds the same read.
    ///
    /// Defaults to a quarter of the I/O timeout (500 ms with the default one).
    pub fn replica_timeout(mut self, timeout: Duration) -> Self {
        self.replica_timeout = Some(timeout);
        self
    }

    /// For [`build_sentinel`](Self::build_sentinel): the password of the master and its
    /// replicas (`requirepass`, or the ACL user's password). The sentinels' own password
    /// goes in their URLs.
    ///
    /// Defaults to none.
    pub fn master_password(mut self, password: impl Into<String>) -> Self {
        self.master.password = Some(password.into());
        self
    }

    /// For [`build_sentinel`](Self::build_sentinel): the ACL user to log in to the master
    /// as, with [`master_password`](Self::master_password).
    ///
    /// Defaults to none (the `default` user).
    pub fn master_user(mut self, username: impl Into<String>) -> Self {
        self.master.username = Some(username.into());
        self
    }

    /// For [`build_sentinel`](Self::build_sentinel): the master's database number
    /// (sentinels have none, so their URLs give none).
    ///
    /// Defaults to 0.
    pub fn master_db(mut self, db: i64) -> Self {
        self.master.db = db;
        self
    }

    fn check(&self) -> Result<()> {
        checked_ttl(self.default_ttl)?;
        if self.pool_size == 0 {
            return Err(Error::InvalidInput(
                "pool_size is 0: a pool needs a connection".into(),
            ));
        }
        let b = &self.bounds;
        for (name, timeout) in [
            ("connect", b.connect),
            ("io", b.io),
            ("checkout", b.checkout),
        ] {
            if timeout.is_zero() {
                return Err(Error::InvalidInput(format!(
                    "{name}_timeout is 0: every network wait needs a bound above zero"
                )));
            }
        }
        let lifetime = self.waiter_lifetime;
        if lifetime < Duration::from_millis(30) || lifetime > Duration::from_secs(3600) {
            return Err(Error::InvalidInput(format!(
                "waiter_lifetime of {lifetime:?} is outside 30 ms to 1 hour: a waiter renews \
                 its place at a third of it"
            )));
        }
        Ok(())
    }

    /// Refuses a replica timeout that a connection's read timeout would cut short.
    fn check_replica_timeout(&self) -> Result<()> {
        let io = self.bounds.io;
        let Some(timeout) = self.replica_timeout else {
            return Ok(()); // a quarter of it
        };
        if timeout.is_zero() || timeout >= io {
            return Err(Error::InvalidInput(format!(
                "replica_timeout of {timeout:?} is not between 0 and the io_timeout ({io:?}): \
                 the wait for replicas must end before the read that waits for it"
            )));
        }
        Ok(())
    }

    /// The replica timeout in effect (at least 1 ms: WAIT counts whole milliseconds).
    fn replica_timeout_or_default(&self) -> Duration {
        let timeout = self.replica_timeout.unwrap_or(self.bounds.io / 4);
        timeout.max(Duration::from_millis(1))
    }
}
#[cfg(test)]
mod tests {
    use super::*;
    use crate::Locker;

    #[test]
    fn builder_rejects_zero_sizes_and_timeouts_before_connecting() {
        let url = "redis://127.0.0.1:1/";
        let cases = [
            Locker::builder().pool_size(0),
            Locker::builder().io_timeout(Duration::ZERO),
            Locker::builder().connect_timeout(Duration::ZERO),
            Locker::builder().checkout_timeout(Duration::ZERO),
            Locker::builder().default_ttl(Duration::from_micros(10)),
        ];
        for builder in cases {
            assert!(matches!(builder.build(url), Err(Error::InvalidInput(_))));
        }
    }

    #[test]
    fn malformed_url_is_invalid_input_naming_the_schemes() {
        let err = Locker::connect("http://user:secret@nope").unwrap_err();
        assert!(matches!(err, Error::InvalidInput(_)), "{err:?}");
        let text = err.to_string();
        assert!(text.contains("invalid Redis URL"), "{text}");
        assert!(
            text.contains("redis://") && text.contains("rediss://"),
            "{text}"
        );
        assert!(!text.contains("secret"), "{text}");
    }
}
