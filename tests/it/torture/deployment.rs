//! Where the run's workers go, and the faults each deployment suffers: one server behind
//! the test's proxy (pauses, kills and restarts with AOF, cuts, latency, blackholes,
//! `CLIENT KILL`), or a master with a replica watched by three sentinels (failovers,
//! forced and after a SIGKILL, pauses past the sentinels' patience, `CLIENT KILL`). Both
//! freeze worker processes too, like a long GC pause.

use std::process::Command;
use std::thread;
use std::time::Duration;

use redguard::testing::Replicated;

use super::Rng;
use crate::proxy::{Cut, Proxy};
use crate::server::RedisServer;

/// How long a fault's effects may outlast it, in either deployment: a word lost in it is
/// found by the waiter's next renewal (at most half a second later); a Sentinel fault is
/// over only once the group is whole again (see `whole`).
pub const SETTLE: Duration = Duration::from_millis(1000);

pub enum Deployment {
    OneServer { server: RedisServer, proxy: Proxy },
    Sentinel { group: Replicated },
}

impl Deployment {
    pub fn one_server() -> Deployment {
        let server = RedisServer::start_persistent();
        let proxy = Proxy::start(server.port());
        Deployment::OneServer { server, proxy }
    }

    pub fn sentinel() -> Deployment {
        let group = Replicated::start(1, 3).unwrap_or_else(|e| panic!("{e}"));
        Deployment::Sentinel { group }
    }

    pub fn name(&self) -> &'static str {
        match self {
            Deployment::OneServer { .. } => "one server",
            Deployment::Sentinel { .. } => "sentinel",
        }
    }

    /// Tells a worker where to go.
    pub fn point(&self, worker: &mut Command) {
        match self {
            Deployment::OneServer { proxy, .. } => {
                worker.env("REDGUARD_TORTURE_URL", proxy.url());
            }
            Deployment::Sentinel { group } => {
                worker
                    .env(
                        "REDGUARD_TORTURE_SENTINELS",
                        group.sentinel_urls().join(","),
                    )
                    .env("REDGUARD_TORTURE_MASTER", group.master_name());
            }
        }
    }

    /// The master's URL, straight (not through the proxy).
    pub fn master_url(&self) -> String {
        match self {
            Deployment::OneServer { server, .. } => server.url(),
            Deployment::Sentinel { group } => {
                let master = group.master_index().unwrap_or(0);
                group.url_of(&group.servers()[master])
            }
        }
    }

    /// How long a run must be for every kind of fault to come up (a round: a failover
    /// through Sentinel is over only some 20 s later, once the sentinels see the old
    /// master as a synced replica).
    pub fn round_secs(&self) -> u64 {
        match self {
            Deployment::OneServer { .. } => 20,
            Deployment::Sentinel { .. } => 60,
        }
    }

    /// Whether the watcher must not read while faults settle (see `watcher.rs`).
    pub fn stale_reads(&self) -> bool {
        matches!(self, Deployment::Sentinel { .. })
    }

    /// The kinds of fault, each injected by [`inject`](Self::inject).
    pub fn kinds(&self) -> &'static [&'static str] {
        match self {
            Deployment::OneServer { .. } => &[
                "server paused",
                "server killed and restarted (AOF)",
                "connections cut",
                "latency",
                "blackhole",
                "worker process paused",
                "CLIENT KILL",
            ],
            Deployment::Sentinel { .. } => &[
                "failover",
                "master killed, failed over, restarted",
                "master paused",
                "worker process paused",
                "CLIENT KILL",
            ],
        }
    }

    /// Injects a fault of `kind`, and returns once it is over.
    pub fn inject(&mut self, kind: &str, rng: &mut Rng, workers: &[u32]) {
        match kind {
            "worker process paused" => {
                // Its refresher too: its leases run out, others take the keys, and it
                // wakes up still "inside".
                let pid = workers[rng.below(workers.len() as u64) as usize].to_string();
                let signal = |name: &str| {
                    let _ = Command::new("kill").args([name, pid.as_str()]).status();
                };
                signal("-STOP");
                thread::sleep(Duration::from_millis(600 + rng.below(900)));
                signal("-CONT");
            }
            "CLIENT KILL" => {
                if let Ok(mut con) = connect(&self.master_url()) {
                    let _: redis::RedisResult<i64> = redis::cmd("CLIENT")
                        .arg("KILL")
                        .arg("TYPE")
                        .arg("normal")
                        .query(&mut con);
                }
            }
            _ => match self {
                Deployment::OneServer { server, proxy } => one_server(server, proxy, kind, rng),
                Deployment::Sentinel { group } => sentinel(group, kind, rng),
            },
        }
    }

    /// Each data server's role and number of keys, for the report.
    pub fn describe(&self) -> String {
        let servers: Vec<(String, u16)> = match self {
            Deployment::OneServer { server, .. } => vec![(server.url(), server.port())],
            Deployment::Sentinel { group } => group
                .servers()
                .iter()
                .map(|s| (group.url_of(s), s.port()))
                .collect(),
        };
        let described: Vec<String> = servers
            .iter()
            .map(|(url, port)| {
                let asked = (|| -> redis::RedisResult<(String, u64)> {
                    let mut con = connect(url)?;
                    let role: Vec<redis::Value> = redis::cmd("ROLE").query(&mut con)?;
                    let role = match role.first() {
                        Some(redis::Value::BulkString(b)) => String::from_utf8_lossy(b).into(),
                        _ => "?".to_string(),
                    };
                    Ok((role, redis::cmd("DBSIZE").query(&mut con)?))
                })();
                match asked {
                    Ok((role, keys)) => format!("{port}: {role} of {keys} keys"),
                    Err(e) => format!("{port}: {e}"),
                }
            })
            .collect();
        described.join(", ")
    }

    /// Undoes what a fault may have left (the proxy's settings).
    pub fn heal(&self) {
        if let Deployment::OneServer { proxy, .. } = self {
            proxy.heal();
        }
    }
}

