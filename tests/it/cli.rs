//! The `redguard` command, as a cron job or a shell script would run it.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redguard::LockOptions;

use crate::server::RedisServer;
use crate::{eventually, locker};

/// The `redguard` command, with `args`, on `url`. `REDGUARD_BIN` names another build of
/// it (to check that a test fails on an older one).
pub(crate) fn redguard_at(url: &str, args: &[&str]) -> Command {
    let bin =
        std::env::var_os("REDGUARD_BIN").unwrap_or_else(|| env!("CARGO_BIN_EXE_redguard").into());
    let mut command = Command::new(bin);
    command.args(args).env("REDIS_URL", url);
    command
}

pub(crate) fn redguard(server: &RedisServer, args: &[&str]) -> Command {
    redguard_at(&server.url(), args)
}

pub(crate) fn run(server: &RedisServer, args: &[&str]) -> Output {
    redguard(server, args).output().expect("run redguard")
}

pub(crate) fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

/// The process ids of `pid`'s children (started by its main thread, as `redguard` starts
/// its command).
pub(crate) fn children(pid: u32) -> Vec<u32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .unwrap_or_default()
        .split_whitespace()
        .filter_map(|child| child.parse().ok())
        .collect()
}

/// The name of the program `pid` runs (empty once it is gone).
pub(crate) fn command_name(pid: u32) -> String {
    let comm = std::fs::read_to_string(format!("/proc/{pid}/comm")).unwrap_or_default();
    comm.trim_end().to_owned()
}

pub(crate) fn signal(pid: u32, name: &str) {
    let status = Command::new("kill")
        .args([&format!("-{name}"), &pid.to_string()])
        .status()
        .unwrap();
    assert!(status.success());
}

#[test]
fn the_commands_exit_status_passes_through() {
    let server = RedisServer::start();
    assert_eq!(code(&run(&server, &["run", "k", "--", "true"])), Some(0));
    assert_eq!(code(&run(&server, &["run", "k", "-c", "exit 3"])), Some(3));
    assert_eq!(
        code(&run(&server, &["run", "k", "-c", "kill -9 $$"])),
        Some(128 + 9)
    );
    assert_eq!(
        code(&run(&server, &["run", "k", "--", "/no/such/command"])),
        Some(71)
    );
    server.query::<u32>(&["RPUSH", "list", "x"]);
    let list = run(&server, &["run", "list", "--", "true"]);
    assert_eq!(code(&list), Some(64), "a key of another type");
    assert_eq!(code(&run(&server, &["run", "k"])), Some(64), "no command");
    assert_eq!(
        code(&run(&server, &["run", "--ttl", "soon", "k", "--", "true"])),
        Some(64)
    );
    let down = run(
        &server,
        &["run", "--url", "redis://127.0.0.1:1/", "k", "--", "true"],
    );
    assert_eq!(code(&down), Some(69));
}

#[test]
fn a_held_key_gives_the_conflict_code_at_once_or_after_the_wait() {
    let server = RedisServer::start();
    let _held = locker(&server).lock(&["k"]).unwrap();
    let started = Instant::now();
    assert_eq!(
        code(&run(&server, &["run", "-n", "k", "--", "true"])),
        Some(1)
    );
    assert_eq!(
        code(&run(&server, &["run", "-n", "-E", "7", "k", "--", "true"])),
        Some(7)
    );
    assert!(
        started.elapsed() < Duration::from_secs(2),
        "at once: {:?}",
        started.elapsed()
    );
    let started = Instant::now();
    assert_eq!(
        code(&run(&server, &["run", "-w", "0.3", "k", "--", "true"])),
        Some(1)
    );
    let waited = started.elapsed();
    assert!(
        waited >= Duration::from_millis(300) && waited < Duration::from_secs(2),
        "{waited:?}"
    );
}

