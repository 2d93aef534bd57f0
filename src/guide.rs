//! The manual: what redguard does, exactly, chapter by chapter. Nothing here is code; each
//! module is a page.

#[doc = include_str!("../docs/semantics.md")]
pub mod semantics {}

#[doc = include_str!("../docs/read_locks.md")]
pub mod read_locks {}

#[doc = include_str!("../docs/semaphores.md")]
pub mod semaphores {}

#[doc = include_str!("../docs/fencing.md")]
pub mod fencing {}

#[doc = include_str!("../docs/security.md")]
pub mod security {}

#[doc = include_str!("../docs/scaling_out.md")]
pub mod scaling_out {}

#[doc = include_str!("../docs/reliability.md")]
pub mod reliability {}

#[doc = include_str!("../docs/performance.md")]
pub mod performance {}

#[doc = include_str!("../docs/command.md")]
pub mod command {}

#[doc = include_str!("../docs/election.md")]
pub mod election {}

#[doc = include_str!("../docs/ci.md")]
pub mod ci {}
