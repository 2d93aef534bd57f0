//! Redlock on five private servers: the lock survives two of them dying, not three.
//!
//! Starts five throwaway `redis-server`s from PATH on free ports and stops them at exit.
//!
//! ```text
//! cargo run --example redlock
//! ```

use std::error::Error;
use std::time::{Duration, Instant};

use redguard::testing::Server;
use redguard::{LockOptions, Locker};

fn main() -> Result<(), Box<dyn Error>> {
    let mut servers = (0..5)
        .map(|_| Server::start())
        .collect::<Result<Vec<Server>, _>>()?;
    let urls: Vec<String> = servers.iter().map(Server::url).collect();
    println!("five independent redis-servers: {}", urls.join(" "));
    let locker = Locker::builder()
        .node_timeout(Duration::from_millis(100))
        .build_redlock(&urls)?;
    let other = Locker::builder().build_redlock(&urls)?;

    let guard = locker.lock_with(
        &["report"],
        LockOptions::default().ttl(Duration::from_secs(2)),
    )?;
    let mut held_on = 0;
    for server in &servers {
        if holds(server, "report", guard.token())? {
            held_on += 1;
        }
    }
    println!("locked \"report\": held on {held_on} of 5 servers (a majority is 3)");

    servers[0].kill();
    servers[1].kill();
    println!("killed two servers");
    println!(
        "  another locker's try_lock: {}",
        match other.try_lock(&["report"])? {
            Some(_) => "obtained (wrong!)",
            None => "not obtained: the three left still hold it",
        }
    );
    guard.refresh(Duration::from_secs(2))?;
    println!(
        "  refresh: ok, ttl on a majority {:?}",
        guard.ttl()?.unwrap_or_default()
    );
    guard.release()?;
    println!(
        "  released; the other locker now: {}",
        match other.try_lock(&["report"])? {
            Some(_) => "obtained",
            None => "not obtained (wrong!)",
        }
    );

    servers[2].kill();
    println!("killed a third server");
    let started = Instant::now();
    match locker.lock(&["report"]) {
        Err(redguard::Error::NotObtained) => println!(
            "  lock: NotObtained after {:?}: two servers are not a majority of five",
            started.elapsed()
        ),
        other => println!("  lock: {other:?} (unexpected)"),
    }
    Ok(())
}

/// Whether `server` has `key` set to `token`: asked on a plain connection of its own,
/// behind the lockers' backs (with no metadata, a lock's value is its token).
fn holds(server: &Server, key: &str, token: &str) -> redis::RedisResult<bool> {
    let mut con = server
        .client()?
        .get_connection_with_timeout(Duration::from_secs(1))?;
    con.set_read_timeout(Some(Duration::from_secs(2)))?;
    let value: Option<String> = redis::cmd("GET").arg(key).query(&mut con)?;
    Ok(value.as_deref() == Some(token))
}
