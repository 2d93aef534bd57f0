use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

use redis::cluster::ClusterClient;
use redis::{Client, ConnectionInfo, IntoConnectionInfo};

use crate::backend::Backend;
use crate::cluster::ClusterPool;
use crate::held::{Held, Timing, later};
use crate::options::{checked_keys, checked_token, checked_ttl};
use crate::pool::{Bounds, Pool};
use crate::quorum::Quorum;
use crate::refresher::Refresher;
use crate::scripts::{Acquired, Attempt};
use crate::subscriber::{Seen, Subscriber, Ticket};
use crate::token::{owner_part, random_token};
use crate::{Error, LockGuard, LockOptions, Result, Retry};

/// On a quorum, a release heard from one node may not have reached the others yet: an
/// attempt right after it that finds only some nodes free ([`Acquired::Partial`]) is
/// tried again after this (and up to four times this, at random), up to
/// [`QUICK_RETRIES`] times per wake-up, without using up a retry.
const QUICK_PAUSE: Duration = Duration::from_millis(1);
const QUICK_RETRIES: u32 = 3;

/// The longest [`LockerBuilder::node_timeout`]: far longer than any sensible one, short
/// enough for the clock arithmetic.
const MAX_NODE_TIMEOUT: Duration = Duration::from_secs(3600);

/// Takes locks on Redis keys. A cheap `Clone` (an `Arc` inside), `Send + Sync`.
///
/// # Threads
/// A locker runs, all gone with it (and its last guard):
/// - `redguard-pool`: one per connection pool, which makes its connections in the
///   background: one on a single server, one per node on a quorum, one for the cluster
///   pool and one per seed on a cluster;
/// - `redguard-refresher`: one, from the first guard with auto-refresh on;
/// - `redguard-subscriber`: one, from the first thread that waits for a held key.
///
/// ```no_run
/// # fn main() -> Result<(), redguard::Error> {
/// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
/// let guard = locker.lock(&["invoice:7"])?; // waits until held
/// // ... the critical section ...
/// guard.release()?; // or let it drop
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct Locker {
    shared: Arc<Shared>,
}

/// What a locker and its guards share; gone (refresher thread joined) with the last of them.
pub(crate) struct Shared {
    pub(crate) backend: Backend,
    pub(crate) default_ttl: Duration,
    /// Put before every key (and fencing counter) in Redis.
    pub(crate) prefix: String,
    pub(crate) refresher: Refresher,
    pub(crate) subscriber: Subscriber,
}

impl Locker {
    /// A locker on its own connection pool, with the defaults of [`LockerBuilder`]. Short
    /// for `Locker::builder().build(url)`.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for a malformed URL; [`Error::Redis`] at once when the first
    /// connection fails (refused, unknown host, wrong password, no such database, or no
    /// answer within the connect and I/O timeouts); [`Error::Pool`] when the others cannot
    /// be made within the checkout timeout.
    pub fn connect<T: IntoConnectionInfo>(url: T) -> Result<Locker> {
        Locker::builder().build(url)
    }

    /// Settings for a new locker.
    pub fn builder() -> LockerBuilder {
        LockerBuilder::default()
    }

    /// A locker on a pool you built, with the defaults of [`LockerBuilder`]; see
    /// [`LockerBuilder::build_with_pool`]. Build the pool with the
    /// [`SocketTimeouts`](crate::SocketTimeouts) customizer, or a frozen server can hang
    /// r2d2's own connection checks.
    pub fn from_pool(pool: r2d2::Pool<Client>) -> Locker {
        // The defaults pass `check`, so this is `build_with_pool` without its `Result`.
        let builder = LockerBuilder::default();
        let io = builder.bounds.io;
        builder.locker(Backend::Single(Pool::Given { pool, io }))
    }

    /// Locks every key, or none, waiting as long as it takes (like `Mutex::lock`): default
    /// TTL, auto-refresh on, exponential backoff with jitter, no deadline.
    ///
    /// Locks are not reentrant: a thread that locks keys one of its own guards already
    /// holds waits for itself, forever (auto-refresh keeps the first guard's lock alive).
    /// Where that can happen, use [`try_lock`](Self::try_lock), or a
    /// [`timeout`](LockOptions::timeout) with [`lock_with`](Self::lock_with).
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty key list, an empty or repeated key;
    /// [`Error::WrongType`] when a key holds another Redis type; [`Error::Redis`] or
    /// [`Error::Pool`] when Redis cannot be asked (returned at once, not retried).
    pub fn lock<K: AsRef<str>>(&self, keys: &[K]) -> Result<LockGuard> {
        self.lock_with(keys, LockOptions::default())
    }