#[test]
fn the_lock_is_held_while_the_command_runs_and_free_right_after() {
    let server = RedisServer::start();
    let mut child = redguard(
        &server,
        &["run", "--metadata", "cron-7", "k", "--", "sleep", "1"],
    )
    .spawn()
    .unwrap();
    eventually(Duration::from_secs(3), "held", || {
        server.query::<u32>(&["EXISTS", "k"]) == 1
    });
    let status = run(&server, &["status", "k"]);
    let said = String::from_utf8_lossy(&status.stdout);
    assert!(said.starts_with("k: exclusive; \"cron-7\""), "{said}");
    assert!(child.wait().unwrap().success());
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0, "free right after");
}

#[test]
fn the_command_gets_stdin_and_the_environment() {
    let server = RedisServer::start();
    let mut child = redguard(
        &server,
        &[
            "run",
            "--fencing",
            "a",
            "b",
            "-c",
            "read line; echo \"$line|$REDGUARD_KEYS|$REDGUARD_TTL_MS|$REDGUARD_FENCE|$MINE\"",
        ],
    )
    .env("MINE", "kept")
    .stdin(Stdio::piped())
    .stdout(Stdio::piped())
    .spawn()
    .unwrap();
    child.stdin.take().unwrap().write_all(b"hello\n").unwrap();
    let output = child.wait_with_output().unwrap();
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "hello|a b|30000|1|kept\n"
    );
}

#[test]
fn a_lost_lock_stops_the_whole_group_and_exits_75() {
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("redguard-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let pid_file = dir.join("grandchild");
    let line = format!("sleep 100 & echo $! > {}; wait", pid_file.display());
    let started = Instant::now();
    let child = redguard(
        &server,
        &["run", "--ttl", "1s", "--kill-grace", "1s", "k", "-c", &line],
    )
    .stderr(Stdio::piped())
    .spawn()
    .unwrap();
    // The file exists before `echo` has written it: until it reads as a pid.
    let read_pid = || {
        std::fs::read_to_string(&pid_file)
            .ok()?
            .trim()
            .parse::<u32>()
            .ok()
    };
    eventually(Duration::from_secs(3), "started", || read_pid().is_some());
    let grandchild = read_pid().unwrap();
    server.query::<u32>(&["DEL", "k"]);
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), Some(75));
    assert!(String::from_utf8_lossy(&output.stderr).contains("lost"));
    assert!(
        started.elapsed() < Duration::from_secs(1 + 1 + 3),
        "{:?}",
        started.elapsed()
    );
    // Killed; maybe a zombie a moment longer, until init reaps it.
    eventually(
        Duration::from_secs(2),
        "the backgrounded grandchild is gone too",
        || !crate::alive(grandchild),
    );
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn sigterm_reaches_the_command_and_ends_a_wait_holding_nothing() {
    let server = RedisServer::start();
    let running = redguard(&server, &["run", "k", "--", "sleep", "30"])
        .spawn()
        .unwrap();
    // Generous bounds for what a loaded machine delays: starting `redguard`, and its
    // starting the command (a sleep of 100 ms was no proof that it had).
    eventually(Duration::from_secs(10), "the command runs", || {
        children(running.id())
            .iter()
            .any(|&pid| command_name(pid) == "sleep")
    });
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 1, "held");
    signal(running.id(), "TERM");
    let output = running.wait_with_output().unwrap();
    assert_eq!(
        code(&output),
        Some(128 + 15),
        "the command was ended by SIGTERM"
    );
    assert_eq!(server.query::<u32>(&["EXISTS", "k"]), 0);

    let locker = locker(&server);
    let _held = locker
        .lock_with(&["k"], LockOptions::default().metadata("first"))
        .unwrap();
    let waiting = redguard(&server, &["run", "k", "--", "true"])
        .spawn()
        .unwrap();
    // It waits (its signal handlers are set before it connects).
    eventually(Duration::from_secs(10), "it waits", || {
        server.queued("k") > 0
    });
    let signalled = Instant::now();
    signal(waiting.id(), "TERM");
    let output = waiting.wait_with_output().unwrap();
    assert_eq!(code(&output), Some(128 + 15));
    assert!(signalled.elapsed() < Duration::from_secs(2));
    let holders = locker.holders("k").unwrap();
    assert_eq!(holders.len(), 1);
    assert_eq!(holders[0].metadata(), "first", "it holds nothing");
}

