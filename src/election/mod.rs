//! Leader election: [`Election`] (campaign, who leads, observe), [`Leadership`] (one term,
//! in `leadership.rs`) and [`Observer`] (each change of leader, in `observer.rs`).
//!
//! A candidate is a lock waiter on the election's one key, taken with fencing: it waits in
//! the key's queue on the server, in arrival order; the script that makes it the leader
//! (an acquire, or the release that hands the key over) raises the key's fencing counter,
//! and that number is its term. Its lease is kept by the locker's refresher like any hold.

mod leadership;
mod observer;

use std::fmt;
use std::sync::Arc;
use std::time::{Duration, Instant};

pub use leadership::Leadership;
pub use observer::Observer;

use crate::backend::{Found, Led, election_keys, leader_call, parse_leader};
use crate::hold::{Kind, Request, obtain};
use crate::options::at_most_once;
use crate::shared::Shared;
use crate::{Error, LockOptions, Result};

/// How often a campaign waits again when its term was gone before it could be
/// lengthened (see [`Election::campaign_with`]).
const CAMPAIGNS_AFTER_A_LOSS: u32 = 3;

/// An election among candidates of every process: at most one leads at a time, for a
/// lease its refresher keeps alive, and each leader's term is larger than every term
/// before it. Made by [`Locker::election`](crate::Locker::election), without a round trip.
/// A cheap `Clone` (an `Arc` inside), `Send + Sync`.
///
/// ```no_run
/// use std::time::{Duration, Instant};
/// use redguard::{LockOptions, Locker};
///
/// # fn main() -> Result<(), redguard::Error> {
/// let locker = Locker::connect("redis://127.0.0.1/")?;
/// let election = locker.election("scheduler")?;
/// let term = election.campaign("10.0.0.7:8080")?; // waits until this candidate leads
/// println!("leading as term {}", term.term());
/// while !term.is_lost() {
///     // ... schedule, passing term.term() to every write that must be fenced ...
///     if !term.fenced_set("jobs:cursor", "42")? {
///         break; // a later term wrote: this one is over
///     }
/// #   break;
/// }
/// term.resign()?; // or let it drop
///
/// // Who leads, for anyone.
/// if let Some(leader) = election.leader()? {
///     println!("{} leads, term {}, {:?} left", leader.value(), leader.term(), leader.ttl());
/// }
/// // A candidate that gives up after 5 s.
/// let options = LockOptions::default().ttl(Duration::from_secs(10)).timeout(Duration::from_secs(5));
/// match election.campaign_with("10.0.0.8:8080", options) {
///     Err(redguard::Error::NotObtained) => println!("someone else leads"),
///     term => drop(term?),
/// }
/// # Ok(()) }
/// ```
///
/// The whole story (what a term promises, what a lease cannot, observers, fenced writes,
/// deployments) is in the [election chapter](crate::guide::election).
#[derive(Clone)]
pub struct Election {
    inner: Arc<Inner>,
}

struct Inner {
    shared: Arc<Shared>,
    name: String,
    /// The lock (each leader's), its fencing counter (the terms) and the value its leader
    /// proclaimed last, as Redis knows them (see `backend::election_keys`).
    keys: [String; 3],
    /// Where observers hear of changes: the lock's release channel (see
    /// `wait::Subscriber::watch`).
    channel: String,
}

impl Election {
    /// The election `name`; see [`Locker::election`](crate::Locker::election).
    pub(crate) fn new(shared: Arc<Shared>, name: &str) -> Result<Election> {
        if name.is_empty() {
            return Err(Error::InvalidInput("election name is empty".into()));
        }
        let keys = election_keys(&shared.prefix, name);
        shared.backend.supports_elections(&keys, &shared.prefix)?;
        let channel = format!("{}{}", shared.subscriber.release_channels(), keys[0]);
        Ok(Election {
            inner: Arc::new(Inner {
                channel,
                name: name.to_owned(),
                keys,
                shared,
            }),
        })
    }

