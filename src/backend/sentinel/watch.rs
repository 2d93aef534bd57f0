//! The failover watcher: a thread subscribed on one sentinel at a time to `+switch-master`
//! and `+promoted-slave`, which follows each switch of our master as it is announced.

use std::sync::{Arc, Weak};
use std::thread;
use std::time::Duration;

use redis::{Connection, RedisResult};

use super::known::Sentinels;

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

impl Sentinels {
    /// A sentinel announced that `new` replaced `old`. Followed at once when `old` is the
    /// master we have (or none yet); otherwise it is news of another switch than ours (a
    /// late one, or one we missed): the sentinels are asked instead.
    pub(super) fn announced(&self, old: &(String, u16), new: &(String, u16)) {
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
}
