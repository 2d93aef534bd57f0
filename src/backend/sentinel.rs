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

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use parking_lot::Mutex;
use redis::{Client, Connection, ConnectionAddr, RedisResult};

use super::bounds::Bounds;

/// A sentinel's announcement of a new master: `<name> <old ip> <old port> <new ip> <new
/// port>`. The sentinel that led the failover sends it last, after reconfiguring the
/// other replicas (a second or more after the promotion); the others as they learn of it.
const SWITCH_MASTER: &str = "+switch-master";

/// The leading sentinel's announcement that the replica it promoted now says it is the
/// master: `slave <ip>:<port> <ip> <port> @ <name> <old ip> <old port>`. From then on the
/// old master is the past, though it stays writable until it is reconfigured.
const PROMOTED: &str = "+promoted-slave";

/// How often the watcher looks up from its subscription (to notice the locker is gone).
const WATCH_SLICE: Duration = Duration::from_secs(1);

/// Makes a client for a master's address (with the master's credentials, database and
/// TLS settings).
pub(crate) type MasterClient = dyn Fn(ConnectionAddr) -> RedisResult<Client> + Send + Sync;

/// The sentinels of one master name, and what they last said of it.
pub(crate) struct Sentinels {
    name: String,
    sentinels: Vec<Client>,
    master_client: Box<MasterClient>,
    /// Whether the master speaks TLS (as the sentinels do).
    tls: bool,
    bounds: Bounds,
    known: Mutex<Known>,
    /// `known.generation`, readable without the lock: every checkout and return of a
    /// pooled connection asks it.
    generation: AtomicU64,
}

#[derive(Default)]
struct Known {
    /// The master's address as last learned.
    master: Option<(String, u16)>,
    /// Whether to use it as it is (else look it up first): not after a connection to it
    /// failed.
    trusted: bool,
    /// Raised each time the master changes, or the one we had answered as a replica.
    generation: u64,
    /// The sentinels' configuration epoch of `master`, as far as we know it.
    epoch: u64,
}

/// What one sentinel says of the master.
struct Answer {
    master: (String, u16),
    /// The epoch of the configuration it names the master by.
    epoch: u64,
}

impl Sentinels {
    /// The sentinels at `sentinels`, watching the master `name`; nothing is asked yet.
    pub(crate) fn new(
        name: &str,
        sentinels: Vec<Client>,
        master_client: Box<MasterClient>,
        tls: bool,
        bounds: Bounds,
    ) -> Sentinels {
        Sentinels {
            name: name.to_string(),
            sentinels,
            master_client,
            tls,
            bounds,
            known: Mutex::default(),
            generation: AtomicU64::new(0),
        }
    }

    /// The current generation: connections made in an older one are not used.
    pub(crate) fn generation(&self) -> u64 {
        self.generation.load(Ordering::Acquire)
    }

    /// A new generation begins (under the lock of `known`).
    fn next_generation(&self, known: &mut Known) {
        known.generation += 1;
        self.generation.store(known.generation, Ordering::Release);
    }

    /// A connection to the master (bounded, with the I/O timeout set), and the generation
    /// it belongs to. Looks the master up first unless its address is trusted, and once
    /// more when connecting to a trusted address fails. A switch heard while connecting
    /// makes it try the new master at once (a few times at most: r2d2 would wait hundreds
    /// of milliseconds before it tried again).
    pub(crate) fn connect(&self) -> RedisResult<(Connection, u64)> {
        let mut last_error = None;
        for _ in 0..3 {
            let trusted = {
                let known = self.known.lock();
                let master = known.master.clone().filter(|_| known.trusted);
                master.map(|master| (master, known.generation))
            };
            let (master, generation) = match &trusted {
                Some(trusted) => trusted.clone(),
                None => self.lookup()?,
            };
            match self.open(&master, generation) {
                Ok(con) => return Ok((con, generation)),
                // Moved on meanwhile: the new master is known already.
                Err(e) if self.generation() != generation => last_error = Some(e),
                // A trusted address that failed: look it up.
                Err(e) if trusted.is_some() => {
                    self.failed(generation);
                    last_error = Some(e);
                }
                Err(e) => return Err(e),
            }
        }
        Err(last_error.unwrap_or_else(|| moved(&self.name)))
    }

