//! Waiters woken by releases: one subscriber connection per locker.
//!
//! `lua/release.lua` publishes on `<prefix>redguard:released:<key>` for each key it frees
//! (or finds already gone). One
//! thread per locker (started with its first waiter) holds one connection subscribed to
//! the channels of the keys its threads wait for, and counts the releases it hears. A
//! waiter still waits at most its retry delay, but a counted release of one of its keys,
//! or a (re)confirmed subscription to all of them, cuts the wait short.
//!
//! Why no release is missed for longer than a retry delay, and usually not at all:
//! - a waiter notes what it has seen of its keys *before* each attempt, so a release
//!   counted while the attempt was in flight ends the next wait at once;
//! - releases before the subscription is confirmed are not counted, so the confirmation
//!   itself ends the wait, and the next attempt sees any such release;
//! - a reconnect counts as a new confirmation, for the same reason.
//!
//! Without a thread (it could not start) or a connection (a caller's pool of one), waiters
//! simply wait out their retry delays.

mod board;
mod line;
mod subscriber;

pub(crate) use board::{Seen, Ticket, Wake};
pub(crate) use line::Offer;
pub(crate) use subscriber::Subscriber;
