//! Asking the sentinels where the master is: every sentinel at once, each bounded by the
//! connect and I/O timeouts, and the newest configuration believed.

use std::thread;

use redis::{Client, Connection, RedisResult};

use super::known::Sentinels;

/// What one sentinel says of the master.
struct Answer {
    master: (String, u16),
    /// The epoch of the configuration it names the master by.
    epoch: u64,
}

impl Sentinels {
    /// Asks every sentinel at once (each bounded by the connect and I/O timeouts) for the
    /// master's address and the epoch of that configuration, and learns the newest answer:
    /// one sentinel that lags, or is cut off from the servers, must not keep the locker on
    /// the old master. The master to use, and its generation.
    pub(super) fn lookup(&self) -> RedisResult<((String, u16), u64)> {
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

    pub(super) fn sentinel_connection(&self, sentinel: &Client) -> RedisResult<Connection> {
        let con = sentinel.get_connection_with_timeout(self.bounds.connect)?;
        con.set_read_timeout(Some(self.bounds.io))?;
        con.set_write_timeout(Some(self.bounds.io))?;
        Ok(con)
    }
}

fn not_known(name: &str) -> redis::RedisError {
    redis::RedisError::from((
        redis::ErrorKind::Io,
        "no sentinel answered with the master's address",
        format!("master name {name:?}: check the name and that the sentinels are up"),
    ))
}