    /// A connection to `master`, if it says it is the master and was still the one of
    /// `generation` once it said so (a switch heard meanwhile makes it a stale one).
    fn open(&self, master: &(String, u16), generation: u64) -> RedisResult<Connection> {
        let (host, port) = master.clone();
        let addr = match self.tls {
            false => ConnectionAddr::Tcp(host, port),
            true => ConnectionAddr::TcpTls {
                host,
                port,
                insecure: false,
                tls_params: None,
            },
        };
        let mut con =
            (self.master_client)(addr)?.get_connection_with_timeout(self.bounds.connect)?;
        con.set_read_timeout(Some(self.bounds.io))?;
        con.set_write_timeout(Some(self.bounds.io))?;
        match redis::cmd("ROLE").query::<redis::Value>(&mut con) {
            Ok(role) if is_master(&role) => {}
            // A user whose ACL forbids ROLE, or a server before 2.8.12 that has none: a
            // replica answers its first write READONLY.
            Err(e) if matches!(e.code(), Some("NOPERM" | "ERR")) => {}
            Ok(_) => {
                self.replica_seen(generation);
                return Err(not_master(&self.name));
            }
            Err(e) => return Err(e),
        }
        if self.generation() != generation {
            return Err(moved(&self.name));
        }
        Ok(con)
    }

    /// Asks every sentinel at once (each bounded by the connect and I/O timeouts) for the
    /// master's address and the epoch of that configuration, and learns the newest answer:
    /// one sentinel that lags, or is cut off from the servers, must not keep the locker on
    /// the old master. The master to use, and its generation.
    fn lookup(&self) -> RedisResult<((String, u16), u64)> {
        let answers: Vec<RedisResult<Option<Answer>>> = thread::scope(|scope| {
            let asks: Vec<_> = self
                .sentinels
                .iter()
                .map(|sentinel| scope.spawn(move || self.ask(sentinel)))
                .collect();
            asks.into_iter()
                .map(|ask| ask.join().unwrap_or_else(|_| Err(not_known(&self.name))))
                .collect()
        });
        let (mut unknown, mut failure, mut newest) = (None, None, None::<Answer>);
        for answer in answers {
            match answer {
                Ok(Some(answer)) => {
                    if newest
                        .as_ref()
                        .is_none_or(|newest| answer.epoch > newest.epoch)
                    {
                        newest = Some(answer);
                    }
                }
                // Said by one that answered, over another's I/O error: the one to act on.
                Ok(None) => unknown = Some(not_known(&self.name)),
                Err(e) => failure = Some(e),
            }
        }
        match newest {
            Some(answer) => Ok(self.learned(&answer.master, Some(answer.epoch))),
            None => Err(unknown.or(failure).unwrap_or_else(|| not_known(&self.name))),
        }
    }

    /// One sentinel's answer: the master's address and its configuration's epoch, `None`
    /// when it does not know the name. The epoch is read first: should the sentinel switch
    /// in between, the new address comes with the old epoch (which errs on the safe side),
    /// never the old address with the new one.
    fn ask(&self, sentinel: &Client) -> RedisResult<Option<Answer>> {
        let mut con = self.sentinel_connection(sentinel)?;
        let fields: Vec<String> = match redis::cmd("SENTINEL")
            .arg("MASTER")
            .arg(&self.name)
            .query(&mut con)
        {
            Ok(fields) => fields,
            // "No such master with that name".
            Err(e) if e.code() == Some("ERR") => return Ok(None),
            Err(e) => return Err(e),
        };
        let epoch = fields
            .iter()
            .position(|field| field == "config-epoch")
            .and_then(|at| fields.get(at + 1)?.parse().ok())
            .unwrap_or(0);
        // Not SENTINEL MASTER's own ip and port: from the reconfiguration of the replicas
        // on, this names the promoted replica already, and they still the old master.
        let master: Option<(String, u16)> = redis::cmd("SENTINEL")
            .arg("GET-MASTER-ADDR-BY-NAME")
            .arg(&self.name)
            .query(&mut con)?;
        Ok(master.map(|master| Answer { master, epoch }))
    }

