//! A private three-master Redis Cluster on free loopback ports, stopped by its handle on
//! drop: for tests of keys that live on different nodes, and of slots that move under a
//! client (MOVED). (Over 400 lines: building a cluster by hand — ports, config, joining,
//! waiting for it to agree, moving a slot — is one job.)

use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant, SystemTime};

const INSTALL_HINT: &str = "the cluster tests start their own redis-server processes and join \
     them with redis-cli. Install both: `apt-get install -y redis-server` (Debian, Ubuntu), \
     `brew install redis` (macOS), or set REDIS_SERVER and REDIS_CLI to their paths";

/// How many hash slots a Redis Cluster has.
const SLOTS: u16 = 16384;

pub struct RedisCluster {
    nodes: Vec<Child>,
    ports: Vec<u16>,
    /// Each node's id (CLUSTER MYID): CLUSTER SETSLOT names nodes by id.
    ids: Vec<String>,
    /// Holds the nodes' cluster config files (`nodes-<port>.conf`); removed on drop.
    dir: PathBuf,
}

impl RedisCluster {
    /// Starts three masters on free ports of 127.0.0.1, joins them with `redis-cli --cluster
    /// create`, and waits until every node serves and sees all 16384 slots. Panics, saying
    /// how to install them, when `redis-server` or `redis-cli` is missing.
    pub fn start() -> RedisCluster {
        static NEXT: AtomicU32 = AtomicU32::new(0);
        let n = NEXT.fetch_add(1, Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("redguard-cluster-{}-{n}", std::process::id()));
        // A killed earlier run with the same process id may have left old node files there.
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).expect("create the cluster's directory");
        // Built first, so that a panic below still kills what was started.
        let mut cluster = RedisCluster {
            nodes: Vec::new(),
            ports: Vec::new(),
            ids: Vec::new(),
            dir,
        };
        for _ in 0..3 {
            cluster.start_node();
        }
        cluster.ids = (0..3)
            .map(|node| cluster.query(node, &cmd("CLUSTER", "MYID")))
            .collect();

