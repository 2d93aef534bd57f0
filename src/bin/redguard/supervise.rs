//! A command run under a hold (`run`'s locks, `elect`'s term): started in its own process
//! group with a watchdog, watched until it ends (stopped should the hold be lost or not
//! kept), and the hold given back; the exit status said.

use std::io;
use std::os::unix::process::ExitStatusExt;
use std::process::{ExitCode, ExitStatus};
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use crate::child::Program;
use crate::hold::{GaveBack, Hold, give_back};
use crate::watch::{Ended, Plan, early_grace, watch};
use crate::watchdog::Watchdog;
use crate::{CANNOT_START, LOST, NOT_RELEASED, fail, signal_code, signals};

/// How the command is watched, and the hold named and given back.
pub(crate) struct Supervision<'a> {
    /// What is held, to name it on stderr.
    pub(crate) named: &'a str,
    /// The hold's TTL: refreshes failing, SIGTERM when it has `kill_grace` left, at most
    /// a third of this (see `watch::early_grace`).
    pub(crate) ttl: Duration,
    /// After a loss found at once: SIGTERM, SIGKILL after this.
    pub(crate) kill_grace: Duration,
    /// The bound on a release's answer.
    pub(crate) io_timeout: Duration,
}

/// What came of [`supervise`].
pub(crate) enum Supervised {
    /// The command ran: the exit status.
    Ran(ExitCode),
    /// It was not started (a signal came first, or it could not be): the exit status.
    NotStarted(ExitCode),
}

/// The grace before an early stop (`watch::early_grace`), said on stderr when cut (once:
/// `elect --requeue` runs its command again and again).
fn early(kill_grace: Duration, ttl: Duration) -> Duration {
    static SAID: AtomicBool = AtomicBool::new(false);
    let early = early_grace(kill_grace, ttl);
    if early < kill_grace && !SAID.swap(true, Ordering::Relaxed) {
        eprintln!(
            "redguard: --kill-grace {kill_grace:?} cut to {early:.1?} (a third of --ttl) for a \
             stop before the lock can expire"
        );
    }
    early
}

/// Runs `program` (with `env` added) under `hold` until it ends, then gives `hold` back.
pub(crate) fn supervise(
    hold: Hold,
    program: &Program,
    env: &[(&str, String)],
    how: &Supervision,
) -> Supervised {
    if let Some(signal) = signals::received() {
        // While the hold was being taken.
        let _ = give_back(hold, how.io_timeout);
        return Supervised::NotStarted(signal_code(signal));
    }
    let mut child = match program.spawn(env) {
        Ok(child) => child,
        Err(e) => {
            let _ = give_back(hold, how.io_timeout);
            let program = program.name();
            return Supervised::NotStarted(fail(
                CANNOT_START,
                &format!("cannot start {program:?}: {e}"),
            ));
        }
    };
    signals::set_group(child.id());
    // Stopped once the command has ended, before the hold is given back.
    let watchdog = Watchdog::start(child.id())
        .map_err(|e| {
            eprintln!(
                "redguard: no watchdog ({e}): should redguard be killed, only the command's \
                 first process is"
            );
        })
        .ok();
    let plan = Plan {
        named: how.named,
        early: early(how.kill_grace, how.ttl),
        kill_grace: how.kill_grace,
    };
    let ended = watch(&mut child, &hold, &plan);
    // The command reaped: its group's number may soon be another's.
    drop(watchdog);
    signals::forget_group();
    Supervised::Ran(finish(ended, hold, how.named, how.io_timeout))
}

/// The exit status once the command has ended: the hold given back (within the I/O
/// timeout, and a little), and any loss said on stderr.
fn finish(ended: io::Result<Ended>, hold: Hold, named: &str, io_timeout: Duration) -> ExitCode {
    let status = match ended {
        Ok(Ended::Exited(status)) => status,
        Ok(Ended::Stopped) => {
            let _ = give_back(hold, LOST_RELEASE);
            return ExitCode::from(LOST);
        }
        Err(e) => {
            let _ = give_back(hold, io_timeout);
            return fail(CANNOT_START, &format!("cannot wait for the command: {e}"));
        }
    };
    if hold.is_lost() {
        let _ = give_back(hold, LOST_RELEASE);
        return fail(
            LOST,
            &format!("the lock on {named} was lost while the command ran (it ended by itself)"),
        );
    }
    match give_back(hold, io_timeout + RELEASE_MARGIN) {
        GaveBack::Done => exit_code(status),
        GaveBack::Lost => fail(
            LOST,
            &format!(
                "the lock on {named} was found lost when given back: the command ({}) may \
                 have run beside another holder",
                described(status)
            ),
        ),
        GaveBack::Failed(e) => fail(
            NOT_RELEASED,
            &format!(
                "the command ended ({}), but the lock on {named} could not be given back \
                 ({e}): it expires with its TTL",
                described(status)
            ),
        ),
        GaveBack::NoAnswer => fail(
            NOT_RELEASED,
            &format!(
                "the command ended ({}), but Redis did not answer the release of {named} \
                 within {io_timeout:?}: the lock expires with its TTL",
                described(status)
            ),
        ),
    }
}

/// How long a lost hold's release is waited for: it only tidies up.
const LOST_RELEASE: Duration = Duration::from_millis(100);
/// Beyond the I/O timeout, for a release to come back.
const RELEASE_MARGIN: Duration = Duration::from_millis(250);

/// The command's status: its exit code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(signal)) => signal_code(signal),
        (None, None) => ExitCode::from(1),
    }
}

/// The command's status in words, for stderr.
fn described(status: ExitStatus) -> String {
    match (status.code(), status.signal()) {
        (Some(code), _) => format!("exit status {code}"),
        (None, Some(signal)) => format!("killed by signal {signal}"),
        (None, None) => "status unknown".into(),
    }
}
