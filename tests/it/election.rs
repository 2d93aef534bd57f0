//! Elections on one server: hand-over, terms, observers, arrival order, a leader that
//! counts itself lost first, and what a loss tells `on_lost`. (Bad input, keys and fenced
//! writes are in `election_input.rs`, candidates in other processes in `election_processes.rs`,
//! Sentinel and Cluster in `election_deploy.rs`.)

use std::sync::{Arc, Mutex, mpsc};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, Leader, LockOptions, Locker, Observer};

use crate::order::in_line;
use crate::server::RedisServer;
use crate::{eventually, locker};

/// How long a new candidate (thread or process) may take to be queued on a loaded machine.
pub(crate) const TO_QUEUE: Duration = Duration::from_secs(15);

/// The lock key of election `name` (no braces in it) for a locker without a prefix; also
/// the channel its observers listen on.
pub(crate) fn lock_key(name: &str) -> String {
    format!("redguard:election:{{{name}}}")
}

/// The fencing counter of election `name`'s lock: its terms.
pub(crate) fn counter_key(name: &str) -> String {
    format!("redguard:fence:t:{}", lock_key(name))
}

/// Where the value its leader proclaimed last is kept.
pub(crate) fn proclaimed_key(name: &str) -> String {
    format!("redguard:proclaimed:t:{}", lock_key(name))
}

/// The next change `observer` yields, which must come within `within`.
pub(crate) fn next_change(observer: &mut Observer, within: Duration) -> Option<Leader> {
    observer
        .next_timeout(within)
        .unwrap_or_else(|| panic!("no change within {within:?}"))
        .expect("the election was read")
}

/// A leader as (term, value), to compare.
pub(crate) fn seen(leader: Option<Leader>) -> Option<(u64, String)> {
    leader.map(|leader| (leader.term(), leader.value().to_owned()))
}

/// The waiting candidate of another locker takes over the moment the leader resigns
/// (its retries are 10 s apart: the release served it); `try_campaign` never waits, and
/// `leader` names whoever leads, with its term and lease.
#[test]
fn a_resigning_leader_hands_the_election_to_the_waiting_candidate() {
    let server = RedisServer::start();
    let election = locker(&server).election("scheduler").unwrap();
    assert_eq!(election.name(), "scheduler");
    assert_eq!(election.leader().unwrap(), None);

    let address = "10.0.0.7:8080"; // a value with a colon, kept whole
    let a = election.campaign(address).unwrap();
    assert_eq!(a.value(), address);
    assert!(!a.is_lost());
    assert!(a.valid_for() > Duration::from_secs(25), "the default 30 s");
    let leader = election.leader().unwrap().expect("a leads");
    assert_eq!((leader.term(), leader.value()), (a.term(), address));
    assert!(leader.ttl() > Duration::from_secs(25) && leader.ttl() <= Duration::from_secs(30));
    assert!(a.fenced_set("cursor", "a").unwrap());

    let other = locker(&server).election("scheduler").unwrap();
    assert!(other.try_campaign("b").unwrap().is_none(), "a leads");
    let waiting = thread::spawn(move || other.campaign_with("b", in_line()));
    eventually(TO_QUEUE, "b is queued", || {
        server.queued(&lock_key("scheduler")) == 1
    });
    let first = a.term();
    let resigned = Instant::now();
    a.resign().unwrap();
    let b = waiting.join().unwrap().unwrap();
    let took = resigned.elapsed();
    assert!(took < Duration::from_secs(1), "served {took:?} after");
    assert!(b.term() > first, "{} after {first}", b.term());
    assert!(
        b.valid_for() > Duration::from_secs(25),
        "a whole lease at once"
    );
    assert!(b.fenced_set("cursor", "b").unwrap());
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((b.term(), "b".into()))
    );
    assert_eq!(server.query::<String>(&["GET", "cursor"]), "b");

    let mut observer = election.observe().unwrap();
    let wait = Duration::from_secs(3);
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((b.term(), "b".into()))
    );
    drop(b); // resigns, and tells the observers
    assert_eq!(next_change(&mut observer, wait), None);
    assert_eq!(election.leader().unwrap(), None);
    assert!(server.queue_entries(&lock_key("scheduler")).is_empty());
}

