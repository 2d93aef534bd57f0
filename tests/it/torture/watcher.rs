//! The queue watcher: reads the queue of `q:0` on the master every few milliseconds,
//! behind the workers' backs (not through the proxy), and records each waiter's
//! continuous presence in it with one ticket: what the queue's order check stands on.
//! It reads only from a server that says, in the same transaction, that it is the master;
//! in `settle`d deployments (Sentinel: an old master may serve stale reads until it is
//! told otherwise) it records nothing while a fault is in progress or settling.

use std::collections::HashMap;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use parking_lot::Mutex;

use super::checker::{Checker, Presence};
use crate::server::queue_of;

/// What a waiter's queue entry carries in its metadata, before its attempt's id.
pub const MARK: &str = "qid=";

/// Each waiter's presence so far: id -> (answered before, sent after, ticket).
type Present = HashMap<String, (Instant, Instant, f64)>;

/// Watches until `stop`; `master` is the URL of the master to read (it may change).
pub fn watch(
    checker: Arc<Mutex<Checker>>,
    master: Arc<Mutex<String>>,
    stop: Arc<AtomicBool>,
    settle: Option<Duration>,
) -> thread::JoinHandle<()> {
    thread::spawn(move || {
        let mut present = Present::new();
        while !stop.load(Ordering::Relaxed) {
            let url = master.lock().clone();
            // Returns on an error or a new master: what was present is then unknown.
            let _ = poll(&url, &checker, &master, &stop, settle, &mut present);
            end_all(&checker, &mut present);
            thread::sleep(Duration::from_millis(20));
        }
    })
}

fn poll(
    url: &str,
    checker: &Mutex<Checker>,
    master: &Mutex<String>,
    stop: &AtomicBool,
    settle: Option<Duration>,
    present: &mut Present,
) -> redis::RedisResult<()> {
    let queue = queue_of("q:0");
    let client = redis::Client::open(url)?;
    let mut con = client.get_connection_with_timeout(Duration::from_millis(200))?;
    con.set_read_timeout(Some(Duration::from_millis(200)))?;
    con.set_write_timeout(Some(Duration::from_millis(200)))?;
    while !stop.load(Ordering::Relaxed) && *master.lock() == url {
        let sent = Instant::now();
        let (role, entries): (Vec<redis::Value>, Vec<(String, f64)>) = redis::pipe()
            .atomic()
            .cmd("ROLE")
            .cmd("ZRANGE")
            .arg(&queue)
            .arg(0)
            .arg(-1)
            .arg("WITHSCORES")
            .query(&mut con)?;
        let answered = Instant::now();
        let is_master = matches!(role.first(), Some(redis::Value::BulkString(b)) if b == b"master");
        let calm = settle.is_none_or(|s| !checker.lock().unsettled(answered, s));
        checker.lock().queue_reads += 1;
        if !(is_master && calm) {
            end_all(checker, present);
        } else {
            let mut seen: HashMap<String, f64> = HashMap::new();
            for (member, ticket) in entries {
                if let Some(at) = member.find(MARK) {
                    seen.insert(member[at + MARK.len()..].to_string(), ticket);
                }
            }
            let gone: Vec<String> = present
                .iter()
                .filter(|(id, (_, _, ticket))| seen.get(*id) != Some(ticket))
                .map(|(id, _)| id.clone())
                .collect();
            for id in gone {
                end(checker, present, &id);
            }
            for (id, ticket) in seen {
                let presence = present.entry(id).or_insert((answered, sent, ticket));
                presence.1 = sent;
            }
        }
        thread::sleep(Duration::from_millis(3));
    }
    Ok(())
}

/// Records `id`'s presence as ended.
fn end(checker: &Mutex<Checker>, present: &mut Present, id: &str) {
    if let Some((first, last, _)) = present.remove(id)
        && first < last
    {
        let id = id.to_string();
        checker.lock().presences.push(Presence { id, first, last });
    }
}

fn end_all(checker: &Mutex<Checker>, present: &mut Present) {
    let ids: Vec<String> = present.keys().cloned().collect();
    for id in ids {
        end(checker, present, &id);
    }
}