    /// One attempt to lock every key: `Ok(None)` when another owner holds one of them.
    ///
    /// # Errors
    /// As [`lock`](Self::lock); on a quorum of servers, [`Error::Redis`] when fewer than
    /// a majority of them answered.
    pub fn try_lock<K: AsRef<str>>(&self, keys: &[K]) -> Result<Option<LockGuard>> {
        self.try_lock_with(keys, LockOptions::default())
    }

    /// One attempt to lock every key as `options` say (TTL, metadata, token, fencing,
    /// auto-refresh; their retry policy and timeout do not apply): `Ok(None)` when another
    /// owner holds one of them.
    ///
    /// ```no_run
    /// use std::time::Duration;
    /// use redguard::LockOptions;
    ///
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// let options = LockOptions::default().ttl(Duration::from_secs(5)).metadata("cron");
    /// match locker.try_lock_with(&["nightly-report"], options)? {
    ///     Some(_guard) => { /* ... run the report ... */ }
    ///     None => println!("another run holds it"),
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// As [`lock_with`](Self::lock_with), but never [`Error::NotObtained`]; on a quorum of
    /// servers, [`Error::Redis`] when fewer than a majority of them answered.
    pub fn try_lock_with<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
    ) -> Result<Option<LockGuard>> {
        let once = LockOptions {
            retry: Retry::none(),
            timeout: None,
            ..options
        };
        // `None` must mean "held elsewhere": too few quorum nodes answering is an error.
        let no_quorum = || {
            Error::Redis(redis::RedisError::from((
                redis::ErrorKind::Io,
                "fewer than a majority of the servers answered",
            )))
        };
        match self.lock_until(keys, once, no_quorum) {
            Ok(guard) => Ok(Some(guard)),
            Err(Error::NotObtained) => Ok(None),
            Err(e) => Err(e),
        }
    }

    /// Locks every key, or none, as `options` say.
    ///
    /// Each attempt is one round trip (two when a plain `SET` finds a single key taken
    /// and the script runs after it). While another owner holds a key, it waits as the
    /// retry policy says, never past the timeout, and tries again as soon as a release of
    /// one of the keys is heard; a Redis error ends it at once.
    ///
    /// # Errors
    /// [`Error::NotObtained`] when the retries or the timeout ran out;
    /// [`Error::InvalidInput`] for bad keys, TTL or token (before any round trip); otherwise
    /// as [`lock`](Self::lock).
    pub fn lock_with<K: AsRef<str>>(&self, keys: &[K], options: LockOptions) -> Result<LockGuard> {
        self.lock_until(keys, options, || Error::NotObtained)
    }

    /// [`lock_with`](Self::lock_with), with `no_quorum` as the error when too few quorum
    /// nodes answer.
    fn lock_until<K: AsRef<str>>(
        &self,
        keys: &[K],
        options: LockOptions,
        no_quorum: impl Fn() -> Error,
    ) -> Result<LockGuard> {
        let started = Instant::now();
        let names = checked_keys(keys)?;
        let prefix = self.shared.prefix.as_str();
        // The keys as Redis knows them; the caller's names are kept only when they differ.
        let (keys, names) = if prefix.is_empty() {
            (names, None)
        } else {
            (
                names.iter().map(|k| format!("{prefix}{k}")).collect(),
                Some(names),
            )
        };
        let ttl_ms = checked_ttl(options.ttl.unwrap_or(self.shared.default_ttl))?;
        self.shared
            .backend
            .supports(&keys, names.as_deref(), prefix, &options, ttl_ms)?;
        let fixed_token = options.token.is_some();
        let token = match options.token {
            Some(token) => {
                checked_token(&token)?;
                token
            }
            None => random_token()?,
        };
        let owner = owner_part(&token);
        // The token ends the owner part; the metadata follows it.
        let token_at = owner.len() - token.len()..owner.len();
        let value = owner + &options.metadata;
        // A timeout too long for the clock is no deadline at all.
        let deadline = options.timeout.and_then(|t| started.checked_add(t));
        let mut delays = options.retry.delays();
        let subscriber = &self.shared.subscriber;
        // Registered as a waiter after the first attempt that finds the keys held.
        let mut ticket: Option<Ticket<'_>> = None;
        // The end of the current retry delay: a wake-up before it gives an attempt, not a
        // retry, so `limit` and the backoff keep counting delays served.
        let mut wake_at: Option<Instant> = None;
        // Quick attempts left since a release was last heard.
        let mut quick = 0;

        loop {
            // What a waiter has seen of the keys, noted before the attempt: a release heard
            // while the attempt is in flight then ends the next wait at once.
            let before = match &mut ticket {
                None => subscriber.seen(&keys),
                Some(ticket) => {
                    ticket.mark();
                    Seen::default()
                }
            };
            let sent_at = Instant::now();
            let mut partial = false;
            let outcome = {
                // A plain SET first only where the key is likely free: on a first attempt,
                // and not while threads of ours wait for it.
                let set_first = ticket.is_none() && !subscriber.is_watched(&keys[0]);
                let attempt = Attempt {
                    keys: &keys,
                    value: &value,
                    owner_len: token_at.end,
                    ttl_ms,
                    fencing: options.fencing,
                    prefix,
                    fixed_token,
                };
                self.shared.backend.acquire(&attempt, set_first)?
            };
            match outcome {
                Acquired::Yes { fences, .. } => {
                    let timing = Timing::new(ttl_ms, sent_at);
                    let held = Held::new(keys, value, token_at, fences, timing).named(names);
                    return LockGuard::new(Arc::clone(&self.shared), held, options.auto_refresh);
                }
                Acquired::WrongType { key, kind } => {
                    // Name a lock key as the caller did; a fencing counter by its Redis name.
                    let named = keys
                        .iter()
                        .position(|k| *k == key)
                        .and_then(|i| names.as_ref().and_then(|names| names.get(i).cloned()));
                    let key = named.unwrap_or(key);
                    return Err(Error::WrongType { key, kind });
                }
                Acquired::HeldElsewhere => {}
                Acquired::Partial => partial = true,
                Acquired::NoQuorum => return Err(no_quorum()),
            }
            let now = Instant::now();
            let mut until = match wake_at {
                Some(at) if at > now => at,
                _ => match delays.next() {
                    Some(delay) => later(now, delay),
                    None => return Err(Error::NotObtained),
                },
            };
            if let Some(deadline) = deadline {
                if now >= deadline {
                    return Err(Error::NotObtained);
                }
                // One last attempt at the deadline itself.
                until = until.min(deadline);
            }
            wake_at = Some(until);
            if partial && quick > 0 {
                quick -= 1;
                // At a random moment, so that the woken waiters do not collide again.
                until = until.min(now + QUICK_PAUSE + delays.jitter(QUICK_PAUSE * 4));
            }
            let released = ticket
                .get_or_insert_with(|| subscriber.wait_for(&keys, before))
                .wait_until(until);
            if released {
                quick = QUICK_RETRIES;
            }
        }
    }
}

