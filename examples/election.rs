//! Leader election: three processes campaign for one scheduler; its leader is SIGKILLed,
//! another takes over with a higher term, and a write from an older term is refused.
//!
//! The example runs itself again as the three candidates (`election candidate NAME URL`).
//! Each leader writes the scheduler's cursor with `fenced_set` every 100 ms. The parent
//! first leads itself, for 0.5 s and without renewals, and keeps that old term to show
//! that its late write is refused. Exits non-zero when anything happens otherwise. Uses
//! `REDIS_URL` when set (keys under `demo:`), else a throwaway `redis-server` from PATH.
//!
//! ```text
//! cargo run --example election
//! ```

use std::io::Read;
use std::process::{Child, Command, ExitCode, Stdio};
use std::thread;
use std::time::{Duration, Instant};

use redguard::testing::Server;
use redguard::{Leader, LockOptions, Locker, Observer};

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const CURSOR: &str = "scheduler:cursor"; // "demo:scheduler:cursor" in Redis (the prefix)

fn main() -> Result<ExitCode> {
    let args: Vec<String> = std::env::args().collect();
    if let [_, role, name, url] = args.as_slice()
        && role == "candidate"
    {
        return candidate(name, url).map(|()| ExitCode::SUCCESS);
    }
    let (url, server) = Server::from_env_or_start("REDIS_URL")?;
    if server.is_some() {
        println!("REDIS_URL is not set: started a throwaway redis-server at {url}");
    }
    let election = locker(&url)?.election("scheduler")?;
    let mut redis = redis::Client::open(url.as_str())?.get_connection()?;
    let mut observer = election.observe()?;
    let mut failed = 0;
    let mut check = |ok: bool, what: &str| {
        println!("   {} {what}", if ok { "ok:" } else { "FAILED:" });
        failed += usize::from(!ok);
    };

    let options = LockOptions::default().ttl(Duration::from_millis(500));
    let old = election.campaign_with("parent", options.auto_refresh(false))?;
    let term = old.term();
    println!("1. the parent leads as term {term}, for 0.5 s without renewals");
    let write = format!("parent, term {term}");
    check(old.fenced_set(CURSOR, &write)?, "it writes");

    println!("2. three candidate processes campaign; the parent's lease runs out");
    let mut candidates = Candidates(Vec::new());
    for name in ["candidate-1", "candidate-2", "candidate-3"] {
        let child = Command::new(std::env::current_exe()?)
            .args(["candidate", name, url.as_str()])
            .stdin(Stdio::piped()) // closed when the parent dies: the candidate exits too
            .spawn()?;
        candidates.0.push((name, child));
    }
    let first = next_leader(&mut observer, "parent")?;
    check(first.term() > old.term(), "a term larger than the parent's");
    check(written_by(&mut redis, &first)?, "it writes");

    let killed = first.value();
    println!("3. SIGKILL {killed}: it never resigns; its lease runs out");
    if let Some((_, child)) = candidates.0.iter_mut().find(|(name, _)| *name == killed) {
        child.kill()?;
        child.wait()?;
    }
    let second = next_leader(&mut observer, killed)?;
    check(second.term() > first.term(), "a term larger than before");
    check(written_by(&mut redis, &second)?, "it writes");

    let lost = old.is_lost();
    println!("4. the parent writes with its old term anyway (is_lost() = {lost})");
    let written = old.fenced_set(CURSOR, "parent, stale")?;
    check(!written, "fenced_set refuses");
    check(written_by(&mut redis, &second)?, "the cursor is unchanged");
    drop(candidates);
    Ok(ExitCode::from(u8::from(failed > 0)))
}

/// A candidate: waits for its turn, then writes the cursor with its term while it leads.
fn candidate(name: &str, url: &str) -> Result<()> {
    thread::spawn(|| {
        let _ = std::io::stdin().read_to_end(&mut Vec::new());
        std::process::exit(0); // the parent is gone
    });
    let election = locker(url)?.election("scheduler")?;
    let term = election.campaign_with(name, LockOptions::default().ttl(Duration::from_secs(1)))?;
    let write = format!("{name}, term {}", term.term());
    println!("   [{name}] leads as term {}", term.term());
    while !term.is_lost() {
        if !term.fenced_set(CURSOR, &write)? {
            println!("   [{name}] refused: a later term wrote");
            break;
        }
        thread::sleep(Duration::from_millis(100));
    }
    Ok(())
}

fn locker(url: &str) -> redguard::Result<Locker> {
    Locker::builder().prefix("demo:").build(url) // every key under demo:
}

/// The next leader the observer sees that is not `not`, telling each change on the way.
fn next_leader(observer: &mut Observer, not: &str) -> Result<Leader> {
    let deadline = Instant::now() + Duration::from_secs(10);
    while let Some(left) = deadline.checked_duration_since(Instant::now()) {
        match observer.next_timeout(left).transpose()? {
            Some(Some(leader)) => {
                let (value, term) = (leader.value(), leader.term());
                println!("   observer: {value} leads, term {term}");
                if value != not {
                    return Ok(leader);
                }
            }
            Some(None) => println!("   observer: nobody leads"),
            None => {} // no change yet
        }
    }
    Err("no new leader within 10 s".into())
}

/// Whether the cursor shows `leader`'s write within 2 s, read with a plain GET.
fn written_by(redis: &mut redis::Connection, leader: &Leader) -> Result<bool> {
    let want = format!("{}, term {}", leader.value(), leader.term());
    let deadline = Instant::now() + Duration::from_secs(2);
    while Instant::now() < deadline {
        let cursor: Option<String> = redis::cmd("GET")
            .arg("demo:scheduler:cursor")
            .query(redis)?;
        if cursor.as_deref() == Some(want.as_str()) {
            println!("   cursor: {want:?}");
            return Ok(true);
        }
        thread::sleep(Duration::from_millis(20));
    }
    Ok(false)
}

/// The candidate processes, killed when the example ends (however it ends).
struct Candidates(Vec<(&'static str, Child)>);

impl Drop for Candidates {
    fn drop(&mut self) {
        for (_, child) in &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}
