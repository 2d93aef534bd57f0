//! Read locks: readers share a key, a writer waits for them, and new readers wait for it.
//!
//! Three readers read a "config" over and over, overlapping, so that some reader always
//! holds it. A writer asks for the lock: it records its intent, new readers wait behind
//! it, and it gets in as soon as the readers already inside have left. Then it
//! downgrades to a read lock, and the readers come back at once.
//!
//! ```text
//! cargo run --example read_write
//! ```

use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::Locker;
use redguard::testing::Server;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let (url, server) = Server::from_env_or_start("REDIS_URL")?;
    if server.is_some() {
        println!("REDIS_URL is not set: started a throwaway redis-server at {url}");
    }
    let locker = Locker::builder().pool_size(8).build(url.as_str())?;
    let key = ["demo:config"];
    let (inside, most, stop) = (
        AtomicUsize::new(0),
        AtomicUsize::new(0),
        AtomicBool::new(false),
    );

    thread::scope(|s| -> Result<(), redguard::Error> {
        let readers: Vec<_> = (0..3)
            .map(|reader| {
                let (locker, inside, most, stop) = (&locker, &inside, &most, &stop);
                s.spawn(move || -> redguard::Result<u32> {
                    thread::sleep(Duration::from_millis(30 * reader));
                    let mut reads = 0;
                    while !stop.load(Ordering::SeqCst) {
                        let reading = locker.read(&key)?;
                        most.fetch_max(inside.fetch_add(1, Ordering::SeqCst) + 1, Ordering::SeqCst);
                        thread::sleep(Duration::from_millis(100)); // reading
                        inside.fetch_sub(1, Ordering::SeqCst);
                        drop(reading);
                        reads += 1;
                    }
                    Ok(reads)
                })
            })
            .collect();

        thread::sleep(Duration::from_millis(300));
        println!(
            "{} readers inside at most, so far",
            most.load(Ordering::SeqCst)
        );
        let asked = Instant::now();
        let writing = locker.lock(&key)?;
        println!(
            "the writer got in after {} ms, with {} readers inside",
            asked.elapsed().as_millis(),
            inside.load(Ordering::SeqCst)
        );
        thread::sleep(Duration::from_millis(100)); // writing
        let reading = writing.downgrade()?;
        println!("the writer downgraded: it reads now, and the readers are back");
        thread::sleep(Duration::from_millis(150));
        println!("{} readers inside beside it", inside.load(Ordering::SeqCst));
        drop(reading);
        stop.store(true, Ordering::SeqCst);
        for reader in readers {
            let reads = reader.join().expect("a reader panicked")?;
            println!("a reader read {reads} times");
        }
        Ok(())
    })?;
    Ok(())
}
