//! The `redguard` command, as a cron job or a shell script would run it.

use std::io::Write;
use std::process::{Command, Output, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redguard::LockOptions;

use crate::server::RedisServer;
use crate::{eventually, locker};

fn redguard(server: &RedisServer, args: &[&str]) -> Command {
    let mut command = Command::new(env!("CARGO_BIN_EXE_redguard"));
    command.args(args).env("REDIS_URL", server.url());
    command
}

fn run(server: &RedisServer, args: &[&str]) -> Output {
    redguard(server, args).output().expect("run redguard")
}

fn code(output: &Output) -> Option<i32> {
    output.status.code()
}

fn signal(pid: u32, name: &str) {
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
    eventually(Duration::from_secs(3), "held", || {
        server.query::<u32>(&["EXISTS", "k"]) == 1
    });
    thread::sleep(Duration::from_millis(100)); // the command runs
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
    eventually(Duration::from_secs(3), "it waits", || {
        server.subscribers("redguard:released:k") > 0
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
fn status_says_who_holds_each_key() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _lock = locker
        .lock_with(&["held"], LockOptions::default().metadata("worker \"1\""))
        .unwrap();
    let _readers: Vec<_> = ["r1", "r2"]
        .iter()
        .map(|m| {
            locker
                .read_with(&["shared"], LockOptions::default().metadata(*m))
                .unwrap()
        })
        .collect();
    server.query::<u32>(&["RPUSH", "list", "x"]);
    let text = run(&server, &["status", "free", "held", "shared", "list"]);
    assert_eq!(code(&text), Some(0));
    let text = String::from_utf8_lossy(&text.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines[0], "free: free");
    assert!(
        lines[1].starts_with("held: exclusive; \"worker \\\"1\\\"\" ")
            && lines[1].ends_with("s left"),
        "{text}"
    );
    assert!(lines[2].starts_with("shared: shared; "), "{text}");
    assert!(
        lines[2].contains("\"r1\"") && lines[2].contains("\"r2\""),
        "{text}"
    );
    assert_eq!(
        lines[3], "list: not a lock (list)",
        "and on to the next key"
    );
    let json = run(&server, &["status", "--json", "held"]);
    let json = String::from_utf8_lossy(&json.stdout);
    assert!(
        json.starts_with(
            r#"{"key":"held","state":"exclusive","holders":[{"metadata":"worker \"1\"","ttl_ms":"#
        ),
        "{json}"
    );
}
