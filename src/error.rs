use std::fmt;

/// What went wrong with a lock operation.
///
/// The three outcomes users must tell apart are separate variants: the lock is held
/// elsewhere ([`NotObtained`](Error::NotObtained)), a lock we held is gone
/// ([`LockLost`](Error::LockLost)), and Redis could not be asked
/// ([`Redis`](Error::Redis) or [`Pool`](Error::Pool)).
///
/// | error | meaning | what to do |
/// |---|---|---|
/// | `NotObtained` | another owner holds a key; retries or timeout ran out (on Redlock, also: too few servers answered) | try later |
/// | `LockLost` | the lock expired or was taken over | the critical section may not have been exclusive |
/// | `InvalidInput(..)` | bad keys, TTL, token, URL or settings; nothing was sent | fix the call |
/// | `WrongType { key, kind }` | a key holds a list, hash, ...; it was left untouched | use another key |
/// | `Redis(..)`, `Pool(..)` | Redis could not be asked (down, frozen, timed out) or refused | check the server |
/// | `NotReplicated { acknowledged, wanted }` | too few replicas acknowledged the hold (or a fenced write) in time; what an acquire took was given up | check the replicas; try later |
/// | `Cancelled` | the wait was cancelled, or its locker closed; nothing is held | stop, or wait again with another `Cancel` |
/// | `Random(..)`, `Refresher(..)` | the OS could not give random bytes or a thread | rare; check the host |
#[derive(Debug)]
#[non_exhaustive]
pub enum Error {
    /// Another owner holds at least one of the keys, and the retry policy or timeout ran
    /// out; or, on a quorum of servers ([`build_redlock`](crate::LockerBuilder::build_redlock)),
    /// fewer than a majority of them answered (returned at once, as waiting would not help).
    NotObtained,
    /// The lock is no longer held: it expired, or someone deleted or overwrote a key.
    LockLost,
    /// The request was rejected before any round trip to Redis.
    InvalidInput(String),
    /// A key already holds another Redis type (a list, a hash, ...), or a fencing counter
    /// holds something other than a counter; it was left untouched, and nothing was taken.
    WrongType {
        /// The key as given to the lock call, or a fencing counter's Redis name.
        key: String,
        /// The type Redis reports for it (`list`, `hash`, `set`, ...).
        kind: String,
    },
    /// Redis answered with an error, or the connection failed or timed out (a
    /// [`redis::RedisError`]; its words end the message, so it is not also the
    /// [`source`](std::error::Error::source)).
    Redis(redis::RedisError),
    /// No connection could be checked out of the pool within its timeout (an
    /// [`r2d2::Error`]).
    Pool(r2d2::Error),
    /// The OS random generator failed, so no token could be made (a
    /// [`getrandom::Error`]).
    Random(getrandom::Error),
    /// The background refresher thread could not be started; the lock was released (a
    /// [`std::io::Error`]).
    Refresher(std::io::Error),
    /// Fewer replicas than [`LockOptions::replicas`](crate::LockOptions::replicas) asked
    /// for acknowledged the hold within the replica timeout. From an acquire: what it took
    /// was given up again, so nothing is held by it (a fixed token keeps what the same owner
    /// held before). From a refresh, or a `fenced_set` of a hold taken with replicas: the
    /// TTL or the value was set on the master, but may not survive a failover.
    NotReplicated {
        /// How many replicas acknowledged it.
        acknowledged: u32,
        /// How many were asked for.
        wanted: u32,
    },
    /// The wait was ended by [`Cancel::cancel`](crate::Cancel::cancel) or
    /// [`Locker::close`](crate::Locker::close): nothing is held by it, and it left
    /// nothing behind.
    Cancelled,
}

