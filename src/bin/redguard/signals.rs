//! The signals `redguard run` and `elect` handle: the ones that end it are passed on to
//! the command's process group; SIGTSTP stops the group before `redguard` itself; SIGCONT
//! is noted, and the group is continued only once the hold is seen to be still valid (see
//! `watch`).

use std::sync::OnceLock;
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU32, Ordering};
use std::thread;

use signal_hook::consts::{SIGCONT, SIGHUP, SIGINT, SIGQUIT, SIGSTOP, SIGTERM, SIGTSTP};

/// The last of the signals that end `redguard` that it received (0: none).
static RECEIVED: AtomicI32 = AtomicI32::new(0);
/// The command's process group, once it runs (0: not yet).
static GROUP: AtomicU32 = AtomicU32::new(0);
/// The command's group was stopped on SIGTSTP and not continued since.
static GROUP_STOPPED: AtomicBool = AtomicBool::new(false);
/// A signal that ends `redguard` came before the command's group was known.
static PENDING: AtomicBool = AtomicBool::new(false);
/// `redguard` was continued (SIGCONT) since the watch loop last looked.
static CONTINUED: AtomicBool = AtomicBool::new(false);
/// The signal mask `redguard` started with, for the command.
static STARTED_WITH: OnceLock<libc::sigset_t> = OnceLock::new();

/// A thread that records SIGINT, SIGTERM, SIGHUP and SIGQUIT and passes each to the
/// command's group once it runs, stops the group and then `redguard` on SIGTSTP, and notes
/// SIGCONT. A signal ignored when `redguard` started (nohup, a shell's `trap '' HUP`) stays
/// ignored, for it and for the command. Call it before any other thread starts.
pub(crate) fn listen() -> std::io::Result<()> {
    let wanted: Vec<i32> = [SIGINT, SIGTERM, SIGHUP, SIGQUIT, SIGTSTP, SIGCONT]
        .into_iter()
        .filter(|&signal| !ignored(signal))
        .collect();
    let blocked = block(&wanted)?;
    let mut signals = signal_hook::iterator::Signals::new(&wanted)?;
    thread::Builder::new()
        .name("redguard-signals".into())
        .spawn(move || {
            // The one thread that takes these signals (they wait, pending, until here).
            // SAFETY: pthread_sigmask reads the set given and changes this thread's mask.
            unsafe { libc::pthread_sigmask(libc::SIG_UNBLOCK, &blocked, std::ptr::null_mut()) };
            for signal in signals.forever() {
                match signal {
                    SIGTSTP => suspend(),
                    SIGCONT => CONTINUED.store(true, Ordering::SeqCst),
                    _ => {
                        RECEIVED.store(signal, Ordering::SeqCst);
                        pass_on(signal);
                    }
                }
            }
        })?;
    Ok(())
}

/// Blocks `signals` in this thread and in every thread it starts from now on (the
/// library's pool, refresher and subscriber, the wait's): only the signal thread takes
/// them. A handler that runs on a thread blocked in a socket read with a timeout (as
/// every connection of the pool has) makes the read fail with EINTR, SA_RESTART or not:
/// a SIGTERM that came while the wait was asking Redis ended `redguard` with 69, "Redis
/// unreachable", instead of 143. The mask before is kept for the command
/// ([`started_with`]): std's spawn does not reset it.
fn block(signals: &[i32]) -> std::io::Result<libc::sigset_t> {
    // SAFETY: sigemptyset and sigaddset fill in plain C structs of ours; pthread_sigmask
    // reads the one and fills in the other, and changes this thread's mask.
    unsafe {
        let mut set: libc::sigset_t = std::mem::zeroed();
        let mut before: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut set);
        for &signal in signals {
            libc::sigaddset(&mut set, signal);
        }
        match libc::pthread_sigmask(libc::SIG_BLOCK, &set, &mut before) {
            0 => {
                let _ = STARTED_WITH.set(before);
                Ok(set)
            }
            error => Err(std::io::Error::from_raw_os_error(error)),
        }
    }
}

/// The signal mask `redguard` started with (before [`listen`] blocked its signals), for
/// the command to start with.
pub(crate) fn started_with() -> Option<libc::sigset_t> {
    STARTED_WITH.get().copied()
}

/// Ctrl-Z: the command's group is stopped first (SIGSTOP, which no command can catch or
/// ignore: a stopped `redguard` refreshes nothing, so the command must not run on), then
/// `redguard` itself, so that the shell sees the job stopped.
fn suspend() {
    if group() != 0 {
        // A SIGCONT noted before this stop must not continue the group.
        CONTINUED.store(false, Ordering::SeqCst);
        GROUP_STOPPED.store(true, Ordering::SeqCst);
        signal_group(SIGSTOP);
    }
    // SAFETY: kill takes two integers and touches no memory of ours.
    let _ = unsafe { libc::kill(libc::getpid(), SIGSTOP) };
}

/// Records the command's group, once it runs, and passes on a signal that came before.
pub(crate) fn set_group(group: u32) {
    GROUP.store(group, Ordering::SeqCst);
    if PENDING.swap(false, Ordering::SeqCst)
        && let Some(signal) = received()
    {
        signal_group(signal);
    }
}

/// Passes `signal` on to the command's group, or, before it runs, leaves it pending for
/// [`set_group`]. Exactly one of the two passes a pending signal on (whichever takes
/// `PENDING`), never both: some commands take a second SIGINT as "quit at once".
fn pass_on(signal: i32) {
    if group() != 0 {
        signal_group(signal);
        return;
    }
    PENDING.store(true, Ordering::SeqCst);
    // The group may have been set since it was read: then `set_group` may have looked
    // before the store above, and this thread passes it on.
    if group() != 0 && PENDING.swap(false, Ordering::SeqCst) {
        signal_group(signal);
    }
}

/// The command has ended and been reaped: its group may be gone and its number taken by
/// another, so no more signals go to it.
pub(crate) fn forget_group() {
    GROUP.store(0, Ordering::SeqCst);
}

fn group() -> u32 {
    GROUP.load(Ordering::SeqCst)
}

/// The last signal that ends `redguard` that came, if any.
pub(crate) fn received() -> Option<i32> {
    match RECEIVED.load(Ordering::SeqCst) {
        0 => None,
        signal => Some(signal),
    }
}

/// Whether the command's group is stopped by us and `redguard` has been continued since:
/// then the caller decides whether the group may go on. Clears the note of the SIGCONT.
pub(crate) fn continued_while_group_stopped() -> bool {
    CONTINUED.swap(false, Ordering::SeqCst) && GROUP_STOPPED.load(Ordering::SeqCst)
}

/// Continues the command's group after a stop.
pub(crate) fn continue_group() {
    GROUP_STOPPED.store(false, Ordering::SeqCst);
    signal_group(SIGCONT);
}

/// Whether the command's group is stopped by us.
pub(crate) fn group_stopped() -> bool {
    GROUP_STOPPED.load(Ordering::SeqCst)
}

/// Sends `signal` to the command's whole group.
pub(crate) fn signal_group(signal: i32) {
    let group = group();
    if group != 0 {
        // SAFETY: killpg takes two integers and touches no memory of ours.
        let _ = unsafe { libc::killpg(group as libc::pid_t, signal) };
    }
}

/// Whether any process of the command's group is still there.
pub(crate) fn group_alive() -> bool {
    let group = group();
    // SAFETY: killpg with signal 0 only checks that the group exists; no memory involved.
    group != 0 && unsafe { libc::killpg(group as libc::pid_t, 0) } == 0
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
