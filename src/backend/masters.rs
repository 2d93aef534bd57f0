//! Which master serves each hash slot, as a cluster last said (`CLUSTER SLOTS`): so that
//! a request over several slots (a refresh round, a release, a TTL query) skips a master's
//! other slots once one of them timed out, and asks the masters that failed last time
//! after the others.

use std::time::{Duration, Instant};

use redis::Value;

/// How old the map may get before a refresh round asks again.
pub(crate) const STALE: Duration = Duration::from_secs(10);

#[derive(Default)]
pub(crate) struct Masters {
    /// First slot, last slot, master (its node id, else `host:port`: a cluster may
    /// announce no usable host, `?`, for several masters).
    ranges: Vec<(u16, u16, String)>,
    fetched: Option<Instant>,
}

impl Masters {
    /// The map from a `CLUSTER SLOTS` reply; empty when the reply has another shape.
    pub(crate) fn parse(reply: &Value) -> Masters {
        let mut ranges = Vec::new();
        if let Value::Array(entries) = reply {
            for entry in entries {
                if let Value::Array(fields) = entry
                    && let [
                        Value::Int(first),
                        Value::Int(last),
                        Value::Array(master),
                        ..,
                    ] = fields.as_slice()
                    && let (Ok(first), Ok(last)) = (u16::try_from(*first), u16::try_from(*last))
                {
                    let name = match master.as_slice() {
                        [_, _, Value::BulkString(id), ..] => String::from_utf8_lossy(id).into(),
                        [Value::BulkString(host), Value::Int(port), ..] => {
                            format!("{}:{port}", String::from_utf8_lossy(host))
                        }
                        _ => continue,
                    };
                    ranges.push((first, last, name));
                }
            }
        }
        Masters {
            ranges,
            fetched: Some(Instant::now()),
        }
    }

    /// Whether a round should ask for the map again.
    pub(crate) fn is_stale(&self) -> bool {
        self.fetched.is_none_or(|at| at.elapsed() >= STALE)
    }

    /// Marks the map as just asked for, when asking failed: try again after [`STALE`].
    pub(crate) fn touched(&mut self) {
        self.fetched = Some(Instant::now());
    }

    /// The master of `slot`, if the map knows it.
    pub(crate) fn of(&self, slot: u16) -> Option<&str> {
        self.ranges
            .iter()
            .find(|(first, last, _)| (*first..=*last).contains(&slot))
            .map(|(_, _, master)| master.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn node(host: &str, port: i64, id: &str) -> Value {
        Value::Array(vec![
            Value::BulkString(host.as_bytes().to_vec()),
            Value::Int(port),
            Value::BulkString(id.as_bytes().to_vec()),
        ])
    }

    #[test]
    fn slots_map_to_their_master() {
        let reply = Value::Array(vec![
            Value::Array(vec![Value::Int(0), Value::Int(5460), node("?", 6379, "a")]),
            Value::Array(vec![
                Value::Int(5461),
                Value::Int(16383),
                node("?", 6379, "b"),
                node("?", 6379, "c"),
            ]),
            // An old server without ids: named by address.
            Value::Array(vec![
                Value::Int(20000),
                Value::Int(20001),
                Value::Array(vec![
                    Value::BulkString(b"10.0.0.1".to_vec()),
                    Value::Int(7000),
                ]),
            ]),
        ]);
        let masters = Masters::parse(&reply);
        assert_eq!(masters.of(0), Some("a"));
        assert_eq!(masters.of(5460), Some("a"));
        assert_eq!(
            masters.of(5461),
            Some("b"),
            "told apart by id, not by '?:6379'"
        );
        assert_eq!(masters.of(20000), Some("10.0.0.1:7000"));
        assert!(!masters.is_stale());
        assert!(Masters::default().is_stale());
        assert_eq!(Masters::parse(&Value::Nil).of(1), None);
    }
}