fn one_server(server: &mut RedisServer, proxy: &Proxy, kind: &str, rng: &mut Rng) {
    match kind {
        "server paused" => {
            // Sometimes past the TTL: holders go on while their lease runs out.
            server.pause();
            thread::sleep(Duration::from_millis(100 + rng.below(900)));
            server.resume();
        }
        "server killed and restarted (AOF)" => {
            server.kill();
            server.restart();
            // Over once it has read its AOF back (it answers LOADING until then, which
            // grows with the run): what follows is calm.
            let loaded = std::time::Instant::now() + Duration::from_secs(30);
            while redis::cmd("PING")
                .query::<String>(&mut server.connection())
                .is_err()
            {
                assert!(
                    std::time::Instant::now() < loaded,
                    "the AOF took over 30 s to load"
                );
                thread::sleep(Duration::from_millis(20));
            }
        }
        "connections cut" => proxy.cut(if rng.below(2) == 0 {
            Cut::Reset
        } else {
            Cut::Close
        }),
        "latency" => {
            let latency = Duration::from_millis(50 + rng.below(600));
            proxy.set(|f| {
                f.down.latency = latency;
                f.down.jitter = latency / 2;
            });
            thread::sleep(Duration::from_millis(300 + rng.below(700)));
            proxy.heal();
        }
        "blackhole" => {
            proxy.set(|f| {
                f.up.blackhole = true;
                f.down.blackhole = true;
            });
            thread::sleep(Duration::from_millis(100 + rng.below(800)));
            proxy.heal();
            proxy.cut(Cut::Reset); // what was in flight is lost
        }
        _ => panic!("no fault {kind:?} on one server"),
    }
}

fn sentinel(group: &mut Replicated, kind: &str, rng: &mut Rng) {
    let master = group.master_index().unwrap_or(0);
    match kind {
        "failover" => drop(group.failover()),
        "master killed, failed over, restarted" => {
            let old = group.servers()[master].port();
            let dir = config_dir(group, &group.servers()[master]);
            group.servers_mut()[master].kill();
            // Restarted before the sentinels moved on, it would be a master of nothing
            // that its replica then copies: a loss the lock never promised to survive.
            if let Err(e) = group.wait_for_new_master(old, Duration::from_secs(30)) {
                panic!("the sentinels did not fail over a dead master: {e}");
            }
            // It comes back as a master of nothing (a new disk: the copy of its master's
            // data it kept from when it last was a replica would bring old data back);
            // the sentinels make it a replica.
            if let Some(dir) = dir {
                let _ = std::fs::remove_file(std::path::Path::new(&dir).join("dump.rdb"));
            }
            let _ = group.servers_mut()[master].restart();
        }
        "master paused" => {
            // Up to past the sentinels' patience (1 s): then they fail over, and the old
            // master wakes up believing it is one.
            let server = &group.servers()[master];
            let _ = server.pause();
            thread::sleep(Duration::from_millis(300 + rng.below(1200)));
            let _ = server.resume();
        }
        _ => panic!("no fault {kind:?} through Sentinel"),
    }
    // A fault is over once the group is whole again: Sentinel would promote a replica
    // still syncing (after a restart, say) and lose what every hold waited for; an
    // operator waits for the sync, and so does the run.
    whole(group, kind);
}

