//! A waiter's place in the server's queue (see `lua/queue/queue.lua`): its entry, kept
//! alive by the locker's refresher like a hold; where word of it arrives; and, should the
//! waiter stop waiting, the script that takes the entry out (and passes on a hold given to
//! it at that very moment).

use std::sync::Arc;
use std::time::{Duration, Instant};

use super::{Held, Kind, Timing};
use crate::backend::{Queue, Release, entry_keys};
use crate::shared::Shared;
use crate::wait::{Enrolment, Letter, Mailbox, Stop};
use crate::{Error, Result};

/// Who waits: its kind, keys and value, its entry in the queue, and the number that names
/// its wait in the word to it.
pub(crate) struct Waiter<'a> {
    pub(crate) kind: Kind,
    pub(crate) keys: &'a [String],
    pub(crate) value: &'a str,
    pub(crate) member: &'a str,
    pub(crate) wait: &'a str,
}

/// What a queued waiter heard.
pub(crate) enum Word {
    /// A script gave it its hold, with these fencing tokens (the script sent at that
    /// time, when known; counted among the locker's locks of its keys: see
    /// `wait::Pending`).
    Handed(Vec<u64>, Option<Instant>, bool),
    /// It should ask Redis now (see [`Letter::Attempt`]).
    Attempt,
    /// Nothing, until the time it waited for.
    Timeout,
    /// Nothing, and its [`Stop`] was set.
    Stopped,
}

/// A queued waiter's entry, from the reply that queued it until it is served or leaves.
pub(crate) struct Place<'a> {
    shared: &'a Shared,
    kind: Kind,
    keys: &'a [String],
    /// The waiter's value (what a hold given to it stores).
    value: &'a str,
    /// The entry, as the scripts know it (see `scripts::queue_entry`).
    member: &'a str,
    enrolment: Enrolment<'a>,
    /// The entry as the refresher renews it: its timing says when the last renewal that
    /// found it queued was sent.
    entry: Arc<Held>,
    /// Set once the waiter has its hold: nothing to take out then.
    served: bool,
    /// When the refresher takes the entry on, if it is not served by then: most waits
    /// are shorter than that, and cost the refresher nothing (see `wait_until`).
    renew_from: Option<Instant>,
    /// When the last renewal of an entry this place replaced (`requeued`) was sent: a word
    /// of a hand-over to that entry may still be on its way, and names the wait, not the
    /// entry, so a hold from a word is counted from here (see `claim`).
    replaced_at: Option<Instant>,
}