impl fmt::Debug for Locker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Locker")
            .field("default_ttl", &self.shared.default_ttl)
            .finish_non_exhaustive()
    }
}

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
    /// the slots, unless the lock allows [`LockOptions::across_slots`]. Fencing counters
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
            crate::tls::ensure_crypto_provider();
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
        let io = self.bounds.io;
        Ok(self.locker(Backend::Single(Pool::Given { pool, io })))
    }

    #[cfg(not(feature = "tls"))]
    fn client<T: IntoConnectionInfo>(&self, url: T) -> redis::RedisResult<Client> {
        Client::open(url)
    }

    #[cfg(feature = "tls")]
    fn client<T: IntoConnectionInfo>(&self, url: T) -> redis::RedisResult<Client> {
        let info = url.into_connection_info()?;
        if matches!(info.addr(), redis::ConnectionAddr::TcpTls { .. }) {
            crate::tls::ensure_crypto_provider();
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
        Locker {
            shared: Arc::new(Shared {
                refresher: Refresher::new(backend.clone()),
                subscriber: Subscriber::new(backend.listen_pools(), &self.prefix),
                backend,
                default_ttl: self.default_ttl,
                prefix: self.prefix,
            }),
        }
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
    fn locker_is_clone_send_sync_and_guard_is_send() {
        fn send_sync<T: Clone + Send + Sync + 'static>() {}
        fn send<T: Send + 'static>() {}
        send_sync::<Locker>();
        send::<LockGuard>();
    }

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