/// Waits (up to 60 s) until every sentinel names the same master, none sees it down or is
/// failing over, each knows every other server as its replica with a link that is up
/// (only such a replica can be promoted), and the master counts them online.
fn whole(group: &Replicated, kind: &str) {
    let deadline = std::time::Instant::now() + Duration::from_secs(60);
    while std::time::Instant::now() < deadline {
        let servers = group.servers();
        if let Some(port) = agreed_master(group)
            && let Some(master) = servers.iter().find(|s| s.port() == port)
            && info(group, master).is_some_and(|info| {
                info.contains("role:master")
                    && info.matches("state=online").count() == servers.len() - 1
            })
        {
            return;
        }
        thread::sleep(Duration::from_millis(50));
    }
    let roles: Vec<String> = group
        .servers()
        .iter()
        .map(|server| {
            let info = info(group, server).unwrap_or_default();
            let role = info.lines().find(|l| l.starts_with("role:")).unwrap_or("?");
            format!("{}: {role}", server.port())
        })
        .collect();
    panic!("the group was not whole again within 60 s of a fault ({kind}): {roles:?}");
}

/// A plain connection to `url` behind the workers' backs, every wait bounded (a frozen
/// server must not hang the run).
pub fn connect(url: &str) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(Duration::from_millis(500))?;
    con.set_read_timeout(Some(Duration::from_secs(2)))?;
    con.set_write_timeout(Some(Duration::from_secs(2)))?;
    Ok(con)
}

/// Where `server` keeps its files.
fn config_dir(group: &Replicated, server: &redguard::testing::Server) -> Option<String> {
    let mut con = connect(&group.url_of(server)).ok()?;
    let pair: Vec<String> = redis::cmd("CONFIG")
        .arg("GET")
        .arg("dir")
        .query(&mut con)
        .ok()?;
    pair.get(1).cloned()
}

/// `INFO replication` of `server`.
fn info(group: &Replicated, server: &redguard::testing::Server) -> Option<String> {
    let mut con = connect(&group.url_of(server)).ok()?;
    redis::cmd("INFO").arg("replication").query(&mut con).ok()
}

/// The master's port when every sentinel sees the group whole (see [`whole`]).
fn agreed_master(group: &Replicated) -> Option<u16> {
    let field = |fields: &[String], name: &str| {
        let at = fields.iter().position(|f| f == name)?;
        fields.get(at + 1).cloned()
    };
    let mut agreed = None;
    for sentinel in group.sentinels() {
        let mut con = connect(&group.url_of(sentinel)).ok()?;
        let ask = |what: &str, con: &mut redis::Connection| {
            redis::cmd("SENTINEL")
                .arg(what)
                .arg(group.master_name())
                .query::<redis::Value>(con)
                .ok()
        };
        let master: Vec<String> = redis::from_redis_value(ask("MASTER", &mut con)?).ok()?;
        let port: u16 = field(&master, "port")?.parse().ok()?;
        if field(&master, "flags")? != "master" || agreed.is_some_and(|p| p != port) {
            return None;
        }
        let replicas: Vec<Vec<String>> =
            redis::from_redis_value(ask("REPLICAS", &mut con)?).ok()?;
        let ready = |server: &redguard::testing::Server| {
            replicas.iter().any(|replica| {
                field(replica, "port") == Some(server.port().to_string())
                    && field(replica, "flags").as_deref() == Some("slave")
                    && field(replica, "master-port") == Some(port.to_string())
                    && field(replica, "master-link-status").as_deref() == Some("ok")
            })
        };
        if !group.servers().iter().all(|s| s.port() == port || ready(s)) {
            return None;
        }
        agreed = Some(port);
    }
    agreed
}
