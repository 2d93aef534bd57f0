//! Locks through Redis Sentinel, across a failover.
//!
//! ```text
//! cargo run --example sentinel
//! ```
//!
//! Starts a private master, one replica and three sentinels (always its own: it ignores
//! `REDIS_URL`), locks through the sentinels with `replicas(1)`, forces a failover, and
//! keeps locking while it happens: the lock taken before it is on the new master, and new
//! locks go there too.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::testing::Replicated;
use redguard::{Error, LockOptions, Locker};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let group = Replicated::start(1, 3)?;
    let port = |i: usize| group.servers()[i].port();
    println!(
        "master on port {}, its replica on {}, three sentinels",
        port(0),
        port(1)
    );
    let locker = Locker::builder()
        .io_timeout(Duration::from_millis(500))
        .build_sentinel(&group.sentinel_urls(), group.master_name())?;

    // Held only once the replica has it too: it survives the failover below.
    let held = locker.lock_with(&["demo:report"], LockOptions::default().replicas(1))?;
    println!("holding demo:report (on the master and its replica)");

    // Meanwhile a worker takes and gives back a lock as fast as it can.
    let stop = Arc::new(AtomicBool::new(false));
    let (taken, failed) = (Arc::new(AtomicU64::new(0)), Arc::new(AtomicU64::new(0)));
    let worker = {
        let (locker, stop) = (locker.clone(), Arc::clone(&stop));
        let (taken, failed) = (Arc::clone(&taken), Arc::clone(&failed));
        thread::spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                match locker.try_lock(&["demo:job"]) {
                    Ok(Some(guard)) => {
                        taken.fetch_add(1, Ordering::Relaxed);
                        drop(guard);
                    }
                    Ok(None) => {}
                    Err(_) => {
                        failed.fetch_add(1, Ordering::Relaxed);
                        thread::sleep(Duration::from_millis(50));
                    }
                }
            }
        })
    };
    thread::sleep(Duration::from_millis(300));

    let started = Instant::now();
    let new = group.failover()?;
    println!(
        "failover: port {} is the master now ({:.1?}); the old one stays writable for a \
         while, but the locker heard the sentinels and moved at once",
        port(new),
        started.elapsed()
    );
    thread::sleep(Duration::from_millis(500));
    stop.store(true, Ordering::Relaxed);
    let _ = worker.join();
    println!(
        "the worker took {} locks meanwhile; {} calls failed during the switch",
        taken.load(Ordering::Relaxed),
        failed.load(Ordering::Relaxed)
    );

    // The lock taken before is on the new master: nobody else gets it there.
    assert!(locker.try_lock(&["demo:report"])?.is_none());
    println!("demo:report is still held, now on the new master");
    match held.release() {
        Ok(()) => println!("released demo:report"),
        Err(Error::LockLost) => println!("demo:report was lost in the failover"),
        Err(e) => return Err(e.into()),
    }
    let again = locker.lock(&["demo:report"])?;
    println!("and locked again on port {}: {}", port(new), again.token());
    Ok(())
}
