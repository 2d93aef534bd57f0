//! The ways to build a [`Locker`] on a [`LockerBuilder`]'s settings: one server, a
//! caller's pool, the master Sentinel names, a quorum of independent masters, a cluster.

use std::sync::Arc;

use redis::cluster::ClusterClient;
use redis::{Client, ConnectionInfo, IntoConnectionInfo};

use super::{LockerBuilder, MAX_NODE_TIMEOUT};
use crate::backend::{Backend, Bounds, ClusterPool, Pool, Quorum, Sentinels};
use crate::shared::Shared;
use crate::{Error, Locker, Result};

impl LockerBuilder {
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
        self.check_replica_timeout()?;
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
        self.check_replica_timeout()?;
        let client = self.client(url).map_err(bad_url)?;
        let pool = Pool::build(client, self.pool_size, self.bounds)?;
        Ok(self.locker(Backend::Single(pool)))
    }

    /// A locker on the master that Redis Sentinel names `master_name`, found through any
    /// of the `sentinels` that answers (`redis://[user:password@]host:port/`, their own
    /// credentials; no database). The master's credentials and database are
    /// [`master_password`](Self::master_password), [`master_user`](Self::master_user)
    /// and [`master_db`](Self::master_db); it speaks TLS when the sentinels do
    /// (`rediss://`).
    ///
    /// The locker follows a failover by itself: a thread listens to the sentinels'
    /// `+switch-master` and `+promoted-slave` announcements (one sentinel at a time,
    /// moving on from one that stops answering its PINGs), and from the moment one is
    /// heard no new request goes to the old master (one already sent finishes there); the
    /// master is also looked up again when a connection to it fails or it answers as a
    /// replica (`READONLY`), and a sentinel that names an older configuration than one
    /// already heard of is not believed. The pool, the refresher and the subscriber all
    /// move. How long a failover takes is Sentinel's
    /// (its `down-after-milliseconds` and election); meanwhile calls fail within the
    /// usual connect, I/O and checkout timeouts. A hold taken on the old master survives
    /// only if a replica had it: see [`LockOptions::replicas`](crate::LockOptions::replicas)
    /// and [scaling out](crate::guide::scaling_out).
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::builder()
    ///     .master_password("s3cret")
    ///     .build_sentinel(&["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"], "mymaster")?;
    /// let _guard = locker.lock(&["report"])?; // on whichever server is the master now
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for no sentinel, an empty master name, a malformed URL, one
    /// with a database number, sentinels with and without TLS, or a bad setting;
    /// [`Error::Redis`] at once when no sentinel names a master that can be reached (the
    /// cause says which), as for [`build`](Self::build).
    pub fn build_sentinel<T: IntoConnectionInfo + Clone>(
        self,
        sentinels: &[T],
        master_name: &str,
    ) -> Result<Locker> {
        self.check()?;
        self.check_replica_timeout()?;
        if sentinels.is_empty() || master_name.is_empty() {
            return Err(Error::InvalidInput(
                "build_sentinel needs at least one sentinel URL and the master's name".into(),
            ));
        }
        let infos = sentinels
            .iter()
            .map(|url| url.clone().into_connection_info())
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(bad_url)?;
        if infos.iter().any(|info| info.redis_settings().db() != 0) {
            return Err(Error::InvalidInput(
                "a sentinel URL gives a database number: sentinels have none (set the \
                 master's with master_db)"
                    .into(),
            ));
        }
        let is_tls =
            |info: &ConnectionInfo| matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. });
        let tls = infos.iter().all(is_tls);
        if !tls && infos.iter().any(is_tls) {
            return Err(Error::InvalidInput(
                "some sentinel URLs are rediss:// and some redis://: the master speaks TLS \
                 when the sentinels do, so give them all the same scheme"
                    .into(),
            ));
        }
        let clients = infos
            .into_iter()
            .map(|info| self.client(info))
            .collect::<redis::RedisResult<Vec<_>>>()
            .map_err(bad_url)?;
        let login = self.master.clone();
        #[cfg(feature = "tls")]
        let tls_root = self.tls_root.clone();
        #[cfg(not(feature = "tls"))]
        let tls_root: Option<Vec<u8>> = None;
        let master_client = move |addr: redis::ConnectionAddr| {
            let mut settings = redis::RedisConnectionInfo::default().set_db(login.db);
            if let Some(username) = &login.username {
                settings = settings.set_username(username);
            }
            if let Some(password) = &login.password {
                settings = settings.set_password(password);
            }
            let info = addr.into_connection_info()?.set_redis_settings(settings);
            client(info, tls_root.as_deref())
        };
        let sentinels = Arc::new(Sentinels::new(
            master_name,
            clients,
            Box::new(master_client),
            tls,
            self.bounds,
        ));
        let pool = Pool::build_sentinel(Arc::clone(&sentinels), self.pool_size, self.bounds)?;
        Sentinels::watch(&sentinels);
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
        self.check_replica_timeout()?;
        Ok(self.given_pool(pool))
    }

    fn client<T: IntoConnectionInfo>(&self, url: T) -> redis::RedisResult<Client> {
        #[cfg(feature = "tls")]
        return client(url, self.tls_root.as_deref());
        #[cfg(not(feature = "tls"))]
        return client(url, None);
    }

    fn locker(self, backend: Backend) -> Locker {
        let replica_timeout = self.replica_timeout_or_default();
        Locker::new(Shared::new(
            backend,
            self.default_ttl,
            self.prefix,
            self.on_lost,
            replica_timeout,
            self.waiter_lifetime,
        ))
    }

    /// A locker on a caller's pool, with settings already checked.
    pub(crate) fn given_pool(self, pool: r2d2::Pool<Client>) -> Locker {
        let io = self.bounds.io;
        self.locker(Backend::Single(Pool::Given { pool, io }))
    }
}

/// A client for `url`; a `rediss://` one trusting `tls_root` when given (else the system's
/// roots), with ring as rustls's provider unless the process has one.
#[cfg(feature = "tls")]
fn client<T: IntoConnectionInfo>(url: T, tls_root: Option<&[u8]>) -> redis::RedisResult<Client> {
    let info = url.into_connection_info()?;
    if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
        crate::backend::tls::ensure_crypto_provider();
    }
    match tls_root {
        None => Client::open(info),
        Some(root) => Client::build_with_tls(
            info,
            redis::TlsCertificates {
                client_tls: None,
                root_cert: Some(root.to_vec()),
            },
        ),
    }
}

/// A client for `url` (no TLS without the `tls` feature).
#[cfg(not(feature = "tls"))]
fn client<T: IntoConnectionInfo>(url: T, _tls_root: Option<&[u8]>) -> redis::RedisResult<Client> {
    Client::open(url)
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