#[test]
fn a_lost_lock_gives_the_whole_group_its_grace() {
    // A shell that dies at once on SIGTERM, running a worker that needs a moment to clean
    // up: the grace is the group's, not the shell's.
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("redguard-grace-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (ready, cleaned) = (dir.join("ready"), dir.join("cleaned"));
    let worker = format!(
        "trap 'sleep 0.3; echo done > {}; exit 0' TERM; touch {}; while :; do sleep 0.05; done",
        cleaned.display(),
        ready.display()
    );
    let line = format!("sh -c \"{worker}\"; echo after");
    let args = ["run", "--ttl", "1s", "--kill-grace", "3s", "k", "-c", &line];
    let child = redguard(&server, &args)
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(3), "the worker runs", || ready.exists());
    server.query::<u32>(&["DEL", "k"]);
    let output = child.wait_with_output().unwrap();
    assert_eq!(code(&output), Some(75));
    let said = std::fs::read_to_string(&cleaned).unwrap_or_default();
    assert_eq!(said, "done\n", "the worker had its grace");
    let _ = std::fs::remove_dir_all(&dir);
}

#[test]
fn a_writer_gets_in_behind_a_stream_of_shared_runs_within_the_librarys_bound() {
    // As read.rs checks for the library's own writer (which gets in within four holds):
    // eight loops of `redguard run --shared`, each run holding the key 1.5 s, some reader
    // always inside.
    let server = RedisServer::start();
    let dir = std::env::temp_dir().join(format!("redguard-readers-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let stop = dir.join("stop");
    let hold = Duration::from_millis(1500);
    let reader = format!(
        "while [ ! -e {} ]; do \"$0\" run --shared k -- sleep 1.5; done",
        stop.display()
    );
    let bin = redguard(&server, &[]).get_program().to_owned();
    let loops: Vec<_> = (0..8)
        .map(|i| {
            thread::sleep(hold / 8 * u32::from(i > 0));
            Loop(
                Command::new("sh")
                    .args(["-c", &reader])
                    .arg(&bin)
                    .env("REDIS_URL", server.url())
                    .spawn()
                    .unwrap(),
            )
        })
        .collect();
    let locker = locker(&server);
    eventually(Duration::from_secs(20), "the readers all hold it", || {
        locker.holders("k").unwrap().len() == 8
    });
    let asked = Instant::now();
    let output = run(&server, &["run", "-w", "4", "k", "--", "true"]);
    let waited = asked.elapsed();
    std::fs::write(&stop, "").unwrap();
    drop(loops);
    let _ = std::fs::remove_dir_all(&dir);
    assert_eq!(
        code(&output),
        Some(0),
        "gave up after {waited:?}: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        waited < hold * 4,
        "the command's writer waited {waited:?} behind readers holding {hold:?} each"
    );
}

/// A reader loop: given a few seconds to end by itself (once told to stop, after the run
/// under way), then killed.
struct Loop(std::process::Child);

impl Drop for Loop {
    fn drop(&mut self) {
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline && matches!(self.0.try_wait(), Ok(None)) {
            thread::sleep(Duration::from_millis(20));
        }
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn help_lists_every_exit_status_and_a_command_that_cannot_start_is_named() {
    let server = RedisServer::start();
    for args in [&["run", "--help"][..], &["--help"][..]] {
        let help = run(&server, args);
        let help = String::from_utf8_lossy(&help.stdout);
        for code in [
            "\n  1 ", "\n  64 ", "\n  69 ", "\n  71 ", "\n  74 ", "\n  75 ",
        ] {
            assert!(help.contains(code), "{args:?} lists {code:?}:\n{help}");
        }
    }
    let run_help = run(&server, &["run", "--help"]);
    let run_help = String::from_utf8_lossy(&run_help.stdout);
    assert!(
        run_help.contains("REDGUARD_FENCE"),
        "fencing, for an overlap"
    );
    let missing = run(&server, &["run", "k", "--", "/no/such/command"]);
    assert_eq!(code(&missing), Some(71));
    let said = String::from_utf8_lossy(&missing.stderr);
    assert!(said.contains("/no/such/command"), "{said}");
}
