//! `redguard status`: who holds each key, for how long.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use redguard::{Error, Holder, Locker, MAX_LIMIT};

use crate::raw::{MAX_LISTED, Raw};
use crate::{Connection, UNAVAILABLE, USAGE, fail, failed};

#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    connection: Connection,
    /// One JSON object per key, a line each.
    #[arg(long)]
    json: bool,
    /// The keys to look at; none: every lock, read lock and semaphore held under
    /// --prefix (found by SCAN: at most 1000 keys, within three I/O timeouts; not on a
    /// cluster).
    #[arg(value_name = "KEY")]
    keys: Vec<String>,
}

/// The fencing counters' names (after the prefix): not locks of their own.
const FENCE_COUNTERS: &str = "redguard:fence:";

pub(crate) fn status(args: StatusArgs) -> ExitCode {
    let locker = match args.connection.locker(Duration::from_secs(30)) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    // Plain connections, for the listing and a semaphore's limit (none on a cluster):
    // opened when first needed.
    let mut raw: Option<Result<Raw, String>> = None;
    let listing = args.keys.is_empty();
    let keys = if listing {
        let listed = match opened(&mut raw, &args.connection) {
            Ok(raw) => raw.list(&args.connection.prefix),
            Err(why) if args.connection.cluster => {
                return fail(USAGE, &format!("status without a KEY: {why}"));
            }
            Err(why) => return fail(UNAVAILABLE, &format!("cannot list the keys: {why}")),
        };
        if listed.cut {
            eprintln!(
                "redguard: the listing was cut short (at most {MAX_LISTED} keys, within three \
                 I/O timeouts): give the keys for the others"
            );
        }
        listed.keys
    } else {
        args.keys.clone()
    };
    let prefix = &args.connection.prefix;
    for key in keys
        .iter()
        .filter(|key| !(listing && key.starts_with(FENCE_COUNTERS)))
    {
        let holders = match locker.holders(key) {
            Ok(holders) => holders,
            Err(Error::WrongType { .. }) if listing => continue, // not ours: not listed
            Err(Error::WrongType { kind, .. }) => {
                // Not a lock of ours: say so, and go on with the other keys.
                println!("{}", not_a_lock(key, &kind, args.json));
                continue;
            }
            Err(e) => return failed(&e),
        };
        if listing && holders.is_empty() {
            continue;
        }
        let semaphore = is_semaphore(&locker, key, &holders).then(|| Semaphore {
            limit: opened(&mut raw, &args.connection)
                .as_mut()
                .ok()
                .and_then(|raw| raw.limit(&format!("{prefix}{key}"))),
            in_use: holders.len(),
        });
        let line = if args.json {
            json(key, &holders, semaphore.as_ref())
        } else {
            text(key, &holders, semaphore.as_ref())
        };
        println!("{line}");
    }
    ExitCode::SUCCESS
}

/// The plain connections in `raw`, opened on the first call.
fn opened<'a>(
    raw: &'a mut Option<Result<Raw, String>>,
    connection: &Connection,
) -> &'a mut Result<Raw, String> {
    raw.get_or_insert_with(|| Raw::open(connection))
}

/// A semaphore's limit (when it could be read) and its permits in use.
struct Semaphore {
    limit: Option<u32>,
    in_use: usize,
}

/// Whether `key`'s shared holders hold permits of a semaphore (not a read lock): only
/// then can the library count them as one.
fn is_semaphore(locker: &Locker, key: &str, holders: &[Holder]) -> bool {
    holders.first().is_some_and(Holder::shared)
        && locker
            .semaphore(key, MAX_LIMIT)
            .and_then(|semaphore| semaphore.available())
            .is_ok()
}

fn not_a_lock(key: &str, kind: &str, json: bool) -> String {
    if json {
        format!(
            r#"{{"key":{},"state":"not a lock","type":{}}}"#,
            quoted(key),
            quoted(kind)
        )
    } else {
        format!("{key}: not a lock ({kind})")
    }
}

fn state(holders: &[Holder], semaphore: Option<&Semaphore>) -> &'static str {
    // A lock waiting for readers holds nothing: readers that just left can leave it alone.
    match holders.iter().find(|holder| !holder.waiting()) {
        None => "free",
        Some(_) if semaphore.is_some() => "semaphore",
        Some(holder) if holder.shared() => "shared",
        Some(_) => "exclusive",
    }
}

fn text(key: &str, holders: &[Holder], semaphore: Option<&Semaphore>) -> String {
    let mut line = format!("{key}: {}", state(holders, semaphore));
    if let Some(semaphore) = semaphore {
        let limit = semaphore
            .limit
            .map_or("a limit not known".into(), |limit| limit.to_string());
        line += &format!(", {} of {limit} permits in use", semaphore.in_use);
    }
    for holder in holders {
        line += &format!("; {}", described(holder));
    }
    line
}

/// One holder as `text` shows it (also `unlock`): its metadata, time left and fence.
pub(crate) fn described(holder: &Holder) -> String {
    let ttl = holder.ttl().map_or("no ttl".into(), |ttl| {
        format!("{:.1}s left", ttl.as_secs_f64())
    });
    // A lock waiting for the readers holds nothing yet: new readers wait behind it.
    let waiting = if holder.waiting() { "waiting: " } else { "" };
    let mut said = format!("{waiting}{:?} {ttl}", holder.metadata());
    if let Some(fence) = holder.fence() {
        said += &format!(", fence {fence}");
    }
    said
}

fn json(key: &str, holders: &[Holder], semaphore: Option<&Semaphore>) -> String {
    let list: Vec<String> = holders
        .iter()
        .map(|holder| {
            let ttl = holder
                .ttl()
                .map_or("null".into(), |ttl| ttl.as_millis().to_string());
            let fence = holder.fence().map_or("null".into(), |f| f.to_string());
            format!(
                r#"{{"metadata":{},"ttl_ms":{ttl},"fence":{fence},"waiting":{}}}"#,
                quoted(holder.metadata()),
                holder.waiting()
            )
        })
        .collect();
    let permits = semaphore.map_or(String::new(), |semaphore| {
        let limit = semaphore.limit.map_or("null".into(), |l| l.to_string());
        format!(r#","limit":{limit},"in_use":{}"#, semaphore.in_use)
    });
    format!(
        r#"{{"key":{},"state":"{}"{permits},"holders":[{}]}}"#,
        quoted(key),
        state(holders, semaphore),
        list.join(",")
    )
}

/// `text` as a JSON string.
pub(crate) fn quoted(text: &str) -> String {
    let mut out = String::from('"');
    for c in text.chars() {
        match c {
            '"' => out += "\\\"",
            '\\' => out += "\\\\",
            c if (c as u32) < 0x20 => out += &format!("\\u{:04x}", c as u32),
            c => out.push(c),
        }
    }
    out + "\""
}
