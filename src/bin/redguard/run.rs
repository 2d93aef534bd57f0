//! `redguard run`: hold the keys, run the command, pass signals on, stop it if the lock
//! is lost, give the keys back as soon as it ends.

use std::process::ExitCode;
use std::time::Duration;

use clap::Args;
use redguard::{LockOptions, Locker};

use crate::child::Program;
use crate::hold::{Want, acquire};
use crate::supervise::{Supervised, Supervision, supervise};
use crate::{CANNOT_START, Connection, USAGE, fail, failed, signals};

/// The options `run` and `elect` share: how long the hold (a lock, or a term) lives, how
/// long it is waited for, and how the command is stopped.
#[derive(Args)]
pub(crate) struct HoldArgs {
    /// How long the lock (or term) lives without a refresh; it is refreshed while the
    /// command runs (30s, 500ms, 2m, or seconds).
    #[arg(long, default_value = "30s", value_parser = duration)]
    pub(crate) ttl: Duration,
    /// Wait at most this long for it, in seconds (fractions allowed); default: as long as
    /// it takes.
    #[arg(short = 'w', long = "wait", value_name = "SECONDS", value_parser = seconds)]
    wait: Option<Duration>,
    /// Do not wait: the same as -w 0.
    #[arg(short = 'n', long = "no-wait", conflicts_with = "wait")]
    no_wait: bool,
    /// The exit status when it was not obtained in time.
    #[arg(short = 'E', long = "conflict-exit-code", default_value_t = 1)]
    pub(crate) conflict_exit_code: u8,
    /// How long after SIGTERM the command's group gets SIGKILL, when the hold is lost or
    /// cannot be kept (cut to a third of --ttl for a stop before it can expire).
    #[arg(long = "kill-grace", default_value = "5s", value_parser = duration)]
    pub(crate) kill_grace: Duration,
}

impl HoldArgs {
    /// Options with the TTL, and the wait -n and -w ask for: one wait, with the whole
    /// deadline (neither: as long as it takes).
    pub(crate) fn options(&self) -> LockOptions {
        let options = LockOptions::default().ttl(self.ttl);
        if self.no_wait {
            options.timeout(Duration::ZERO)
        } else if let Some(wait) = self.wait {
            options.timeout(wait)
        } else {
            options
        }
    }
}

#[derive(Args)]
pub(crate) struct RunArgs {
    #[command(flatten)]
    connection: Connection,
    #[command(flatten)]
    hold: HoldArgs,
    /// A read lock: shared with other --shared runs, excluded by plain ones.
    #[arg(long, conflicts_with = "permits")]
    shared: bool,
    /// KEY is a semaphore of N permits: at most N runs hold it at once.
    #[arg(long, value_name = "N")]
    permits: Option<u32>,
    /// Take fencing tokens; the first key's is given to the command as REDGUARD_FENCE.
    #[arg(long)]
    fencing: bool,
    /// Hold the lock at least this long from when it was taken, also when the command
    /// ends sooner (its TTL is then shortened to what is left): cron on several hosts runs
    /// the job once per period (e.g. -n --at-least 50s for a job every minute).
    #[arg(long = "at-least", value_name = "DURATION", value_parser = duration)]
    at_least: Option<Duration>,
    /// Hold the lock at most this long: then it is given up as if lost, and the command
    /// stopped as on a loss (exit 75), even if it is merely slow.
    #[arg(long = "max-hold", value_name = "DURATION", value_parser = duration)]
    max_hold: Option<Duration>,
    /// Stored with the lock, for `status` to show (default: hostname:pid).
    #[arg(long)]
    metadata: Option<String>,
    /// The keys to hold, all or none.
    #[arg(required = true, value_name = "KEY")]
    keys: Vec<String>,
    #[command(flatten)]
    program: Program,
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
    if let Err(code) = args.program.check() {
        return code;
    }
    if args.permits.is_some() && args.keys.len() != 1 {
        return fail(USAGE, "--permits takes exactly one KEY: the semaphore");
    }
    if let Err(e) = signals::listen() {
        return fail(CANNOT_START, &format!("cannot handle signals: {e}"));
    }
    let locker = match args.connection.locker(args.hold.ttl) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    let named = format!("{:?}", args.keys);
    let hold = match want(&locker, &args).and_then(|(want, options)| {
        acquire(
            &locker,
            want,
            options,
            args.hold.ttl,
            args.hold.conflict_exit_code,
            &named,
        )
    }) {
        Ok(hold) => hold,
        Err(code) => return code,
    };
    let mut env = vec![
        ("REDGUARD_KEYS", args.keys.join(" ")),
        ("REDGUARD_TTL_MS", args.hold.ttl.as_millis().to_string()),
    ];
    if let Some(fence) = hold.fence() {
        env.push(("REDGUARD_FENCE", fence.to_string()));
    }
    let how = Supervision {
        named: &named,
        // With --max-hold, no TTL is longer: the early stop's grace is cut to it.
        ttl: (args.max_hold).map_or(args.hold.ttl, |max_hold| args.hold.ttl.min(max_hold)),
        kill_grace: args.hold.kill_grace,
        io_timeout: args.connection.io_timeout,
    };
    match supervise(hold, &args.program, &env, &how) {
        Supervised::Ran(code) | Supervised::NotStarted(code) => code,
    }
}

/// What to take, and how.
fn want(locker: &Locker, args: &RunArgs) -> Result<(Want, LockOptions), ExitCode> {
    let metadata = args.metadata.clone().unwrap_or_else(default_metadata);
    let mut options = args.hold.options().metadata(metadata).fencing(args.fencing);
    if let Some(at_least) = args.at_least {
        options = options.hold_at_least(at_least);
    }
    if let Some(max_hold) = args.max_hold {
        options = options.max_hold(max_hold);
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

/// `hostname:pid`, so that `status` says who holds it.
pub(crate) fn default_metadata() -> String {
    let host = hostname().unwrap_or_else(|| "unknown".into());
    format!("{host}:{}", std::process::id())
}

/// This host's name, if it can be found.
pub(crate) fn hostname() -> Option<String> {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .ok()
        .or_else(|| std::env::var("HOSTNAME").ok())
        .map(|host| host.trim().to_owned())
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
pub(crate) fn seconds(text: &str) -> Result<Duration, String> {
    let value: f64 = text
        .parse()
        .map_err(|_| format!("{text:?} is not a number of seconds"))?;
    Duration::try_from_secs_f64(value).map_err(|e| format!("{text:?}: {e}"))
}
