//! The command `redguard` runs (`run`, `elect`): given after `--` or as `-c 'shell
//! command'`; started in a process group of its own, with the signal mask `redguard`
//! started with, and killed when `redguard` dies.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, Command, ExitCode};

use clap::Args;

use crate::{CANNOT_START, USAGE, fail, signals};

/// The command to run.
#[derive(Args)]
pub(crate) struct Program {
    /// Run this through $SHELL -c (else /bin/sh -c), instead of a COMMAND after --.
    #[arg(short = 'c', value_name = "SHELL_COMMAND")]
    shell: Option<String>,
    /// The command to run, and its arguments (after --).
    #[arg(last = true, value_name = "COMMAND")]
    command: Vec<String>,
}

impl Program {
    /// A usage error unless exactly one of a COMMAND and `-c` was given.
    pub(crate) fn check(&self) -> Result<(), ExitCode> {
        if self.shell.is_some() != self.command.is_empty() {
            return Err(fail(
                USAGE,
                "give either a COMMAND after --, or -c 'shell command'",
            ));
        }
        Ok(())
    }

    /// The program started: the shell for `-c`, else the COMMAND's first word.
    pub(crate) fn name(&self) -> String {
        match &self.shell {
            Some(_) => shell(),
            None => self.command[0].clone(),
        }
    }

    /// Starts the command in a process group of its own, with `env` added to its
    /// environment. Called on the main thread, which lives as long as `redguard`: the
    /// parent-death signal is tied to the thread that started the child.
    pub(crate) fn spawn(&self, env: &[(&str, String)]) -> io::Result<Child> {
        let mut command = match &self.shell {
            Some(line) => {
                let mut command = Command::new(shell());
                command.arg("-c").arg(line);
                command
            }
            None => {
                let mut command = Command::new(&self.command[0]);
                command.args(&self.command[1..]);
                command
            }
        };
        command.process_group(0);
        for (name, value) in env {
            command.env(name, value);
        }
        in_the_child(&mut command);
        command.spawn()
    }
}

/// $SHELL, else /bin/sh.
fn shell() -> String {
    std::env::var("SHELL").unwrap_or_else(|_| "/bin/sh".into())
}

/// Between fork and exec: the child gets the signal mask `redguard` started with (it
/// blocks the signals it handles in all threads but one), and is killed (SIGKILL) when
/// `redguard` dies, even by SIGKILL: it must not run on without the lock.
fn in_the_child(command: &mut Command) {
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
