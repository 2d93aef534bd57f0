//! Waiters woken by the server: one subscriber connection per locker.
//!
//! With the server's queue (see `lua/queue/queue.lua`), a script that gives a waiter its
//! hold publishes one message on the waiter's locker channel
//! (`<prefix>redguard:wake:<random>`); the locker's subscriber thread, subscribed to it,
//! puts the word in that waiter's [`Mailbox`]. A waiter of the releasing locker itself
//! hears it from the release's reply instead. Word is never the only way: a waiter's
//! refresher renews its entry at a third of its lifetime and, finding it gone, has it ask
//! Redis; and every (re)subscription of the channel has every queued waiter ask, as a
//! message may have been missed meanwhile. A thread that asks for keys another thread of
//! its locker holds leaves its entry with [`Pending`] for that thread's release, which
//! puts it in the queue in the same script (`joins.rs`).
//!
//! Waiters that do not queue (a lock on a quorum, or across cluster slots) listen for
//! `<prefix>redguard:released:<key>`, which releases there publish for each key they free:
//! - a waiter notes what it has seen of its keys *before* each attempt, so a release
//!   counted while the attempt was in flight ends the next wait at once;
//! - releases before the subscription is confirmed are not counted, so the confirmation
//!   itself ends the wait, and the next attempt sees any such release;
//! - a reconnect counts as a new confirmation, for the same reason.
//!
//! Without a connection for the thread (a caller's pool of one), queued waiters learn of
//! their hand-overs from their renewals, and others wait out their retry delays.
//!
//! Whatever it sleeps on, a wait ends early when its [`Stop`] is set (its `Cancel`, its
//! locker's `close`): ringing either wakes it under the lock it sleeps under (`stop.rs`).

mod board;
mod enrolment;
mod joins;
mod mailbox;
mod stop;
mod subscriber;
mod ticket;

pub(crate) use board::Seen;
pub(crate) use enrolment::Enrolment;
pub(crate) use joins::Pending;
pub(crate) use mailbox::{Letter, Mailbox};
pub(crate) use stop::{Alarm, Sleeper, Stop};
pub(crate) use subscriber::Subscriber;
pub(crate) use ticket::{Ticket, Wake};
