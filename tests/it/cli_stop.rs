//! The `redguard` command stopping its command: on Ctrl-Z, when it is killed itself,
//! before a lock it cannot refresh expires, and what it says when the lock was lost or
//! could not be given back.

use std::io::Write;
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::time::{Duration, Instant};

use redguard::{LockOptions, Retry};

use crate::cli::{code, redguard, redguard_at, signal};
use crate::proxy::Proxy;
use crate::server::RedisServer;
use crate::{alive, eventually, locker};

/// A directory of the test's own, removed on drop.
pub(crate) struct Dir(PathBuf);

impl Dir {
    pub(crate) fn new(test: &str) -> Dir {
        let dir = std::env::temp_dir().join(format!("redguard-{test}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        Dir(dir)
    }

    /// The path of `name` in it.
    pub(crate) fn file(&self, name: &str) -> PathBuf {
        self.0.join(name)
    }

    /// A shell line that writes its pid to a file here, then runs `then` in its place
    /// (`exec`) or after it; and the file.
    fn pid_line(&self, then: &str) -> (String, PathBuf) {
        let file = self.0.join("pid");
        (format!("echo $$ > {}; {then}", file.display()), file)
    }
}

impl Drop for Dir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The pid written to `file`, once it is there whole (within a bound).
fn written_pid(file: &PathBuf) -> u32 {
    let read = || {
        std::fs::read_to_string(file)
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    eventually(Duration::from_secs(10), "the command runs", || {
        read().is_some()
    });
    read().unwrap()
}

/// Kills `pid` on drop, should the test fail with the command still running.
struct Reap(u32);

impl Drop for Reap {
    fn drop(&mut self) {
        // SAFETY: kill takes two integers; a pid already gone gives ESRCH.
        unsafe { libc::kill(self.0 as libc::pid_t, libc::SIGKILL) };
    }
}

/// The state letter of `pid` in /proc (R, S, T, Z...); '?' once it is gone.
fn state(pid: u32) -> char {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    stat.rsplit_once(')')
        .and_then(|(_, rest)| rest.trim_start().chars().next())
        .unwrap_or('?')
}

fn stderr_of(child: Child) -> (Option<i32>, String) {
    let output = child.wait_with_output().unwrap();
    (
        code(&output),
        String::from_utf8_lossy(&output.stderr).into_owned(),
    )
}

/// A looping command run under `redguard run --ttl ttl`, then stopped by a Ctrl-Z
/// (SIGTSTP to `redguard`): `redguard`, the command's pid, and what cleans up after them.
fn stopped_run(server: &RedisServer, test: &str, ttl: &str) -> (Child, u32, Reap, Dir) {
    let dir = Dir::new(test);
    let (line, file) = dir.pid_line("while :; do sleep 0.05; done");
    let child = redguard(server, &["run", "--ttl", ttl, "k", "-c", &line])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let command = written_pid(&file);
    let reap = Reap(command);
    signal(child.id(), "TSTP");
    eventually(Duration::from_secs(5), "the command is stopped", || {
        state(command) == 'T'
    });
    (child, command, reap, dir)
}

#[test]
fn ctrl_z_stops_the_commands_group_and_fg_continues_it() {
    let server = RedisServer::start();
    let (child, command, _reap, _dir) = stopped_run(&server, "tstp", "10s");
    eventually(Duration::from_secs(5), "redguard is stopped", || {
        state(child.id()) == 'T'
    });
    signal(child.id(), "CONT");
    eventually(Duration::from_secs(5), "the command runs again", || {
        matches!(state(command), 'S' | 'R')
    });
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 1, "still held");
    signal(child.id(), "TERM");
    let (code, _) = stderr_of(child);
    assert_eq!(code, Some(128 + 15));
}

#[test]
fn a_command_stopped_past_the_ttl_never_runs_beside_the_next_holder() {
    let server = RedisServer::start();
    let (child, command, _reap, _dir) = stopped_run(&server, "tstp-lost", "1s");
    // Nothing refreshes the lock: it expires, and another holder gets in.
    let locker = locker(&server);
    let next = locker
        .lock_with(
            &["k"],
            LockOptions::default().timeout(Duration::from_secs(10)),
        )
        .unwrap();
    assert_eq!(state(command), 'T', "the command stays stopped");
    signal(child.id(), "CONT");
    let (code, said) = stderr_of(child);
    assert_eq!(code, Some(75), "{said}");
    assert!(said.contains("lost"), "{said}");
    assert!(!alive(command), "killed, not continued");
    next.release()
        .expect("the next holder's lock was left alone");
}

#[test]
fn a_killed_redguard_takes_the_commands_group_with_it() {
    let server = RedisServer::start();
    let dir = Dir::new("sigkill");
    let grandchild = dir.0.join("grandchild");
    let (line, file) = dir.pid_line(&format!(
        "sleep 30 & echo $! > {}.tmp; mv {0}.tmp {0}; wait",
        grandchild.display()
    ));
    let mut child = redguard(&server, &["run", "k", "-c", &line])
        .spawn()
        .unwrap();
    let command = written_pid(&file);
    let _reap = Reap(command);
    let grandchild = written_pid(&grandchild);
    let _reap_too = Reap(grandchild);
    signal(child.id(), "KILL");
    let _ = child.wait();
    // The lock stays until its TTL (30 s) lets the next holder in: the command and what
    // it started are gone long before.
    eventually(Duration::from_secs(3), "the command is gone", || {
        !alive(command)
    });
    eventually(Duration::from_secs(3), "its child is gone", || {
        !alive(grandchild)
    });
}

#[test]
fn failing_refreshes_stop_a_command_that_ignores_sigterm_before_the_lock_can_expire() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let dir = Dir::new("early");
    // The command ignores SIGTERM (and so do the sleeps it runs): only SIGKILL ends it.
    let (line, file) = dir.pid_line("trap '' TERM; while :; do sleep 0.05; done");
    let child = redguard_at(&proxy.url(), &["run", "--ttl", "3s", "k", "-c", &line])
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let command = written_pid(&file);
    let _reap = Reap(command);
    // Redis unreachable for `redguard` (its bytes go nowhere), not for the next holder.
    let cut = Instant::now();
    proxy.set(|faults| {
        faults.up.blackhole = true;
        faults.down.blackhole = true;
    });
    let next = locker(&server)
        .lock_with(
            &["k"],
            LockOptions::default()
                .retry(Retry::linear(Duration::from_millis(5)))
                .timeout(Duration::from_secs(10)),
        )
        .unwrap();
    assert!(
        !alive(command),
        "the command ran on beside the next holder ({:?} after the cut)",
        cut.elapsed()
    );
    let (code, said) = stderr_of(child);
    assert_eq!(code, Some(75), "{said}");
    assert!(said.contains("could not be refreshed"), "{said}");
    // Promptly: at about the TTL, not after a release that waits for Redis.
    assert!(
        cut.elapsed() < Duration::from_secs(3 + 1),
        "{:?}",
        cut.elapsed()
    );
    drop(next);
}

/// `redguard run k` with a command that ends once told (a line on its standard input),
/// once it holds the lock.
fn holding_until_told(server: &RedisServer) -> Child {
    let child = redguard(server, &["run", "k", "-c", "read line"])
        .stdin(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), "held", || {
        server.query::<u32>(&["EXISTS", "k"]) == 1
    });
    child
}

