//! [`Leadership`]: one term of an election, held; resigned on drop.

use std::fmt;
use std::time::Duration;

use super::Election;
use crate::backend::{Found, parse_written, proclaim_call};
use crate::hold::Holding;
use crate::{Error, Result};

/// One term of an [`Election`]: this candidate leads until it resigns (or drops this), or
/// its lease is lost. Made by [`Election::campaign`] and its siblings; campaigning again
/// gives a new `Leadership` with a new, larger term. `Send`; it may outlive its `Locker`.
///
/// There is no "is leader" flag anywhere else: this value is the term, and
/// [`is_lost`](Self::is_lost) only ever turns from `false` to `true`.
///
/// # Step down first
/// [`is_lost`](Self::is_lost) turns `true` before the server can let the next candidate in:
/// it counts the lease from when the last renewal that succeeded was *sent*, less 1% of
/// the TTL and 2 ms for a server clock running a little fast. A leader checks it before
/// each step, stops acting once it is `true`, and passes [`term`](Self::term) to every
/// write that must not come from a stale leader ([`fenced_set`](Self::fenced_set), or the
/// resource's own check: see the [election chapter](crate::guide::election)). A pause
/// (GC, SIGSTOP) between the check and the write is what the term is for.
#[must_use = "if unused the leadership is resigned at once"]
pub struct Leadership {
    /// Dropped first: gives the term up (the release hands it to the next candidate)...
    holding: Holding,
    /// ...then tells the observers.
    election: Announced,
    term: u64,
    value: String,
}

/// The election, whose observers are told when it drops (after the term was given up).
struct Announced(Election);

impl Drop for Announced {
    fn drop(&mut self) {
        self.0.announce();
    }
}

impl Leadership {
    /// The term `holding` (the election's lock, taken with fencing) is.
    pub(super) fn new(election: Election, holding: Holding) -> Result<Leadership> {
        let held = holding.held();
        let Some(&term) = held.fences.first() else {
            // Never: every campaign takes the lock with fencing. Given up by the drop.
            return Err(Error::Redis(redis::RedisError::from((
                redis::ErrorKind::UnexpectedReturnType,
                "an election's lock was taken without a term",
            ))));
        };
        let value = held.metadata().to_owned();
        // A term a release handed over lasts what the candidate's place in the queue had
        // left (about a second) until the refresher's next turn: a leader starts with its
        // whole lease, so that `valid_for` means what it says.
        let ttl = Duration::from_millis(held.timing().ttl_ms);
        if holding.valid_for() < ttl / 2 {
            holding.refresh(ttl)?;
        }
        log::debug!(
            "redguard: election {:?}: term {term} leads",
            election.name()
        );
        election.announce();
        Ok(Leadership {
            holding,
            election: Announced(election),
            term,
            value,
        })
    }

    /// This term: larger than every earlier term of the election (minted by the script
    /// that made this candidate the leader, from a counter that outlives leaders), also
    /// when the same process or value leads again. Use it as the fencing token of every
    /// write this leader makes.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// What this leader advertises: the value it campaigned with, or the one it proclaimed
    /// last.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// The election this term is of.
    pub fn election(&self) -> &Election {
        &self.election.0
    }

    /// `true` once this term is over for this process: the refresher found the lease gone,
    /// or it ran out by this process's clock before a renewal succeeded (counted from
    /// before the renewal was sent, less the drift allowance: before the server can hand
    /// the election to another candidate). Never goes back to `false`. No round trip.
    ///
    /// While this host is suspended its clock stops and the server's does not: after a
    /// resume this can say `false` for a lease the server has already expired, until the
    /// refresher finds it gone. [`term`](Self::term) is what protects the writes then.
    pub fn is_lost(&self) -> bool {
        self.holding.is_lost()
    }

    /// How long this process still counts itself the leader without a renewal, by its own
    /// clock; zero once lost. A leader with a deadline of its own stops before it.
    pub fn valid_for(&self) -> Duration {
        self.holding.valid_for()
    }

    /// Sets the lease to `ttl` from now, if this term still leads; with auto-refresh on,
    /// later renewals use this TTL too. As [`LockGuard::refresh`](crate::LockGuard::refresh).
    ///
    /// # Errors
    /// As [`LockGuard::refresh`](crate::LockGuard::refresh): [`Error::LockLost`] when the
    /// term is over (nothing is changed).
    pub fn refresh(&self, ttl: Duration) -> Result<()> {
        self.holding.refresh(ttl)
    }

    /// Advertises `value` instead, for the rest of this term (same term; observers are
    /// told). It takes `&mut self` since [`value`](Self::value) changes with it.
    ///
    /// # Errors
    /// [`Error::LockLost`] when this candidate no longer leads (nothing is changed, and the
    /// term counts as lost from then on); [`Error::WrongType`] when the key the value is
    /// kept in holds another type; [`Error::Redis`] or [`Error::Pool`] when Redis cannot be
    /// asked.
    pub fn proclaim(&mut self, value: &str) -> Result<()> {
        if self.holding.is_lost() {
            return Err(Error::LockLost);
        }
        let election = &self.election.0;
        let keys = election.keys();
        let stored = &self.holding.held().value;
        let call = proclaim_call(keys, stored, self.term, value, election.channel());
        let slot_keys = [keys[0].as_str(), keys[2].as_str()];
        let backend = &election.shared().backend;
        match backend.run_in_slot(&slot_keys, &call, parse_written)? {
            Found::Yes(true) => {
                self.value = value.to_owned();
                Ok(())
            }
            Found::Yes(false) => {
                self.holding.held().mark_lost();
                Err(Error::LockLost)
            }
            Found::WrongType { key, kind } => Err(Error::WrongType { key, kind }),
        }
    }

    /// Writes `value` at `key` (a plain string other clients can GET, its TTL if any
    /// kept; after the locker's prefix) unless a later term has written it: `Ok(false)` then, and nothing is
    /// changed. One script: a stale leader that wakes from a pause after its successor
    /// wrote can never overwrite it. The largest term that wrote `key` is kept beside it
    /// (`redguard:fenced:{<key>}`, in its Cluster slot, no TTL); a key written only by
    /// this election's leaders is fenced by its terms. It checks the term, not the lease:
    /// check [`is_lost`](Self::is_lost) first, and let this refuse what slips past.
    ///
    /// # Errors
    /// [`Error::InvalidInput`] for an empty key, or on a cluster a key whose record could
    /// not share its slot (a `}` without a hash tag); [`Error::WrongType`] when `key` holds
    /// another type (left untouched); [`Error::Redis`] or [`Error::Pool`] when Redis
    /// cannot be asked; [`Error::NotReplicated`] for a campaign with
    /// [`replicas(n)`](crate::LockOptions::replicas) when fewer replicas acknowledged the
    /// write in time (it is on the master, and a failover may forget it).
    pub fn fenced_set(&self, key: &str, value: &str) -> Result<bool> {
        self.holding.fenced_set(key, value)
    }

    /// Gives the term up at once (the next candidate in line leads), and tells observers.
    ///
    /// # Errors
    /// [`Error::LockLost`] when the term was already over (lost, or taken over);
    /// [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked (the lease then
    /// expires with its TTL).
    pub fn resign(self) -> Result<()> {
        let Leadership {
            holding, election, ..
        } = self;
        let resigned = holding.release();
        drop(election); // tells the observers, now that the term is given up
        resigned
    }
}

impl fmt::Debug for Leadership {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Leadership")
            .field("election", &self.election.0.name())
            .field("term", &self.term)
            .field("value", &self.value)
            .field("lost", &self.is_lost())
            .finish_non_exhaustive()
    }
}
