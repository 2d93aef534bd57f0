//! A held lock and what keeps it: its state (keys, value, token, timing, loss), the owner
//! token stored in each key, and the one refresher thread per locker that extends every
//! auto-refreshed hold in one batch.

mod held;
mod refresher;
mod token;

pub(crate) use held::{Held, Timing, drift_ms, later};
pub(crate) use refresher::Refresher;
pub(crate) use token::{owner_part, random_token};
