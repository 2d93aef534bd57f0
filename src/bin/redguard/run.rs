//! `redguard run`: hold the keys, run the command, pass signals on, stop it if the lock
//! is lost, give the keys back as soon as it ends.

use std::io;
use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitCode, ExitStatus};
use std::time::Duration;

use clap::Args;
use redguard::{LockOptions, Locker};

use crate::hold::{GaveBack, Hold, Want, acquire, give_back};
use crate::watch::{Ended, Plan, early_grace, watch};
use crate::watchdog::Watchdog;
use crate::{
    CANNOT_START, Connection, LOST, NOT_RELEASED, USAGE, fail, failed, signal_code, signals,
};

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    connection: Connection,
    /// How long the lock lives without a refresh; it is refreshed while the command runs
    /// (30s, 500ms, 2m, or seconds).
    #[arg(long, default_value = "30s", value_parser = duration)]
    ttl: Duration,
    /// Wait at most this long for the lock, in seconds (fractions allowed); default: as
    /// long as it takes.
    #[arg(short = 'w', long = "wait", value_name = "SECONDS", value_parser = seconds)]
    wait: Option<Duration>,
    /// Do not wait: the same as -w 0.
    #[arg(short = 'n', long = "no-wait", conflicts_with = "wait")]
    no_wait: bool,
    /// The exit status when the lock was not obtained.
    #[arg(short = 'E', long = "conflict-exit-code", default_value_t = 1)]
    conflict_exit_code: u8,
    /// A read lock: shared with other --shared runs, excluded by plain ones.
    #[arg(long, conflicts_with = "permits")]
    shared: bool,
    /// KEY is a semaphore of N permits: at most N runs hold it at once.
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Take fencing tokens; the first key's is given to the command as REDGUARD_FENCE.
    #[arg(long)]
    fencing: bool,
    /// Stored with the lock, for `status` to show (default: hostname:pid).
    #[arg(long)]
    metadata: Option<String>,
    /// How long after SIGTERM the command's group gets SIGKILL, when the lock is lost or
    /// cannot be kept (cut to a third of --ttl for a stop before the lock can expire).
    #[arg(long = "kill-grace", default_value = "5s", value_parser = duration)]
    kill_grace: Duration,
    /// Run this through $SHELL -c (else /bin/sh -c), instead of a COMMAND after --.
    #[arg(short = 'c', value_name = "SHELL_COMMAND")]
    shell: Option<String>,
    /// The keys to hold, all or none.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
    /// The command to run, and its arguments (after --).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

/// After `run`'s options in `--help`: what the command is promised, and the exit statuses.
pub(crate) const AFTER_HELP: &str = concat!(
    "\
While the command runs its lock is refreshed. Should the refreshes fail (Redis down or
unreachable), the command is stopped before the lock can expire: SIGTERM to its process
group once the lock has --kill-grace of validity left (by this host's clock), SIGKILL to
the group 0.1 s before the validity runs out. The grace is cut to a third of --ttl when
longer (the lock is refreshed with two thirds left). A lock taken away at once (its keys
deleted or overwritten) is found at the next refresh: the command then gets SIGTERM and,
after --kill-grace, SIGKILL, while another holder may already run. Neither can rule out an
overlap (a write already sent, this host's clock or process stalled): the fencing token the
command gets with --fencing (REDGUARD_FENCE) is what makes one harmless, if the resource
refuses tokens older than the newest it has seen.

The wait is one wait with the whole -w deadline; INT, TERM, HUP or QUIT ends it at once
(128 + N). A run ended so while it waited leaves its place in the queue, which holds later
waiters back, to expire: within about 2 s.

Ctrl-Z (SIGTSTP) stops the command's group, then redguard; once continued, the group goes
on only if the lock is still valid (else SIGKILL, exit 75). Should redguard be killed
(SIGKILL, the OOM killer), the command's group gets SIGKILL (from a watchdog shell).

",
    crate::exit_statuses!()
);

pub(crate) fn run(args: RunArgs) -> ExitCode {
    if args.shell.is_some() != args.command.is_empty() {
        return fail(
            USAGE,
            "give either a COMMAND after --, or -c 'shell command'",
        );
    }
    if args.permits.is_some() && args.keys.len() != 1 {
        return fail(USAGE, "--permits takes exactly one KEY: the semaphore");
    }
    if let Err(e) = signals::listen() {
        return fail(CANNOT_START, &format!("cannot handle signals: {e}"));
    }
    let locker = match args.connection.locker(args.ttl) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    let named = format!("{:?}", args.keys);
    let hold = match want(&locker, &args).and_then(|(want, options)| {
        acquire(
            &locker,
            want,
            options,
            args.ttl,
            args.conflict_exit_code,
            &named,
        )
    }) {
        Ok(hold) => hold,
        Err(code) => return code,
    };
    if let Some(signal) = signals::received() {
        // While the lock was being taken.
        let _ = give_back(hold, args.connection.io_timeout);
        return signal_code(signal);
    }
    let mut child = match spawn(&args, &hold) {
        Ok(child) => child,
        Err(e) => {
            let _ = give_back(hold, args.connection.io_timeout);
            let program = match &args.shell {
                Some(_) => shell(),
                None => args.command[0].clone(),
            };
            return fail(CANNOT_START, &format!("cannot start {program:?}: {e}"));
        }
    };
    signals::set_group(child.id());
    // Stopped once the command has ended, before the lock is given back.
    let watchdog = Watchdog::start(child.id())
        .map_err(|e| {
            eprintln!(
                "redguard: no watchdog ({e}): should redguard be killed, only the command's \
                 first process is"
            );
        })
        .ok();
    let early = early_grace(args.kill_grace, args.ttl);
    if early < args.kill_grace {
        eprintln!(
            "redguard: --kill-grace {:?} cut to {early:.1?} (a third of --ttl) for a stop \
             before the lock can expire",
            args.kill_grace
        );
    }
    let plan = Plan {
        named: &named,
        early,
        kill_grace: args.kill_grace,
    };
    let ended = watch(&mut child, &hold, &plan);
    // The command reaped: its group's number may soon be another's.
    drop(watchdog);
    signals::forget_group();
    finish(ended, hold, &named, args.connection.io_timeout)
}

/// The exit status once the command has ended: the lock given back (within the I/O
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

/// What to take, and how.
fn want(locker: &Locker, args: &RunArgs) -> Result<(Want, LockOptions), ExitCode> {
    let metadata = args.metadata.clone().unwrap_or_else(default_metadata);
    let mut options = LockOptions::default()
        .ttl(args.ttl)
        .metadata(metadata)
        .fencing(args.fencing);
    // One wait, with the whole deadline (none: as long as it takes).
    if args.no_wait {
        options = options.timeout(Duration::ZERO);
    } else if let Some(wait) = args.wait {
        options = options.timeout(wait);
    }
    let want = match args.permits {
        Some(permits) => Want::Permit(
            locker
                .semaphore(&args.keys[0], permits)
                .map_err(|e| failed(&e))?,
        ),
        None if args.shared => Want::Read(args.keys.clone()),
        None => Want::Lock(args.keys.clone()),
    };
    Ok((want, options))
}

/// $SHELL, else /bin/sh.
fn shell() -> String {
    std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())
}

