//! Connecting to the master the sentinels name: to its trusted address or one just looked
//! up, checked to be the master (ROLE) and still the one of its generation.

use redis::{Connection, ConnectionAddr, RedisResult};

use super::known::Sentinels;

impl Sentinels {
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