/// Terms grow with every new leader: of other lockers, the same process and value again
/// (resigned, dropped, or by `try_campaign`), a hand-over, a lock deleted from outside,
/// and a server killed and restarted from its append-only file while a term leads.
#[test]
fn terms_strictly_increase_over_leaders_reelections_and_a_restart() {
    let mut server = RedisServer::start_persistent();
    let mine = locker(&server).election("e").unwrap();
    let theirs = locker(&server).election("e").unwrap();
    let mut terms = Vec::new();
    for round in 0..4 {
        let election = if round % 2 == 0 { &mine } else { &theirs };
        let term = election.campaign("v").unwrap();
        terms.push(term.term());
        term.resign().unwrap();
    }
    for _ in 0..3 {
        let term = mine.campaign("same").unwrap();
        terms.push(term.term());
        drop(term);
        let term = mine.try_campaign("same").unwrap().expect("nobody leads");
        terms.push(term.term());
        term.resign().unwrap();
    }

    let held = mine.campaign("a").unwrap();
    terms.push(held.term());
    let next = {
        let theirs = theirs.clone();
        thread::spawn(move || theirs.campaign_with("b", in_line()))
    };
    eventually(TO_QUEUE, "b is queued", || {
        server.queued(&lock_key("e")) == 1
    });
    held.resign().unwrap();
    let next = next.join().unwrap().unwrap();
    terms.push(next.term());

    // The lock deleted behind the leader's back: the counter is another key, and stays.
    server.query::<u32>(&["DEL", &lock_key("e")]);
    let short = LockOptions::default().ttl(Duration::from_secs(2));
    let across = mine.campaign_with("c", short.clone()).unwrap();
    terms.push(across.term());
    drop(next); // lost: its drop gives nothing up

    server.kill();
    server.restart();
    // The term was kept by the append-only file (fsynced at once), and is resigned.
    assert_eq!(
        seen(theirs.leader().unwrap()),
        Some((across.term(), "c".into()))
    );
    across.resign().unwrap();
    let after = theirs.campaign_with("d", short).unwrap();
    terms.push(after.term());
    assert!(
        terms.windows(2).all(|pair| pair[0] < pair[1]),
        "not strictly increasing: {terms:?}"
    );
    assert_eq!(
        server.query::<u64>(&["GET", &counter_key("e")]),
        after.term()
    );
    assert_eq!(
        seen(mine.leader().unwrap()),
        Some((after.term(), "d".into()))
    );
}

/// A leader whose lease is not renewed counts itself lost (by its own clock) before the
/// server lets the next candidate in: every `false` from `is_lost` was said before the
/// successor led, and so was the instant `valid_for` gave. Its term is then stale.
#[test]
fn a_leader_without_renewals_counts_itself_lost_before_its_successor_leads() {
    let server = RedisServer::start();
    let ttl = Duration::from_secs(1);
    let paused = locker(&server)
        .election("e")
        .unwrap()
        .campaign_with(
            "paused",
            LockOptions::default().ttl(ttl).auto_refresh(false),
        )
        .unwrap();
    // valid_for first: `lost_from` is then no earlier than the instant is_lost turns.
    let left = paused.valid_for();
    let lost_from = Instant::now() + left;
    assert!(!left.is_zero() && left < ttl, "{left:?}");

    let next = locker(&server).election("e").unwrap();
    let successor = thread::spawn(move || {
        let options = LockOptions::default().timeout(Duration::from_secs(10));
        let term = next.campaign_with("next", options);
        (term, Instant::now())
    });
    let mut last_false = None;
    loop {
        let asked = Instant::now();
        if paused.is_lost() {
            break;
        }
        last_false = Some(asked);
        thread::sleep(Duration::from_millis(1));
    }
    let (next, led_at) = successor.join().unwrap();
    let next = next.unwrap();
    let last_false = last_false.expect("not lost at first");
    assert!(last_false < led_at, "said held after the successor led");
    assert!(lost_from < led_at, "lost {:?} late", lost_from - led_at);
    println!("lost {:?} before the successor led", led_at - lost_from);

    assert!(paused.is_lost() && paused.valid_for().is_zero());
    assert!(next.term() > paused.term());
    assert!(next.fenced_set("out", "next").unwrap());
    assert!(!paused.fenced_set("out", "paused").unwrap(), "a stale term");
    assert_eq!(server.query::<String>(&["GET", "out"]), "next");
    assert!(matches!(paused.resign(), Err(Error::LockLost)));
    assert!(!next.is_lost());
}