    /// The name given to [`Locker::election`](crate::Locker::election).
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// Waits until this candidate leads, as long as it takes, in arrival order among the
    /// candidates of every process: the lease has the locker's default TTL and is renewed
    /// by its refresher. `value` is what the leader advertises (to
    /// [`leader`](Self::leader) and observers) until it [proclaims](Leadership::proclaim)
    /// another.
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked (at once, not
    /// retried); [`Error::WrongType`] when one of the election's keys holds another type;
    /// [`Error::Refresher`] when the refresher thread could not be started (nothing is
    /// held then).
    pub fn campaign(&self, value: &str) -> Result<Leadership> {
        self.campaign_with(value, LockOptions::default())
    }

    /// [`campaign`](Self::campaign) as `options` say: the lease's
    /// [`ttl`](LockOptions::ttl), a [`timeout`](LockOptions::timeout) (then
    /// [`Error::NotObtained`], leaving nothing behind), the [`retry`](LockOptions::retry)
    /// policy, [`replicas`](LockOptions::replicas) to acknowledge the term before it is
    /// taken and at each renewal, and [`auto_refresh`](LockOptions::auto_refresh) (off: the
    /// term ends with its first TTL). Fencing is always on: it makes the terms.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign); [`Error::NotObtained`] when the timeout or retries
    /// ran out; [`Error::Cancelled`] when its [`cancel`](LockOptions::cancel) or the locker's
    /// [`close`](crate::Locker::close) ended the wait; [`Error::LockLost`] when a term handed over ran out before it could be
    /// lengthened, again and again (a TTL of a few ms); [`Error::NotReplicated`] when fewer replicas than
    /// [`replicas(n)`](LockOptions::replicas) acknowledged the term (it was given up);
    /// [`Error::InvalidInput`] for a fixed [`token`](LockOptions::token) (a term
    /// must be new, and a fixed owner re-obtains its old one) or
    /// [`metadata`](LockOptions::metadata) (the value takes its place).
    pub fn campaign_with(&self, value: &str, options: LockOptions) -> Result<Leadership> {
        let mut options = self.checked(value, options)?;
        let deadline = options.timeout.and_then(|t| Instant::now().checked_add(t));
        let mut again = 0;
        loop {
            let holding = obtain(&self.inner.shared, self.request(), options.clone(), || {
                Error::NotObtained
            })?;
            match Leadership::new(self.clone(), holding) {
                // A term handed over that ran out before it could be lengthened: this
                // candidate waits again, for a new term, as long as its timeout allows
                // (and a few times at most: a TTL of a few ms may never last that long).
                Err(Error::LockLost) if again < CAMPAIGNS_AFTER_A_LOSS => {}
                leadership => return leadership,
            }
            if let Some(deadline) = deadline {
                let left = deadline.saturating_duration_since(Instant::now());
                if left.is_zero() {
                    return Err(Error::NotObtained);
                }
                options = options.timeout(left);
            }
            again += 1;
        }
    }

    /// One attempt to lead, taking no place among the waiting candidates: `None` when
    /// another candidate leads.
    ///
    /// # Errors
    /// As [`campaign`](Self::campaign).
    pub fn try_campaign(&self, value: &str) -> Result<Option<Leadership>> {
        let options = self.checked(value, LockOptions::default())?.once();
        let no_leader = || Error::NotObtained;
        let holding = at_most_once(obtain(
            &self.inner.shared,
            self.request(),
            options,
            no_leader,
        ))?;
        holding
            .map(|holding| Leadership::new(self.clone(), holding))
            .transpose()
    }

    /// Who leads now, as the server sees it (one round trip): `None` when nobody does
    /// (never elected, resigned, or its lease expired).
    ///
    /// # Errors
    /// [`Error::Redis`] or [`Error::Pool`] when Redis cannot be asked;
    /// [`Error::WrongType`] when one of the election's keys holds another type.
    pub fn leader(&self) -> Result<Option<Leader>> {
        let inner = &self.inner;
        let keys: Vec<&str> = inner.keys.iter().map(String::as_str).collect();
        let call = leader_call(&inner.keys);
        match inner
            .shared
            .backend
            .run_in_slot(&keys, &call, parse_leader)?
        {
            Found::Yes(led) => Ok(led.map(Leader::from)),
            Found::WrongType { key, kind } => Err(Error::WrongType { key, kind }),
        }
    }

    /// The leader now, then each change: a new leader (with its term), a new value
    /// proclaimed, and `None` when nobody leads any more (resigned, or its lease expired).
    /// Never a leader older than one already yielded. It hears of changes through the
    /// locker's one subscriber connection, and reads the election again after each
    /// message, at each leader's expiry, at least once a second, and after the subscriber
    /// reconnected: a gap can lose intermediate leaders but never report a stale one.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// let locker = redguard::Locker::connect("redis://127.0.0.1/")?;
    /// for change in locker.election("scheduler")?.observe()? {
    ///     match change? {
    ///         Some(leader) => println!("{} leads, term {}", leader.value(), leader.term()),
    ///         None => println!("no leader"),
    ///     }
    /// }
    /// # Ok(()) }
    /// ```
    ///
    /// # Errors
    /// None yet: no round trip is made until the first
    /// [`next`](Iterator::next); each change is a `Result` of its own.
    pub fn observe(&self) -> Result<Observer> {
        Ok(Observer::new(self.clone()))
    }

    /// The options of a campaign for `value`: fencing on (it makes the terms), the value
    /// as metadata; what would break a term refused.
    fn checked(&self, value: &str, options: LockOptions) -> Result<LockOptions> {
        if options.token.is_some() {
            return Err(Error::InvalidInput(
                "a campaign takes no fixed token: a term must be new, and a fixed owner \
                 re-obtains the term it held"
                    .into(),
            ));
        }
        if !options.metadata.is_empty() {
            return Err(Error::InvalidInput(
                "a campaign takes no metadata: the value it advertises takes its place".into(),
            ));
        }
        Ok(options.fencing(true).metadata(value))
    }

    /// The lock every candidate asks for.
    fn request(&self) -> Request {
        let inner = &self.inner;
        let prefix = inner.shared.prefix.as_str();
        let lock = inner.keys[0].clone();
        // The caller's name for the key: without the prefix.
        let names = (!prefix.is_empty()).then(|| vec![lock[prefix.len()..].to_owned()]);
        Request {
            kind: Kind::Lock,
            keys: vec![lock],
            names,
        }
    }

    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.inner.shared
    }

