//! The in-process queue: threads of one locker that wait for the same keys wait in line,
//! in arrival order. Only the first in line talks to Redis; the others sleep on a wake-up
//! of their own until they are first. A release by the same locker may hand the lock
//! straight to the first in line (see [`Lines::claim`]).
//!
//! A line is for one set of keys, exactly: waiters for overlapping but different sets
//! (`[a]` and `[a, b]`) are in different lines and meet in Redis, as waiters of different
//! lockers do. A line per key would make a waiter for `[a, b]` hold `a` back from a
//! thread that already holds `b` and asks for `a`: both would wait for ever. Waiters for
//! the same keys never need anything from each other but those keys, so their line adds
//! no wait that was not there.
//!
//! (Over 400 lines: nearly half of it is the unit tests of the line's rules, beside them.)

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;
use std::time::{Duration, Instant};

use parking_lot::Condvar;

use crate::backend::Replicas;
use crate::hold::Kind;

/// A streak of hand-overs ends after this many in a row while others listen for the
/// keys' releases (other lockers, as the last real release's announcement counted them),
/// or after [`STREAK_TIME`] in any case: the next release of those keys is a real one,
/// announced, so that waiters elsewhere (which no hand-over reaches) get their chance.
const STREAK_HANDOVERS: u32 = 4;
/// See [`STREAK_HANDOVERS`]: the bound for waiters elsewhere that do not listen.
const STREAK_TIME: Duration = Duration::from_millis(10);
/// A streak this old is over whatever it counted: forgotten once its line is gone.
const STALE: Duration = Duration::from_millis(100);
/// After a real release that others heard, how long this locker's first in line waits
/// before it attempts: the others hear of it later than it does (one more hop), and would
/// otherwise lose nearly every race.
const HEAD_START: Duration = Duration::from_micros(250);

/// What a releasing guard needs to take the keys for a waiter: the waiter's own value and
/// TTL, in the waiter's key order.
#[derive(Debug)]
pub(crate) struct Offer {
    pub(crate) kind: Kind,
    /// The keys as stored in Redis.
    pub(crate) keys: Vec<String>,
    pub(crate) value: String,
    pub(crate) owner_len: usize,
    pub(crate) ttl_ms: u64,
    pub(crate) fencing: bool,
    pub(crate) fixed_token: bool,
    /// Held only once this many replicas acknowledged it: never handed over.
    pub(crate) replicas: Option<Replicas>,
}

/// How a claim on a waiter ended.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(super) enum Handover {
    /// The lock is the waiter's now: its fencing tokens, and when the request was sent.
    Done { fences: Vec<u64>, sent_at: Instant },
    /// Not handed over (the lock was gone, or the backend cannot): the waiter attempts
    /// by itself.
    Declined,
    /// Redis failed during the hand-over: it may have run, leaving the keys in the
    /// waiter's name. The waiter attempts by itself (its own value re-obtains them), or,
    /// past its deadline, says Redis failed.
    Failed,
}

#[derive(Default)]
pub(super) struct Lines {
    next_id: u64,
    /// Per set of keys (sorted), the waiters for exactly that set, in arrival order.
    lines: HashMap<Vec<String>, VecDeque<u64>>,
    /// Per key, the sets with a line that contain it: whom a release of it concerns.
    sets: HashMap<String, Vec<Vec<String>>>,
    places: HashMap<u64, Place>,
    /// Hand-overs in a row per set of keys (sorted), since the last real release (which
    /// forgets it when no one waits for the set any more).
    streaks: HashMap<Vec<String>, Streak>,
}

struct Place {
    /// The keys sorted: the line's name (a lock is handed over only to a waiter for
    /// exactly its keys).
    sorted: Vec<String>,
    wake: Arc<Condvar>,
    offer: Arc<Offer>,
    /// Asleep in a wait (not in the middle of an attempt of its own).
    asleep: bool,
    /// First in line since a waiter ahead of it left without the lock: attempt now.
    turn: bool,
    claim: Claim,
}

#[derive(PartialEq, Eq)]
enum Claim {
    Free,
    /// A releasing guard is handing the lock over right now.
    Pending,
    Ended(Handover),
}

struct Streak {
    count: u32,
    since: Instant,
    /// Whether the last real release reached listeners other than this locker (until
    /// one is seen: assumed).
    others: bool,
    /// Until then, after a real release that others heard, this locker does not attempt.
    head_start: Option<Instant>,
}

impl Streak {
    fn new(others: bool) -> Streak {
        let now = Instant::now();
        Streak {
            count: 0,
            since: now,
            others,
            head_start: others.then(|| now + HEAD_START),
        }
    }

    fn is_over(&self) -> bool {
        (self.others && self.count >= STREAK_HANDOVERS) || self.since.elapsed() >= STREAK_TIME
    }
}

