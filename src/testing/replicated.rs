//! A replicated deployment of private servers: a master, its replicas, and the sentinels
//! that watch it.

use std::io;
use std::thread;
use std::time::{Duration, Instant};

use super::Server;

/// The name the sentinels know the master by.
const MASTER_NAME: &str = "redguard";

/// A master with replicas, watched by Redis Sentinel, all on free loopback ports and all
/// stopped on drop: for testing code that uses
/// [`build_sentinel`](crate::LockerBuilder::build_sentinel), failovers included.
///
/// The sentinels take a master for down after 1 s without an answer, and a quorum of a
/// majority of them agrees on it.
///
/// ```no_run
/// # fn main() -> Result<(), Box<dyn std::error::Error>> {
/// use redguard::Locker;
/// use redguard::testing::Replicated;
///
/// let group = Replicated::start(1, 3)?; // a master, 1 replica, 3 sentinels
/// let locker = Locker::builder().build_sentinel(&group.sentinel_urls(), group.master_name())?;
/// let guard = locker.lock(&["report"])?;
/// group.failover()?; // the replica is the master now
/// drop(guard);
/// let _guard = locker.lock(&["report"])?; // on the new master
/// # Ok(()) }
/// ```
pub struct Replicated {
    /// The master first, as started; after a failover another one is the master.
    servers: Vec<Server>,
    sentinels: Vec<Server>,
    password: Option<String>,
    /// Every server and sentinel speaks TLS only, with these certificates.
    tls: Option<(std::path::PathBuf, Vec<u8>)>,
}

impl Replicated {
    /// Starts a master, `replicas` replicas of it and `sentinels` sentinels, and waits
    /// (up to 30 s) until every sentinel knows the replicas and the other sentinels.
    ///
    /// # Errors
    /// As [`Server::start`], and when the sentinels do not agree in time.
    pub fn start(replicas: usize, sentinels: usize) -> io::Result<Replicated> {
        Replicated::start_inner(replicas, sentinels, None, |port| port, None)
    }

    /// Like [`start`](Self::start), with `password` required by every server and sentinel
    /// (`requirepass`; replicas and sentinels log in with it).
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_with_password(
        replicas: usize,
        sentinels: usize,
        password: &str,
    ) -> io::Result<Replicated> {
        Replicated::start_inner(
            replicas,
            sentinels,
            Some(password.to_string()),
            |port| port,
            None,
        )
    }

    /// Like [`start`](Self::start), every server and sentinel speaking TLS only (also to
    /// each other), with the certificates of [`Server::start_tls`]: the sentinels' URLs
    /// are `rediss://`.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    #[cfg(feature = "tls")]
    pub fn start_tls(
        replicas: usize,
        sentinels: usize,
        certs: &std::path::Path,
        ca: Vec<u8>,
    ) -> io::Result<Replicated> {
        let tls = Some((certs.to_path_buf(), ca));
        Replicated::start_inner(replicas, sentinels, None, |port| port, tls)
    }

    /// Like [`start`](Self::start), with the replicas replicating from the port `via`
    /// gives for the master's: a proxy of the test's own, say, to cut the replication
    /// link while the sentinels still reach every server directly.
    ///
    /// # Errors
    /// As [`start`](Self::start).
    pub fn start_via(
        replicas: usize,
        sentinels: usize,
        via: impl FnOnce(u16) -> u16,
    ) -> io::Result<Replicated> {
        Replicated::start_inner(replicas, sentinels, None, via, None)
    }

    fn start_inner(
        replicas: usize,
        sentinels: usize,
        password: Option<String>,
        via: impl FnOnce(u16) -> u16,
        tls: Option<(std::path::PathBuf, Vec<u8>)>,
    ) -> io::Result<Replicated> {
        // Replicas sync at once (no 5 s wait for more of them), whichever is the master.
        let mut auth: Vec<&str> = vec!["--repl-diskless-sync-delay", "0"];
        if let Some(password) = &password {
            auth.extend(["--requirepass", password, "--masterauth", password]);
        }
        if tls.is_some() {
            auth.extend(["--tls-replication", "yes"]);
        }
        let data_server = |args: &[&str]| match &tls {
            #[cfg(feature = "tls")]
            Some((certs, ca)) => Server::start_tls_with(certs, ca.clone(), args),
            _ => Server::start_with(args),
        };
        let master = data_server(&auth)?;
        let master_port = master.port().to_string();
        let upstream = via(master.port()).to_string();
        let mut servers = vec![master];
        for _ in 0..replicas {
            let mut args = vec!["--replicaof", "127.0.0.1", &upstream];
            args.extend(&auth);
            servers.push(data_server(&args)?);
        }
        let mut group = Replicated {
            servers,
            sentinels: Vec::new(),
            password,
            tls: tls.clone(),
        };
        group.wait_until_synced()?;
        let quorum = sentinels / 2 + 1;
        let mut config = format!(
            "sentinel monitor {MASTER_NAME} 127.0.0.1 {master_port} {quorum}\n\
             sentinel down-after-milliseconds {MASTER_NAME} 1000\n\
             sentinel failover-timeout {MASTER_NAME} 4000\n"
        );
        if let Some(password) = &group.password {
            config +=
                &format!("sentinel auth-pass {MASTER_NAME} {password}\nrequirepass {password}\n");
        }
        let sentinel = |config: &str| match &tls {
            #[cfg(feature = "tls")]
            Some((certs, ca)) => Server::start_sentinel_tls(config, certs, ca.clone()),
            _ => Server::start_sentinel(config),
        };
        group.sentinels = (0..sentinels)
            .map(|_| sentinel(&config))
            .collect::<io::Result<Vec<_>>>()?;
        group.wait_until_agreed(replicas)?;
        Ok(group)
    }

