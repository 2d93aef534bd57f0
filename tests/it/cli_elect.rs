//! `redguard elect` (a command run while it leads) and `redguard leader` (who leads).

use std::io::{BufRead, BufReader, Write};
use std::path::PathBuf;
use std::process::{Child, Stdio};
use std::sync::mpsc::{self, Receiver};
use std::time::{Duration, Instant};

use redguard::LockOptions;

use crate::cli::{children, code, command_name, redguard, run, signal};
use crate::cli_stop::Dir;
use crate::server::RedisServer;
use crate::{alive, eventually, locker};

/// The Redis key of election `name`'s lock (see `src/backend/fence.rs`).
fn election_key(name: &str) -> String {
    format!("redguard:election:{{{name}}}")
}

/// Kills a `redguard` on drop, should the test fail with it still running.
struct Running(Child);

impl Drop for Running {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Waits for `file` to hold a whole line (written by `echo ... > file.tmp; mv`), and
/// gives it.
fn read_when_written(file: &PathBuf) -> String {
    eventually(Duration::from_secs(10), "the command runs", || {
        file.exists()
    });
    std::fs::read_to_string(file).unwrap().trim().to_owned()
}

fn stdout(output: &std::process::Output) -> String {
    String::from_utf8_lossy(&output.stdout).into_owned()
}

#[test]
fn elect_runs_the_command_with_its_term_and_passes_its_status_through() {
    let server = RedisServer::start();
    let line = "echo \"$REDGUARD_TERM $REDGUARD_FENCE\"; exit 3";
    let first = run(&server, &["elect", "x", "-c", line]);
    assert_eq!(code(&first), Some(3), "the command's own status");
    let said = stdout(&first);
    let (term, fence) = said.trim().split_once(' ').expect("two numbers");
    assert_eq!(term, fence, "REDGUARD_FENCE is the term");
    let term: u64 = term.parse().expect("a term");
    assert!(term >= 1);
    // Resigned once it ended; the next term is larger.
    assert_eq!(server.query::<u32>(&["EXISTS", &election_key("x")]), 0);
    let second = run(
        &server,
        &["elect", "x", "--", "sh", "-c", "echo $REDGUARD_TERM"],
    );
    assert_eq!(code(&second), Some(0));
    let next: u64 = stdout(&second).trim().parse().expect("a term");
    assert!(next > term, "{next} after {term}");
    assert_eq!(code(&run(&server, &["elect", "x"])), Some(64), "no command");
    let bad = run(&server, &["elect", "x", "--", "/no/such/command"]);
    assert_eq!(code(&bad), Some(71));
}

#[test]
fn a_second_candidate_with_no_wait_exits_1_without_running_its_command() {
    let server = RedisServer::start();
    let dir = Dir::new("elect-n");
    let (started, second) = (dir.file("started"), dir.file("second"));
    let line = format!("touch {}; exec sleep 30", started.display());
    let first = Running(
        redguard(&server, &["elect", "--value", "first", "x", "-c", &line])
            .spawn()
            .unwrap(),
    );
    eventually(Duration::from_secs(10), "the first leads", || {
        started.exists()
    });
    let touch = format!("touch {}", second.display());
    let refused = run(&server, &["elect", "-n", "x", "-c", &touch]);
    assert_eq!(code(&refused), Some(1));
    assert!(
        String::from_utf8_lossy(&refused.stderr).contains("held elsewhere"),
        "{}",
        String::from_utf8_lossy(&refused.stderr)
    );
    let waited = Instant::now();
    let refused = run(
        &server,
        &["elect", "-w", "0.3", "-E", "9", "x", "-c", &touch],
    );
    assert_eq!(code(&refused), Some(9));
    assert!(waited.elapsed() >= Duration::from_millis(300));
    assert!(!second.exists(), "the second command never ran");
    let leader = locker(&server).election("x").unwrap().leader().unwrap();
    assert_eq!(
        leader.map(|l| l.value().to_owned()).as_deref(),
        Some("first")
    );
    signal(first.0.id(), "TERM");
    let mut first = first;
    let status = first.0.wait().unwrap();
    assert_eq!(status.code(), Some(128 + 15));
}

#[test]
fn a_lost_term_stops_the_command_and_exits_75() {
    let server = RedisServer::start();
    let dir = Dir::new("elect-lost");
    let pid_file = dir.file("pid");
    let line = format!(
        "echo $$ > {0}.tmp; mv {0}.tmp {0}; exec sleep 30",
        pid_file.display()
    );
    let args = [
        "elect",
        "--ttl",
        "1s",
        "--kill-grace",
        "1s",
        "x",
        "-c",
        &line,
    ];
    let child = redguard(&server, &args)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let command: u32 = read_when_written(&pid_file).parse().unwrap();
    // Taken away from outside: the refresher finds it gone within a third of the TTL.
    server.query::<u32>(&["DEL", &election_key("x")]);
    let output = child.wait_with_output().unwrap();
    let said = String::from_utf8_lossy(&output.stderr);
    assert_eq!(code(&output), Some(75), "{said}");
    assert!(said.contains("lost"), "{said}");
    eventually(Duration::from_secs(2), "the command is gone", || {
        !alive(command)
    });
}

#[test]
fn a_waiting_candidate_leads_when_the_leader_ends_and_runs_its_command_whole() {
    // A term handed over by a resignation lasts what the candidate's place in the queue
    // had left until the refresher renews it: the command must not be stopped for it.
    let server = RedisServer::start();
    let mut first = redguard(&server, &["elect", "x", "-c", "read line"])
        .stdin(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), "the first leads", || {
        server.query::<u32>(&["EXISTS", &election_key("x")]) == 1
    });
    let line = "sleep 1; echo $REDGUARD_TERM";
    let second = redguard(&server, &["elect", "x", "-c", line])
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    eventually(Duration::from_secs(10), "the second waits", || {
        server.queued(&election_key("x")) == 1
    });
    first.stdin.take().unwrap().write_all(b"done\n").unwrap();
    assert_eq!(first.wait().unwrap().code(), Some(0));
    let output = second.wait_with_output().unwrap();
    assert_eq!(
        code(&output),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(stdout(&output), "2\n", "the second term");
}

#[test]
fn requeue_campaigns_again_after_the_command_ends_until_signalled() {
    let server = RedisServer::start();
    let dir = Dir::new("elect-requeue");
    let terms = dir.file("terms");
    // Two terms end at once; the third one's command runs until the signal.
    let line = format!(
        "echo $REDGUARD_TERM >> {0}; [ $(wc -l < {0}) -ge 3 ] && exec sleep 30; exit 4",
        terms.display()
    );
    let child = Running(
        redguard(&server, &["elect", "--requeue", "x", "-c", &line])
            .spawn()
            .unwrap(),
    );
    eventually(
        Duration::from_secs(10),
        "the third term's command runs",
        || {
            children(child.0.id())
                .iter()
                .any(|&pid| command_name(pid) == "sleep")
        },
    );
    let written = std::fs::read_to_string(&terms).unwrap();
    let written: Vec<u64> = written.lines().map(|t| t.parse().unwrap()).collect();
    assert_eq!(written.len(), 3, "{written:?}");
    assert!(
        written.windows(2).all(|pair| pair[0] < pair[1]),
        "{written:?}"
    );
    let leader = locker(&server).election("x").unwrap().leader().unwrap();
    assert_eq!(leader.map(|l| l.term()), Some(written[2]));
    signal(child.0.id(), "TERM");
    let mut child = child;
    assert_eq!(child.0.wait().unwrap().code(), Some(128 + 15));
    assert_eq!(
        server.query::<u32>(&["EXISTS", &election_key("x")]),
        0,
        "resigned"
    );
}

#[test]
fn leader_says_who_leads_as_text_and_json() {
    let server = RedisServer::start();
    let said = |args: &[&str]| {
        let output = run(&server, args);
        assert_eq!(code(&output), Some(0), "{args:?}");
        stdout(&output)
    };
    assert_eq!(said(&["leader", "x"]), "x: no leader\n");
    assert_eq!(
        said(&["leader", "--json", "x"]),
        "{\"election\":\"x\",\"leader\":null}\n"
    );
    let locker = locker(&server);
    let election = locker.election("x").unwrap();
    let options = LockOptions::default().ttl(Duration::from_secs(10));
    let term = election.campaign_with("say \"hi\"\\", options).unwrap();
    let text = said(&["leader", "x"]);
    let prefix = format!("x: say \"hi\"\\, term {}, ", term.term());
    let left = text
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix("s left\n"))
        .unwrap_or_else(|| panic!("{text:?}"));
    let left: f64 = left.parse().unwrap();
    assert!(left > 0.0 && left <= 10.0, "{left}");
    let json = said(&["leader", "--json", "x"]);
    let prefix = format!(
        "{{\"election\":\"x\",\"value\":\"say \\\"hi\\\"\\\\\",\"term\":{},\"ttl_ms\":",
        term.term()
    );
    let ttl_ms = json
        .strip_prefix(&prefix)
        .and_then(|rest| rest.strip_suffix("}\n"))
        .unwrap_or_else(|| panic!("{json:?}"));
    let ttl_ms: u64 = ttl_ms.parse().unwrap();
    assert!(ttl_ms > 0 && ttl_ms <= 10_000, "{ttl_ms}");
    server.query::<u32>(&["RPUSH", &election_key("list"), "x"]);
    assert_eq!(code(&run(&server, &["leader", "list"])), Some(64));
    let down = run(&server, &["leader", "--url", "redis://127.0.0.1:1/", "x"]);
    assert_eq!(code(&down), Some(69));
}

