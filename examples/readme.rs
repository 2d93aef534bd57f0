//! The program in README.md (a test checks that README shows this file as it is).
use std::time::Duration;

use redguard::{Error, Locker};

fn main() -> Result<(), Error> {
    let url = std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1/".into());
    let locker = Locker::connect(url.as_str())?;

    // One process at a time rebuilds the daily report; the others wait their turn.
    let guard = locker.lock(&["report:daily"])?;
    let mut total = 0u64;
    for day in 1..=10u64 {
        // A lease can run out (a long pause, Redis unreachable): stop before each step.
        if guard.is_lost() {
            return Err(Error::LockLost);
        }
        total += day * day; // a step of real work
        std::thread::sleep(Duration::from_millis(20));
    }
    guard.release()?; // or let it drop
    println!("report rebuilt: {total}");
    Ok(())
}