    /// The name the sentinels know the master by.
    pub fn master_name(&self) -> &str {
        MASTER_NAME
    }

    /// The sentinels' URLs (with the password, if there is one).
    pub fn sentinel_urls(&self) -> Vec<String> {
        self.sentinels.iter().map(|s| self.url_of(s)).collect()
    }

    /// The data servers: the master as started first, then the replicas.
    pub fn servers(&self) -> &[Server] {
        &self.servers
    }

    /// The data servers, to kill, pause or restart one.
    pub fn servers_mut(&mut self) -> &mut [Server] {
        &mut self.servers
    }

    /// The sentinels.
    pub fn sentinels(&self) -> &[Server] {
        &self.sentinels
    }

    /// A URL of `server` (a data server or a sentinel), with the password if there is one.
    pub fn url_of(&self, server: &Server) -> String {
        match &self.password {
            Some(password) => format!("redis://:{password}@127.0.0.1:{}/", server.port()),
            None => server.url(),
        }
    }

    /// The port of the master as the first sentinel that answers names it.
    ///
    /// # Errors
    /// When no sentinel answers.
    pub fn master_port(&self) -> io::Result<u16> {
        let mut last = io::Error::other("no sentinel");
        for sentinel in &self.sentinels {
            match self.ask(sentinel) {
                Ok(port) => return Ok(port),
                Err(e) => last = e,
            }
        }
        Err(last)
    }

    /// The index in [`servers`](Self::servers) of the master the sentinels name.
    ///
    /// # Errors
    /// As [`master_port`](Self::master_port).
    pub fn master_index(&self) -> io::Result<usize> {
        self.index_of(self.master_port()?)
    }

    /// The index in [`servers`](Self::servers) of the master the sentinel at index
    /// `sentinel` names (when another one is paused, say).
    ///
    /// # Errors
    /// When there is no such sentinel, or it does not answer.
    pub fn master_index_by(&self, sentinel: usize) -> io::Result<usize> {
        let sentinel = self
            .sentinels
            .get(sentinel)
            .ok_or_else(|| io::Error::other("no such sentinel"))?;
        self.index_of(self.ask(sentinel)?)
    }

    fn index_of(&self, port: u16) -> io::Result<usize> {
        self.servers
            .iter()
            .position(|server| server.port() == port)
            .ok_or_else(|| io::Error::other(format!("the sentinels name port {port}")))
    }

    /// Forces a failover (`SENTINEL FAILOVER` on the first sentinel, retried while
    /// Sentinel is not ready for one), and waits until the sentinels that answer name the
    /// new master and it says it is one. Returns the new master's index in
    /// [`servers`](Self::servers).
    ///
    /// # Errors
    /// When it does not happen within 30 s.
    pub fn failover(&self) -> io::Result<usize> {
        self.failover_through(0)
    }