impl Lines {
    /// Puts a waiter at the back of the line for its keys; its id, and the wake-up it
    /// sleeps on.
    pub(super) fn join(&mut self, offer: Arc<Offer>) -> (u64, Arc<Condvar>) {
        let id = self.next_id;
        self.next_id += 1;
        let sorted = line_name(&offer);
        let line = self.lines.entry(sorted.clone()).or_default();
        if line.is_empty() {
            for key in sorted.iter().filter(|key| !key.is_empty()) {
                self.sets
                    .entry(key.clone())
                    .or_default()
                    .push(sorted.clone());
            }
        }
        line.push_back(id);
        let wake = Arc::new(Condvar::new());
        let place = Place {
            sorted,
            wake: Arc::clone(&wake),
            offer,
            asleep: false,
            turn: false,
            claim: Claim::Free,
        };
        self.places.insert(id, place);
        (id, wake)
    }

    /// Takes a waiter out of its line. Whoever is first now is woken to attempt when the
    /// one that left did not get the lock (it gave up); when it got the lock, the next
    /// stays asleep, to be handed it, or woken by its release.
    pub(super) fn leave(&mut self, id: u64, with_lock: bool) {
        let Some(place) = self.places.remove(&id) else {
            return;
        };
        let Some(line) = self.lines.get_mut(&place.sorted) else {
            return;
        };
        let was_first = line.front() == Some(&id);
        line.retain(|&other| other != id);
        match line.front() {
            None => {
                self.lines.remove(&place.sorted);
                // Streaks of sets no one has waited for in a while are over anyway: keep
                // the map from growing with every set of keys ever contended.
                let lines = &self.lines;
                self.streaks.retain(|set, streak| {
                    lines.contains_key(set) || streak.since.elapsed() < STALE
                });
                for key in &place.sorted {
                    if let Some(sets) = self.sets.get_mut(key) {
                        sets.retain(|set| *set != place.sorted);
                        if sets.is_empty() {
                            self.sets.remove(key);
                        }
                    }
                }
            }
            // A permit leaves others free: the next may find one too.
            Some(&next) if was_first && (!with_lock || place.offer.kind != Kind::Lock) => {
                if let Some(next) = self.places.get_mut(&next) {
                    next.turn = true;
                    next.wake.notify_one();
                }
            }
            Some(_) => {}
        }
    }

    /// Until when the waiter leaves others the first attempt after a real release.
    pub(super) fn head_start(&self, id: u64) -> Option<Instant> {
        let place = self.places.get(&id)?;
        self.streaks.get(&place.sorted)?.head_start
    }

    /// Whether the waiter became first in line since a waiter ahead of it gave up (once).
    pub(super) fn take_turn(&mut self, id: u64) -> bool {
        self.places
            .get_mut(&id)
            .is_some_and(|place| std::mem::take(&mut place.turn))
    }

    /// Whether a newcomer for `keys` gets in line without asking Redis first: while they
    /// pass between threads of this locker by hand-overs (an attempt could only find them
    /// held), and during the head start this locker leaves others after a real release.
    /// Otherwise (the streak over, or never begun) the keys may be free or held elsewhere,
    /// and the newcomer asks.
    pub(super) fn defers(&self, offer: &Offer) -> bool {
        self.streaks.get(&line_name(offer)).is_some_and(|streak| {
            (streak.count > 0 && !streak.is_over())
                || streak.head_start.is_some_and(|at| Instant::now() < at)
        })
    }

    /// Whether the waiter is first in its line.
    pub(super) fn is_first(&self, id: u64) -> bool {
        self.places.get(&id).is_some_and(|place| {
            self.lines.get(&place.sorted).and_then(VecDeque::front) == Some(&id)
        })
    }

    /// Wakes the first in every line whose keys include `key` (a release of it was heard,
    /// or its subscription confirmed).
    pub(super) fn wake_front(&self, key: &str) {
        for set in self.sets.get(key).into_iter().flatten() {
            if let Some(place) = self
                .lines
                .get(set)
                .and_then(VecDeque::front)
                .and_then(|id| self.places.get(id))
            {
                place.wake.notify_one();
            }
        }
    }

    pub(super) fn set_asleep(&mut self, id: u64, asleep: bool) {
        if let Some(place) = self.places.get_mut(&id) {
            place.asleep = asleep;
        }
    }

    /// For a guard releasing `keys` (as stored): the waiter to hand the lock to, if one
    /// waits for exactly these keys, is first in line on all of them, is asleep, and the
    /// keys' streak of hand-overs is not over. Marks it claimed: it stays in line until
    /// [`end_claim`](Self::end_claim). When the streak is over, it is reset, and `None`
    /// makes this release a real one.
    pub(super) fn claim(&mut self, keys: &[String]) -> Option<(u64, Arc<Offer>)> {
        let sorted = sorted(keys);
        let id = *self.lines.get(&sorted)?.front()?;
        if self.streaks.get(&sorted).is_some_and(Streak::is_over) {
            self.streaks.remove(&sorted);
            return None;
        }
        let place = self.places.get_mut(&id)?;
        // (A lock's line: shared holds wait in lines of their own, see `line_name`.)
        if !place.asleep || place.claim != Claim::Free {
            return None;
        }
        place.claim = Claim::Pending;
        Some((id, Arc::clone(&place.offer)))
    }

