//! `redguard`: run a command while holding locks on Redis, or say who holds what.
//!
//! ```text
//! redguard run [OPTIONS] KEY... -- COMMAND [ARG]...
//! redguard run [OPTIONS] KEY... -c 'shell command'
//! redguard status [--json] KEY...
//! ```
//!
//! Exit status: the command's (128 + the signal when a signal ended it); the conflict code
//! (`-E`, default 1) when the lock was not obtained in time; 64 for a usage error; 69 when
//! Redis is unavailable; 71 when the command could not be started; 75 when the lock was
//! lost while the command ran (it is then stopped: SIGTERM to its group, SIGKILL after
//! the grace).
//!
//! The command runs in a process group of its own, so that signals reach all of it. Two
//! consequences: with a terminal on its standard input, a command that reads the terminal
//! is stopped (SIGTTIN; give it `< /dev/null`, as cron does); and background jobs the
//! command leaves running when it exits are not covered by the lock, which is given back
//! as soon as the command itself exits.

mod run;
mod status;

use std::process::ExitCode;
use std::time::Duration;

use clap::{Args, Parser, Subcommand};
use redguard::{Error, Locker};

/// Run a command under a lock on Redis, or say who holds what.
#[derive(Parser)]
#[command(name = "redguard", version)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Run COMMAND while holding every KEY.
    Run(run::RunArgs),
    /// Say who holds each KEY, and for how long.
    Status(status::StatusArgs),
}

/// Where Redis is.
#[derive(Args)]
struct Connection {
    /// A Redis URL (default: $REDIS_URL, then redis://127.0.0.1:6379/); repeat it with
    /// --redlock for every master, or give a few seeds with --cluster.
    #[arg(long = "url", value_name = "URL")]
    urls: Vec<String>,
    /// The URLs are independent masters: a lock is held on a majority of them.
    #[arg(long, conflicts_with = "cluster")]
    redlock: bool,
    /// The URLs are seeds of a Redis Cluster.
    #[arg(long)]
    cluster: bool,
    /// Put before every key in Redis (for ACLs).
    #[arg(long, default_value = "")]
    prefix: String,
}

/// The exit statuses of sysexits(3) this command uses.
pub(crate) const USAGE: u8 = 64;
pub(crate) const UNAVAILABLE: u8 = 69;
pub(crate) const CANNOT_START: u8 = 71;
pub(crate) const LOST: u8 = 75;

impl Connection {
    /// A locker for these settings, with `ttl` as its default TTL.
    fn locker(&self, ttl: Duration) -> Result<Locker, ExitCode> {
        let urls: Vec<String> = match self.urls.as_slice() {
            [] => vec![
                std::env::var("REDIS_URL").unwrap_or_else(|_| "redis://127.0.0.1:6379/".into()),
            ],
            urls => urls.to_vec(),
        };
        let builder = Locker::builder()
            .pool_size(4)
            .default_ttl(ttl)
            .prefix(self.prefix.clone());
        let built = if self.redlock {
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
    }
}
