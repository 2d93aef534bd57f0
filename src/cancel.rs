//! [`Cancel`]: a handle that ends waits from another thread.

use std::fmt;
use std::sync::Arc;

use crate::wait::Alarm;

/// Ends waits from another thread: pass it with
/// [`LockOptions::cancel`](crate::LockOptions::cancel) to
/// [`lock_with`](crate::Locker::lock_with), [`read_with`](crate::Locker::read_with),
/// [`Semaphore::acquire_with`](crate::Semaphore::acquire_with),
/// [`Election::campaign_with`](crate::Election::campaign_with) (or their `try_` forms),
/// and [`cancel`](Self::cancel) ends every wait using it, or any clone of it, with
/// [`Error::Cancelled`](crate::Error::Cancelled):
/// - a wait asleep (in the server's queue, or listening for releases) is woken at once,
///   no polling, and returns within 50 ms (a few ms as measured here); one with a round
///   trip in flight returns as soon as that is answered (within the locker's I/O timeout
///   at worst);
/// - it leaves nothing behind: one more round trip takes a queued wait's entry out, and a
///   hold handed to it (or taken by its attempt) as the cancel came is given up at once,
///   passed on to the next in line, never returned nor left to expire. Should Redis not
///   answer then, what is left lapses on its own: an entry, and a hold handed to it,
///   within the locker's [`waiter_lifetime`](crate::LockerBuilder::waiter_lifetime); a
///   hold its own attempt took, with its TTL;
/// - a wait that starts after the cancel returns at once, without a round trip;
/// - guards returned before the cancel are left alone (held, refreshed, released as
///   usual): a wait that returned its guard just before the cancel keeps it. With a fixed
///   [`token`](crate::LockOptions::token), a hold the attempt found held by that token
///   already (another guard's) is left as it was.
///
/// It cannot be undone: make a new one to wait again. [`Locker::close`](crate::Locker::close)
/// does the same to every wait of a locker. A cheap `Clone` (an `Arc` inside),
/// `Send + Sync`; [`is_cancelled`](Self::is_cancelled) is one atomic load.
///
/// ```no_run
/// use redguard::{Cancel, Error, LockOptions, Locker};
///
/// # fn main() -> Result<(), redguard::Error> {
/// let locker = Locker::connect("redis://127.0.0.1/")?;
/// let shutdown = Cancel::new();
/// let waiting = {
///     let (locker, shutdown) = (locker.clone(), shutdown.clone());
///     std::thread::spawn(move || {
///         locker.lock_with(&["job"], LockOptions::default().cancel(&shutdown))
///     })
/// };
/// shutdown.cancel(); // say, on SIGTERM
/// assert!(matches!(waiting.join().unwrap(), Err(Error::Cancelled) | Ok(_)));
/// # Ok(()) }
/// ```
#[derive(Clone, Default)]
pub struct Cancel {
    alarm: Arc<Alarm>,
}

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Ends every wait using this handle (or a clone of it), now and later, for good (see
    /// above): a wait asleep is woken here, on this thread, which takes one short lock
    /// per wait; no round trip. Guards obtained before are left alone.
    pub fn cancel(&self) {
        self.alarm.ring();
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.alarm.is_rung()
    }

    /// What the waits using it listen to.
    pub(crate) fn alarm(&self) -> &Alarm {
        &self.alarm
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