/// `redguard leader --watch`'s lines, as they come; killed on drop.
struct Watching {
    child: Child,
    lines: Receiver<String>,
}

impl Watching {
    fn start(server: &RedisServer, args: &[&str]) -> Watching {
        let mut child = redguard(server, args)
            .stdout(Stdio::piped())
            .spawn()
            .unwrap();
        let out = BufReader::new(child.stdout.take().unwrap());
        let (sender, lines) = mpsc::channel();
        std::thread::spawn(move || {
            for line in out.lines().map_while(Result::ok) {
                if sender.send(line).is_err() {
                    break;
                }
            }
        });
        Watching { child, lines }
    }

    /// The next line, within a bound.
    fn next(&self) -> String {
        self.lines
            .recv_timeout(Duration::from_secs(10))
            .expect("a line within 10 s")
    }
}

impl Drop for Watching {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

#[test]
fn leader_watch_prints_each_change() {
    let server = RedisServer::start();
    let watching = Watching::start(&server, &["leader", "--watch", "x"]);
    assert_eq!(watching.next(), "x: no leader");
    let locker = locker(&server);
    let election = locker.election("x").unwrap();
    let first = election.campaign("a").unwrap();
    let line = watching.next();
    let prefix = format!("x: a, term {}, ", first.term());
    assert!(line.starts_with(&prefix), "{line}");
    first.resign().unwrap();
    assert_eq!(watching.next(), "x: no leader");
    let second = election.campaign("b").unwrap();
    let line = watching.next();
    let prefix = format!("x: b, term {}, ", second.term());
    assert!(line.starts_with(&prefix), "{line}");
    drop(second);
    assert_eq!(watching.next(), "x: no leader");

    let json = Watching::start(&server, &["leader", "--watch", "--json", "x"]);
    assert_eq!(json.next(), "{\"election\":\"x\",\"leader\":null}");
    let third = election.campaign("c").unwrap();
    let line = json.next();
    let prefix = format!(
        "{{\"election\":\"x\",\"value\":\"c\",\"term\":{},",
        third.term()
    );
    assert!(line.starts_with(&prefix), "{line}");
    assert!(alive(json.child.id()), "it goes on watching");
}

#[test]
fn help_lists_the_exit_statuses_and_the_terms_variables() {
    let server = RedisServer::start();
    let elect = stdout(&run(&server, &["elect", "--help"]));
    for needed in [
        "REDGUARD_TERM",
        "REDGUARD_FENCE",
        "--requeue",
        "\n  1 ",
        "\n  75 ",
    ] {
        assert!(elect.contains(needed), "elect --help: {needed:?}:\n{elect}");
    }
    let leader = stdout(&run(&server, &["leader", "--help"]));
    for needed in ["--watch", "no leader", "\n  69 "] {
        assert!(
            leader.contains(needed),
            "leader --help: {needed:?}:\n{leader}"
        );
    }
    let top = stdout(&run(&server, &["--help"]));
    assert!(top.contains("elect") && top.contains("leader"), "{top}");
}
