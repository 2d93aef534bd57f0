//! `redguard leader`: who leads an election, and with `--watch` each change.

use std::io::{self, Write};
use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use redguard::Leader;
use signal_hook::consts::SIGPIPE;

use crate::status::quoted;
use crate::{Connection, fail, failed, signal_code};

#[derive(Args)]
pub(crate) struct LeaderArgs {
    #[command(flatten)]
    connection: Connection,
    /// Then a line for each change (a new leader, a new value, or nobody leading), until
    /// a signal ends it.
    #[arg(long)]
    watch: bool,
    /// One JSON object per line.
    #[arg(long)]
    json: bool,
    /// The election.
    #[arg(value_name = "NAME")]
    name: String,
}

/// After `leader`'s options in `--help`.
pub(crate) const AFTER_HELP: &str = "\
One line: `NAME: VALUE, term N, 12.3s left` (what the leader advertises, its term, and
what its lease had left by the server's clock), or `NAME: no leader`. With --json:
{\"election\":\"NAME\",\"value\":\"V\",\"term\":N,\"ttl_ms\":M} or
{\"election\":\"NAME\",\"leader\":null}. With --watch, the leader now, then a line for
each change as soon as it is seen (a resignation at once, an expiry at the lease's end);
changes in between two reads may be missed, but never an older leader shown after a newer.

Exit statuses:
  0    answered (with --watch, it runs until a signal ends it)
  64   usage error: bad arguments, or a key of the election that holds another Redis type
  69   Redis unavailable, or it refused (with --watch: at any read)";

pub(crate) fn leader(args: LeaderArgs) -> ExitCode {
    let locker = match args.connection.locker(Duration::from_secs(30)) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    let election = match locker.election(&args.name) {
        Ok(election) => election,
        Err(e) => return failed(&e),
    };
    if !args.watch {
        return match election.leader() {
            Ok(leader) => said(&line(&args.name, leader.as_ref(), args.json)),
            Err(e) => failed(&e),
        };
    }
    let observer = match election.observe() {
        Ok(observer) => observer,
        Err(e) => return failed(&e),
    };
    for change in observer {
        let code = match change {
            Ok(leader) => said(&line(&args.name, leader.as_ref(), args.json)),
            Err(e) => failed(&e),
        };
        if code != ExitCode::SUCCESS {
            return code;
        }
    }
    ExitCode::SUCCESS
}

/// Writes `line` to stdout (flushed at once, for a reader of each change): success, or
/// as after SIGPIPE when the reader has gone.
fn said(line: &str) -> ExitCode {
    let mut stdout = io::stdout().lock();
    match writeln!(stdout, "{line}").and_then(|()| stdout.flush()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) if e.kind() == io::ErrorKind::BrokenPipe => signal_code(SIGPIPE),
        Err(e) => fail(1, &format!("cannot write: {e}")),
    }
}

/// Who leads `name`, as text or JSON.
fn line(name: &str, leader: Option<&Leader>, json: bool) -> String {
    match (leader, json) {
        (None, false) => format!("{name}: no leader"),
        (None, true) => format!(r#"{{"election":{},"leader":null}}"#, quoted(name)),
        (Some(leader), false) => {
            let ttl = match leader.ttl() {
                Duration::MAX => "no ttl".into(),
                ttl => format!("{:.1}s left", ttl.as_secs_f64()),
            };
            format!("{name}: {}, term {}, {ttl}", leader.value(), leader.term())
        }
        (Some(leader), true) => {
            let ttl = match leader.ttl() {
                Duration::MAX => "null".into(),
                ttl => ttl.as_millis().to_string(),
            };
            format!(
                r#"{{"election":{},"value":{},"term":{},"ttl_ms":{ttl}}}"#,
                quoted(name),
                quoted(leader.value()),
                leader.term()
            )
        }
    }
}
