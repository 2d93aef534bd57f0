use std::collections::HashSet;
use std::time::Duration;

use crate::{Cancel, Error, Result, Retry};

/// The longest TTL, 2^52 ms (about 142,700 years); a longer one is an
/// [`Error::InvalidInput`]. The scripts count in Lua numbers (doubles), which are exact
/// to 2^53: an expiry on the server's clock (now, in ms since 1970, plus the TTL) stays
/// exact up to this, so every TTL is kept and reported to the millisecond.
pub const MAX_TTL: Duration = Duration::from_millis(1 << 52);

/// The most keys one lock may take (the scripts pass them to Redis commands as Lua
/// arguments, and Lua's stack is bounded).
pub const MAX_KEYS: usize = 1024;

/// How one lock is taken: TTL, wait, owner token and refresh.
///
/// Start from `LockOptions::default()` and set what differs; pass it to
/// [`Locker::lock_with`](crate::Locker::lock_with).
///
/// ```
/// use std::time::Duration;
/// use redguard::{LockOptions, Retry};
///
/// let options = LockOptions::default()
///     .ttl(Duration::from_millis(500))
///     .timeout(Duration::from_secs(2))
///     .retry(Retry::linear(Duration::from_millis(50)))
///     .metadata("job-42");
/// ```
#[derive(Clone, Debug)]
pub struct LockOptions {
    pub(crate) ttl: Option<Duration>,
    pub(crate) timeout: Option<Duration>,
    pub(crate) retry: Retry,
    pub(crate) metadata: String,
    pub(crate) token: Option<String>,
    pub(crate) auto_refresh: bool,
    pub(crate) fencing: bool,
    pub(crate) across_slots: bool,
    pub(crate) replicas: u32,
    pub(crate) hold_at_least: Option<Duration>,
    pub(crate) max_hold: Option<Duration>,
    pub(crate) cancel: Option<Cancel>,
}

impl Default for LockOptions {
    fn default() -> Self {
        LockOptions {
            ttl: None,
            timeout: None,
            retry: Retry::default(),
            metadata: String::new(),
            token: None,
            auto_refresh: true,
            fencing: false,
            across_slots: false,
            replicas: 0,
            hold_at_least: None,
            max_hold: None,
            cancel: None,
        }
    }
}

impl LockOptions {
    /// How long Redis keeps the keys if nobody refreshes or releases them. At least 1 ms,
    /// at most [`MAX_TTL`]; whole milliseconds count (the rest is dropped).
    ///
    /// Defaults to the locker's [`default_ttl`](crate::LockerBuilder::default_ttl).
    pub fn ttl(mut self, ttl: Duration) -> Self {
        self.ttl = Some(ttl);
        self
    }

    /// The longest the whole acquisition may wait, retries included; once it has passed
    /// the result is [`Error::NotObtained`]. It is independent of the TTL.
    ///
    /// Defaults to no deadline (only the retry policy ends the wait).
    pub fn timeout(mut self, timeout: Duration) -> Self {
        self.timeout = Some(timeout);
        self
    }

    /// When to try again while another owner holds a key.
    ///
    /// Defaults to [`Retry::default()`]: exponential backoff in steps from 2 ms to 100 ms
    /// (each delay drawn from the upper half of its step), no limit.
    pub fn retry(mut self, retry: Retry) -> Self {
        self.retry = retry;
        self
    }

    /// Any UTF-8 text stored after the token, for whoever inspects the keys.
    ///
    /// Defaults to empty.
    pub fn metadata(mut self, metadata: impl Into<String>) -> Self {
        self.metadata = metadata.into();
        self
    }

