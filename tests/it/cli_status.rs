//! `redguard status`: who holds each key, every lock under a prefix, through Sentinel too.

use redguard::LockOptions;
use redguard::testing::Replicated;

use crate::cli::{code, redguard_at, run};
use crate::locker;
use crate::server::RedisServer;

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

#[test]
fn status_and_run_through_sentinels() {
    let group = Replicated::start(0, 1).unwrap_or_else(|e| panic!("{e}"));
    let sentinel = group.sentinel_urls()[0].clone();
    let master = group.master_name().to_owned();
    let through = |args: &[&str]| {
        let mut command = redguard_at("redis://127.0.0.1:1/", &args[..1]);
        command.args(["--sentinel", &sentinel, "--master", &master]);
        command.args(&args[1..]);
        command
    };
    // `run` holds the key on the master the sentinel names; `status` inside it sees so.
    let status = format!(
        "{} status --sentinel {sentinel} --master {master} k",
        env!("CARGO_BIN_EXE_redguard")
    );
    let output = through(&["run", "--metadata", "via-sentinel", "k", "-c", &status])
        .output()
        .unwrap();
    let said = String::from_utf8_lossy(&output.stdout);
    assert_eq!(
        code(&output),
        Some(0),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(said.starts_with("k: exclusive; \"via-sentinel\""), "{said}");
    let after = through(&["status", "k"]).output().unwrap();
    assert_eq!(String::from_utf8_lossy(&after.stdout), "k: free\n");
    let wrong = through(&["status", "k"])
        .args(["--url", "redis://127.0.0.1:1/"])
        .output()
        .unwrap();
    assert_eq!(code(&wrong), Some(64), "--url and --sentinel conflict");
}

#[test]
fn status_without_a_key_lists_every_lock_under_the_prefix_and_a_semaphores_limit() {
    let server = RedisServer::start();
    let prefixed = redguard::Locker::builder()
        .prefix("app:")
        .build(server.url())
        .unwrap();
    let with = |metadata: &str| LockOptions::default().metadata(metadata);
    let _a = prefixed.lock_with(&["a"], with("ma")).unwrap();
    let _f = prefixed
        .lock_with(&["f"], with("mf").fencing(true))
        .unwrap();
    let _r = prefixed.read_with(&["r"], with("mr")).unwrap();
    let semaphore = prefixed.semaphore("s", 3).unwrap();
    let _permits = [
        semaphore.acquire_with(with("p1")).unwrap(),
        semaphore.acquire_with(with("p2")).unwrap(),
    ];
    let _elsewhere = locker(&server).lock(&["outside"]).unwrap();
    server.query::<u32>(&["RPUSH", "app:list", "x"]);
    let listed = run(&server, &["status", "--prefix", "app:"]);
    assert_eq!(code(&listed), Some(0));
    let text = String::from_utf8_lossy(&listed.stdout);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines.len(),
        4,
        "the locks under the prefix, and only them:\n{text}"
    );
    assert!(lines[0].starts_with("a: exclusive; \"ma\""), "{text}");
    assert!(lines[1].starts_with("f: exclusive; \"mf\"") && lines[1].ends_with(", fence 1"));
    assert!(lines[2].starts_with("r: shared; \"mr\""), "{text}");
    assert!(
        lines[3].starts_with("s: semaphore, 2 of 3 permits in use; "),
        "{text}"
    );
    let json = run(&server, &["status", "--json", "--prefix", "app:", "s"]);
    let json = String::from_utf8_lossy(&json.stdout);
    assert!(
        json.starts_with(r#"{"key":"s","state":"semaphore","limit":3,"in_use":2,"holders":[{"#),
        "{json}"
    );
}

#[test]
fn status_shows_a_lock_waiting_for_the_readers() {
    let server = RedisServer::start();
    let locker = locker(&server);
    let _reader = locker
        .read_with(&["shared"], LockOptions::default().metadata("reader"))
        .unwrap();
    let writer = {
        let locker = locker.clone();
        std::thread::spawn(move || {
            let options = LockOptions::default()
                .metadata("writer")
                .timeout(std::time::Duration::from_secs(3));
            locker.lock_with(&["shared"], options).map(drop)
        })
    };
    crate::eventually(std::time::Duration::from_secs(3), "it waits", || {
        locker
            .holders("shared")
            .unwrap()
            .iter()
            .any(|h| h.waiting())
    });
    let text = run(&server, &["status", "shared"]);
    let text = String::from_utf8_lossy(&text.stdout);
    assert!(
        text.starts_with("shared: shared; \"reader\" ") && text.contains("; waiting: \"writer\" "),
        "{text}"
    );
    let json = run(&server, &["status", "--json", "shared"]);
    let json = String::from_utf8_lossy(&json.stdout);
    assert!(json.contains(r#""metadata":"writer","ttl_ms":"#), "{json}");
    assert!(json.contains(r#""waiting":true"#), "{json}");
    assert!(writer.join().unwrap().is_err());
}