/// Starts the command in a process group of its own, with what it should know. Called on
/// the main thread, which lives as long as `redguard`: the parent-death signal is tied to
/// the thread that started the child.
fn spawn(args: &RunArgs, hold: &Hold) -> io::Result<Child> {
    let mut command = match &args.shell {
        Some(line) => {
            let mut command = std::process::Command::new(shell());
            command.arg("-c").arg(line);
            command
        }
        None => {
            let mut command = std::process::Command::new(&args.command[0]);
            command.args(&args.command[1..]);
            command
        }
    };
    command
        .process_group(0)
        .env("REDGUARD_KEYS", args.keys.join(" "))
        .env("REDGUARD_TTL_MS", args.ttl.as_millis().to_string());
    if let Some(fence) = hold.fence() {
        command.env("REDGUARD_FENCE", fence.to_string());
    }
    in_the_child(&mut command);
    command.spawn()
}

/// Between fork and exec: the child gets the signal mask `redguard` started with (it
/// blocks the signals it handles in all threads but one), and is killed (SIGKILL) when
/// `redguard` dies, even by SIGKILL: it must not run on without the lock.
fn in_the_child(command: &mut std::process::Command) {
    let mask = signals::started_with();
    // SAFETY: getpid takes nothing and cannot fail.
    let parent = unsafe { libc::getpid() };
    // SAFETY: the closure runs in the child between fork and exec, and calls only
    // async-signal-safe functions (sigprocmask, prctl, getppid, _exit) on values copied
    // in, allocating nothing.
    unsafe {
        command.pre_exec(move || {
            if let Some(mask) = &mask
                && libc::sigprocmask(libc::SIG_SETMASK, mask, std::ptr::null_mut()) != 0
            {
                return Err(io::Error::last_os_error());
            }
            die_with(parent)
        });
    }
}

/// SIGKILL to this process when `parent` (the thread that forked it) ends.
#[cfg(target_os = "linux")]
fn die_with(parent: libc::pid_t) -> io::Result<()> {
    // SAFETY: prctl with these integer arguments and getppid touch no memory; _exit ends
    // the child at once. All async-signal-safe.
    unsafe {
        if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0) != 0 {
            return Err(io::Error::last_os_error());
        }
        // Should `redguard` have died before the prctl, nothing would be sent.
        if libc::getppid() != parent {
            libc::_exit(CANNOT_START.into());
        }
    }
    Ok(())
}

#[cfg(not(target_os = "linux"))]
fn die_with(_parent: libc::pid_t) -> io::Result<()> {
    Ok(())
}

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

/// `hostname:pid`, so that `status` says who holds it.
fn default_metadata() -> String {
    let host = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .unwrap_or_else(|| "unknown".into());
    format!("{}:{}", host.trim(), std::process::id())
}

/// `30s`, `500ms`, `2m`, or a number of seconds.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    let (number, unit) = match text {
        t if t.ends_with("ms") => (&t[..t.len() - 2], 0.001),
        t if t.ends_with('s') => (&t[..t.len() - 1], 1.0),
        t if t.ends_with('m') => (&t[..t.len() - 1], 60.0),
        t => (t, 1.0),
    };
    let value: f64 = number
        .parse()
        .map_err(|_| format!("{text:?} is not a duration (like 30s, 500ms, 2m)"))?;
    Duration::try_from_secs_f64(value * unit).map_err(|e| format!("{text:?}: {e}"))
}

/// A number of seconds, fractions allowed.
fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(value).map_err(|e| format!("{text:?}: {e}"))
}
