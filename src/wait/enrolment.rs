//! A queued waiter's enrolment with its locker's board: where the word of its wait (see
//! `lua/queue/queue.lua`) arrives, whether by message, reply or renewal, and the count of
//! the locker's locks a hand-over starts (see `joins.rs`).

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Instant;

use super::board::{Board, SWEEP};
use super::mailbox::{Letter, Mailbox};

/// A queued waiter's registration: where its word arrives; given up on drop.
pub(crate) struct Enrolment<'a> {
    board: &'a Board,
    value: String,
    pub(crate) mailbox: Arc<Mailbox>,
}

impl Drop for Enrolment<'_> {
    fn drop(&mut self) {
        let mut state = self.board.state.lock();
        if let Some(mailboxes) = state.entries.get_mut(&self.value) {
            mailboxes.retain(|mailbox| !Arc::ptr_eq(mailbox, &self.mailbox));
            if mailboxes.is_empty() {
                state.entries.remove(&self.value);
            }
        }
        drop(state);
        // Nothing is delivered here any more. A lock handed to a waiter that left without
        // it (the release of its place passes it on): its count among the locker's locks
        // ends here.
        if let Some(Letter::Handed { counted: true, .. }) = self.mailbox.take()
            && let Some(keys) = &self.mailbox.lock_keys
        {
            for pending in self.board.joins.hold_ending(keys) {
                pending.joined(None);
            }
        }
        self.board.waiting.fetch_sub(1, Ordering::SeqCst);
        crate::stats::waiting(false);
    }
}

impl Board {
    /// Registers a queued waiter whose entry holds `value` (for a lock, on `lock_keys`),
    /// with any word that came early.
    #[cfg(test)]
    pub(super) fn enrol(&self, value: &str, lock_keys: Option<&[String]>) -> Enrolment<'_> {
        self.enrol_mailbox(value, Arc::new(Mailbox::new(lock_keys)))
    }

    /// [`enrol`](Self::enrol) with a mailbox of the waiter's already.
    pub(super) fn enrol_mailbox(&self, value: &str, mailbox: Arc<Mailbox>) -> Enrolment<'_> {
        let mut state = self.state.lock();
        if let Some((letter, _)) = state.early.remove(value) {
            mailbox.post(self.counting(&mailbox, letter));
        }
        state
            .entries
            .entry(value.to_owned())
            .or_default()
            .push(Arc::clone(&mailbox));
        drop(state);
        self.waiting.fetch_add(1, Ordering::SeqCst);
        crate::stats::waiting(true);
        Enrolment {
            board: self,
            value: value.to_owned(),
            mailbox,
        }
    }

    /// Word for the waiter whose entry holds `value`: to its mailbox, or kept a while for
    /// it (its enrolment may be on its way).
    pub(super) fn deliver(&self, value: &str, letter: Letter) {
        let mut state = self.state.lock();
        match state
            .entries
            .get(value)
            .and_then(|mailboxes| mailboxes.first())
        {
            Some(mailbox) => mailbox.post(self.counting(mailbox, letter)),
            None => {
                let now = Instant::now();
                state
                    .early
                    .retain(|_, (_, at)| now.duration_since(*at) < SWEEP);
                state.early.insert(value.to_owned(), (letter, now));
            }
        }
    }

    /// `letter` for `mailbox`: a lock handed to a waiter counts among the locker's locks of
    /// its keys from now on, before the waiter wakes (a thread asking for them meanwhile
    /// waits for its release, see `joins.rs`).
    fn counting(&self, mailbox: &Mailbox, letter: Letter) -> Letter {
        match (letter, &mailbox.lock_keys) {
            (
                Letter::Handed {
                    fences,
                    sent_at,
                    counted: false,
                },
                Some(keys),
            ) => {
                self.joins.hold_began(keys);
                Letter::Handed {
                    fences,
                    sent_at,
                    counted: true,
                }
            }
            (letter, _) => letter,
        }
    }

    /// The locker's own channel was (re)subscribed: word sent before may have been missed,
    /// so every queued waiter asks for itself.
    pub(super) fn own_channel_subscribed(&self) {
        for mailboxes in self.state.lock().entries.values() {
            for mailbox in mailboxes {
                mailbox.post(Letter::Attempt);
            }
        }
    }
}