/// Polls `observer`, which must yield nothing meanwhile, until the server counts one
/// subscriber (its locker's) to the release channel of election `name`'s lock, where
/// observers hear of changes.
fn listening(server: &RedisServer, observer: &mut Observer, name: &str) {
    let channel = format!("redguard:released:{}", lock_key(name));
    eventually(Duration::from_secs(5), "the observer listens", || {
        let change = observer.next_timeout(Duration::from_millis(20));
        assert!(change.is_none(), "{change:?}");
        server.subscribers(&channel) == 1
    });
}

/// An observer yields the state at first, then each leader (terms increasing), a
/// proclaimed value, `None` after a resignation and `None` after a lease ran out (no one
/// published that: it read at the expiry), and nothing when nothing changed.
#[test]
fn an_observer_sees_each_leader_its_proclamation_and_each_vacancy_in_order() {
    let server = RedisServer::start();
    let election = locker(&server).election("e").unwrap();
    let mut observer = election.observe().unwrap();
    let first = observer.next().expect("an iterator without end");
    assert_eq!(first.unwrap(), None, "nobody leads yet");
    listening(&server, &mut observer, "e");

    let mut a = election.campaign("a").unwrap();
    let wait = Duration::from_secs(3);
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((a.term(), "a".into()))
    );
    a.proclaim("a2").unwrap();
    assert_eq!(a.value(), "a2");
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((a.term(), "a2".into()))
    );
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((a.term(), "a2".into()))
    );
    let first_term = a.term();
    a.resign().unwrap();
    assert_eq!(next_change(&mut observer, wait), None);

    let once = LockOptions::default()
        .ttl(Duration::from_secs(1))
        .auto_refresh(false);
    let b = election.campaign_with("b", once).unwrap();
    assert!(b.term() > first_term);
    // a's proclamation was of its own term only.
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((b.term(), "b".into()))
    );
    assert_eq!(next_change(&mut observer, wait), None, "b's lease ran out");
    assert!(b.is_lost(), "the server let b go, and b does not know");
    assert!(
        observer.next_timeout(Duration::from_millis(300)).is_none(),
        "no change to tell"
    );
}

/// An observer whose locker's subscriber was cut off misses what changed meanwhile, but
/// the first thing it yields after is the leader now, never an earlier one; it then
/// listens again.
#[test]
fn an_observer_cut_off_yields_the_leader_now_and_never_an_older_one() {
    let server = RedisServer::start();
    let mine = locker(&server).election("e").unwrap();
    let theirs = locker(&server).election("e").unwrap();
    let mut observer = mine.observe().unwrap();
    let wait = Duration::from_secs(3);
    assert_eq!(next_change(&mut observer, wait), None);
    let a = mine.campaign("a").unwrap();
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((a.term(), "a".into()))
    );

    listening(&server, &mut observer, "e");
    let killed: u64 = server.query(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    assert!(killed >= 1, "the observer's locker's subscriber");
    let mut terms = vec![a.term()];
    a.resign().unwrap();
    let b = theirs.campaign("b").unwrap();
    terms.push(b.term());
    b.resign().unwrap();
    let c = mine.campaign("c").unwrap();
    terms.push(c.term());
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((c.term(), "c".into())),
        "the leader now, after the gap"
    );
    listening(&server, &mut observer, "e");

    c.resign().unwrap();
    assert_eq!(next_change(&mut observer, wait), None);
    let d = theirs.campaign("d").unwrap();
    terms.push(d.term());
    assert_eq!(
        seen(next_change(&mut observer, wait)),
        Some((d.term(), "d".into()))
    );
    assert!(terms.windows(2).all(|pair| pair[0] < pair[1]), "{terms:?}");
}

