//! `redguard status`: who holds each key, for how long.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use redguard::{Error, Holder};

use crate::{Connection, failed};

#[derive(Args)]
pub(crate) struct StatusArgs {
    #[command(flatten)]
    connection: Connection,
    /// One JSON object per key, a line each.
    #[arg(long)]
    json: bool,
    /// The keys to look at.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
}

pub(crate) fn status(args: StatusArgs) -> ExitCode {
    let locker = match args.connection.locker(Duration::from_secs(30)) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    for key in &args.keys {
        let holders = match locker.holders(key) {
            Ok(holders) => holders,
            Err(Error::WrongType { kind, .. }) => {
                // Not a lock of ours: say so, and go on with the other keys.
                println!("{}", not_a_lock(key, &kind, args.json));
                continue;
            }
            Err(e) => return failed(&e),
        };
        let line = if args.json {
            json(key, &holders)
        } else {
            text(key, &holders)
        };
        println!("{line}");
    }
    ExitCode::SUCCESS
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

fn state(holders: &[Holder]) -> &'static str {
    match holders.first() {
        None => "free",
        Some(holder) if holder.shared() => "shared",
        Some(_) => "exclusive",
    }
}

fn text(key: &str, holders: &[Holder]) -> String {
    let mut line = format!("{key}: {}", state(holders));
    for holder in holders {
        let ttl = holder.ttl().map_or("no ttl".into(), |ttl| {
            format!("{:.1}s left", ttl.as_secs_f64())
        });
        line += &format!("; {:?} {ttl}", holder.metadata());
        if let Some(fence) = holder.fence() {
            line += &format!(", fence {fence}");
        }
    }
    line
}

fn json(key: &str, holders: &[Holder]) -> String {
    let list: Vec<String> = holders
        .iter()
        .map(|holder| {
            let ttl = holder
                .ttl()
                .map_or("null".into(), |ttl| ttl.as_millis().to_string());
            let fence = holder.fence().map_or("null".into(), |f| f.to_string());
            format!(
                r#"{{"metadata":{},"ttl_ms":{ttl},"fence":{fence}}}"#,
                quoted(holder.metadata())
            )
        })
        .collect();
    format!(
        r#"{{"key":{},"state":"{}","holders":[{}]}}"#,
        quoted(key),
        state(holders),
        list.join(",")
    )
}

/// `text` as a JSON string.
fn quoted(text: &str) -> String {
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