impl fmt::Display for Error {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Error::NotObtained => f.write_str(
                "lock not obtained: another owner holds at least one of the keys, or (on a \
                 quorum of servers) too few of them answered (retry later, or allow a longer \
                 timeout)",
            ),
            Error::LockLost => f.write_str(
                "lock lost: the keys expired or were changed by someone else, so the critical \
                 section may not have been exclusive (check is_lost() before each step; if they \
                 expired, use a longer ttl)",
            ),
            Error::InvalidInput(why) => write!(f, "invalid input: {why}"),
            Error::WrongType { key, kind } => write!(
                f,
                "key {key:?} holds a Redis {kind}, not a lock, and was left untouched \
                 (lock another key or delete it)"
            ),
            // The cause is said here, not chained by `source`: a reader who sees only this
            // line (the command prints only it) needs the server's own words.
            Error::Redis(e) => write!(f, "{}: {e}", redis_says(e)),
            Error::Pool(_) => f.write_str(
                "no redis connection available within the checkout timeout \
                 (check that the server is up, or raise pool_size)",
            ),
            Error::Random(_) => f.write_str("the OS random generator failed to make a lock token"),
            Error::NotReplicated {
                acknowledged,
                wanted,
            } => write!(
                f,
                "only {acknowledged} of the {wanted} replicas asked for acknowledged the hold \
                 within the replica timeout (check the replicas, or ask for fewer)"
            ),
            Error::Refresher(_) => f.write_str(
                "could not start the refresher thread, so the lock was released \
                 (lock with auto_refresh(false), or free some threads)",
            ),
            Error::Cancelled => f.write_str(
                "the wait was cancelled (Cancel::cancel, or Locker::close): nothing is held",
            ),
        }
    }
}

/// What a Redis error means to the user, in a few words, with what to check; the error's
/// own words follow it in the message.
fn redis_says(e: &redis::RedisError) -> &'static str {
    #[cfg(feature = "tls")]
    if crate::backend::tls::is_certificate_error(e) {
        return "the server's TLS certificate was refused (give its CA with tls_root_cert, or \
                check the host name in the URL)";
    }
    if e.is_connection_refusal() {
        "redis refused the connection: nothing listens there (check the host and port, and \
         that the server is up)"
    } else if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() {
        "redis is unreachable or not answering (check the host name and port, and that the \
         server is up)"
    } else if e.kind() == redis::ErrorKind::AuthenticationFailed || e.code() == Some("NOAUTH") {
        "redis refused the credentials (check the user name and password)"
    } else if e.detail().is_some_and(|d| d.starts_with("DB index")) {
        "redis has no such database (check the number at the end of the URL)"
    } else if e.code() == Some("NOPERM") {
        "redis refused a command or key to this user (check its ACL)"
    } else if e.kind() == redis::ErrorKind::Parse {
        "the server does not answer as Redis does (is that the Redis port?)"
    } else {
        "redis refused the request"
    }
}

impl std::error::Error for Error {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            // Its words are in the message already (and redis-rs chains its own cause,
            // whose words it repeats): nothing further.
            Error::Redis(_) => None,
            Error::Pool(e) => Some(e),
            Error::Random(e) => Some(e),
            Error::Refresher(e) => Some(e),
            _ => None,
        }
    }
}

impl From<redis::RedisError> for Error {
    fn from(e: redis::RedisError) -> Self {
        Error::Redis(e)
    }
}

impl From<r2d2::Error> for Error {
    fn from(e: r2d2::Error) -> Self {
        Error::Pool(e)
    }
}

/// The crate's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_is_send_sync_static() {
        fn assert<T: Send + Sync + 'static>() {}
        assert::<Error>();
    }

    #[test]
    fn not_obtained_lost_and_unavailable_read_differently() {
        let io = std::io::Error::new(std::io::ErrorKind::TimedOut, "timed out");
        let messages = [
            Error::NotObtained.to_string(),
            Error::LockLost.to_string(),
            Error::Redis(io.into()).to_string(),
        ];
        assert!(messages[0].starts_with("lock not obtained"));
        assert!(messages[1].starts_with("lock lost"));
        assert!(messages[2].starts_with("redis is unreachable"));
    }

    #[test]
    fn a_redis_error_says_its_cause_once() {
        use std::error::Error as _;
        let io = std::io::Error::new(
            std::io::ErrorKind::ConnectionRefused,
            "127.0.0.1:1: Connection refused",
        );
        let err = Error::Redis(io.into());
        let shown = err.to_string();
        assert!(shown.starts_with("redis refused the connection"), "{shown}");
        assert_eq!(shown.matches("127.0.0.1:1: Connection refused").count(), 1);
        assert!(err.source().is_none(), "not chained again");
        let refused = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "An error was signalled by the server",
            "OOM command not allowed".to_string(),
        ));
        assert!(
            Error::Redis(refused)
                .to_string()
                .contains("OOM command not allowed")
        );
        assert!(Error::NotObtained.source().is_none());
    }
}
