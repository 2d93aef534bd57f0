//! Redlock: nodes killed, frozen, restarted empty or out of reach; the lock holds while a
//! majority answers.

use super::*;

#[test]
fn two_nodes_killed_locks_still_work() {
    let mut servers = five();
    let urls = urls(&servers);
    let locker = redlock(&urls);
    let held = locker.lock(&["k"]).unwrap();
    servers[1].kill();
    servers[3].kill();
    held.refresh(Duration::from_secs(10)).unwrap();
    assert!(held.ttl().unwrap().is_some());
    assert!(
        locker.try_lock(&["k"]).unwrap().is_none(),
        "still exclusive"
    );
    held.release().unwrap();
    let started = Instant::now();
    let again = locker.lock(&["k"]).unwrap();
    assert!(
        started.elapsed() < 2 * NODE_TIMEOUT,
        "{:?}",
        started.elapsed()
    );
    again.release().unwrap();
}

#[test]
fn three_nodes_killed_gives_not_obtained_at_once() {
    let mut servers = five();
    let locker = redlock(&urls(&servers));
    let held = locker.lock(&["k"]).unwrap();
    for i in [0, 2, 4] {
        servers[i].kill();
    }
    for _ in 0..3 {
        let started = Instant::now();
        // No deadline, endless retries: still no hang.
        let result = locker.lock(&["other"]);
        assert!(matches!(result, Err(Error::NotObtained)), "{result:?}");
        assert!(
            started.elapsed() < 2 * NODE_TIMEOUT,
            "{:?}",
            started.elapsed()
        );
    }
    let once = locker.try_lock(&["other"]);
    assert!(
        matches!(once, Err(Error::Redis(_))),
        "not 'held elsewhere': {once:?}"
    );
    assert!(held.refresh(Duration::from_secs(10)).is_err());
    assert!(held.ttl().is_err());
    let started = Instant::now();
    drop(held);
    assert!(started.elapsed() < 2 * NODE_TIMEOUT, "drop is bounded");
}

#[test]
fn frozen_nodes_cost_one_node_timeout_together_then_are_left_out() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    drop(locker.lock(&["warm"]).unwrap()); // connections made
    servers[0].pause();
    servers[4].pause();
    let started = Instant::now();
    let guard = locker.lock(&["k"]).unwrap();
    let first = started.elapsed();
    // Both replies are awaited against one deadline, not one after the other.
    assert!(
        first >= NODE_TIMEOUT && first < NODE_TIMEOUT * 3 / 2,
        "{first:?}"
    );
    guard.release().unwrap();
    // From then on, each lock sees the frozen nodes left out, or on probation when their
    // rest ends (waited for about as long as the others took): never a node timeout again.
    let until = Instant::now() + Duration::from_millis(2500);
    let mut slowest = Duration::ZERO;
    let mut cycles = 0;
    while Instant::now() < until {
        let started = Instant::now();
        locker.lock(&["k"]).unwrap().release().unwrap();
        slowest = slowest.max(started.elapsed());
        cycles += 1;
    }
    assert!(
        slowest < NODE_TIMEOUT / 3,
        "slowest of {cycles} cycles: {slowest:?}"
    );
    servers[0].resume();
    servers[4].resume();
    // Back in use once they answer: a lock is then taken on all five.
    eventually(
        Duration::from_secs(3),
        "the resumed nodes hold locks again",
        || {
            let guard = locker.lock(&["back"]).unwrap();
            let held = values(&servers, "back").iter().flatten().count();
            drop(guard);
            held == 5
        },
    );
}

#[test]
fn node_restarted_empty_during_a_hold_keeps_the_lock_and_its_exclusion() {
    let mut servers = five();
    let urls = urls(&servers);
    let (one, two) = (redlock(&urls), redlock(&urls));
    let guard = one.lock(&["k"]).unwrap();
    servers[2].kill();
    servers[2].restart(); // in memory only: the key is gone there
    assert_eq!(values(&servers, "k")[2], None);
    assert!(
        two.try_lock(&["k"]).unwrap().is_none(),
        "four of five still hold it"
    );
    guard.refresh(Duration::from_secs(10)).unwrap();
    assert!(!guard.is_lost());
    assert!(guard.ttl().unwrap().is_some());
    guard.release().unwrap();
    assert!(two.try_lock(&["k"]).unwrap().is_some());
}