#[test]
fn a_loss_found_only_by_the_release_gives_75() {
    let server = RedisServer::start();
    let mut child = holding_until_told(&server);
    // Taken away behind its back; the refresher (at a third of 30 s) does not notice.
    server.query::<String>(&["SET", "k", "someone else"]);
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let (code, said) = stderr_of(child);
    assert_eq!(
        code,
        Some(75),
        "the command ended by itself, but not under the lock"
    );
    assert!(said.contains("lost"), "{said}");
    let value: String = server.query(&["GET", "k"]);
    assert_eq!(value, "someone else", "left alone");
}

#[test]
fn a_release_that_redis_does_not_answer_is_said_and_gives_74_promptly() {
    let server = RedisServer::start();
    let mut child = holding_until_told(&server);
    server.pause();
    let ended = Instant::now();
    child.stdin.take().unwrap().write_all(b"done\n").unwrap();
    let (code, said) = stderr_of(child);
    let took = ended.elapsed();
    server.resume();
    assert_eq!(code, Some(74), "{said}");
    assert!(said.contains("could not be given back") || said.contains("did not answer"));
    assert!(
        said.contains("exit status 0"),
        "the command's own status: {said}"
    );
    // The I/O timeout (2 s), and a little.
    assert!(took < Duration::from_secs(2 + 2), "{took:?}");
}
