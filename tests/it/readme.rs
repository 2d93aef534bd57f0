//! README.md's program is `examples/readme.rs`, shown as it is, and it runs; so does the
//! semaphore, read-write and sentinel examples README points to.

use std::process::Command;

use crate::server::RedisServer;

#[test]
fn readme_shows_the_readme_example_and_it_runs() {
    let root = env!("CARGO_MANIFEST_DIR");
    let readme = std::fs::read_to_string(format!("{root}/README.md")).unwrap();
    let example = std::fs::read_to_string(format!("{root}/examples/readme.rs")).unwrap();
    // Everything after the file's first line (its doc comment).
    let (_, program) = example.split_once('\n').unwrap();
    assert!(
        readme.contains(&format!("```rust\n{program}```")),
        "README.md does not show examples/readme.rs as it is"
    );

    // `cargo test` builds the examples next to this binary's directory.
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let server = RedisServer::start();
    let output = Command::new(dir.join("readme"))
        .env("REDIS_URL", server.url())
        .output()
        .expect("cargo test builds examples/readme.rs");
    assert!(output.status.success(), "{output:?}");
    assert_eq!(
        String::from_utf8_lossy(&output.stdout),
        "report rebuilt: 385\n"
    );
}

#[test]
fn the_semaphore_example_runs_and_never_lets_more_than_three_in() {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let server = RedisServer::start();
    let output = Command::new(dir.join("semaphore"))
        .env("REDIS_URL", server.url())
        .output()
        .expect("cargo test builds examples/semaphore.rs");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        stdout.contains("at most 3 inside at once (limit 3)"),
        "{stdout}"
    );
    assert!(!stdout.contains("(4 inside)"), "{stdout}");
}

#[test]
fn the_read_write_example_runs_and_its_writer_is_alone() {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let server = RedisServer::start();
    let output = Command::new(dir.join("read_write"))
        .env("REDIS_URL", server.url())
        .output()
        .expect("cargo test builds examples/read_write.rs");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("with 0 readers inside"), "{stdout}");
    assert_eq!(stdout.matches("a reader read").count(), 3, "{stdout}");
}

#[test]
fn the_sentinel_example_fails_over_and_keeps_locking() {
    let exe = std::env::current_exe().unwrap();
    let dir = exe.parent().unwrap().parent().unwrap().join("examples");
    let output = Command::new(dir.join("sentinel"))
        .output()
        .expect("cargo test builds examples/sentinel.rs");
    assert!(output.status.success(), "{output:?}");
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(stdout.contains("is the master now"), "{stdout}");
    assert!(
        stdout.contains("demo:report is still held, now on the new master"),
        "{stdout}"
    );
    assert!(stdout.contains("released demo:report"), "{stdout}");
}
