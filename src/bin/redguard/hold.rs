//! The hold `redguard run` takes (a lock, a read lock or a permit), or `redguard elect`'s
//! term: taken by one wait of the library's with the real deadline, on a thread of its own
//! so that a signal ends the wait at once; given back within a bound.

use std::process::ExitCode;
use std::sync::mpsc::{self, RecvTimeoutError};
use std::thread;
use std::time::Duration;

use redguard::{
    Election, Error, Leadership, LockGuard, LockOptions, Locker, Permit, ReadGuard, Semaphore,
};

use crate::{UNAVAILABLE, fail, failed, signal_code, signals};

/// How often the waiting thread looks at the signals.
const POLL: Duration = Duration::from_millis(20);
/// After a signal ends the wait: how long a grant already on its way may take to come
/// (it is then given back); a later one is never seen, as `redguard` has exited.
const LATE_GRANT: Duration = Duration::from_millis(200);

/// A hold of any kind.
pub(crate) enum Hold {
    Lock(LockGuard),
    Read(ReadGuard),
    Permit(Permit),
    /// A term of an election: its number is its fencing token.
    Term(Leadership),
}

impl Hold {
    pub(crate) fn is_lost(&self) -> bool {
        match self {
            Hold::Lock(g) => g.is_lost(),
            Hold::Read(g) => g.is_lost(),
            Hold::Permit(p) => p.is_lost(),
            Hold::Term(t) => t.is_lost(),
        }
    }

    /// How long this process still counts the hold as held (zero once lost).
    pub(crate) fn valid_for(&self) -> Duration {
        match self {
            Hold::Lock(g) => g.valid_for(),
            Hold::Read(g) => g.valid_for(),
            Hold::Permit(p) => p.valid_for(),
            Hold::Term(t) => t.valid_for(),
        }
    }

    /// Sets the TTL to `ttl` from now, if still held.
    fn refresh(&self, ttl: Duration) -> redguard::Result<()> {
        match self {
            Hold::Lock(g) => g.refresh(ttl),
            Hold::Read(g) => g.refresh(ttl),
            Hold::Permit(p) => p.refresh(ttl),
            Hold::Term(t) => t.refresh(ttl),
        }
    }

    pub(crate) fn fence(&self) -> Option<u64> {
        match self {
            Hold::Lock(g) => g.fence(),
            Hold::Read(g) => g.fence(),
            Hold::Permit(p) => p.fence(),
            Hold::Term(t) => Some(t.term()),
        }
    }

    fn release(self) -> redguard::Result<()> {
        match self {
            Hold::Lock(g) => g.release(),
            Hold::Read(g) => g.release(),
            Hold::Permit(p) => p.release(),
            Hold::Term(t) => t.resign(),
        }
    }
}

/// What to take.
pub(crate) enum Want {
    Lock(Vec<String>),
    Read(Vec<String>),
    Permit(Semaphore),
    /// To lead `Election`, advertising the value.
    Term(Election, String),
}

impl Want {
    /// Takes it with `options` and their `ttl`.
    fn take(&self, locker: &Locker, options: LockOptions, ttl: Duration) -> redguard::Result<Hold> {
        let hold = match self {
            Want::Lock(keys) => locker.lock_with(keys, options).map(Hold::Lock),
            Want::Read(keys) => locker.read_with(keys, options).map(Hold::Read),
            Want::Permit(semaphore) => semaphore.acquire_with(options).map(Hold::Permit),
            Want::Term(election, value) => election.campaign_with(value, options).map(Hold::Term),
        }?;
        // A hold a release gave this waiter lasts what its place in the queue had left
        // until the refresher lengthens it; the command's stop rules count from how long
        // it is valid, so it is lengthened now.
        if hold.valid_for() < ttl / 2 {
            hold.refresh(ttl)?;
        }
        Ok(hold)
    }
}

/// Takes `want` as `options` say (their timeout is the whole wait), on a thread of its
/// own: a signal that ends `redguard` ends the wait at once, with 128 + the signal.
/// `conflict` is the exit status when the wait ran out. A waiter's place in the queue
/// (which holds later waiters back) is then left to expire (within 2 s).
pub(crate) fn acquire(
    locker: &Locker,
    want: Want,
    options: LockOptions,
    ttl: Duration,
    conflict: u8,
    named: &str,
) -> Result<Hold, ExitCode> {
    let (sender, receiver) = mpsc::sync_channel(1);
    let waiter = locker.clone();
    let spawned = thread::Builder::new()
        .name("redguard-acquire".into())
        .spawn(move || {
            // The receiver may be gone (a signal came): then the hold drops here.
            let _ = sender.send(want.take(&waiter, options, ttl));
        });
    if let Err(e) = spawned {
        return Err(fail(UNAVAILABLE, &format!("cannot start waiting: {e}")));
    }
    loop {
        if let Some(signal) = signals::received() {
            if let Ok(Ok(hold)) = receiver.recv_timeout(LATE_GRANT) {
                let _ = give_back(hold, LATE_GRANT);
            }
            return Err(signal_code(signal));
        }
        match receiver.recv_timeout(POLL) {
            Ok(Ok(hold)) => return Ok(hold),
            Ok(Err(Error::NotObtained)) => {
                eprintln!("redguard: {named} held elsewhere");
                return Err(ExitCode::from(conflict));
            }
            Ok(Err(e)) => return Err(failed(&e)),
            Err(RecvTimeoutError::Timeout) => {}
            Err(RecvTimeoutError::Disconnected) => {
                return Err(fail(
                    UNAVAILABLE,
                    "the wait for the lock ended without an answer",
                ));
            }
        }
    }
}

/// How giving the hold back went.
pub(crate) enum GaveBack {
    Done,
    /// The release found the hold gone (or it was already known lost).
    Lost,
    Failed(Error),
    /// No answer within the bound: the hold expires with its TTL.
    NoAnswer,
}

/// Releases `hold`, waiting at most `within` for the answer.
pub(crate) fn give_back(hold: Hold, within: Duration) -> GaveBack {
    let (sender, receiver) = mpsc::sync_channel(1);
    let spawned = thread::Builder::new()
        .name("redguard-release".into())
        .spawn(move || {
            let _ = sender.send(hold.release());
        });
    if spawned.is_err() {
        // The hold was dropped with the closure: given back as on drop, answer unknown.
        return GaveBack::NoAnswer;
    }
    match receiver.recv_timeout(within) {
        Ok(Ok(())) => GaveBack::Done,
        Ok(Err(Error::LockLost)) => GaveBack::Lost,
        Ok(Err(e)) => GaveBack::Failed(e),
        Err(_) => GaveBack::NoAnswer,
    }
}