        let cli = std::env::var("REDIS_CLI").unwrap_or_else(|_| "redis-cli".into());
        let output = Command::new(&cli)
            .args(["--cluster", "create"])
            .args(cluster.ports.iter().map(|port| format!("127.0.0.1:{port}")))
            .args(["--cluster-replicas", "0", "--cluster-yes"])
            .stdin(Stdio::null())
            .output()
            .unwrap_or_else(|e| match e.kind() {
                std::io::ErrorKind::NotFound => panic!("{cli} was not found: {INSTALL_HINT}"),
                _ => panic!("could not run {cli}: {e}"),
            });
        let said = format!(
            "{}{}",
            String::from_utf8_lossy(&output.stdout),
            String::from_utf8_lossy(&output.stderr)
        );
        assert!(
            output.status.success(),
            "redis-cli --cluster create failed ({}):\n{said}",
            output.status
        );
        // redis-cli returns once the nodes agree on the slots; each node may still be
        // gossiping its way to `cluster_state:ok`.
        let ready = poll(Duration::from_secs(20), || {
            (0..3).all(|node| {
                let info = cluster.try_query::<String>(node, &cmd("CLUSTER", "INFO"));
                let covered = cluster.slot_ranges(node).map(|ranges| {
                    ranges
                        .iter()
                        .map(|(start, end, _)| end - start + 1)
                        .sum::<u16>()
                });
                info.is_ok_and(|info| info.contains("cluster_state:ok"))
                    && covered.is_ok_and(|covered| covered == SLOTS)
            })
        });
        assert!(
            ready,
            "the cluster was not ok within 20 s; redis-cli --cluster create said:\n{said}"
        );
        cluster
    }

    /// Starts one more node. A probed port can be taken before the node binds it (the node
    /// then exits), maybe by another server, whose answers must not pass for this node's:
    /// so it is known by its process id, and tried again on other ports.
    fn start_node(&mut self) {
        for _ in 0..5 {
            let port = free_port_pair();
            self.nodes.push(spawn(port, &self.dir));
            self.ports.push(port);
            let node = self.nodes.len() - 1;
            let ours = format!("process_id:{}\r\n", self.nodes[node].id());
            let mut up = false;
            poll(Duration::from_secs(5), || {
                let info = query_port::<String>(port, &cmd("INFO", "server"));
                up = info.is_ok_and(|info| info.contains(&ours));
                up || matches!(self.nodes[node].try_wait(), Ok(Some(_)))
            });
            if up {
                return;
            }
            let mut child = self.nodes.pop().expect("the node just started");
            self.ports.pop();
            let _ = child.kill();
            let _ = child.wait();
        }
        panic!("a cluster node did not come up on a free port after 5 tries");
    }

    /// Starts a fourth node as a replica of master `master`, and waits until it has
    /// synced. Its index is 3.
    #[allow(dead_code)] // for the replicas test
    pub fn add_replica(&mut self, master: usize) -> usize {
        self.start_node();
        let replica = self.nodes.len() - 1;
        let master_port = self.ports[master];
        let _: () = self.query(replica, &cmd("CLUSTER", ("MEET", "127.0.0.1", master_port)));
        let id = self.ids[master].clone();
        let met = poll(Duration::from_secs(20), || {
            self.try_query::<String>(replica, &cmd("CLUSTER", "NODES"))
                .is_ok_and(|nodes| nodes.contains(&id))
        });
        assert!(met, "the new node did not meet master {master}");
        let _: () = self.query(replica, &cmd("CLUSTER", ("REPLICATE", id.as_str())));
        let synced = poll(Duration::from_secs(20), || {
            self.try_query::<String>(replica, &cmd("INFO", "replication"))
                .is_ok_and(|info| info.contains("master_link_status:up"))
        });
        assert!(synced, "the replica did not sync with master {master}");
        // WAIT counts it once the master has its first acknowledgement (up to a second).
        let online = poll(Duration::from_secs(20), || {
            self.try_query::<String>(master, &cmd("INFO", "replication"))
                .is_ok_and(|info| info.contains("state=online"))
        });
        assert!(online, "master {master} did not count its replica online");
        let ok = poll(Duration::from_secs(20), || {
            self.try_query::<String>(replica, &cmd("CLUSTER", "INFO"))
                .is_ok_and(|info| info.contains("cluster_state:ok"))
        });
        assert!(ok, "the replica did not see the whole cluster");
        let my_id = self.query(replica, &cmd("CLUSTER", "MYID"));
        self.ids.push(my_id);
        replica
    }

    #[allow(dead_code)] // for tests that connect a Locker
    pub fn urls(&self) -> Vec<String> {
        self.ports
            .iter()
            .map(|port| format!("redis://127.0.0.1:{port}/"))
            .collect()
    }

    pub fn ports(&self) -> Vec<u16> {
        self.ports.clone()
    }

    /// Freezes node `node` (SIGSTOP): its connections stay open, nothing answers.
    #[allow(dead_code)]
    pub fn pause(&self, node: usize) {
        signal(self.nodes[node].id(), "STOP");
    }

    /// Undoes [`pause`](Self::pause).
    #[allow(dead_code)]
    pub fn resume(&self, node: usize) {
        signal(self.nodes[node].id(), "CONT");
    }

    /// The nodes' process ids (the benchmark reads their CPU time).
    #[allow(dead_code)]
    pub fn pids(&self) -> Vec<u32> {
        self.nodes.iter().map(Child::id).collect()
    }

    /// The hash slot of `key`, as Redis Cluster computes it: CRC16/XMODEM modulo 16384 of
    /// the hash tag (the part between the first `{` and the next `}`, when non-empty), so
    /// that keys sharing a tag land in one slot, else of the whole key.
    pub fn slot(key: &str) -> u16 {
        let key = key.as_bytes();
        let tag = key.iter().position(|&b| b == b'{').and_then(|open| {
            let rest = &key[open + 1..];
            let close = rest.iter().position(|&b| b == b'}')?;
            (close > 0).then(|| &rest[..close])
        });
        crc16(tag.unwrap_or(key)) % SLOTS
    }

    /// The index (0..3) of the node serving `slot` now, as node 0 sees it.
    pub fn owner_of(&self, slot: u16) -> usize {
        self.owner_seen_by(0, slot)
            .unwrap_or_else(|| panic!("node 0 knows no owner of slot {slot}"))
    }

    fn owner_seen_by(&self, node: usize, slot: u16) -> Option<usize> {
        let ranges = self.slot_ranges(node).ok()?;
        let (_, _, port) = ranges
            .iter()
            .find(|(start, end, _)| (*start..=*end).contains(&slot))?;
        self.ports.iter().position(|p| p == port)
    }

    /// Moves `slot` with its keys (and their TTLs: MIGRATE keeps them) from its owner to
    /// node `to`, the way `redis-cli --cluster reshard` does, and waits until all three
    /// nodes agree. A client that still sends the slot to the old owner gets MOVED.
    pub fn migrate_slot(&self, slot: u16, to: usize) {
        if let Some(from) = self.begin_migration(slot, to) {
            self.finish_migration(slot, from, to);
        }
    }

    /// The first half of [`migrate_slot`](Self::migrate_slot): the slot is IMPORTING on
    /// `to` and MIGRATING on its owner, whose index this returns (`None` when `to` already
    /// owns it). Until [`finish_migration`](Self::finish_migration), clients get ASK or
    /// TRYAGAIN for its keys.
    pub fn begin_migration(&self, slot: u16, to: usize) -> Option<usize> {
        let from = self.owner_of(slot);
        if from == to {
            return None;
        }
        self.query::<()>(
            to,
            &cmd("CLUSTER", ("SETSLOT", slot, "IMPORTING", &self.ids[from])),
        );
        self.query::<()>(
            from,
            &cmd("CLUSTER", ("SETSLOT", slot, "MIGRATING", &self.ids[to])),
        );
        Some(from)
    }

    /// Moves the slot's keys from `from` to `to` and makes `to` its owner everywhere.
    pub fn finish_migration(&self, slot: u16, from: usize, to: usize) {
        loop {
            let keys: Vec<Vec<u8>> =
                self.query(from, &cmd("CLUSTER", ("GETKEYSINSLOT", slot, 100)));
            if keys.is_empty() {
                break;
            }
            let port = self.ports[to];
            self.query::<()>(
                from,
                &cmd("MIGRATE", ("127.0.0.1", port, "", 0, 5000, "KEYS", keys)),
            );
        }
        for node in [to, from, 3 - to - from] {
            self.query::<()>(
                node,
                &cmd("CLUSTER", ("SETSLOT", slot, "NODE", &self.ids[to])),
            );
        }
        let agreed = poll(Duration::from_secs(10), || {
            (0..3).all(|node| self.owner_seen_by(node, slot) == Some(to))
        });
        assert!(
            agreed,
            "the nodes did not agree within 10 s that node {to} owns slot {slot}"
        );
    }

    /// Runs `cmd` on node `node` over a fresh connection; panics, saying where and what,
    /// on any error.
    pub fn query<T: redis::FromRedisValue>(&self, node: usize, cmd: &redis::Cmd) -> T {
        self.try_query(node, cmd).unwrap_or_else(|e| {
            panic!(
                "node {node} (port {}): {}: {e}",
                self.ports[node],
                describe(cmd)
            )
        })
    }

    /// Like [`query`](Self::query), with the error (MOVED, say) returned for the test to check.
    pub fn try_query<T: redis::FromRedisValue>(
        &self,
        node: usize,
        cmd: &redis::Cmd,
    ) -> redis::RedisResult<T> {
        query_port(self.ports[node], cmd)
    }

    /// The slot ranges `node` knows of, each with the port of the master serving it.
    fn slot_ranges(&self, node: usize) -> redis::RedisResult<Vec<(u16, u16, u16)>> {
        let ranges: Vec<Vec<redis::Value>> = self.try_query(node, &cmd("CLUSTER", "SLOTS"))?;
        let number = |value: &redis::Value| redis::from_redis_value_ref::<u16>(value);
        let range = |r: &Vec<redis::Value>| -> redis::RedisResult<(u16, u16, u16)> {
            let master: Vec<redis::Value> = redis::from_redis_value_ref(&r[2])?;
            Ok((number(&r[0])?, number(&r[1])?, number(&master[1])?))
        };
        ranges.iter().map(range).collect()
    }
}

