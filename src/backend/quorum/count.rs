//! How the nodes' answers to one request are counted: the answers of one fan-out, whether
//! a count of them is settled either way, and the error when it is not.

use std::time::Instant;

use redis::{ErrorKind, RedisError, Value};

use super::fan_out::Ask;
use super::group::Quorum;
use super::node::refused;
use crate::backend::call::Call;
use crate::{Error, Result};

impl Quorum {
    /// `Ok` when a majority of the nodes answer a PING; else one of the failures.
    pub(crate) fn ping(&self) -> Result<()> {
        let ping = Call::command(redis::cmd("PING"));
        self.answers(&ping, Ask::Awake, Ok).map(drop)
    }

    /// Whether `held` nodes make a majority: `Some(true)` when they do, `Some(false)` when
    /// they could not even with every one of the `silent` nodes, `None` in between.
    pub(super) fn count(&self, held: usize, silent: usize) -> Option<bool> {
        if held >= self.majority() {
            Some(true)
        } else if held + silent < self.majority() {
            Some(false)
        } else {
            None
        }
    }

    /// The parsed answers of the nodes that gave one, and how many did not; an error when
    /// fewer than a majority answered: the first refusal (see [`refused`]) if any, as it
    /// says what to fix, else the first failure.
    pub(super) fn answers<T>(
        &self,
        call: &Call,
        ask: Ask<'_>,
        parse: impl Fn(Value) -> Result<T>,
    ) -> Result<(Vec<T>, usize)> {
        let mut answers = Vec::with_capacity(self.nodes.len());
        let mut failure = None;
        for reply in self
            .fan_out(call, ask, Instant::now() + self.timeout)
            .values
        {
            match reply.and_then(&parse) {
                Ok(answer) => answers.push(answer),
                Err(e) => {
                    let refusal =
                        |e: &Option<Error>| matches!(e, Some(Error::Redis(e)) if refused(e));
                    let e = Some(e);
                    if failure.is_none() || (refusal(&e) && !refusal(&failure)) {
                        failure = e;
                    }
                }
            }
        }
        let silent = self.nodes.len() - answers.len();
        match failure {
            Some(failure) if answers.len() < self.majority() => Err(failure),
            _ => Ok((answers, silent)),
        }
    }
}

/// The error of a lock whose state the nodes that answered cannot settle.
pub(crate) fn undecided() -> RedisError {
    RedisError::from((
        ErrorKind::Io,
        "too few nodes answered to tell whether a majority holds the lock",
    ))
}