    /// A fixed owner token instead of a random one. An owner that presents exactly the
    /// same token re-obtains keys it already holds (the new guard takes over; the old one
    /// will find the lock lost if the metadata changed, and releases the new one's keys if
    /// it did not). Any other token, even one that starts or ends like it, does not.
    ///
    /// What each key stores: a random token, or a fixed one of exactly 32 lowercase hex
    /// digits (a whole random token, say from [`LockGuard::token`], to re-obtain its
    /// lock), is stored as it is, followed by the metadata; any other fixed token is stored
    /// as its length in bytes, a colon and the token, then the metadata: `token("worker-1")`
    /// with metadata `"job 7"` stores `8:worker-1job 7`.
    ///
    /// [`LockGuard::token`]: crate::LockGuard::token
    ///
    /// Defaults to 16 random bytes from the OS generator, hex-encoded (32 characters).
    pub fn token(mut self, token: impl Into<String>) -> Self {
        self.token = Some(token.into());
        self
    }

    /// Whether the locker's background refresher extends the TTL while the guard lives,
    /// at about a third of the TTL, and marks the guard lost when it cannot.
    ///
    /// Defaults to `true`.
    pub fn auto_refresh(mut self, auto_refresh: bool) -> Self {
        self.auto_refresh = auto_refresh;
        self
    }

    /// Whether the acquisition also takes a fencing token per key
    /// ([`LockGuard::fences`](crate::LockGuard::fences)): in the same atomic step, each
    /// key's counter (`redguard:fence:{<key>}`, or `redguard:fence:t:<key>` for a key with a
    /// hash tag; with a locker prefix `p`, `p` + that, around the prefixed key) is
    /// incremented, so every new acquisition of a key gets a strictly larger token than
    /// the last; a re-obtain by the same owner keeps its token. Counters never expire: each
    /// takes one small Redis string (about 60 bytes plus the key's length) for every key
    /// ever locked with fencing. Use fencing for every lock on a key, or none.
    ///
    /// Tokens only rise while Redis keeps the counters: use the append-only file
    /// (`appendfsync always` to survive a crash), a `maxmemory-policy` that never evicts
    /// keys without a TTL (`noeviction` or `volatile-*`), and no failover to a replica that
    /// may lag. A counter lost any other way (`FLUSHDB`, a restart without persistence)
    /// starts again from 1.
    ///
    /// Defaults to `false`.
    pub fn fencing(mut self, fencing: bool) -> Self {
        self.fencing = fencing;
        self
    }

    /// On a Redis Cluster ([`build_cluster`](crate::LockerBuilder::build_cluster)):
    /// whether a lock may take keys in different hash slots. They are then taken one slot
    /// after another, in ascending slot order, and what was taken is released again when
    /// a slot is held elsewhere — so the lock is still all-or-nothing once returned and
    /// never deadlocks, but it is not atomic: for a moment, another owner may see some of
    /// its keys taken and others free, and a crash mid-way leaves the taken ones until
    /// their TTL. Each slot costs a round trip. Elsewhere this setting changes nothing.
    ///
    /// Defaults to `false`: keys in different slots are an [`Error::InvalidInput`] that
    /// names the slots.
    pub fn across_slots(mut self, across_slots: bool) -> Self {
        self.across_slots = across_slots;
        self
    }