impl Drop for RedisCluster {
    fn drop(&mut self) {
        for child in &mut self.nodes {
            let _ = child.kill();
            let _ = child.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

/// Starts a cluster-enabled, in-memory `redis-server` on `port` (and its cluster bus on
/// `port + 10000`), keeping its cluster config file in `dir`.
fn spawn(port: u16, dir: &Path) -> Child {
    let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    let mut command = Command::new(&binary);
    command
        .args(["--bind", "127.0.0.1", "--port", &port.to_string()])
        .args([
            "--daemonize",
            "no",
            "--save",
            "",
            "--appendonly",
            "no",
            "--dir",
        ])
        .arg(dir)
        .args([
            "--cluster-enabled",
            "yes",
            "--cluster-node-timeout",
            "15000",
        ])
        // A master frozen by a test (for 6 s) must not take the others' slots down with it:
        // no test here wants failure detection (replicas never fail over in 15 s).
        .args(["--cluster-require-full-coverage", "no"])
        // A replica syncs at once, not after waiting 5 s for more of them.
        .args(["--repl-diskless-sync-delay", "0"])
        .arg("--cluster-config-file")
        .arg(dir.join(format!("nodes-{port}.conf")));
    match command.stdout(Stdio::null()).stderr(Stdio::null()).spawn() {
        Ok(child) => child,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            panic!("{binary} was not found: {INSTALL_HINT}")
        }
        Err(e) => panic!("could not start {binary}: {e}"),
    }
}

/// A port p of 127.0.0.1 where p and its cluster bus port p + 10000 were both free a
/// moment ago. The OS hands out no such pairs, so this probes ports spread over
/// 20000..45000 from a per-call start, which parallel tests do not share.
fn free_port_pair() -> u16 {
    static NEXT: AtomicU32 = AtomicU32::new(0);
    let nanos = SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap_or_default();
    let start = nanos.subsec_nanos() ^ std::process::id().wrapping_mul(2_654_435_761);
    let free = |port: u16| TcpListener::bind(("127.0.0.1", port)).is_ok();
    for _ in 0..1000 {
        let i = NEXT.fetch_add(1, Ordering::Relaxed);
        let port = 20000 + (start.wrapping_add(i.wrapping_mul(7919)) % 25000) as u16;
        if free(port) && free(port + 10000) {
            return port;
        }
    }
    panic!("no free pair of ports p, p + 10000 on 127.0.0.1 with p in 20000..45000");
}

/// CRC16/XMODEM (polynomial 0x1021, initial value 0): the checksum Redis Cluster hashes
/// keys with.
fn crc16(bytes: &[u8]) -> u16 {
    let mut crc = 0u16;
    for &byte in bytes {
        crc ^= u16::from(byte) << 8;
        for _ in 0..8 {
            crc = (crc << 1) ^ if crc & 0x8000 != 0 { 0x1021 } else { 0 };
        }
    }
    crc
}

/// Runs `cmd` on a fresh connection to the node on `port`, every wait bounded.
fn query_port<T: redis::FromRedisValue>(port: u16, cmd: &redis::Cmd) -> redis::RedisResult<T> {
    let client = redis::Client::open(format!("redis://127.0.0.1:{port}/"))?;
    let mut con = client.get_connection_with_timeout(Duration::from_secs(1))?;
    con.set_read_timeout(Some(Duration::from_secs(5)))?;
    con.set_write_timeout(Some(Duration::from_secs(5)))?;
    cmd.query(&mut con)
}

/// A command with its arguments (a tuple of them, say), built in one expression.
fn cmd(name: &str, args: impl redis::ToRedisArgs) -> redis::Cmd {
    let mut cmd = redis::cmd(name);
    cmd.arg(args);
    cmd
}

/// Polls `condition` every few milliseconds; false if it did not hold within `limit`.
fn poll(limit: Duration, mut condition: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + limit;
    while !condition() {
        if Instant::now() >= deadline {
            return false;
        }
        thread::sleep(Duration::from_millis(5));
    }
    true
}

/// A command as one would type it, for panic messages.
fn describe(cmd: &redis::Cmd) -> String {
    let args = cmd.args_iter().map(|arg| match arg {
        redis::Arg::Simple(bytes) => String::from_utf8_lossy(bytes).into_owned(),
        _ => "<cursor>".into(),
    });
    args.collect::<Vec<_>>().join(" ")
}

fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .expect("run kill");
    assert!(status.success(), "kill -{name} {pid} failed");
}

#[cfg(test)]
mod tests {
    use super::{RedisCluster, cmd};

