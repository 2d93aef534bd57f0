//! A semaphore: 8 threads share 3 permits, so at most 3 call the "payment API" at once.
//!
//! Each thread takes a permit (waiting while all 3 are held), works, and gives it back by
//! dropping it; the counter shows how many are inside at once. Then a holder dies without
//! giving its permit back, and the next one gets it when its TTL runs out, on the server's
//! clock, without waiting for a retry delay.
//!
//! ```text
//! cargo run --example semaphore
//! ```

use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::testing::Server;
use redguard::{LockOptions, Locker};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, server) = Server::from_env_or_start("REDIS_URL")?;
    if server.is_some() {
        println!("REDIS_URL is not set: started a throwaway redis-server at {url}");
    }
    let locker = Locker::builder().pool_size(10).build(url.as_str())?;
    let payments = locker.semaphore("demo:payments", 3)?;
    let inside = AtomicUsize::new(0);
    let most = AtomicUsize::new(0);

    thread::scope(|s| {
        let workers: Vec<_> = (0..8)
            .map(|worker| {
                let (payments, inside, most) = (&payments, &inside, &most);
                s.spawn(move || -> redguard::Result<()> {
                    let options = LockOptions::default().metadata(format!("worker-{worker}"));
                    let permit = payments.acquire_with(options)?;
                    let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                    most.fetch_max(now, Ordering::SeqCst);
                    println!("worker {worker} calls the API ({now} inside)");
                    thread::sleep(Duration::from_millis(100)); // the call
                    inside.fetch_sub(1, Ordering::SeqCst);
                    drop(permit); // gives the permit back, and wakes a waiter
                    Ok(())
                })
            })
            .collect();
        workers
            .into_iter()
            .try_for_each(|w| w.join().expect("a worker panicked"))
    })?;
    println!(
        "all 8 done; at most {} inside at once (limit {})",
        most.load(Ordering::SeqCst),
        payments.limit()
    );

    // A holder that dies: its permits are never given back, nor refreshed.
    let ttl = Duration::from_millis(500);
    let dying = LockOptions::default()
        .ttl(ttl)
        .auto_refresh(false)
        .metadata("dies");
    for _ in 0..3 {
        std::mem::forget(payments.acquire_with(dying.clone())?);
    }
    let holders = payments.holders()?;
    println!(
        "a worker died holding {} permits ({:?}, {} free)",
        holders.len(),
        holders.first().map(|holder| holder.metadata()),
        payments.available()?
    );
    let started = Instant::now();
    let permit = payments.acquire()?;
    println!(
        "the next worker got a permit after {} ms, when the dead one's expired",
        started.elapsed().as_millis()
    );
    permit.release()?;
    Ok(())
}
