//! A hold, whatever its kind (a lock, a read lock, a permit): how it is obtained (the one
//! waiting loop, `obtain.rs`, over what is fixed for a wait, `plan.rs`, and the waiter's
//! place in the server's queue, `place.rs`), its state (keys, value, token, timing,
//! loss), its RAII owner, the owner token stored in Redis, and the one refresher thread
//! per locker that extends every auto-refreshed hold and renews every queued waiter's
//! place in one batch.

mod give_up;
mod held;
mod holding;
mod join;
mod lease;
mod obtain;
mod place;
mod plan;
mod refresher;
mod token;

pub(crate) use held::{Held, Kind, Timing, drift_ms, later};
pub(crate) use holding::Holding;
pub(crate) use lease::Lease;
pub(crate) use obtain::obtain;
pub(crate) use plan::Request;
pub(crate) use refresher::Refresher;
pub(crate) use token::{is_random_form, metadata_of, owner_part, random_token};
