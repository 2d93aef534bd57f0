//! Threads contending for locks: hold, refresh and loss.
//!
//! Uses the server at `REDIS_URL` when set; otherwise starts a throwaway `redis-server`
//! from PATH on a free port and stops it at exit.
//!
//! ```text
//! cargo run --example quickstart
//! ```

use std::error::Error;
use std::thread;
use std::time::{Duration, Instant};

use redguard::testing::Server;
use redguard::{LockOptions, Locker};

fn main() -> std::process::ExitCode {
    match demo() {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            // Say what happened, then each cause.
            let mut message = format!("error: {e}");
            let mut cause = e.source();
            while let Some(c) = cause {
                message += &format!("\n  caused by: {c}");
                cause = c.source();
            }
            eprintln!("{message}");
            std::process::ExitCode::FAILURE
        }
    }
}

fn demo() -> Result<(), Box<dyn Error>> {
    // Keep the throwaway server (if any) alive until the end of main.
    let (url, server) = Server::from_env_or_start("REDIS_URL")?;
    if server.is_some() {
        println!("REDIS_URL is not set: started a throwaway redis-server at {url}");
    }
    let locker = Locker::connect(url.as_str())?;
    let mut raw =
        redis::Client::open(url.as_str())?.get_connection_with_timeout(Duration::from_secs(2))?;
    let started = Instant::now();
    let at = move || format!("{:>6.1} ms", started.elapsed().as_secs_f64() * 1e3);

    println!("\n1. Four threads take turns on one lock (each holds it for 50 ms)");
    let workers: Vec<_> = (1..=4)
        .map(|n| {
            let locker = locker.clone();
            thread::spawn(move || -> Result<(), redguard::Error> {
                let guard = locker.lock_with(
                    &["demo:printer"],
                    LockOptions::default().metadata(format!("worker-{n}")),
                )?;
                println!(
                    "   {} worker {n} holds the printer (token {}...)",
                    at(),
                    &guard.token()[..8]
                );
                thread::sleep(Duration::from_millis(50));
                guard.release()
            })
        })
        .collect();
    for worker in workers {
        worker.join().map_err(|_| "a worker panicked")??;
    }

    println!(
        "\n2. All or nothing: with \"b\" held, [\"a\", \"b\"] is not taken, and \"a\" stays free"
    );
    let b = locker.lock(&["demo:b"])?;
    let both = locker.try_lock(&["demo:a", "demo:b"])?;
    let a_exists: bool = redis::cmd("EXISTS").arg("demo:a").query(&mut raw)?;
    println!(
        "   try_lock([a, b]) -> {}, a exists: {a_exists}",
        if both.is_some() { "held" } else { "None" }
    );
    drop(b);

    println!("\n3. A 300 ms lock stays held for a second: the background refresher extends it");
    let guard = locker.lock_with(
        &["demo:report"],
        LockOptions::default().ttl(Duration::from_millis(300)),
    )?;
    for _ in 0..5 {
        thread::sleep(Duration::from_millis(200));
        let ttl = guard
            .ttl()?
            .map_or("gone".into(), |t| format!("{} ms left", t.as_millis()));
        println!("   {} lost: {}, {ttl}", at(), guard.is_lost());
    }

    println!("\n4. Someone deletes the key behind our back: the guard learns it lost the lock");
    let _: () = redis::cmd("DEL").arg("demo:report").query(&mut raw)?;
    while !guard.is_lost() {
        thread::sleep(Duration::from_millis(10));
    }
    println!("   {} is_lost() = true", at());
    match guard.release() {
        Err(e) => println!("   release() -> Err: {e}"),
        Ok(()) => println!("   release() -> Ok (unexpected)"),
    }
    println!("\ndone");
    Ok(())
}