impl<'a> Place<'a> {
    /// The place an attempt sent at `sent_at` found (or took) for the waiter whose entry
    /// is `member`, on `keys`.
    pub(crate) fn new(
        shared: &'a Shared,
        waiter: Waiter<'a>,
        sent_at: Instant,
        enrolment: Option<Enrolment<'a>>,
    ) -> Result<Place<'a>> {
        let Waiter {
            kind,
            keys,
            value,
            member,
            wait,
        } = waiter;
        let lock_keys = (kind == Kind::Lock).then_some(keys);
        let enrolment = enrolment.unwrap_or_else(|| shared.subscriber.enrol(wait, lock_keys));
        let entry = entry(shared, kind, keys, member, sent_at, &enrolment);
        Ok(Place {
            shared,
            kind,
            keys,
            value,
            member,
            enrolment,
            entry,
            served: false,
            renew_from: Some(sent_at + shared.waiter_lifetime / 6),
            replaced_at: None,
        })
    }

    /// Waits until `until` for word of the waiter's entry, or until `stop` is set (a
    /// waiter listening to it with [`mailbox`](Self::mailbox) hears that at once). A wait
    /// that goes on past a sixth of the entry's lifetime has the refresher take the entry
    /// on then (its first renewal is due at a third).
    /// An error when the refresher could not take it on.
    pub(crate) fn wait_until(&mut self, until: Instant, stop: Stop<'_>) -> Result<Word> {
        if let Some(renew_from) = self.renew_from {
            let word = self.wait_once(until.min(renew_from), stop);
            if !matches!(word, Word::Timeout) || Instant::now() >= until {
                return Ok(word);
            }
            self.renew()?;
        }
        Ok(self.wait_once(until, stop))
    }

    /// Where word of the entry arrives.
    pub(crate) fn mailbox(&self) -> &Arc<Mailbox> {
        &self.enrolment.mailbox
    }

    /// Has the refresher renew the entry from now on.
    fn renew(&mut self) -> Result<()> {
        self.renew_from = None;
        self.shared
            .refresher
            .add(Arc::clone(&self.entry))
            .map_err(Error::Refresher)
    }

    fn wait_once(&mut self, until: Instant, stop: Stop<'_>) -> Word {
        match self.enrolment.mailbox.wait_until(until, stop) {
            Some(Letter::Handed {
                fences,
                sent_at,
                counted,
            }) => {
                self.served = true;
                Word::Handed(fences, sent_at, counted)
            }
            // (Queued: word from before the place, which changes nothing: asking is safe.)
            Some(Letter::Attempt | Letter::Queued { .. }) => Word::Attempt,
            None if stop.is_set() => Word::Stopped,
            None => Word::Timeout,
        }
    }

    /// A hold given to the waiter and not yet taken from its mailbox: its fences, and when
    /// the script was sent if known.
    pub(crate) fn handed_meanwhile(&mut self) -> Option<(Vec<u64>, Option<Instant>, bool)> {
        match self.enrolment.mailbox.take()? {
            Letter::Handed {
                fences,
                sent_at,
                counted,
            } => {
                self.served = true;
                Some((fences, sent_at, counted))
            }
            Letter::Attempt | Letter::Queued { .. } => None,
        }
    }

    /// An attempt sent at `sent_at` found the waiter queued (again): should the refresher
    /// have given up on its entry (found gone, or not renewed in time), it takes it on
    /// anew.
    pub(crate) fn requeued(&mut self, sent_at: Instant) -> Result<()> {
        self.served = false;
        if !self.entry.is_lost() {
            return Ok(());
        }
        let replaced = self.entry.timing().sent_at();
        self.replaced_at = Some(self.replaced_at.map_or(replaced, |at| at.min(replaced)));
        self.entry.end();
        self.shared.refresher.remove(self.entry.id);
        let (shared, kind, keys, member) = (self.shared, self.kind, self.keys, self.member);
        self.entry = entry(shared, kind, keys, member, sent_at, &self.enrolment);
        self.renew()
    }

    /// The waiter took its hold by an attempt of its own (which took the entry out).
    pub(crate) fn served(&mut self) {
        self.served = true;
    }

    /// How long a hold given to the waiter is sure to last, by this process's clock: the
    /// script gave it what the entry had left, and no more than `ttl_ms`. The entry lives
    /// its lifetime from the last renewal that found it queued (sent before the script
    /// ran), and the script ran after `script_sent`, when known.
    ///
    /// A word from the channel (no `script_sent`) names the wait, not the entry: after a
    /// requeue it may be a late one for the entry replaced, whose hold was counted from
    /// that entry's renewals and may be over (and the keys someone else's). Such a hold is
    /// counted from the replaced entry's last renewal, so that `confirmed` asks the server
    /// before anyone relies on it.
    pub(crate) fn claim(&self, ttl_ms: u64, script_sent: Option<Instant>) -> Timing {
        let renewed = self.entry.timing();
        let (base, lifetime_ms) = (renewed.sent_at(), renewed.ttl_ms);
        let Some(sent_at) = script_sent else {
            let base = self.replaced_at.map_or(base, |replaced| replaced.min(base));
            return Timing::claimed(ttl_ms, base, lifetime_ms.min(ttl_ms));
        };
        let by_entry = Timing::claimed(ttl_ms, base, lifetime_ms);
        let by_script = Timing::claimed(ttl_ms, sent_at, ttl_ms);
        match by_script.expires_at() < by_entry.expires_at() {
            true => by_script,
            false => by_entry,
        }
    }
}

impl Drop for Place<'_> {
    fn drop(&mut self) {
        // The refresher stops renewing it first: what it finds from now on is no news.
        self.entry.end();
        if self.renew_from.is_none() {
            self.shared.refresher.remove(self.entry.id);
        }
        if self.served {
            return;
        }
        // Out of the queue; a hold given to us meanwhile goes to the next (best effort:
        // the entry lapses within its lifetime anyway, and such a hold with it).
        let release = Release {
            kind: self.kind,
            keys: self.keys,
            value: self.value,
            prefix: &self.shared.prefix,
            queue: Some(Queue {
                channel: self.shared.subscriber.channel(),
                entry: Some(self.member),
                lifetime_ms: millis(self.shared.waiter_lifetime),
            }),
            announce: self.shared.announce(),
            joins: &[],
        };
        let sent_at = Instant::now();
        if let Ok(released) = self.shared.backend.release(&release) {
            self.shared.subscriber.handed(released.handed, sent_at);
        }
    }
}

/// The entry `member` on `keys`, set by a request sent at `sent_at`, as the refresher
/// renews it (it tells `enrolment`'s mailbox when it no longer finds it queued).
fn entry(
    shared: &Shared,
    kind: Kind,
    keys: &[String],
    member: &str,
    sent_at: Instant,
    enrolment: &Enrolment<'_>,
) -> Arc<Held> {
    let timing = Timing::new(millis(shared.waiter_lifetime), sent_at);
    let all = entry_keys(&shared.prefix, keys);
    let held = Held::new(kind, all, member.to_owned(), 0..0, Vec::new(), timing);
    Arc::new(held.queued(keys.len(), Arc::clone(&enrolment.mailbox)))
}

/// `duration` in whole milliseconds, at least 1.
pub(crate) fn millis(duration: Duration) -> u64 {
    u64::try_from(duration.as_millis())
        .unwrap_or(u64::MAX)
        .max(1)
}
