//! `redguard`: run a command while holding locks on Redis, or while leading an election;
//! say who holds what, or who leads.
//!
//! ```text
//! redguard run [OPTIONS] KEY... -- COMMAND [ARG]...
//! redguard run [OPTIONS] KEY... -c 'shell command'
//! redguard status [OPTIONS] [KEY]...      (no KEY: every lock under --prefix)
//! redguard elect [OPTIONS] NAME -- COMMAND [ARG]...   (or -c; --requeue: again and again)
//! redguard leader [OPTIONS] NAME          (--watch: each change; --json)
//! redguard unlock --force [OPTIONS] KEY...  (break-glass: removes locks whoever holds them)
//! ```
//!
//! Redis is one server (`--url`, else `$REDIS_URL`), the master sentinels name
//! (`--sentinel URL... --master NAME`), a quorum (`--redlock`; not for elections) or a
//! cluster (`--cluster`). Exit statuses: see [`EXIT_STATUSES`] (also in `--help`); what
//! the command is promised when the lock cannot be kept: `run::AFTER_HELP`; when the term
//! is lost: `elect::AFTER_HELP` (`run` and `elect` share `supervise.rs`, and the hold
//! behind it in `hold.rs`).
//!
//! The command runs in a process group of its own, so that signals reach all of it. Two
//! consequences: with a terminal on its standard input, a command that reads the terminal
//! is stopped (SIGTTIN; give it `< /dev/null`, as cron does); and background jobs the
//! command leaves running when it exits are not covered by the lock, which is given back
//! as soon as the command itself exits.

mod child;
mod elect;
mod hold;
mod leader;
mod raw;
mod run;
mod signals;
mod status;
mod supervise;
mod unlock;
mod watch;
mod watchdog;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redguard::{Error, Locker};

/// Run a command under a lock on Redis or while leading an election; say who holds what,
/// or who leads.
#[derive(Parser)]
#[command(name = "redguard", version, after_help = EXIT_STATUSES)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND while holding every KEY.
    #[command(after_help = run::AFTER_HELP)]
    Run(run::RunArgs),
    /// Say who holds each KEY (or every lock under --prefix), and for how long.
    #[command(after_help = EXIT_STATUSES)]
    Status(status::StatusArgs),
    /// Run COMMAND while leading election NAME (its term in REDGUARD_TERM).
    #[command(after_help = elect::AFTER_HELP)]
    Elect(elect::ElectArgs),
    /// Say who leads election NAME, and with --watch each change.
    #[command(after_help = leader::AFTER_HELP)]
    Leader(leader::LeaderArgs),
    /// Remove the lock on each KEY whoever holds it (break-glass; needs --force).
    #[command(after_help = unlock::AFTER_HELP)]
    Unlock(unlock::UnlockArgs),
}

/// Where Redis is.
#[derive(Args)]
struct Connection {
    /// A Redis URL (default: $REDIS_URL, then redis://127.0.0.1:6379/); repeat it with
    /// --redlock for every master, or give a few seeds with --cluster.
    #[arg(long = "url", value_name = "URL", conflicts_with = "sentinels")]
    urls: Vec<String>,
    /// The URLs are independent masters: a lock is held on a majority of them.
    #[arg(long, conflicts_with_all = ["cluster", "sentinels"])]
    redlock: bool,
    /// The URLs are seeds of a Redis Cluster.
    #[arg(long, conflicts_with = "sentinels")]
    cluster: bool,
    /// A Redis Sentinel's URL (repeat it for each): the lock is held on the master they
    /// name (--master), followed through failovers.
    #[arg(long = "sentinel", value_name = "URL", requires = "master")]
    sentinels: Vec<String>,
    /// With --sentinel: the name the sentinels know the master by.
    #[arg(long, value_name = "NAME", requires = "sentinels")]
    master: Option<String>,
    /// Put before every key in Redis (for ACLs).
    #[arg(long, default_value = "")]
    prefix: String,
    /// The longest any one wait on Redis may take: connecting, a request, a connection
    /// from the pool (2s, 500ms, or seconds). Redis down, `redguard` gives up after it.
    #[arg(long = "io-timeout", default_value = "2s", value_parser = run::duration)]
    io_timeout: Duration,
}