    fn sentinel_connection(&self, sentinel: &Client) -> RedisResult<Connection> {
        let con = sentinel.get_connection_with_timeout(self.bounds.connect)?;
        con.set_read_timeout(Some(self.bounds.io))?;
        con.set_write_timeout(Some(self.bounds.io))?;
        Ok(con)
    }

    /// A sentinel named `master`: from a lookup, with its configuration's `epoch`; from an
    /// announcement of a switch, without. A new generation if it moved. Not backwards
    /// while the master we have works: a lookup's answer older than what we know (the
    /// sentinels have not all heard of the failover yet) is ignored then, and an announced
    /// switch counts as at least one epoch newer than the configuration it replaces. Once
    /// the master we have failed or answered as a replica, the newest answer is believed,
    /// whatever its epoch (sentinels set up afresh start counting again). The master to
    /// use now, and its generation.
    fn learned(&self, master: &(String, u16), epoch: Option<u64>) -> ((String, u16), u64) {
        let mut known = self.known.lock();
        let stale = known.trusted && epoch.is_some_and(|epoch| epoch < known.epoch);
        if let (true, Some(current)) = (stale, &known.master) {
            let current = current.clone();
            return (current, known.generation);
        }
        if known.master.as_ref() != Some(master) {
            if known.master.is_some() {
                log::warn!(
                    "redguard: sentinel master {:?} is now {}:{}",
                    self.name,
                    master.0,
                    master.1
                );
            }
            known.epoch = match epoch {
                Some(epoch) => epoch,
                None if known.master.is_some() => known.epoch + 1,
                None => known.epoch,
            };
            known.master = Some(master.clone());
            self.next_generation(&mut known);
        } else if let Some(epoch) = epoch {
            known.epoch = match known.trusted {
                true => known.epoch.max(epoch),
                false => epoch,
            };
        }
        known.trusted = true;
        (master.clone(), known.generation)
    }

    /// A sentinel announced that `new` replaced `old`. Followed at once when `old` is the
    /// master we have (or none yet); otherwise it is news of another switch than ours (a
    /// late one, or one we missed): the sentinels are asked instead.
    fn announced(&self, old: &(String, u16), new: &(String, u16)) {
        let ours = {
            let known = self.known.lock();
            known
                .master
                .as_ref()
                .is_none_or(|master| master == old || master == new)
        };
        match ours {
            true => drop(self.learned(new, None)),
            false => drop(self.lookup()),
        }
    }

    /// A connection of `generation` to the master failed: look it up again before the
    /// next one (unless a newer generation began meanwhile).
    pub(crate) fn failed(&self, generation: u64) {
        let mut known = self.known.lock();
        if known.generation == generation {
            known.trusted = false;
        }
    }

    /// The server a connection of `generation` went to answered as a replica: every
    /// connection to it is stale, and the master is looked up again (unless a newer
    /// generation began meanwhile: then it is the old master, already left behind).
    pub(crate) fn replica_seen(&self, generation: u64) {
        let mut known = self.known.lock();
        if known.generation == generation {
            known.trusted = false;
            self.next_generation(&mut known);
        }
    }

