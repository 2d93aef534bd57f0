//! `LockerBuilder`: every setting of a locker, and the three ways to build one (one server,
//! a quorum, a cluster). (Over 400 lines: one documented setter per setting, each with its
//! default and bounds, and the checks that refuse bad ones before any connection.)

use std::sync::Arc;
use std::time::Duration;

use redis::cluster::ClusterClient;
use redis::{Client, ConnectionInfo, IntoConnectionInfo};

use crate::backend::Backend;
use crate::backend::{Bounds, ClusterPool, Pool, Quorum};
use crate::lost::OnLost;
use crate::options::checked_ttl;
use crate::{Error, Locker, Lost, Result};

/// The longest [`LockerBuilder::node_timeout`]: far longer than any sensible one, short
/// enough for the clock arithmetic.
const MAX_NODE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Settings for a [`Locker`]; every setter's doc says its default.
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

    /// A locker on several independent Redis masters (not replicas of each other, not a
    /// cluster), with the Redlock algorithm: a lock is held when a majority of them
    /// (`N/2 + 1`) took it, all-or-nothing on each, within what is left of its TTL after
    /// the attempt and a clock drift allowance (1% of the TTL and 2 ms). Every request
    /// goes to all nodes at once and costs about one round trip, whatever their number.
    /// Refresh needs a majority; release goes to all. A node that is down is left out
    /// until it answers again, so up to `(N-1)/2` of them may be down.
    ///
    /// Each node gets a pool of [`pool_size`](Self::pool_size) connections, made in the
    /// background. Fencing tokens are refused here (separate counters on separate servers
    /// cannot make one rising sequence). See [scaling out](crate::guide::scaling_out) for
    /// what this does and does not guarantee.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::builder().build_redlock(&[
    ///     "redis://10.0.0.1:6379/",
    ///     "redis://10.0.0.2:6379/",
    ///     "redis://10.0.0.3:6379/",
    /// ])?;
    /// let _guard = locker.lock(&["report"])?; // held on at least 2 of the 3
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for no URL, a malformed or repeated one (two pools on one
    /// server would count its vote twice), or a bad setting; [`Error::Redis`] or
    /// [`Error::Pool`] when fewer than a majority of the nodes answer a PING within the
    /// node timeout.
    pub fn build_redlock<T: IntoConnectionInfo + Clone>(self, urls: &[T]) -> Result<Locker> {
        self.check()?;
        if self.node_timeout.is_zero() || self.node_timeout > MAX_NODE_TIMEOUT {
            return Err(Error::InvalidInput(format!(
                "node_timeout of {:?} is not between 0 and {MAX_NODE_TIMEOUT:?}: it bounds \
                 every request, and must stay far below the TTL",
                self.node_timeout
            )));
        }
        if urls.is_empty() {
            return Err(Error::InvalidInput(
                "build_redlock needs at least one node URL".into(),
            ));
        }
        let mut seen = Vec::with_capacity(urls.len());
        let mut pools = Vec::with_capacity(urls.len());
        for url in urls {
            let client = self.client(url.clone()).map_err(bad_url)?;
            let info = client.get_connection_info();
            let node = info.addr().to_string();
            if seen.contains(&node) {
                return Err(Error::InvalidInput(format!(
                    "node {node} is given twice: each server gets one vote"
                )));
            }
            seen.push(node);
            // The node timeout is each connection's read and write timeout too.
            let bounds = Bounds {
                io: self.node_timeout,
                ..self.bounds
            };
            pools.push(Pool::build_lazy(client, self.pool_size, bounds));
        }
        let quorum = Quorum::new(pools, self.node_timeout);
        quorum.ping()?;
        Ok(self.locker(Backend::Quorum(Arc::new(quorum))))
    }

    /// A locker on a Redis Cluster, found through one or more of its nodes (`seeds`): a
    /// pool of [`pool_size`](Self::pool_size) cluster connections (each one reaches every
    /// master), following MOVED and ASK redirections when slots move.
    ///
    /// A lock's keys must share a hash slot — give them a common hash tag, as in
    /// `{order42}:a`, `{order42}:b` — so that one script takes them atomically, as on one
    /// server; keys in different slots are refused with an [`Error::InvalidInput`] naming
    /// the slots, unless the lock allows [`LockOptions::across_slots`](crate::LockOptions::across_slots). Fencing counters
    /// are kept in their key's slot. Release notifications are plain PUBLISHes, which a
    /// cluster passes to every node; the locker listens on one seed node at a time.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::builder().build_cluster(&[
    ///     "redis://10.0.0.1:7000/",
    ///     "redis://10.0.0.2:7000/",
    /// ])?;
    /// let _guard = locker.lock(&["{order42}:items", "{order42}:payment"])?;
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for no seed or a malformed one, or a bad setting;
    /// [`Error::Pool`] when the cluster cannot be reached within the checkout timeout.
    pub fn build_cluster<T: IntoConnectionInfo + Clone>(self, seeds: &[T]) -> Result<Locker> {
        self.check()?;
        if seeds.is_empty() {
            return Err(Error::InvalidInput(
                "build_cluster needs at least one seed node URL".into(),
            ));
        }
        let infos = seeds
            .iter()
            .map(|seed| seed.clone().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(bad_url)?;
        let mut listen = Vec::with_capacity(infos.len());
        for info in &infos {
            let client = self.client(info.clone()).map_err(bad_url)?;
            listen.push(Pool::build_lazy(client, 1, self.bounds));
        }
        let client = self.cluster_client(infos).map_err(bad_url)?;
        let cluster = ClusterPool::build(client, self.pool_size, self.bounds)?;
        Ok(self.locker(Backend::Cluster(Arc::new(cluster), listen)))
    }

    fn cluster_client(&self, seeds: Vec<ConnectionInfo>) -> redis::RedisResult<ClusterClient> {
        let checkout_ms = u64::try_from(self.bounds.checkout.as_millis()).unwrap_or(u64::MAX);
        #[cfg(feature = "tls")]
        if seeds
            .iter()
            .any(|seed| matches!(seed.addr(), redis::ConnectionAddr::TcpTls { .. }))
        {
            crate::backend::tls::ensure_crypto_provider();
        }
        let builder = ClusterClient::builder(seeds)
            .connection_timeout(self.bounds.connect)
            .response_timeout(self.bounds.io)
            // One redirection (MOVED or ASK, a slot moving) or reconnect: each retry may
            // cost an I/O timeout on a frozen master, and the defaults would retry 16 times
            // for up to minutes.
            .retries(1)
            .min_retry_wait(10)
            .max_retry_wait(checkout_ms);
        #[cfg(feature = "tls")]
        let builder = match &self.tls_root {
            None => builder,
            Some(root) => builder.certs(redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.clone()),
            }),
        };
        builder.build()
    }

    /// A locker on a new pool of connections to `url` (`redis://[user:password@]host:port/db`).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL or a zero size or timeout;
    /// [`Error::Redis`] at once when the first connection fails (refused, unknown host,
    /// wrong password, no such database, or no answer within the connect and I/O
    /// timeouts); [`Error::Pool`] when the others cannot be made within the checkout
    /// timeout.
    pub fn build<T: IntoConnectionInfo>(self, url: T) -> Result<Locker> {
        self.check()?;
        let client = self.client(url).map_err(bad_url)?;
        let pool = Pool::build(client, self.pool_size, self.bounds)?;
        Ok(self.locker(Backend::Single(pool)))
    }

    /// A locker on a pool you built. Its connect and checkout timeouts are the pool's own
    /// (the pool size, connect and checkout settings here do not apply); the I/O timeout is
    /// set on each of its connections the first time the locker uses it.
    ///
    /// r2d2 makes connections and (by default) PINGs them on checkout before the locker
    /// sees them, with no socket timeout unless the pool sets one: build the pool with the
    /// [`SocketTimeouts`](crate::SocketTimeouts) customizer so that a frozen server gives
    /// an error there too. A connection whose request failed mid-way is not used again
    /// until an `ECHO` round trip shows its replies are back in step.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a zero I/O timeout or a bad default TTL.
    pub fn build_with_pool(self, pool: r2d2::Pool<Client>) -> Result<Locker> {
        self.check()?;
        Ok(self.given_pool(pool))
    }

    #[cfg(not(feature = "tls"))]
    fn client<T: IntoConnectionInfo>(&self, url: T) -> redis::RedisResult<Client> {
        Client::open(url)
    }

    #[cfg(feature = "tls")]
    fn client<T: IntoConnectionInfo>(&self, url: T) -> redis::RedisResult<Client> {
        let info = url.into_connection_info()?;
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            crate::backend::tls::ensure_crypto_provider();
        }
        match &self.tls_root {
            None => Client::open(info),
            Some(root) => Client::build_with_tls(
                info,
                redis::TlsCertificates {
                    client_tls: None,
                    root_cert: Some(root.clone()),
                },
            ),
        }
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
        Ok(())
    }

    fn locker(self, backend: Backend) -> Locker {
        Locker::new(backend, self.default_ttl, self.prefix, self.on_lost)
    }

    /// A locker on a caller's pool, with settings already checked.
    pub(crate) fn given_pool(self, pool: r2d2::Pool<Client>) -> Locker {
        let io = self.bounds.io;
        self.locker(Backend::Single(Pool::Given { pool, io }))
    }
}

/// A URL (or connection info) that redis-rs cannot use. The URL itself is not repeated:
/// it may hold a password.
fn bad_url(e: redis::RedisError) -> Error {
    let tls = if cfg!(feature = "tls") {
        "rediss:// for TLS"
    } else {
        "rediss:// for TLS with the `tls` feature"
    };
    Error::InvalidInput(format!(
        "invalid Redis URL ({e}): use redis://[user:password@]host[:port][/db], {tls}, or \
         redis+unix:///path/to/socket"
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

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
