//! Should `redguard` be killed (SIGKILL, the OOM killer), the command's whole group must
//! not run on without the lock. The parent-death signal covers the process `redguard`
//! started, not what that one starts (a shell's children): a watchdog does, a `/bin/sh`
//! in a process group of its own that waits on a pipe from `redguard` and, once the pipe
//! closes without a word (its writer is gone), sends SIGKILL to the command's group.

use std::io;
use std::os::unix::process::CommandExt;
use std::process::{Child, ChildStdin, Command, Stdio};

/// The watchdog's script: `$1` is the command's group. It ignores the signals a terminal
/// sends (it is in no foreground group, but a hangup can reach it).
const SCRIPT: &str = "trap '' INT TERM HUP QUIT TSTP TTIN TTOU; read _; kill -KILL -\"$1\"";

/// A watchdog for one group; stopped (SIGKILL, reaped) when dropped, before it could act:
/// a `redguard` that ends by itself leaves the group alone.
pub(crate) struct Watchdog {
    child: Child,
    /// Held open while `redguard` lives; closed by the kernel when it dies.
    _pipe: ChildStdin,
}

impl Watchdog {
    /// Starts a watchdog for `group`.
    ///
    /// # Errors
    /// When `/bin/sh` cannot be started.
    pub(crate) fn start(group: u32) -> io::Result<Watchdog> {
        let mut child = Command::new("/bin/sh")
            .args(["-c", SCRIPT, "redguard-watchdog"])
            .arg(group.to_string())
            .stdin(Stdio::piped())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .process_group(0)
            .spawn()?;
        let Some(pipe) = child.stdin.take() else {
            // Never: stdin was asked piped. Do not leave the shell waiting.
            let _ = child.kill();
            let _ = child.wait();
            return Err(io::Error::other("the watchdog has no pipe"));
        };
        Ok(Watchdog { child, _pipe: pipe })
    }
}

impl Drop for Watchdog {
    fn drop(&mut self) {
        // Killed before the pipe closes (fields drop after this), so it never sends.
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}
