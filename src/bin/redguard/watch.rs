//! While the command runs: stop it before its hold can expire when refreshes fail, stop
//! it when the hold is found lost, and continue it after a Ctrl-Z only if the hold is
//! still valid.

use std::io;
use std::process::{Child, ExitStatus};
use std::thread;
use std::time::{Duration, Instant};

use signal_hook::consts::{SIGKILL, SIGTERM};

use crate::hold::Hold;
use crate::signals;

/// How often the hold and the command are looked at.
const POLL: Duration = Duration::from_millis(20);
/// SIGKILL comes this long before the hold's validity runs out (it is counted by this
/// process's clock, with an allowance for the server's running fast; this is for this
/// process being late to look).
const KILL_AHEAD: Duration = Duration::from_millis(100);

/// How the command ended.
pub(crate) enum Ended {
    /// By itself (or by a signal passed on), with the hold valid throughout as far as
    /// this process could see.
    Exited(ExitStatus),
    /// Stopped by `redguard`: the hold was lost, or could not be kept valid.
    Stopped,
}

/// When the command is stopped.
pub(crate) struct Plan<'a> {
    /// The keys, to name them.
    pub(crate) named: &'a str,
    /// Refreshes failing, SIGTERM when the hold has this long left (then SIGKILL before
    /// it runs out): the kill grace cut to fit (see `early_grace`).
    pub(crate) early: Duration,
    /// After a loss found at once (the keys taken or deleted): SIGTERM, SIGKILL after
    /// this.
    pub(crate) kill_grace: Duration,
}

/// The grace an early stop gives: `kill_grace`, but at most a third of the TTL. The
/// refresher extends a hold when two thirds of its TTL are left, so a hold with more
/// than a third left is one whose refreshes still work, or only just failed.
pub(crate) fn early_grace(kill_grace: Duration, ttl: Duration) -> Duration {
    kill_grace.min(ttl / 3)
}

/// A stop under way: SIGKILL to what is left of the group at `kill_at`, or, for an
/// early stop, once the hold has no more than `KILL_AHEAD` left.
struct Stop {
    kill_at: Instant,
    early: bool,
}

/// Watches the command until it ends, stopping it as `plan` says.
pub(crate) fn watch(child: &mut Child, hold: &Hold, plan: &Plan) -> io::Result<Ended> {
    let mut stop: Option<Stop> = None;
    loop {
        match &stop {
            None => match child.try_wait() {
                Ok(Some(status)) => return Ok(Ended::Exited(status)),
                Ok(None) => {}
                Err(e) => return Err(killed(child, e)),
            },
            Some(under_way) => {
                // Reaped, the leader no longer counts: the grace is the whole group's.
                if let Err(e) = child.try_wait() {
                    return Err(killed(child, e));
                }
                let due = Instant::now() >= under_way.kill_at
                    || under_way.early && hold.valid_for() <= KILL_AHEAD;
                if due || !signals::group_alive() {
                    break;
                }
            }
        }
        if signals::continued_while_group_stopped() {
            if hold.valid_for() <= KILL_AHEAD {
                eprintln!(
                    "redguard: the lock on {} was lost (it expired while redguard was \
                     stopped): killing the command (SIGKILL)",
                    plan.named
                );
                break;
            }
            signals::continue_group();
        }
        if stop.is_none() {
            stop = begin_stop(hold, plan);
        }
        let pause = stop.as_ref().map_or(POLL, |under_way| {
            POLL.min(under_way.kill_at.saturating_duration_since(Instant::now()))
        });
        thread::sleep(pause);
    }
    kill(child);
    Ok(Ended::Stopped)
}

/// Starts stopping the command if the hold says so: SIGTERM to the group now, and when
/// SIGKILL is due.
fn begin_stop(hold: &Hold, plan: &Plan) -> Option<Stop> {
    let valid = hold.valid_for();
    let now = Instant::now();
    if hold.is_lost() {
        if signals::group_stopped() {
            // Stopped by a Ctrl-Z: it must not run again without the lock.
            eprintln!(
                "redguard: the lock on {} was lost while the command was stopped: \
                 killing it (SIGKILL)",
                plan.named
            );
            return Some(Stop {
                kill_at: now,
                early: false,
            });
        }
        eprintln!(
            "redguard: the lock on {} was lost while the command ran: stopping it \
             (SIGTERM, SIGKILL after {:?})",
            plan.named, plan.kill_grace
        );
        signals::signal_group(SIGTERM);
        return Some(Stop {
            kill_at: now + plan.kill_grace,
            early: false,
        });
    }
    if valid > plan.early.max(KILL_AHEAD) {
        return None;
    }
    eprintln!(
        "redguard: the lock on {} could not be refreshed and counts as held for {:.1?} \
         more: stopping the command (SIGTERM now, SIGKILL before the lock can expire)",
        plan.named, valid
    );
    signals::signal_group(SIGTERM);
    Some(Stop {
        kill_at: now + valid.saturating_sub(KILL_AHEAD),
        early: true,
    })
}

/// SIGKILL to the command's whole group, if any of it is left, and the leader reaped.
fn kill(child: &mut Child) {
    if signals::group_alive() {
        signals::signal_group(SIGKILL);
    }
    let _ = child.kill(); // should the group be gone and the leader not (never blocks)
    let _ = child.wait();
}

/// The command killed, as it cannot be watched any more (`e`): it must not run on
/// without the lock.
fn killed(child: &mut Child, e: io::Error) -> io::Error {
    kill(child);
    e
}
