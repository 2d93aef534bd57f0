//! What `status` asks Redis behind the locker, which has no call for it: the keys under
//! the prefix (SCAN, bounded in count and time) and a semaphore's limit. On one server,
//! the master the sentinels name, or each server of a quorum; not on a cluster.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use redis::Value;

use crate::Connection;

/// At most this many keys are listed.
pub(crate) const MAX_LISTED: usize = 1000;
/// How many keys each SCAN call looks at.
const SCAN_COUNT: usize = 200;

/// Plain connections to the servers the locks are on.
pub(crate) struct Raw {
    servers: Vec<redis::Connection>,
    bound: Duration,
}

/// The keys `list` found, and whether the listing was cut short (the count or the time).
pub(crate) struct Listed {
    pub(crate) keys: Vec<String>,
    pub(crate) cut: bool,
}

impl Raw {
    /// Connections to the servers `connection` names (the sentinels asked for the
    /// master); `Err` says why when none can be had, or on a cluster.
    pub(crate) fn open(connection: &Connection) -> Result<Raw, String> {
        let bound = connection.io_timeout;
        let urls = match &connection.master {
            Some(master) => vec![master_url(&connection.sentinels, master, bound)?],
            None if connection.cluster => {
                return Err("not on a cluster: give the keys".into());
            }
            None => connection.urls(),
        };
        let mut servers = Vec::new();
        let mut errors = Vec::new();
        for url in &urls {
            match connect(url, bound) {
                Ok(con) => servers.push(con),
                Err(e) => errors.push(format!("{url}: {e}")),
            }
        }
        if servers.is_empty() {
            return Err(errors.join("; "));
        }
        Ok(Raw { servers, bound })
    }

    /// The keys that start with `prefix` (the prefix taken off), sorted, from every
    /// server that answers; at most [`MAX_LISTED`], and within a few I/O timeouts.
    pub(crate) fn list(&mut self, prefix: &str) -> Listed {
        let pattern = format!("{}*", glob_escaped(prefix));
        let deadline = Instant::now() + self.bound * 3;
        let mut keys = BTreeSet::new();
        let mut cut = false;
        'servers: for con in &mut self.servers {
            let mut cursor: u64 = 0;
            loop {
                if keys.len() >= MAX_LISTED || Instant::now() >= deadline {
                    cut = true;
                    break 'servers;
                }
                let reply: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
                    .arg(cursor)
                    .arg("MATCH")
                    .arg(&pattern)
                    .arg("COUNT")
                    .arg(SCAN_COUNT)
                    .query(con);
                let Ok((next, found)) = reply else {
                    cut = true;
                    continue 'servers;
                };
                for key in found {
                    if let Some(name) = key.strip_prefix(prefix) {
                        keys.insert(name.to_owned());
                    }
                }
                if next == 0 {
                    break;
                }
                cursor = next;
            }
        }
        let mut keys: Vec<String> = keys.into_iter().collect();
        cut |= keys.len() > MAX_LISTED;
        keys.truncate(MAX_LISTED);
        Listed { keys, cut }
    }

    /// The limit the holders of semaphore `key` (with its prefix) use, from the first
    /// server that says.
    pub(crate) fn limit(&mut self, key: &str) -> Option<u32> {
        self.servers.iter_mut().find_map(|con| {
            // The member '' is scored by minus the limit (lua/queue/acquire.lua).
            let score: Option<f64> = redis::cmd("ZSCORE").arg(key).arg("").query(con).ok()?;
            let limit = -score?;
            (limit >= 1.0 && limit <= f64::from(u32::MAX)).then_some(limit as u32)
        })
    }
}

/// A plain connection to `url`, every wait bounded by `bound`.
fn connect(url: &str, bound: Duration) -> redis::RedisResult<redis::Connection> {
    let con = redis::Client::open(url)?.get_connection_with_timeout(bound)?;
    con.set_read_timeout(Some(bound))?;
    con.set_write_timeout(Some(bound))?;
    Ok(con)
}

/// The master's URL, from the first sentinel that names it.
fn master_url(sentinels: &[String], master: &str, bound: Duration) -> Result<String, String> {
    let mut errors = Vec::new();
    for sentinel in sentinels {
        let tls = sentinel.starts_with("rediss://");
        let asked = connect(sentinel, bound).and_then(|mut con| {
            redis::cmd("SENTINEL")
                .arg("get-master-addr-by-name")
                .arg(master)
                .query::<Value>(&mut con)
        });
        match asked {
            Ok(Value::Array(address)) => match address.as_slice() {
                [host, port] => {
                    let host: String = redis::from_redis_value_ref(host).unwrap_or_default();
                    let port: String = redis::from_redis_value_ref(port).unwrap_or_default();
                    let scheme = if tls { "rediss" } else { "redis" };
                    return Ok(format!("{scheme}://{host}:{port}/"));
                }
                _ => errors.push(format!("{sentinel}: no address for {master:?}")),
            },
            Ok(_) => errors.push(format!("{sentinel}: knows no master {master:?}")),
            Err(e) => errors.push(format!("{sentinel}: {e}")),
        }
    }
    Err(errors.join("; "))
}

/// `text` with SCAN's glob characters escaped.
fn glob_escaped(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::glob_escaped;

    #[test]
    fn glob_characters_in_a_prefix_are_escaped() {
        assert_eq!(glob_escaped("locks:"), "locks:");
        assert_eq!(glob_escaped("a*b?[c]\\"), "a\\*b\\?\\[c\\]\\\\");
    }
}