/// The exit statuses of sysexits(3) this command uses.
pub(crate) const USAGE: u8 = 64;
pub(crate) const UNAVAILABLE: u8 = 69;
pub(crate) const CANNOT_START: u8 = 71;
pub(crate) const NOT_RELEASED: u8 = 74;
pub(crate) const LOST: u8 = 75;

/// Every exit status, for `--help` (a macro, for `concat!`).
macro_rules! exit_statuses {
    () => {
        "\
Exit statuses:
  0-255  the command's own status; 128 + N when signal N ended it (or ended the wait)
  1      the lock was not obtained in time (-n, -w; change it with -E)
  64     usage error: bad arguments, or a key that holds another Redis type
  69     Redis unavailable, or it refused (before the command started)
  71     the command could not be started (not found, not executable)
  74     the command ended under the lock, but the lock could not be given back (Redis
         unreachable): it expires with its TTL; the command's status is on stderr
  75     the lock was lost, or could not be kept, while the command ran: the command was
         stopped, or it ended and the lock was found lost when given back"
    };
}
pub(crate) use exit_statuses;

/// Every exit status, for `--help`.
pub(crate) const EXIT_STATUSES: &str = exit_statuses!();

impl Connection {
    /// The URLs given, else $REDIS_URL, else the local default.
    fn urls(&self) -> Vec<String> {
        match self.urls.as_slice() {
            [] => vec![
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into()),
            ],
            urls => urls.to_vec(),
        }
    }

    /// A locker for these settings, with `ttl` as its default TTL.
    fn locker(&self, ttl: Duration) -> Result<Locker, ExitCode> {
        let urls = self.urls();
        let bound = self.io_timeout;
        let builder = Locker::builder()
            .pool_size(4)
            .default_ttl(ttl)
            .connect_timeout(bound)
            .io_timeout(bound)
            .checkout_timeout(bound)
            .prefix(self.prefix.clone());
        let built = if let Some(master) = &self.master {
            builder.build_sentinel(&self.sentinels, master)
        } else if self.redlock {
            builder.build_redlock(&urls)
        } else if self.cluster {
            builder.build_cluster(&urls)
        } else if let [url] = urls.as_slice() {
            builder.build(url.as_str())
        } else {
            return Err(fail(USAGE, "several --url need --redlock or --cluster"));
        };
        built.map_err(|e| failed(&e))
    }
}

/// Says why on stderr; the exit status for `error`.
pub(crate) fn failed(error: &Error) -> ExitCode {
    let code = match error {
        Error::InvalidInput(_) | Error::WrongType { .. } => USAGE,
        _ => UNAVAILABLE,
    };
    fail(code, &error.to_string())
}

/// 128 + `signal`, the shell's code for a death by a signal.
pub(crate) fn signal_code(signal: i32) -> ExitCode {
    ExitCode::from(u8::try_from(128 + signal).unwrap_or(255))
}

/// Says `why` on stderr, and gives `code`.
pub(crate) fn fail(code: u8, why: &str) -> ExitCode {
    eprintln!("redguard: {why}");
    ExitCode::from(code)
}

fn main() -> ExitCode {
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => {
            let code = if e.use_stderr() { USAGE } else { 0 };
            let _ = e.print();
            return ExitCode::from(code);
        }
    };
    match cli.command {
        Command::Run(args) => run::run(args),
        Command::Status(args) => status::status(args),
        Command::Elect(args) => elect::elect(args),
        Command::Leader(args) => leader::leader(args),
        Command::Unlock(args) => unlock::unlock(args),
    }
}
