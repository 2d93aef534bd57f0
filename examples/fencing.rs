//! Fencing tokens: a resource that refuses writes from a holder whose lock has passed on.
//!
//! A lock is a lease. Here client A takes the lock, stalls past its TTL (think of a GC pause
//! or SIGSTOP), and wakes up still believing it holds the lock; meanwhile B took it. The
//! storage remembers the largest token it has accepted and refuses smaller ones, so A's
//! late write is rejected instead of overwriting B's.
//!
//! ```text
//! cargo run --example fencing
//! ```

use std::sync::Mutex;
use std::thread;
use std::time::Duration;

use redguard::testing::Server;
use redguard::{LockOptions, Locker};

/// The protected resource: it checks the token, which the lock alone cannot do.
#[derive(Default)]
struct Storage {
    largest_token: Mutex<u64>,
}

impl Storage {
    fn write(&self, token: u64, who: &str, value: &str) {
        let mut largest = self.largest_token.lock().unwrap_or_else(|e| e.into_inner());
        if token < *largest {
            println!(
                "   storage: REFUSED {who}'s write of {value:?}: token {token} < {}",
                *largest
            );
            return;
        }
        *largest = token;
        println!("   storage: accepted {who}'s write of {value:?} with token {token}");
    }
}

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, server) = Server::from_env_or_start("REDIS_URL")?;
    if server.is_some() {
        println!("REDIS_URL is not set: started a throwaway redis-server at {url}");
    }
    let locker = Locker::connect(url.as_str())?;
    let storage = Storage::default();
    let ttl = Duration::from_millis(200);
    let options = LockOptions::default()
        .fencing(true)
        .ttl(ttl)
        .auto_refresh(false);

    let a = locker.lock_with(&["demo:fenced"], options.clone())?;
    let a_token = a.fence().ok_or("fencing is on")?;
    println!("A holds the lock with token {a_token}, then stalls past its TTL");
    thread::sleep(ttl * 2);

    let b = locker.lock_with(&["demo:fenced"], options)?;
    let b_token = b.fence().ok_or("fencing is on")?;
    println!("B holds the lock with token {b_token} and writes");
    storage.write(b_token, "B", "from B");

    println!("A wakes up (is_lost() = {}) and writes anyway", a.is_lost());
    storage.write(a_token, "A", "from A");
    b.release()?;
    Ok(())
}