/// Three candidates of three lockers queue one after another behind a leader; each
/// resignation makes the next in line the leader, in the order they came.
#[test]
fn waiting_candidates_lead_in_the_order_they_came() {
    let server = RedisServer::start();
    let election = locker(&server).election("e").unwrap();
    let mut leading = election.campaign("holder").unwrap();
    let (tx, rx) = mpsc::channel();
    let candidates: Vec<_> = (0..3)
        .map(|i| {
            let (election, tx) = (locker(&server).election("e").unwrap(), tx.clone());
            let candidate = thread::spawn(move || {
                tx.send(election.campaign_with(&format!("c{i}"), in_line()))
                    .unwrap();
            });
            eventually(TO_QUEUE, &format!("c{i} is queued"), || {
                server.queued(&lock_key("e")) == i + 1
            });
            candidate
        })
        .collect();
    let line = server.queue_entries(&lock_key("e"));
    assert_eq!(line.len(), 3, "{line:?}");
    for (i, entry) in line.iter().enumerate() {
        assert!(entry.ends_with(&format!("c{i}")), "{line:?}");
    }

    for i in 0..3 {
        let before = leading.term();
        leading.resign().unwrap();
        leading = rx
            .recv_timeout(Duration::from_secs(5))
            .expect("the next candidate leads")
            .unwrap();
        assert_eq!(leading.value(), format!("c{i}"));
        assert!(leading.term() > before);
        assert_eq!(
            seen(election.leader().unwrap()),
            Some((leading.term(), format!("c{i}")))
        );
    }
    leading.resign().unwrap();
    for candidate in candidates {
        candidate.join().unwrap();
    }
    assert!(server.queue_entries(&lock_key("e")).is_empty());
    assert_eq!(election.leader().unwrap(), None);
}

/// The lock of a leading term deleted from outside: the refresher finds it gone and
/// tells `on_lost` (once, with the election's lock and the value), the term is lost,
/// and another candidate leads with a larger term.
#[test]
fn a_term_deleted_from_outside_is_lost_and_told_to_on_lost() {
    let server = RedisServer::start();
    type Told = (Vec<String>, String);
    let told: Arc<Mutex<Vec<Told>>> = Arc::default();
    let locker = {
        let told = Arc::clone(&told);
        Locker::builder()
            .on_lost(move |lost| {
                let what = (lost.keys().to_vec(), lost.metadata().to_owned());
                told.lock().unwrap().push(what);
            })
            .build(server.url())
            .unwrap()
    };
    let election = locker.election("e").unwrap();
    let ttl = LockOptions::default().ttl(Duration::from_millis(900));
    let mut term = election.campaign_with("a", ttl).unwrap();
    server.query::<u32>(&["DEL", &lock_key("e")]);
    eventually(Duration::from_secs(3), "on_lost is told", || {
        !told.lock().unwrap().is_empty()
    });
    assert_eq!(
        *told.lock().unwrap(),
        [(vec![lock_key("e")], "a".to_string())]
    );
    assert!(term.is_lost() && term.valid_for().is_zero());
    assert!(matches!(term.proclaim("a2"), Err(Error::LockLost)));
    assert_eq!(term.value(), "a");

    let next = crate::locker(&server).election("e").unwrap();
    let next = next.try_campaign("b").unwrap().expect("nobody leads");
    assert!(next.term() > term.term());
    assert!(matches!(term.resign(), Err(Error::LockLost)));
    assert_eq!(told.lock().unwrap().len(), 1, "told once");
    assert_eq!(
        seen(election.leader().unwrap()),
        Some((next.term(), "b".into()))
    );
}
