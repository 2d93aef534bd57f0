//! `redguard run`: hold the keys, run the command, pass signals on, stop it if the lock
//! is lost, give the keys back as soon as it ends.

use std::os::unix::process::{CommandExt, ExitStatusExt};
use std::process::{Child, ExitCode, ExitStatus};
use std::sync::atomic::{AtomicI32, AtomicU32, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use clap::Args;
use redguard::{Error, LockGuard, LockOptions, Locker, Permit, ReadGuard};
use signal_hook::consts::{SIGHUP, SIGINT, SIGKILL, SIGQUIT, SIGTERM};

use crate::{CANNOT_START, Connection, LOST, USAGE, fail, failed};

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
    /// When the lock is lost: how long after SIGTERM the command's group gets SIGKILL.
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

/// The last of the signals this command passes on that it received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// The command's process group, once it runs (0: not yet).
static GROUP: AtomicU32 = AtomicU32::new(0);

/// A hold of any kind.
enum Hold {
    Lock(LockGuard),
    Read(ReadGuard),
    Permit(Permit),
}

impl Hold {
    fn is_lost(&self) -> bool {
        match self {
            Hold::Lock(g) => g.is_lost(),
            Hold::Read(g) => g.is_lost(),
            Hold::Permit(p) => p.is_lost(),
        }
    }

    fn fence(&self) -> Option<u64> {
        match self {
            Hold::Lock(g) => g.fence(),
            Hold::Read(g) => g.fence(),
            Hold::Permit(p) => p.fence(),
        }
    }
}

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
    if let Err(e) = listen_for_signals() {
        return fail(CANNOT_START, &format!("cannot handle signals: {e}"));
    }
    let locker = match args.connection.locker(args.ttl) {
        Ok(locker) => locker,
        Err(code) => return code,
    };
    let hold = match acquire(&locker, &args) {
        Ok(hold) => hold,
        Err(code) => return code,
    };
    if let Some(code) = signalled() {
        return code; // while the lock was being taken: it is given back on drop
    }
    let mut child = match spawn(&args, &hold) {
        Ok(child) => child,
        Err(e) => return fail(CANNOT_START, &format!("cannot start the command: {e}")),
    };
    GROUP.store(child.id(), Ordering::SeqCst);
    if RECEIVED.load(Ordering::SeqCst) != 0 {
        signal_group(RECEIVED.load(Ordering::SeqCst)); // came before the group was known
    }
    loop {
        match child.try_wait() {
            Ok(Some(status)) => {
                drop(hold); // given back as soon as the command ends
                return exit_code(status);
            }
            Ok(None) => {}
            Err(e) => return fail(CANNOT_START, &format!("cannot wait for the command: {e}")),
        }
        if hold.is_lost() {
            eprintln!(
                "redguard: the lock on {:?} was lost while the command ran: stopping it",
                args.keys
            );
            stop(&mut child, args.kill_grace);
            drop(hold);
            return ExitCode::from(LOST);
        }
        thread::sleep(Duration::from_millis(20));
    }
}

/// Takes the hold, waiting in slices so that a signal ends the wait.
fn acquire(locker: &Locker, args: &RunArgs) -> Result<Hold, ExitCode> {
    let metadata = args.metadata.clone().unwrap_or_else(default_metadata);
    let options = LockOptions::default()
        .ttl(args.ttl)
        .metadata(metadata)
        .fencing(args.fencing);
    let wait = if args.no_wait {
        Some(Duration::ZERO)
    } else {
        args.wait
    };
    let deadline = wait.map(|wait| Instant::now() + wait);
    let semaphore = match args.permits {
        Some(permits) => Some(
            locker
                .semaphore(&args.keys[0], permits)
                .map_err(|e| failed(&e))?,
        ),
        None => None,
    };
    loop {
        if let Some(code) = signalled() {
            return Err(code);
        }
        // Slices, so that a signal ends the wait within one (each slice is a wait of the
        // library's: a waiting lock's intent is taken back and recorded again between).
        let slice = Duration::from_secs(1);
        let left = deadline.map_or(slice, |at| at.saturating_duration_since(Instant::now()));
        let options = options.clone().timeout(left.min(slice));
        let taken = match &semaphore {
            Some(semaphore) => semaphore.acquire_with(options).map(Hold::Permit),
            None if args.shared => locker.read_with(&args.keys, options).map(Hold::Read),
            None => locker.lock_with(&args.keys, options).map(Hold::Lock),
        };
        match taken {
            Ok(hold) => return Ok(hold),
            Err(Error::NotObtained) if deadline.is_none_or(|at| Instant::now() < at) => {}
            Err(Error::NotObtained) => {
                eprintln!("redguard: {:?} held elsewhere", args.keys);
                return Err(ExitCode::from(args.conflict_exit_code));
            }
            Err(e) => return Err(failed(&e)),
        }
    }
}