    /// Like [`failover`](Self::failover), asking the sentinel at index `sentinel` (when
    /// the first is paused, say).
    ///
    /// # Errors
    /// As [`failover`](Self::failover).
    pub fn failover_through(&self, sentinel: usize) -> io::Result<usize> {
        let leader = self
            .sentinels
            .get(sentinel)
            .ok_or_else(|| io::Error::other(format!("no sentinel {sentinel}")))?;
        let old = self.ask(leader)?;
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            let asked = self.query(leader, |con| {
                redis::cmd("SENTINEL")
                    .arg("FAILOVER")
                    .arg(MASTER_NAME)
                    .query::<()>(con)
            });
            match asked {
                Ok(()) => break,
                Err(e) if Instant::now() < deadline => {
                    let _ = e; // NOGOODSLAVE or INPROG: not ready yet
                    thread::sleep(Duration::from_millis(200));
                }
                Err(e) => return Err(e),
            }
        }
        self.wait_for_new_master(old, deadline.saturating_duration_since(Instant::now()))
    }

    /// Waits up to `within` until the sentinels that answer (a majority at least) name a
    /// master other than the one on port `old`, and that server says it is the master
    /// (after the old one was killed, say). Returns its index in
    /// [`servers`](Self::servers).
    ///
    /// # Errors
    /// When that does not happen in time.
    pub fn wait_for_new_master(&self, old: u16, within: Duration) -> io::Result<usize> {
        let deadline = Instant::now() + within;
        while Instant::now() < deadline {
            let named: Vec<u16> = self
                .sentinels
                .iter()
                .filter_map(|sentinel| self.ask(sentinel).ok())
                .collect();
            if let Some(port) = named.first()
                && *port != old
                && named.len() > self.sentinels.len() / 2
                && named.iter().all(|n| n == port)
                && let Some(at) = self.servers.iter().position(|s| s.port() == *port)
                && self.is_master(&self.servers[at])
            {
                return Ok(at);
            }
            thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::other(format!(
            "the sentinels did not move from the master on port {old} within {within:?}"
        )))
    }

    /// Waits until every replica has finished its first sync with the master, and the
    /// master counts it online.
    fn wait_until_synced(&self) -> io::Result<()> {
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let synced = self.servers[1..].iter().all(|replica| {
                self.query(replica, |con| {
                    let info: String = redis::cmd("INFO").arg("replication").query(con)?;
                    Ok(info.contains("master_link_status:up"))
                })
                .unwrap_or(false)
            });
            // And the master counts them: after a sync it waits for a replica's first
            // acknowledgement (up to a second) before WAIT counts it.
            let online = self.query(&self.servers[0], |con| {
                let info: String = redis::cmd("INFO").arg("replication").query(con)?;
                Ok(info.matches("state=online").count())
            });
            let synced = synced && online.is_ok_and(|n| n == self.servers.len() - 1);
            if synced {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(20));
        }
        Err(io::Error::other("the replicas did not sync within 30 s"))
    }

    /// Waits until each sentinel knows `replicas` replicas and every other sentinel.
    fn wait_until_agreed(&self, replicas: usize) -> io::Result<()> {
        let others = self.sentinels.len().saturating_sub(1);
        let deadline = Instant::now() + Duration::from_secs(30);
        while Instant::now() < deadline {
            let agreed = self.sentinels.iter().all(|sentinel| {
                self.query(sentinel, |con| {
                    let info: Vec<String> = redis::cmd("SENTINEL")
                        .arg("MASTER")
                        .arg(MASTER_NAME)
                        .query(con)?;
                    let field = |name: &str| -> Option<usize> {
                        let at = info.iter().position(|f| f == name)?;
                        info.get(at + 1)?.parse().ok()
                    };
                    Ok(field("num-slaves") == Some(replicas)
                        && field("num-other-sentinels") == Some(others))
                })
                .unwrap_or(false)
            });
            if agreed {
                return Ok(());
            }
            thread::sleep(Duration::from_millis(50));
        }
        Err(io::Error::other(
            "the sentinels did not agree on the replicas and each other within 30 s",
        ))
    }

    /// The master's port as `sentinel` names it.
    fn ask(&self, sentinel: &Server) -> io::Result<u16> {
        let (_host, port): (String, u16) = self.query(sentinel, |con| {
            redis::cmd("SENTINEL")
                .arg("GET-MASTER-ADDR-BY-NAME")
                .arg(MASTER_NAME)
                .query(con)
        })?;
        Ok(port)
    }

    fn is_master(&self, server: &Server) -> bool {
        self.query(server, |con| {
            let role: Vec<redis::Value> = redis::cmd("ROLE").query(con)?;
            Ok(matches!(role.first(), Some(redis::Value::BulkString(r)) if r == b"master"))
        })
        .unwrap_or(false)
    }

    /// Runs `f` on a new connection to `server`, every wait bounded.
    fn query<T>(
        &self,
        server: &Server,
        f: impl FnOnce(&mut redis::Connection) -> redis::RedisResult<T>,
    ) -> io::Result<T> {
        let client = match self.tls {
            Some(_) => server.client(), // trusting its CA
            None => redis::Client::open(self.url_of(server)),
        }
        .map_err(io::Error::other)?;
        let mut con = client
            .get_connection_with_timeout(Duration::from_secs(1))
            .map_err(io::Error::other)?;
        con.set_read_timeout(Some(Duration::from_secs(2)))
            .map_err(io::Error::other)?;
        con.set_write_timeout(Some(Duration::from_secs(2)))
            .map_err(io::Error::other)?;
        f(&mut con).map_err(io::Error::other)
    }
}

impl std::fmt::Debug for Replicated {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Replicated")
            .field("servers", &self.servers)
            .field("sentinels", &self.sentinels)
            .finish_non_exhaustive()
    }
}