    /// The node a MOVED error points to, checked to be one of the cluster's.
    fn moved_to(cluster: &RedisCluster, error: &redis::RedisError) -> usize {
        let (addr, _) = error
            .redirect_node()
            .unwrap_or_else(|| panic!("not MOVED: {error}"));
        assert_eq!(
            error.kind(),
            redis::ErrorKind::Server(redis::ServerErrorKind::Moved)
        );
        let port = addr
            .strip_prefix("127.0.0.1:")
            .and_then(|port| port.parse().ok());
        cluster
            .ports()
            .iter()
            .position(|p| Some(*p) == port)
            .expect("a node of ours")
    }

    #[test]
    fn cluster_comes_up_and_redirects_to_the_owner() {
        let started = std::time::Instant::now();
        let cluster = RedisCluster::start();
        println!(
            "3-node cluster up in {:?} on ports {:?}",
            started.elapsed(),
            cluster.ports()
        );
        let slot = RedisCluster::slot("{t}a");
        let owner = cluster.owner_of(slot);
        // A client that guesses the wrong node is sent to the owner, and the write lands.
        let wrong = (owner + 1) % 3;
        let set = cmd("SET", ("{t}a", 1));
        let error = cluster.try_query::<()>(wrong, &set).expect_err("MOVED");
        let node = moved_to(&cluster, &error);
        assert_eq!((node, error.redirect_node().unwrap().1), (owner, slot));
        cluster.query::<()>(node, &set);
        assert_eq!(cluster.query::<i64>(owner, &cmd("GET", "{t}a")), 1);
    }