/// Starts the command in a process group of its own, with what it should know.
fn spawn(args: &RunArgs, hold: &Hold) -> std::io::Result<Child> {
    let mut command = match &args.shell {
        Some(line) => {
            let shell = std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into());
            let mut command = std::process::Command::new(shell);
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
    command.spawn()
}

/// SIGTERM to the command's group; SIGKILL to what is left of the group after `grace`
/// (the whole group's grace: a shell dies at once, the worker it runs may need the time).
fn stop(child: &mut Child, grace: Duration) {
    signal_group(SIGTERM);
    let deadline = Instant::now() + grace;
    while Instant::now() < deadline && group_alive() {
        let _ = child.try_wait(); // reaped, the leader no longer counts as alive
        thread::sleep(Duration::from_millis(20));
    }
    signal_group(SIGKILL);
    let _ = child.kill(); // should the group be gone and the leader not (never blocks)
    let _ = child.wait();
}

/// Whether any process of the command's group is still there.
fn group_alive() -> bool {
    let group = GROUP.load(Ordering::SeqCst);
    // SAFETY: killpg with signal 0 only checks that the group exists; no memory involved.
    group != 0 && unsafe { libc::killpg(group as libc::pid_t, 0) } == 0
}

/// 128 + `signal`, the shell's code for a death by a signal.
fn signal_code(signal: i32) -> ExitCode {
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(255))
}

/// The command's status: its exit code, or 128 + the signal that ended it.
fn exit_code(status: ExitStatus) -> ExitCode {
    match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        (None, Some(signal)) => signal_code(signal),
        (None, None) => ExitCode::from(1),
    }
}

/// A thread that records SIGINT, SIGTERM, SIGHUP and SIGQUIT, and passes each to the
/// command's group once it runs. A signal ignored when `redguard` started (nohup, a
/// shell's `trap '' HUP`) stays ignored, for it and for the command.
fn listen_for_signals() -> std::io::Result<()> {
    let wanted: Vec<i32> = [SIGINT, SIGTERM, SIGHUP, SIGQUIT]
        .into_iter()
        .filter(|&signal| !ignored(signal))
        .collect();
    let mut signals = signal_hook::iterator::Signals::new(&wanted)?;
    thread::Builder::new()
        .name("redguard-signals".into())
        .spawn(move || {
            for signal in signals.forever() {
                RECEIVED.store(signal, Ordering::SeqCst);
                signal_group(signal);
            }
        })?;
    Ok(())
}

/// 128 + the signal, if one came (before the command runs: the wait ends).
fn signalled() -> Option<ExitCode> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal_code(signal)),
    }
}

/// Whether `signal` is ignored (SIG_IGN) in this process.
fn ignored(signal: i32) -> bool {
    // SAFETY: sigaction with no new action only reads the current one into `old`, a
    // zeroed plain C struct that the call fills in.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(signal, std::ptr::null(), &mut old) == 0
            && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Sends `signal` to the command's whole group.
fn signal_group(signal: i32) {
    let group = GROUP.load(Ordering::SeqCst);
    if group != 0 {
        // SAFETY: killpg takes two integers and touches no memory of ours.
        let _ = unsafe { libc::killpg(group as libc::pid_t, signal) };
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
fn duration(text: &str) -> Result<Duration, String> {
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