    /// Held only once at least `n` replicas of the master have it: after the acquire,
    /// `WAIT n` on the same connection, for at most the locker's
    /// [`replica_timeout`](crate::LockerBuilder::replica_timeout). With fewer
    /// acknowledgements the hold is given up again (compare-and-delete, unless the same
    /// fixed token held it before) and the result is [`Error::NotReplicated`], at once.
    /// Every refresh waits for them too; a refresh that cannot get them is tried again
    /// like a refresh that failed, and the hold is finally reported lost.
    ///
    /// For one server with replicas, [Sentinel](crate::LockerBuilder::build_sentinel)
    /// and a cluster (each slot's master); an [`Error::InvalidInput`] on Redlock, and
    /// above 100. It narrows, but does not close, the failover hole: see [scaling
    /// out](crate::guide::scaling_out). It costs one round trip more per acquire (the
    /// replicas' acknowledgement), and the same per refresh round (on a cluster, per hash
    /// slot the round refreshes). On a cluster whose slot is being moved (an `ASK`
    /// redirection), the wait may be asked of the slot's old master, which does not have
    /// the write: no guarantee while resharding.
    ///
    /// Defaults to 0: no wait for replicas.
    ///
    /// ```no_run
    /// # fn main() -> Result<(), redguard::Error> {
    /// use redguard::{Error, LockOptions, Locker};
    ///
    /// let locker = Locker::builder()
    ///     .build_sentinel(&["redis://10.0.0.1:26379/", "redis://10.0.0.2:26379/"], "mymaster")?;
    /// match locker.lock_with(&["k"], LockOptions::default().replicas(1)) {
    ///     Ok(_guard) => { /* held, and on at least one replica */ }
    ///     Err(Error::NotReplicated { acknowledged, wanted }) => {
    ///         eprintln!("only {acknowledged} of {wanted} replicas: nothing is held");
    ///     }
    ///     Err(e) => return Err(e),
    /// }
    /// # Ok(()) }
    /// ```
    pub fn replicas(mut self, n: u32) -> Self {
        self.replicas = n;
        self
    }

    /// Held for at least `d` from when it was obtained: a release (or drop) before then
    /// leaves the keys held until `d` has passed (their TTL shortened to what is left of
    /// `d`, nothing deleted) and returns `Ok`; waiters get them then. For a job that must
    /// run once per period whichever host starts it: hosts that start a little late find
    /// the lock still held. For locks, read locks and permits. Without auto-refresh, a
    /// release never keeps the hold longer than its own TTL would have.
    ///
    /// Defaults to none: a release gives the hold up at once.
    pub fn hold_at_least(mut self, d: Duration) -> Self {
        self.hold_at_least = Some(d);
        self
    }

    /// Held for at most `d` from when it was obtained: the refresher never extends the
    /// hold past that, and once it runs out the hold is lost ([`is_lost`], the locker's
    /// [`on_lost`], the loss warning), even though this process is alive: a hung holder
    /// does not keep it for ever. For every primitive, an election's term included.
    ///
    /// [`is_lost`]: crate::LockGuard::is_lost
    /// [`on_lost`]: crate::LockerBuilder::on_lost
    ///
    /// Defaults to none: refreshed for as long as the guard lives.
    pub fn max_hold(mut self, d: Duration) -> Self {
        self.max_hold = Some(d);
        self
    }

    /// Ends the wait when `cancel` is cancelled, from any thread (a clone of it shares
    /// its state): the call returns [`Error::Cancelled`], at once if the wait sleeps, else
    /// as soon as its round trip in flight is answered, and leaves nothing behind: its
    /// queue entry is taken out, and a hold handed to it as the cancel came is passed on
    /// to the next in line, not returned (see [`Cancel`]). Already cancelled: the call
    /// returns [`Error::Cancelled`] at once, without a round trip. For every call that
    /// takes `LockOptions` (the `try_` forms too, which never wait); a guard once
    /// returned is not touched by a later cancel.
    ///
    /// Defaults to none: only the timeout and retries end a wait (and
    /// [`Locker::close`](crate::Locker::close)).
    pub fn cancel(mut self, cancel: &Cancel) -> Self {
        self.cancel = Some(cancel.clone());
        self
    }
}

/// Copies the keys after checking them: at least one, none empty, none twice.
impl LockOptions {
    /// These options for exactly one attempt: no retry, no timeout.
    pub(crate) fn once(self) -> LockOptions {
        LockOptions {
            retry: Retry::none(),
            timeout: None,
            ..self
        }
    }
}

/// The answer of a single attempt: `None` when it was not obtained.
pub(crate) fn at_most_once<T>(attempt: Result<T>) -> Result<Option<T>> {
    match attempt {
        Ok(hold) => Ok(Some(hold)),
        Err(Error::NotObtained) => Ok(None),
        Err(e) => Err(e),
    }
}