    #[test]
    fn slot_matches_the_servers_keyslot() {
        assert_eq!(RedisCluster::slot("foo"), 12182);
        assert_eq!(RedisCluster::slot("123456789"), 12739);
        assert_eq!(
            RedisCluster::slot("{user1000}.following"),
            RedisCluster::slot("{user1000}.followers")
        );
        let cluster = RedisCluster::start();
        // Empty and unclosed tags hash the whole key; only the first tag counts.
        let odd = "|foo|bar|{|}|{}|}{|{}a|a{}|{}{a}|{a}|a{b}c|{a}{b}|{{a}}|a{b|a}b{c}|x{}{y}|{ }|\
                   ключ|{ключ}1|日本語|🔒{🔒}|lock:{order:17}|redguard:{a}:fence";
        let mut keys: Vec<String> = odd.split('|').map(String::from).collect();
        keys.extend((0..30).map(|i| format!("key:{i}:{}", "x".repeat(i))));
        for key in &keys {
            let server: u16 = cluster.query(0, &cmd("CLUSTER", ("KEYSLOT", key)));
            assert_eq!(RedisCluster::slot(key), server, "slot of {key:?}");
        }
    }

    #[test]
    fn migrate_slot_moves_keys_with_their_ttl() {
        let cluster = RedisCluster::start();
        let slot = RedisCluster::slot("{m}lock");
        let from = cluster.owner_of(slot);
        cluster.query::<()>(from, &cmd("SET", ("{m}lock", "token", "PX", 60_000)));
        // More keys than one GETKEYSINSLOT batch of 100.
        let pairs: Vec<_> = (0..150).map(|i| (format!("{{m}}{i}"), i)).collect();
        cluster.query::<()>(from, &cmd("MSET", pairs));

        let to = (from + 1) % 3;
        cluster.migrate_slot(slot, to);
        assert_eq!(cluster.owner_of(slot), to);
        let ttl: i64 = cluster.query(to, &cmd("PTTL", "{m}lock"));
        assert!(ttl > 0 && ttl <= 60_000, "PTTL after the move: {ttl}");
        let token: String = cluster.query(to, &cmd("GET", "{m}lock"));
        assert_eq!(token, "token");
        let count = cmd("CLUSTER", ("COUNTKEYSINSLOT", slot));
        assert_eq!(cluster.query::<u64>(to, &count), 151);
        assert_eq!(cluster.query::<u64>(from, &count), 0);
        // Both other nodes send a client that still uses them to the new owner.
        for node in [from, 3 - from - to] {
            let get = cmd("GET", "{m}lock");
            let error = cluster.try_query::<String>(node, &get).expect_err("MOVED");
            assert_eq!(moved_to(&cluster, &error), to);
        }
    }
}