    /// Ends a claim, and wakes the waiter to take what it says.
    pub(super) fn end_claim(&mut self, id: u64, handover: Handover) {
        let Some(place) = self.places.get_mut(&id) else {
            return;
        };
        if let Handover::Done { .. } = handover {
            let streak = self
                .streaks
                .entry(place.sorted.clone())
                .or_insert_with(|| Streak::new(true));
            streak.count += 1;
        }
        place.claim = Claim::Ended(handover);
        place.wake.notify_one();
    }

    /// A real release of `keys`, whose announcement reached `others` (listeners other than
    /// this locker): a new streak of hand-overs starts, bounded as they say.
    pub(super) fn released_for_real(&mut self, keys: &[String], others: bool) {
        // Locks and shared holds of these keys wait in lines of their own: both get the
        // new streak (a shared line, only its head start).
        let sorted = sorted(keys);
        let shared = shared_name(sorted.clone());
        for name in [sorted, shared] {
            if self.lines.contains_key(&name) {
                self.streaks.insert(name, Streak::new(others));
            } else {
                self.streaks.remove(&name);
            }
        }
    }

    /// Whether a claim on the waiter is under way.
    pub(super) fn is_claimed(&self, id: u64) -> bool {
        self.places
            .get(&id)
            .is_some_and(|place| place.claim == Claim::Pending)
    }

    /// How a claim on the waiter ended, once: it is free again after this.
    pub(super) fn take_handover(&mut self, id: u64) -> Option<Handover> {
        let place = self.places.get_mut(&id)?;
        match std::mem::replace(&mut place.claim, Claim::Free) {
            Claim::Ended(handover) => Some(handover),
            other => {
                place.claim = other;
                None
            }
        }
    }
}

/// The name of the line `offer` waits in: its keys sorted, and for a hold that others may
/// share (a read lock, a permit), an empty string first, which no key is. Locks and shared
/// holds of the same keys wait in lines of their own: in one line, a reader first in line
/// that waits behind a lock's intent (see `lua/read/acquire.lua`) would keep that very
/// lock, behind it, from ever attempting.
fn line_name(offer: &Offer) -> Vec<String> {
    let name = sorted(&offer.keys);
    if offer.kind == Kind::Lock {
        name
    } else {
        shared_name(name)
    }
}

/// The name of the line of shared holds of `sorted` keys.
fn shared_name(mut sorted: Vec<String>) -> Vec<String> {
    sorted.insert(0, String::new());
    sorted
}

/// `keys` sorted: the name of their lock's line.
fn sorted(keys: &[String]) -> Vec<String> {
    let mut sorted = keys.to_vec();
    sorted.sort_unstable();
    sorted
}

#[cfg(test)]
mod tests {
    use super::*;

    fn offer(keys: &[&str]) -> Arc<Offer> {
        Arc::new(Offer {
            kind: Kind::Lock,
            keys: keys.iter().map(|k| k.to_string()).collect(),
            value: "v".into(),
            owner_len: 1,
            ttl_ms: 1000,
            fencing: false,
            fixed_token: false,
            replicas: None,
        })
    }

    fn shared(keys: &[&str]) -> Arc<Offer> {
        Arc::new(Offer {
            kind: Kind::Read,
            ..Arc::try_unwrap(offer(keys)).expect("just made")
        })
    }

    #[test]
    fn locks_and_shared_holds_of_the_same_keys_wait_in_lines_of_their_own() {
        let mut lines = Lines::default();
        let (reader, _) = lines.join(shared(&["k"]));
        let (lock, _) = lines.join(offer(&["k"]));
        let (second_reader, _) = lines.join(shared(&["k"]));
        // The lock attempts though a reader came first: that reader may be waiting for
        // this very lock's intent to go.
        assert!(lines.is_first(reader) && lines.is_first(lock));
        assert!(!lines.is_first(second_reader));
        lines.set_asleep(reader, true);
        lines.set_asleep(lock, true);
        let (claimed, _) = lines.claim(&keys(&["k"])).expect("the lock's line");
        assert_eq!(
            claimed, lock,
            "a lock is handed over to a lock, never to a reader"
        );
        // A reader that gets in lets the next reader attempt at once.
        lines.leave(reader, true);
        assert!(lines.take_turn(second_reader));
        // A real release that others heard gives them their head start on both lines.
        lines.released_for_real(&keys(&["k"]), true);
        assert!(lines.head_start(second_reader).is_some());
        assert!(lines.head_start(lock).is_some());
        // (Whether a newcomer defers depends on the clock: the head start is 250 µs.)
    }