pub(crate) fn checked_keys<K: AsRef<str>>(keys: &[K]) -> Result<Vec<String>> {
    if keys.is_empty() {
        return invalid("no keys given: a lock needs at least one key".into());
    }
    if keys.len() > MAX_KEYS {
        return invalid(format!(
            "{} keys given: a lock takes at most {MAX_KEYS}",
            keys.len()
        ));
    }
    let mut seen = HashSet::with_capacity(keys.len());
    for (i, key) in keys.iter().map(AsRef::as_ref).enumerate() {
        if key.is_empty() {
            return invalid(format!("key #{i} is empty"));
        }
        if !seen.insert(key) {
            return invalid(format!("key {key:?} is given twice"));
        }
    }
    Ok(keys.iter().map(|k| k.as_ref().to_owned()).collect())
}

/// The TTL in whole milliseconds, as Redis takes it; never 0 (`PEXPIRE key 0` deletes).
pub(crate) fn checked_ttl(ttl: Duration) -> Result<u64> {
    if ttl < Duration::from_millis(1) {
        return invalid(format!(
            "ttl {ttl:?} is under 1 ms: Redis would expire the keys at once"
        ));
    }
    if ttl > MAX_TTL {
        return invalid(format!(
            "ttl {ttl:?} is longer than Redis can store (at most {MAX_TTL:?})"
        ));
    }
    // In range: at most MAX_TTL's milliseconds, which fit in u64.
    Ok(ttl.as_millis() as u64)
}

/// A caller's fixed token, checked: never empty (any other text is safe, as each key
/// stores it in a self-delimiting form: see [`owner_part`](crate::hold::owner_part)).
pub(crate) fn checked_token(token: &str) -> Result<()> {
    if token.is_empty() {
        return invalid("token is empty: leave it unset for a random one".into());
    }
    Ok(())
}

fn invalid<T>(why: String) -> Result<T> {
    Err(Error::InvalidInput(why))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn why<T: std::fmt::Debug>(result: Result<T>) -> String {
        match result {
            Err(Error::InvalidInput(why)) => why,
            other => panic!("expected InvalidInput, got {other:?}"),
        }
    }

    #[test]
    fn keys_are_checked() {
        assert!(why(checked_keys::<&str>(&[])).contains("no keys"));
        assert!(why(checked_keys(&["a", ""])).contains("key #1 is empty"));
        assert!(why(checked_keys(&["a", "b", "a"])).contains("\"a\" is given twice"));
        let many: Vec<String> = (0..=MAX_KEYS).map(|i| i.to_string()).collect();
        assert!(why(checked_keys(&many)).contains("at most"));
        assert_eq!(checked_keys(&["ключ", "🔒"]).unwrap(), vec!["ключ", "🔒"]);
    }

    #[test]
    fn ttl_is_checked_and_never_rounded_to_zero() {
        assert!(why(checked_ttl(Duration::ZERO)).contains("under 1 ms"));
        assert!(why(checked_ttl(Duration::from_micros(999))).contains("under 1 ms"));
        assert!(why(checked_ttl(Duration::MAX)).contains("longer than"));
        assert!(why(checked_ttl(MAX_TTL + Duration::from_millis(1))).contains("longer"));
        assert_eq!(checked_ttl(Duration::from_micros(1500)).unwrap(), 1);
        assert_eq!(checked_ttl(MAX_TTL).unwrap(), 1 << 52);
    }

    #[test]
    fn empty_tokens_are_rejected() {
        assert!(why(checked_token("")).contains("token is empty"));
        for token in ["7", "deadbeef", "owner-1", "DEADBEEF", &"a".repeat(32)] {
            assert!(checked_token(token).is_ok(), "{token:?}");
        }
    }
}
