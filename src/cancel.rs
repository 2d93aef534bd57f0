//! [`Cancel`]: a handle that ends waits from another thread.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

/// Ends every wait it was given to, from any thread: pass it with
/// [`LockOptions::cancel`](crate::LockOptions::cancel), and [`cancel`](Self::cancel) makes
/// each wait using it return [`Error::Cancelled`](crate::Error::Cancelled) within about
/// 50 ms, leaving nothing behind (no queue entry, no key; a hold handed to the waiter at
/// that moment is passed on to the next in line, never kept). A wait started after the
/// cancel ends at once. A cheap `Clone` (an `Arc` inside), `Send + Sync`.
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
    cancelled: Arc<AtomicBool>,
}

impl Cancel {
    /// A handle not cancelled yet.
    pub fn new() -> Cancel {
        Cancel::default()
    }

    /// Ends every wait using this handle, now and later. Held guards are left alone.
    pub fn cancel(&self) {
        self.cancelled.store(true, Ordering::SeqCst);
    }

    /// Whether [`cancel`](Self::cancel) was called.
    pub fn is_cancelled(&self) -> bool {
        self.cancelled.load(Ordering::SeqCst)
    }
}

impl fmt::Debug for Cancel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Cancel")
            .field("cancelled", &self.is_cancelled())
            .finish()
    }
}
