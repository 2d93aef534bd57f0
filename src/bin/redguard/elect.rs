//! `redguard elect`: campaign in an election, run the command while this candidate leads
//! (stopped as `run` stops it should the term be lost or not kept), and with `--requeue`
//! campaign again once it has ended.

use std::process::ExitCode;
use std::time::{Duration, Instant};

use clap::Args;

use crate::child::Program;
use crate::hold::{Want, acquire};
use crate::run::{HoldArgs, default_metadata};
use crate::supervise::{Supervised, Supervision, supervise};
use crate::{CANNOT_START, Connection, fail, failed, signals};

/// The shortest time between two campaigns of `--requeue`.
const REQUEUE_PACE: Duration = Duration::from_secs(1);

#[derive(Args)]
pub(crate) struct ElectArgs {
    #[command(flatten)]
    connection: Connection,
    /// What this candidate advertises while it leads, for `leader` to show (default:
    /// hostname:pid).
    #[arg(long, value_name = "V")]
    value: Option<String>,
    #[command(flatten)]
    hold: HoldArgs,
    /// Once the command has ended or been stopped, campaign again (for a new term), until
    /// a signal ends redguard.
    #[arg(long)]
    requeue: bool,
    /// The election.
    #[arg(value_name = "NAME")]
    name: String,
    #[command(flatten)]
    program: Program,
}

/// After `elect`'s options in `--help`: what the command is promised, and the exit
/// statuses.
pub(crate) const AFTER_HELP: &str = concat!(
    "\
Candidates wait in arrival order, in every process. While the command runs, this
candidate leads: its term is renewed, and the command gets its number as REDGUARD_TERM
(and REDGUARD_FENCE, the same number), larger than every term before it. Pass it to every
write that must not come from a stale leader. Should the renewals fail, or the term be
lost (the election's key deleted or taken over), the command is stopped as `redguard run`
stops it (see its --help): SIGTERM to its process group, SIGKILL after --kill-grace, or
before the term can run out; redguard then exits 75 (with --requeue, it campaigns
again). The term is resigned as soon as the command ends: the next candidate leads. The
command also gets REDGUARD_ELECTION (NAME) and REDGUARD_TTL_MS (--ttl).

With --requeue, redguard campaigns again once the command has ended or been stopped (a
new term, behind the candidates already waiting; at most one a second, should the
command end at once), until INT, TERM, HUP or QUIT ends it:
during the wait (128 + N), or passed on to the command (the command's status). A command
that cannot be started, a wait that runs out (-n, -w) or Redis unavailable during a wait
end it too.

Below, \"the lock\" is the term; \"not obtained\" is not leading in time.

",
    crate::exit_statuses!()
);

pub(crate) fn elect(args: ElectArgs) -> ExitCode {
    if let Err(code) = args.program.check() {
        return code;
    }
    if let Err(e) = signals::listen() {
        return fail(CANNOT_START, &format!("cannot handle signals: {e}"));
    }
    let locker = match args.connection.locker(args.hold.ttl) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    let election = match locker.election(&args.name) {
        Ok(election) => election,
        Err(e) => return failed(&e),
    };
    let value = args.value.clone().unwrap_or_else(default_metadata);
    let named = format!("election {:?}", args.name);
    let how = Supervision {
        named: &named,
        ttl: args.hold.ttl,
        kill_grace: args.hold.kill_grace,
        io_timeout: args.connection.io_timeout,
    };
    loop {
        let options = args.hold.options();
        let want = Want::Term(election.clone(), value.clone());
        let conflict = args.hold.conflict_exit_code;
        let campaigned = Instant::now();
        let hold = match acquire(&locker, want, options, args.hold.ttl, conflict, &named) {
            Ok(hold) => hold,
            Err(code) => return code,
        };
        let term = hold
            .fence()
            .map(|term| term.to_string())
            .unwrap_or_default();
        let env = [
            ("REDGUARD_ELECTION", args.name.clone()),
            ("REDGUARD_TERM", term.clone()),
            ("REDGUARD_FENCE", term),
            ("REDGUARD_TTL_MS", args.hold.ttl.as_millis().to_string()),
        ];
        match supervise(hold, &args.program, &env, &how) {
            Supervised::NotStarted(code) => return code,
            Supervised::Ran(code) if !args.requeue || signals::received().is_some() => {
                return code;
            }
            Supervised::Ran(_) => pace(campaigned),
        }
    }
}

/// With --requeue, at most one campaign every [`REQUEUE_PACE`]: a command that ends at
/// once (a bad configuration) is not run, nor a term minted, in a tight loop. A signal
/// ends the pause (the next wait then ends with it).
fn pace(campaigned: Instant) {
    let until = campaigned + REQUEUE_PACE;
    while Instant::now() < until && signals::received().is_none() {
        std::thread::sleep(Duration::from_millis(20));
    }
}