    fn keys(names: &[&str]) -> Vec<String> {
        names.iter().map(|k| k.to_string()).collect()
    }

    #[test]
    fn waiters_are_first_in_arrival_order() {
        let mut lines = Lines::default();
        let (a, _) = lines.join(offer(&["k"]));
        let (b, _) = lines.join(offer(&["k"]));
        assert!(lines.is_first(a) && !lines.is_first(b));
        lines.leave(a, false);
        assert!(lines.is_first(b));
        lines.leave(b, false);
        assert!(lines.lines.is_empty());
    }

    #[test]
    fn waiters_for_other_sets_of_keys_are_not_in_the_same_line() {
        let mut lines = Lines::default();
        let (ab, _) = lines.join(offer(&["a", "b"]));
        let (a, _) = lines.join(offer(&["a"]));
        let (ba, _) = lines.join(offer(&["b", "a"]));
        // `[a]` is not held back by `[a, b]`: a thread holding `b` may want `a`.
        assert!(lines.is_first(ab) && lines.is_first(a));
        assert!(!lines.is_first(ba), "the same set, in any order: one line");
        assert_eq!(lines.lines.len(), 2, "[a, b] and [a]");
        lines.leave(ab, false);
        assert!(lines.is_first(ba));
        assert!(lines.take_turn(ba), "the one ahead gave up: attempt now");
    }

    #[test]
    fn only_an_asleep_first_waiter_for_the_same_keys_is_claimed() {
        let mut lines = Lines::default();
        let (w, _) = lines.join(offer(&["b", "a"]));
        assert!(lines.claim(&keys(&["a", "b"])).is_none(), "awake");
        lines.set_asleep(w, true);
        assert!(lines.claim(&keys(&["a"])).is_none(), "other keys");
        let (id, _) = lines.claim(&keys(&["a", "b"])).unwrap();
        assert_eq!(id, w);
        assert!(lines.is_claimed(w));
        assert!(lines.claim(&keys(&["a", "b"])).is_none(), "claimed once");
        lines.end_claim(w, Handover::Declined);
        assert_eq!(lines.take_handover(w), Some(Handover::Declined));
        assert_eq!(lines.take_handover(w), None);
    }

    #[test]
    fn a_streak_of_hand_overs_ends_in_a_real_release_when_others_listen() {
        let mut lines = Lines::default();
        let k = keys(&["k"]);
        let (mut w, _) = lines.join(offer(&["k"]));
        for _ in 0..STREAK_HANDOVERS {
            lines.set_asleep(w, true);
            let (id, _) = lines.claim(&k).unwrap();
            let done = Handover::Done {
                fences: Vec::new(),
                sent_at: Instant::now(),
            };
            lines.end_claim(id, done);
            // The next waiter is in line before this one leaves with the lock.
            let (next, _) = lines.join(offer(&["k"]));
            lines.leave(id, true);
            w = next;
        }
        lines.set_asleep(w, true);
        assert!(lines.claim(&k).is_none(), "the streak is over");
        assert!(lines.claim(&k).is_some(), "and starts again");
    }

    #[test]
    fn streaks_of_sets_no_one_waits_for_are_forgotten() {
        let mut lines = Lines::default();
        for i in 0..100 {
            let (w, _) = lines.join(offer(&[&format!("k{i}")]));
            lines.set_asleep(w, true);
            let (id, _) = lines.claim(&keys(&[&format!("k{i}")])).unwrap();
            let done = Handover::Done {
                fences: Vec::new(),
                sent_at: Instant::now(),
            };
            lines.end_claim(id, done);
            lines.leave(id, true);
        }
        std::thread::sleep(STALE);
        let (w, _) = lines.join(offer(&["last"]));
        lines.leave(w, false);
        assert!(
            lines.streaks.is_empty(),
            "{} streaks left",
            lines.streaks.len()
        );
    }

    #[test]
    fn with_no_one_else_listening_only_time_ends_a_streak() {
        let mut lines = Lines::default();
        let k = keys(&["k"]);
        let (w, _) = lines.join(offer(&["k"]));
        lines.set_asleep(w, true);
        lines.released_for_real(&k, false);
        for _ in 0..10 * STREAK_HANDOVERS {
            let (id, _) = lines.claim(&k).expect("no count bound");
            let done = Handover::Done {
                fences: Vec::new(),
                sent_at: Instant::now(),
            };
            lines.end_claim(id, done);
            assert!(lines.take_handover(id).is_some());
        }
        std::thread::sleep(STREAK_TIME);
        assert!(lines.claim(&k).is_none(), "the time bound");
    }
}
