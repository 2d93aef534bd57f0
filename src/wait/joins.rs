//! Waiters that join the queue by their own locker's release: a thread that asks for keys
//! another thread of its locker holds leaves its entry here, and the holder's release
//! puts it at the back of the server's queue in the same script (one round trip for the
//! hand-over, none for the join). Only for locks, and only for exactly the same keys.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Instant;

use parking_lot::Mutex;

use super::mailbox::{Letter, Mailbox};

/// The locker's holds and waiting joins, per set of keys (sorted).
#[derive(Default)]
pub(crate) struct Joins {
    state: Mutex<HashMap<Vec<String>, Local>>,
}

#[derive(Default)]
struct Local {
    /// Locks of this locker on exactly these keys (more than one only for a fixed token).
    holds: usize,
    /// Entries to join at the next release, in arrival order.
    waiting: Vec<Pending>,
}

/// An entry left for the next release, and where its waiter hears what became of it.
#[derive(Clone)]
pub(crate) struct Pending {
    pub(crate) member: String,
    mailbox: Arc<Mailbox>,
}

fn sorted(keys: &[String]) -> Vec<String> {
    let mut keys = keys.to_vec();
    keys.sort_unstable();
    keys
}

impl Joins {
    /// A lock of this locker on `keys` began.
    pub(crate) fn hold_began(&self, keys: &[String]) {
        self.state.lock().entry(sorted(keys)).or_default().holds += 1;
    }

    /// A lock of this locker on `keys` is being given up: the entries to join with it.
    pub(crate) fn hold_ending(&self, keys: &[String]) -> Vec<Pending> {
        let mut state = self.state.lock();
        let name = sorted(keys);
        let Some(local) = state.get_mut(&name) else {
            return Vec::new();
        };
        local.holds = local.holds.saturating_sub(1);
        let waiting = std::mem::take(&mut local.waiting);
        if local.holds == 0 {
            state.remove(&name);
        }
        waiting
    }

    /// Leaves `member` for the next release of `keys`, if a lock of this locker holds
    /// them: `false` when none does (the waiter asks for itself).
    pub(crate) fn defer(&self, keys: &[String], member: &str, mailbox: &Arc<Mailbox>) -> bool {
        let mut state = self.state.lock();
        let Some(local) = state.get_mut(&sorted(keys)).filter(|local| local.holds > 0) else {
            return false;
        };
        local.waiting.push(Pending {
            member: member.to_owned(),
            mailbox: Arc::clone(mailbox),
        });
        true
    }

    /// Takes `member` back, unless a release took it already: `true` when taken back.
    pub(crate) fn withdraw(&self, keys: &[String], member: &str) -> bool {
        let mut state = self.state.lock();
        let Some(local) = state.get_mut(&sorted(keys)) else {
            return false;
        };
        let before = local.waiting.len();
        local.waiting.retain(|pending| pending.member != member);
        local.waiting.len() < before
    }
}

impl Pending {
    /// The release sent at `sent_at` put the entry in the queue (or, `None`, failed: the
    /// waiter asks for itself).
    pub(crate) fn joined(&self, sent_at: Option<Instant>) {
        self.mailbox.post(match sent_at {
            Some(sent_at) => Letter::Queued { sent_at },
            None => Letter::Attempt,
        });
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn entries_wait_for_a_hold_of_exactly_their_keys() {
        let joins = Joins::default();
        let mailbox = Arc::new(Mailbox::default());
        assert!(!joins.defer(&keys(&["a"]), "e1", &mailbox), "nothing held");
        joins.hold_began(&keys(&["b", "a"]));
        assert!(!joins.defer(&keys(&["a"]), "e1", &mailbox), "other keys");
        assert!(joins.defer(&keys(&["a", "b"]), "e1", &mailbox));
        assert!(joins.defer(&keys(&["a", "b"]), "e2", &mailbox));
        assert!(joins.withdraw(&keys(&["a", "b"]), "e2"));
        let pending = joins.hold_ending(&keys(&["a", "b"]));
        assert_eq!(pending.len(), 1);
        assert_eq!(pending[0].member, "e1");
        assert!(
            !joins.withdraw(&keys(&["a", "b"]), "e1"),
            "taken by the release"
        );
        assert!(
            !joins.defer(&keys(&["a", "b"]), "e3", &mailbox),
            "no longer held"
        );
    }
}
