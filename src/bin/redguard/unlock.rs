//! `redguard unlock --force KEY…`: break-glass, for an operator; each key's lock removed
//! whoever holds it (see `Locker::force_release`), and what was removed said.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use redguard::{Error, Holder, Locker};

use crate::status::described;
use crate::{Connection, USAGE, fail, failed};

#[derive(Args)]
pub(crate) struct UnlockArgs {
    #[command(flatten)]
    connection: Connection,
    /// Remove the locks whoever holds them, also a holder that still runs (required:
    /// without it nothing is done).
    #[arg(long)]
    force: bool,
    /// The keys whose locks (or read locks: all their readers) to remove.
    #[arg(value_name = "KEY", required = true)]
    keys: Vec<String>,
}

/// After `unlock`'s options in `--help`.
pub(crate) const AFTER_HELP: &str = "\
Removes each KEY's lock, or every reader of its read lock, whoever holds it, and gives the
key to the first waiter in its queue as a release does. Fencing counters are kept: the
next holder's token is higher than the removed one's. The holder is not told: if it still
runs, it believes it holds the lock until its next refresh (at a third of its TTL) finds it
gone, and meanwhile only a resource that checks fencing tokens refuses it. Use it on a
holder known to be dead (with a long TTL), or stuck and stopped. One line per key: the
holders removed (as `status` shows them, read just before), or `nothing held`. A
semaphore's permits are never removed.

Exit statuses:
  0    every KEY was answered (its holders removed, or nothing held)
  64   usage error: bad arguments, no --force, or a KEY that holds another Redis type or
       is a semaphore (left alone; the other keys are done)
  69   Redis unavailable, or it refused";

pub(crate) fn unlock(args: UnlockArgs) -> ExitCode {
    if !args.force {
        return fail(
            USAGE,
            "unlock removes locks whoever holds them, also ones whose holder still runs and \
             believes it holds them (only fencing tokens protect a resource then): give \
             --force to do it; nothing was removed",
        );
    }
    let locker = match args.connection.locker(Duration::from_secs(30)) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    let mut left_alone = false;
    for key in &args.keys {
        match unlock_key(&locker, key) {
            Ok(Some(line)) => println!("{line}"),
            Ok(None) => {
                left_alone = true;
            }
            Err(e) => return failed(&e),
        }
    }
    match left_alone {
        true => ExitCode::from(USAGE),
        false => ExitCode::SUCCESS,
    }
}

/// Removes `key`'s holders and says so: `None` (said on stdout and stderr) when the key
/// is not a lock's, and was left alone.
fn unlock_key(locker: &Locker, key: &str) -> Result<Option<String>, Error> {
    let left_alone = |what: &str| {
        println!("{key}: {what}, left alone");
        eprintln!("redguard: {key} is {what}: unlock removes only locks and read locks");
        Ok(None)
    };
    // Who holds it, for the record: read just before (a holder may come or go between).
    let holders: Vec<Holder> = match locker.holders(key) {
        Ok(holders) => holders.into_iter().filter(|h| !h.waiting()).collect(),
        Err(Error::WrongType { kind, .. }) => return left_alone(&format!("not a lock ({kind})")),
        Err(e) => return Err(e),
    };
    let removed = match locker.force_release(&[key]) {
        Ok(removed) => removed,
        Err(Error::WrongType { kind, .. }) => return left_alone(&format!("not a lock ({kind})")),
        // One key, checked by `holders`: only a semaphore's is refused.
        Err(Error::InvalidInput(_)) => return left_alone("a semaphore"),
        Err(e) => return Err(e),
    };
    Ok(Some(said(key, &holders, removed)))
}

/// The line for `key`: what was removed (`holders`, as read before), or nothing held.
fn said(key: &str, holders: &[Holder], removed: bool) -> String {
    match (removed, holders.first()) {
        (true, Some(first)) => {
            let state = if first.shared() {
                "shared"
            } else {
                "exclusive"
            };
            let mut line = format!("{key}: removed {state}");
            for holder in holders {
                line += &format!("; {}", described(holder));
            }
            line
        }
        (true, None) => {
            format!("{key}: removed a hold taken after the look (its holder not known)")
        }
        (false, Some(_)) => format!("{key}: nothing held (its holder gave it up meanwhile)"),
        (false, None) => format!("{key}: nothing held"),
    }
}