    /// Starts the thread that listens for `+switch-master` and `+promoted-slave` on one
    /// sentinel at a time, for as long as `sentinels` lives elsewhere. Best effort: without it, failovers are
    /// still followed when a connection fails or answers as a replica.
    pub(crate) fn watch(sentinels: &Arc<Sentinels>) {
        let weak = Arc::downgrade(sentinels);
        let _ = thread::Builder::new()
            .name("redguard-sentinel".into())
            .spawn(move || watch(&weak));
    }
}

/// The watcher thread: subscribe on a sentinel, learn each switch of our master, move to
/// the next sentinel when the connection fails; until the sentinels are dropped.
fn watch(weak: &Weak<Sentinels>) {
    let mut next = 0;
    let mut backoff = Duration::from_millis(50);
    loop {
        let Some(sentinels) = weak.upgrade() else {
            return;
        };
        let sentinel = sentinels.sentinels[next % sentinels.sentinels.len()].clone();
        let connected = sentinels.sentinel_connection(&sentinel);
        drop(sentinels); // never keep them alive while blocked
        if let Ok(con) = connected {
            let _ = listen(weak, con, &mut backoff);
        }
        next += 1;
        thread::sleep(backoff);
        backoff = (backoff * 2).min(WATCH_SLICE);
    }
}

/// Listens for switches on one sentinel's connection; returns when it fails, or when the
/// sentinels are gone.
fn listen(weak: &Weak<Sentinels>, mut con: Connection, backoff: &mut Duration) -> RedisResult<()> {
    con.set_read_timeout(Some(WATCH_SLICE))?;
    let mut pubsub = con.as_pubsub();
    pubsub.subscribe(&[SWITCH_MASTER, PROMOTED])?;
    *backoff = Duration::from_millis(50);
    // A switch may have happened while nobody listened.
    match weak.upgrade() {
        Some(sentinels) => drop(sentinels.lookup()),
        None => return Ok(()),
    }
    loop {
        match pubsub.get_message() {
            Ok(message) => {
                let Some(sentinels) = weak.upgrade() else {
                    return Ok(());
                };
                let payload: String = message.get_payload()?;
                if let Some((old, new)) =
                    new_master(message.get_channel_name(), &payload, &sentinels.name)
                {
                    sentinels.announced(&old, &new);
                }
            }
            // Quiet for a slice: a PING, whose answer must come within the next one (a
            // frozen sentinel, or one cut off, is left for the next).
            Err(e) if e.is_timeout() => {
                if weak.strong_count() == 0 {
                    return Ok(());
                }
                pubsub.ping::<redis::Value>()?;
            }
            Err(e) => return Err(e),
        }
    }
}

/// The master of `name` an announcement on `channel` says was replaced, and its new one,
/// if it does.
type Switch = ((String, u16), (String, u16));

fn new_master(channel: &str, payload: &str, name: &str) -> Option<Switch> {
    let fields: Vec<&str> = payload.split(' ').collect();
    let (master_name, old, new) = match (channel, &fields[..]) {
        (SWITCH_MASTER, [master_name, old_host, old_port, host, port]) => {
            (*master_name, (*old_host, *old_port), (*host, *port))
        }
        (PROMOTED, ["slave", _, host, port, "@", master_name, old_host, old_port]) => {
            (*master_name, (*old_host, *old_port), (*host, *port))
        }
        _ => return None,
    };
    let address = |(host, port): (&str, &str)| Some((host.to_string(), port.parse().ok()?));
    (master_name == name).then_some((address(old)?, address(new)?))
}

/// Whether a ROLE reply is a master's.
fn is_master(role: &redis::Value) -> bool {
    match role {
        redis::Value::Array(items) => matches!(
            items.first(),
            Some(redis::Value::BulkString(role)) if role == b"master"
        ),
        _ => false,
    }
}

fn not_known(name: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "no sentinel answered with the master's address",
        format!("master name {name:?}: check the name and that the sentinels are up"),
    ))
}

fn moved(name: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "the master changed while connecting to it (a failover)",
        format!("master name {name:?}"),
    ))
}