    pub(crate) fn keys(&self) -> &[String; 3] {
        &self.inner.keys
    }

    /// Where observers listen for changes.
    pub(crate) fn channel(&self) -> &str {
        &self.inner.channel
    }

    /// Tells observers that something changed. Best effort: they read the election again
    /// at each leader's expiry and at least once a second anyway.
    pub(crate) fn announce(&self) {
        if let Err(e) = self.inner.shared.backend.publish(self.channel()) {
            log::debug!(
                "redguard: election {:?}: observers not told: {e}",
                self.name()
            );
        }
    }
}

impl fmt::Debug for Election {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Election")
            .field("name", &self.inner.name)
            .finish_non_exhaustive()
    }
}

/// Who leads an election, as [`Election::leader`] and [`Observer`] read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Leader {
    value: String,
    term: u64,
    ttl: Duration,
}

impl Leader {
    /// What the leader advertises: the value it campaigned with, or the one it proclaimed
    /// last.
    pub fn value(&self) -> &str {
        &self.value
    }

    /// Its term: larger than every earlier term of the election.
    pub fn term(&self) -> u64 {
        self.term
    }

    /// What its lease had left when it was read, on the server's clock
    /// (`Duration::MAX` when the key has no TTL: someone ran PERSIST).
    pub fn ttl(&self) -> Duration {
        self.ttl
    }
}

impl From<Led> for Leader {
    fn from(led: Led) -> Leader {
        Leader {
            value: led.value,
            term: led.term,
            ttl: led.ttl,
        }
    }
}