#[test]
fn clients_that_each_reach_a_different_three_of_five_exclude_each_other() {
    let servers = five();
    let all = urls(&servers);
    // A node a client cannot reach: a closed port in its place.
    let unreachable = |i: usize| closed_url(i as u16);
    let views = [[0, 1, 2], [2, 3, 4], [0, 3, 4], [1, 2, 4]];
    let lockers: Vec<Locker> = views
        .iter()
        .map(|view| {
            let seen: Vec<String> = (0..5)
                .map(|i| {
                    if view.contains(&i) {
                        all[i].clone()
                    } else {
                        unreachable(i)
                    }
                })
                .collect();
            redlock(&seen)
        })
        .collect();
    let inside = Arc::new(AtomicBool::new(false));
    let entries = Arc::new(AtomicU64::new(0));
    let deadline = Instant::now() + Duration::from_millis(1500);
    let threads: Vec<_> = lockers
        .into_iter()
        .map(|locker| {
            let (inside, entries) = (Arc::clone(&inside), Arc::clone(&entries));
            thread::spawn(move || {
                let options =
                    || LockOptions::default().retry(Retry::linear(Duration::from_millis(5)));
                let mut mine = 0;
                while Instant::now() < deadline {
                    let guard = locker
                        .lock_with(&["shared"], options().timeout(Duration::from_secs(5)))
                        .unwrap();
                    assert!(!inside.swap(true, Ordering::SeqCst), "two owners at once");
                    thread::sleep(Duration::from_micros(200));
                    inside.store(false, Ordering::SeqCst);
                    entries.fetch_add(1, Ordering::Relaxed);
                    mine += 1;
                    guard.release().unwrap();
                }
                mine
            })
        })
        .collect();
    let per_client: Vec<u64> = threads.into_iter().map(|t| t.join().unwrap()).collect();
    assert!(
        per_client.iter().all(|&n| n > 0),
        "every client got in: {per_client:?}"
    );
    assert!(entries.load(Ordering::Relaxed) > 20);
}

#[test]
fn refresher_keeps_a_short_lock_alive_on_a_majority() {
    let mut servers = five();
    let locker = redlock(&urls(&servers));
    let guard = locker
        .lock_with(
            &["k"],
            LockOptions::default().ttl(Duration::from_millis(600)),
        )
        .unwrap();
    servers[0].kill();
    let until = Instant::now() + Duration::from_secs(2);
    while Instant::now() < until {
        assert!(!guard.is_lost());
        thread::sleep(Duration::from_millis(50));
    }
    let ttl = guard.ttl().unwrap().expect("held");
    assert!(ttl <= Duration::from_millis(600));
    // Deleted on three nodes behind its back: the refresher sees a minority and gives up.
    for server in &servers[1..4] {
        let _: u64 = server.query(&["DEL", "k"]);
    }
    eventually(
        Duration::from_secs(2),
        "the refresher marks the lock lost",
        || guard.is_lost(),
    );
}

#[test]
fn waiter_is_still_woken_after_the_node_it_listened_on_died() {
    let mut servers = five();
    let locker = redlock(&urls(&servers));
    let holder = locker.lock(&["k"]).unwrap();
    let first = thread::spawn({
        let locker = locker.clone();
        move || {
            drop(locker.lock_with(
                &["k"],
                LockOptions::default().timeout(Duration::from_secs(5)),
            ))
        }
    });
    eventually(
        Duration::from_secs(5),
        "the subscriber listens on the last node",
        || servers[4].subscribers("redguard:released:k") == 1,
    );
    servers[4].kill();
    eventually(
        Duration::from_secs(5),
        "the subscriber moves to the next node",
        || servers[3].subscribers("redguard:released:k") == 1,
    );
    let waiting = waiter(&locker, "k");
    thread::sleep(Duration::from_millis(50)); // let it make its first attempt
    let released = Instant::now();
    holder.release().unwrap();
    first.join().unwrap();
    let (got, at) = waiting.join().unwrap();
    drop(got.unwrap());
    assert!(
        at - released < Duration::from_secs(2),
        "{:?}",
        at - released
    );
}

#[test]
fn a_lock_is_not_given_up_while_the_silent_nodes_could_still_hold_it() {
    let servers = five();
    let locker = redlock(&urls(&servers));
    let guard = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    servers[0].pause();
    servers[1].pause();
    // Lost there (as on a restart), but the node answers: a restarted node's pool would
    // first have to find its old connections closed, and the refresh be short of answers.
    let _: u64 = servers[2].query(&["DEL", "k"]);
    // Two of the three that answer hold it; the two silent ones may too.
    let refreshed = guard.refresh(Duration::from_secs(30));
    assert!(
        matches!(&refreshed, Err(Error::Redis(e)) if e.to_string().contains("a majority holds")),
        "says what happened: {refreshed:?}"
    );
    assert!(guard.ttl().is_err());
    assert!(!guard.is_lost());
    servers[0].resume();
    servers[1].resume();
    eventually(
        Duration::from_secs(3),
        "refreshed once the nodes answer",
        || guard.refresh(Duration::from_secs(30)).is_ok(),
    );
    // Deleted on three nodes: now lost for certain.
    for server in &servers[..3] {
        let _: u64 = server.query(&["DEL", "k"]);
    }
    // (Once the resumed nodes answer again: until then they might still hold it.)
    eventually(
        Duration::from_secs(3),
        "refresh reports the lock lost",
        || matches!(guard.refresh(Duration::from_secs(30)), Err(Error::LockLost)),
    );
    assert!(matches!(guard.release(), Err(Error::LockLost)));
}
