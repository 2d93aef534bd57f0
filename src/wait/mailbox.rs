//! A queued waiter's mailbox: where it hears that a script gave it its hold, or that it
//! should ask Redis itself.

use std::time::Instant;

use parking_lot::{Condvar, Mutex};

use super::stop::Stop;

/// Word for a queued waiter.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Letter {
    /// A script (a release, or another's attempt) gave the waiter its hold, with these
    /// fencing tokens: it holds it now, for as long as its queue entry had left (and no
    /// longer than its TTL from when the script ran, which was after `sent_at` when the
    /// script's reply told of it: a request of this locker's own).
    Handed {
        fences: Vec<u64>,
        sent_at: Option<Instant>,
        /// Counted among the locker's locks of its keys from delivery on (see
        /// `joins.rs`): the waiter's hold must end that count.
        counted: bool,
    },
    /// A release of this locker, sent at `sent_at`, put the waiter's entry in the queue
    /// (see `joins.rs`): it waits there now.
    Queued { sent_at: Instant },
    /// Attempt now: the waiter's keys may be its own already (word may have been lost: a
    /// resubscribed channel, an entry its refresher no longer found), or its other keys
    /// are on another script's side (see `lua/queue/queue.lua`).
    Attempt,
}

#[derive(Default)]
pub(crate) struct Mailbox {
    letter: Mutex<Option<Letter>>,
    posted: Condvar,
    /// For a lock's waiter in the queue: its keys, counted among the locker's locks of
    /// them once it is handed them (see `joins.rs`).
    pub(crate) lock_keys: Option<Vec<String>>,
}

impl Mailbox {
    /// A mailbox for a waiter; for a lock's, with its keys (see `lock_keys`).
    pub(crate) fn new(lock_keys: Option<&[String]>) -> Mailbox {
        Mailbox {
            lock_keys: lock_keys.map(<[String]>::to_vec),
            ..Mailbox::default()
        }
    }

    /// Leaves `letter` and wakes the waiter: a hand-over is never replaced, nor word that
    /// the entry was queued by a mere "attempt".
    pub(crate) fn post(&self, letter: Letter) {
        let mut slot = self.letter.lock();
        let keep = matches!(
            (&*slot, &letter),
            (Some(Letter::Handed { .. }), _) | (Some(Letter::Queued { .. }), Letter::Attempt)
        );
        if !keep {
            *slot = Some(letter);
        }
        self.posted.notify_one();
    }

    /// The letter posted, waiting for one until `until` or until `stop` is set (which a
    /// waiter that listens to it hears at once, see `stop.rs`); `None` when none came. A
    /// letter there is taken even when `stop` is set: a hand-over must not go unnoticed.
    pub(crate) fn wait_until(&self, until: Instant, stop: Stop<'_>) -> Option<Letter> {
        let mut slot = self.letter.lock();
        loop {
            if let Some(letter) = slot.take() {
                return Some(letter);
            }
            if stop.is_set() || Instant::now() >= until {
                return None;
            }
            self.posted.wait_until(&mut slot, until);
        }
    }

    /// Wakes the waiter without word (to check its [`Stop`]).
    pub(crate) fn wake(&self) {
        let _slot = self.letter.lock();
        self.posted.notify_all();
    }

    /// The letter posted, if any, without waiting.
    pub(crate) fn take(&self) -> Option<Letter> {
        self.letter.lock().take()
    }
}

/// What a script published on a locker's channel (see `lua/queue/queue.lua`): the value
/// of the waiter it concerns, and the word for it. `None` for anything else (the empty
/// message that wakes the subscriber thread).
pub(crate) fn parse(message: &[u8]) -> Option<(String, Letter)> {
    let message = std::str::from_utf8(message).ok()?;
    let (head, value) = message.split_once(':')?;
    let letter = match head.strip_prefix('h') {
        Some(fences) => Letter::Handed {
            sent_at: None,
            counted: false,
            fences: fences
                .split(',')
                .filter(|fence| !fence.is_empty())
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?,
        },
        None if head == "t" => Letter::Attempt,
        None => return None,
    };
    Some((value.to_owned(), letter))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn messages_name_the_waiter_and_the_word() {
        let handed = Letter::Handed {
            fences: vec![3, 12],
            sent_at: None,
            counted: false,
        };
        assert_eq!(parse(b"h3,12:v:x"), Some(("v:x".into(), handed)));
        let plain = Letter::Handed {
            fences: vec![],
            sent_at: None,
            counted: false,
        };
        assert_eq!(parse(b"h:abc"), Some(("abc".into(), plain)));
        assert_eq!(parse(b"t:abc"), Some(("abc".into(), Letter::Attempt)));
        assert_eq!(parse(b""), None);
        assert_eq!(parse(b"hx:abc"), None);
    }

    #[test]
    fn a_hand_over_is_never_replaced() {
        let mailbox = Mailbox::default();
        let handed = Letter::Handed {
            fences: vec![1],
            sent_at: None,
            counted: false,
        };
        mailbox.post(handed.clone());
        mailbox.post(Letter::Attempt);
        assert_eq!(mailbox.take(), Some(handed));
        assert_eq!(mailbox.take(), None);
    }
}