fn not_master(name: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "the server the sentinels named is not a master (a failover under way?)",
        format!("master name {name:?}"),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn announcements_of_a_new_master_are_read_for_our_name_only() {
        let old = ("10.0.0.1".to_string(), 6379);
        let ours = Some((old, ("10.0.0.2".to_string(), 6380)));
        let switch = "redguard 10.0.0.1 6379 10.0.0.2 6380";
        assert_eq!(new_master(SWITCH_MASTER, switch, "redguard"), ours);
        assert_eq!(new_master(SWITCH_MASTER, switch, "other"), None);
        let promoted = "slave 10.0.0.2:6380 10.0.0.2 6380 @ redguard 10.0.0.1 6379";
        assert_eq!(new_master(PROMOTED, promoted, "redguard"), ours);
        assert_eq!(new_master(PROMOTED, promoted, "other"), None);
        assert_eq!(new_master(PROMOTED, switch, "redguard"), None);
        assert_eq!(
            new_master(SWITCH_MASTER, "redguard 1 2 3 port", "redguard"),
            None
        );
    }

    /// Sentinels on a port where nothing listens: every lookup fails at once.
    fn nowhere() -> Sentinels {
        let timeout = Duration::from_millis(100);
        let bounds = Bounds {
            connect: timeout,
            io: timeout,
            checkout: timeout,
        };
        let client = Client::open("redis://127.0.0.1:1/").unwrap();
        Sentinels::new("m", vec![client], Box::new(Client::open), false, bounds)
    }

    #[test]
    fn the_master_never_moves_back_while_it_works_and_stale_connections_change_nothing() {
        let sentinels = nowhere();
        let (a, b) = (("a".to_string(), 1), ("b".to_string(), 2));
        assert_eq!(sentinels.learned(&a, Some(0)), (a.clone(), 1));
        assert_eq!(
            sentinels.learned(&a, Some(0)),
            (a.clone(), 1),
            "the same master"
        );
        // Announced: at least one epoch newer than what it replaced.
        sentinels.announced(&a, &b);
        assert_eq!(sentinels.generation(), 2);
        // A sentinel that has not heard of it yet is not believed.
        assert_eq!(sentinels.learned(&a, Some(0)), (b.clone(), 2));
        assert_eq!(sentinels.learned(&b, Some(1)), (b.clone(), 2));
        // A later failover back to a, told by a lookup.
        assert_eq!(sentinels.learned(&a, Some(2)), (a.clone(), 3));
        // Failures of connections of an older generation change nothing.
        sentinels.replica_seen(2);
        sentinels.failed(2);
        assert_eq!(sentinels.generation(), 3);
        assert!(sentinels.known.lock().trusted);
        // Once the master answered as a replica, the sentinels are believed, whatever the
        // epoch (set up afresh, they count from 0 again).
        sentinels.replica_seen(3);
        assert_eq!(sentinels.generation(), 4);
        assert!(!sentinels.known.lock().trusted);
        assert_eq!(sentinels.learned(&b, Some(0)), (b.clone(), 5));
        assert_eq!(sentinels.known.lock().epoch, 0);
    }

    #[test]
    fn an_announcement_of_another_switch_than_ours_is_not_followed() {
        // No sentinel listens: the lookup the stray announcement triggers fails.
        let sentinels = nowhere();
        let (a, b, c) = (
            ("a".to_string(), 1),
            ("b".to_string(), 2),
            ("c".to_string(), 3),
        );
        sentinels.learned(&c, Some(3));
        sentinels.announced(&a, &b); // late news of an older switch
        assert_eq!(sentinels.known.lock().master, Some(c.clone()));
        assert_eq!(sentinels.generation(), 1);
        sentinels.announced(&c, &a);
        assert_eq!(sentinels.known.lock().master, Some(a));
        assert_eq!(sentinels.generation(), 2);
    }
}
