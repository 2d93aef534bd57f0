//! Faults on the wire, through the fault-injecting proxy (`proxy.rs`): replies lost,
//! half-open connections, latency past the TTL, and Redlock partitions.

use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{Error, LockOptions, Locker, Retry};

use crate::eventually;
use crate::proxy::{Cut, Proxy};
use crate::server::RedisServer;

/// A locker through the proxy, with `tight` bounds: every call fails within about a
/// second.
fn behind(proxy: &Proxy) -> Locker {
    crate::tight()
        .build(proxy.url())
        .expect("a locker through the proxy")
}

fn stored(server: &RedisServer, key: &str) -> Option<String> {
    server.query(&["GET", key])
}

#[test]
fn a_reply_lost_on_acquire_errors_in_time_and_blocks_no_one_beyond_the_ttl() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = behind(&proxy);
    let direct = crate::locker(&server);
    // Well past the I/O timeout, so that the call's error comes long before it expires.
    let ttl = Duration::from_millis(1500);
    // The acquire script loaded (else its first call is EVALSHA, whose NOSCRIPT is lost).
    locker.lock(&["w:other"]).unwrap().release().unwrap();
    proxy.drop_replies_after(0);
    let started = Instant::now();
    let err = locker
        .lock_with(&["w:a"], LockOptions::default().ttl(ttl))
        .unwrap_err();
    let took = started.elapsed();
    assert!(matches!(err, Error::Redis(_)), "{err:?}");
    assert!(took < Duration::from_secs(2), "{took:?}");
    // The request ran: the keys are taken, by nobody who knows it. No second owner while
    // the first might hold them, and none blocked past the TTL.
    assert!(stored(&server, "w:a").is_some());
    assert!(direct.try_lock(&["w:a"]).unwrap().is_none());
    let freed = Instant::now();
    let second = direct.lock(&["w:a"]).unwrap();
    assert!(started.elapsed() >= ttl - Duration::from_millis(50));
    assert!(freed.elapsed() < ttl, "{:?}", freed.elapsed());
    drop(second);
    proxy.heal();
    assert!(
        locker.try_lock(&["w:a"]).unwrap().is_some(),
        "the pool recovered"
    );
}

#[test]
fn a_reply_lost_on_release_never_releases_someone_elses_lock() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = behind(&proxy);
    let direct = crate::locker(&server);
    // The release script is cached on the server: the release below runs there.
    drop(locker.lock(&["w:warm"]).unwrap());
    let options = LockOptions::default().ttl(Duration::from_millis(300));
    let guard = locker
        .lock_with(&["w:r"], options.auto_refresh(false))
        .unwrap();
    // The release is held up on the way (longer than the I/O timeout, and the TTL): it
    // errors, the key expires, a next owner takes it, and only then does it arrive.
    proxy.set(|f| f.up.latency = Duration::from_millis(1200));
    let sent = Instant::now();
    let err = guard.release().unwrap_err();
    assert!(
        matches!(err, Error::Redis(_)),
        "an error, as the docs say: {err:?}"
    );
    let next = loop {
        if let Some(next) = direct.try_lock(&["w:r"]).unwrap() {
            break next;
        }
        assert!(
            sent.elapsed() < Duration::from_secs(5),
            "the key never expired"
        );
        thread::sleep(Duration::from_millis(5));
    };
    assert!(
        sent.elapsed() < Duration::from_millis(1000),
        "taken before it arrived"
    );
    // Until the held-up release has run on the server.
    let calls = server.evalsha_calls();
    eventually(Duration::from_secs(5), "the late release arrives", || {
        server.evalsha_calls() > calls
    });
    assert_eq!(
        stored(&server, "w:r").as_deref(),
        Some(next.token()),
        "the late release left the next owner's lock alone"
    );
    proxy.heal();
    next.release().unwrap();
}

#[test]
fn a_half_open_connection_while_holding_is_lost_in_time_and_the_pool_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let told = Arc::new(AtomicUsize::new(0));
    let counted = Arc::clone(&told);
    let locker = crate::tight()
        .on_lost(move |_| {
            counted.fetch_add(1, Ordering::SeqCst);
        })
        .build(proxy.url())
        .unwrap();
    let ttl = Duration::from_millis(1200);
    let taken = Instant::now();
    let guard = locker
        .lock_with(&["w:h"], LockOptions::default().ttl(ttl))
        .unwrap();
    proxy.set(|f| {
        f.up.blackhole = true;
        f.down.blackhole = true;
    });
    // Every call errors within its bound.
    let started = Instant::now();
    assert!(guard.ttl().is_err());
    assert!(locker.try_lock(&["w:other"]).is_err());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    // Lost by the TTL; and the refresher, whose refreshes go unanswered, says so within
    // about one more refresh attempt (an I/O timeout and its retry delay).
    thread::sleep((taken + ttl).saturating_duration_since(Instant::now()));
    assert!(guard.is_lost());
    eventually(
        Duration::from_secs(2),
        "on_lost told by the refresher",
        || told.load(Ordering::SeqCst) == 1,
    );
    proxy.heal();
    let again = Instant::now();
    eventually(Duration::from_secs(3), "the pool recovers", || {
        locker.try_lock(&["w:h2"]).is_ok_and(|g| g.is_some())
    });
    assert!(again.elapsed() < Duration::from_secs(3));
    assert!(matches!(
        guard.release(),
        Err(Error::LockLost) | Err(Error::Redis(_))
    ));
}

#[test]
fn a_half_open_connection_while_waiting_errors_in_time() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = behind(&proxy);
    let direct = crate::locker(&server);
    let held = direct.lock(&["w:wait"]).unwrap();
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || {
            let options = LockOptions::default().retry(Retry::linear(Duration::from_millis(50)));
            let started = Instant::now();
            (
                locker.lock_with(&["w:wait"], options).map(drop),
                started.elapsed(),
            )
        })
    };
    // Waiting now: its attempts go through the proxy.
    let before = proxy.requests();
    eventually(Duration::from_secs(2), "the waiter attempts", || {
        proxy.requests() > before + 1
    });
    let cut_at = Instant::now();
    proxy.set(|f| {
        f.up.blackhole = true;
        f.down.blackhole = true;
    });
    let (result, _) = waiter.join().unwrap();
    assert!(
        matches!(result, Err(Error::Redis(_)) | Err(Error::Pool(_))),
        "{result:?}"
    );
    assert!(
        cut_at.elapsed() < Duration::from_secs(3),
        "{:?}",
        cut_at.elapsed()
    );
    drop(held);
}

#[test]
fn latency_past_the_ttl_while_holding_is_lost_before_the_server_expires_it() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = Locker::builder()
        .pool_size(2)
        .io_timeout(Duration::from_secs(3))
        .build(proxy.url())
        .unwrap();
    let ttl = Duration::from_millis(600);
    let guard = locker
        .lock_with(&["w:slow"], LockOptions::default().ttl(ttl))
        .unwrap();
    // Replies now take longer than the TTL: refreshes arrive, their answers too late.
    proxy.set(|f| f.down.latency = Duration::from_millis(900));
    let mut con = server.connection();
    let waiting = Instant::now();
    loop {
        let ttl_left: i64 = redis::cmd("PTTL").arg("w:slow").query(&mut con).unwrap();
        if ttl_left == -2 {
            break;
        }
        assert!(waiting.elapsed() < Duration::from_secs(10), "never expired");
        thread::sleep(Duration::from_millis(5));
    }
    // Gone on the server: the guard knew by then (its clock counts from before each
    // request it saw answered).
    assert!(
        guard.is_lost(),
        "the server let it go while the guard said held"
    );
    proxy.heal();
    assert!(matches!(guard.refresh(ttl), Err(Error::LockLost)));
}

/// Five servers, each behind a proxy of each client's own.
struct Quorum {
    servers: Vec<RedisServer>,
}

impl Quorum {
    fn start() -> Quorum {
        Quorum {
            servers: (0..5).map(|_| RedisServer::start()).collect(),
        }
    }

    /// A client: a Redlock locker on proxies of its own to every server.
    fn client(&self) -> (Locker, Vec<Proxy>) {
        let proxies: Vec<Proxy> = self
            .servers
            .iter()
            .map(|s| Proxy::start(s.port()))
            .collect();
        let urls: Vec<String> = proxies.iter().map(Proxy::url).collect();
        let locker = Locker::builder()
            .pool_size(4)
            .node_timeout(Duration::from_millis(200))
            .connect_timeout(Duration::from_millis(200))
            .build_redlock(&urls)
            .unwrap();
        (locker, proxies)
    }
}

#[test]
fn redlock_with_two_slow_nodes_holds_on_three_for_what_is_left_of_the_ttl() {
    let quorum = Quorum::start();
    let (locker, proxies) = quorum.client();
    for slow in &proxies[..2] {
        slow.set(|f| f.down.latency = Duration::from_millis(400)); // above node_timeout
    }
    let ttl = Duration::from_millis(1500);
    let started = Instant::now();
    let guard = locker
        .lock_with(
            &["q:slow"],
            LockOptions::default().ttl(ttl).auto_refresh(false),
        )
        .unwrap();
    let took = started.elapsed();
    // Held on the three fast nodes; the time spent is taken off the validity.
    let holding = quorum
        .servers
        .iter()
        .filter(|s| stored(s, "q:slow").as_deref() == Some(guard.token()))
        .count();
    assert!(holding >= 3, "{holding}");
    // Still held a little before what is left of the TTL after the attempt...
    let left = ttl.saturating_sub(took + Duration::from_millis(150));
    thread::sleep((started + left).saturating_duration_since(Instant::now()));
    assert!(!guard.is_lost() || started.elapsed() > left + Duration::from_millis(50));
    // ...and lost by the TTL counted from before the request.
    thread::sleep((started + ttl).saturating_duration_since(Instant::now()));
    assert!(guard.is_lost());
}

#[test]
fn redlock_clients_on_different_majorities_never_both_hold_and_a_node_comes_back() {
    let mut quorum = Quorum::start();
    let (x, x_proxies) = quorum.client();
    let (y, y_proxies) = quorum.client();
    // x sees nodes 0, 1, 2; y sees 2, 3, 4: only node 2 is on both sides.
    for cut in [&x_proxies[3], &x_proxies[4], &y_proxies[0], &y_proxies[1]] {
        cut.set(|f| {
            f.up.blackhole = true;
            f.down.blackhole = true;
        });
    }
    let inside = Arc::new(AtomicUsize::new(0));
    let most = Arc::new(AtomicUsize::new(0));
    let deadline = Instant::now() + Duration::from_secs(3);
    let workers: Vec<_> = [x.clone(), y.clone()]
        .into_iter()
        .map(|locker| {
            let (inside, most) = (Arc::clone(&inside), Arc::clone(&most));
            thread::spawn(move || {
                let mut held = 0;
                while Instant::now() < deadline {
                    let options = LockOptions::default().ttl(Duration::from_secs(2));
                    if let Ok(Some(guard)) = locker.try_lock_with(&["q:split"], options) {
                        let now = inside.fetch_add(1, Ordering::SeqCst) + 1;
                        most.fetch_max(now, Ordering::SeqCst);
                        held += 1;
                        thread::sleep(Duration::from_millis(20));
                        inside.fetch_sub(1, Ordering::SeqCst);
                        let _ = guard.release();
                    }
                }
                held
            })
        })
        .collect();
    let held: Vec<usize> = workers.into_iter().map(|w| w.join().unwrap()).collect();
    assert!(
        held.iter().all(|n| *n > 0),
        "each side held it in turn: {held:?}"
    );
    assert_eq!(most.load(Ordering::SeqCst), 1, "never both at once");
    // The partition heals: both get the lock again, on every node.
    for proxy in x_proxies.iter().chain(&y_proxies) {
        proxy.heal();
        proxy.cut(Cut::Close);
    }
    for locker in [&x, &y] {
        eventually(Duration::from_secs(3), "held on all five nodes", || {
            let Ok(Some(guard)) = locker.try_lock(&["q:back"]) else {
                return false;
            };
            quorum
                .servers
                .iter()
                .all(|s| stored(s, "q:back").as_deref() == Some(guard.token()))
        });
    }
    // A node killed and started again, empty: left out, then counted again.
    quorum.servers[0].kill();
    let guard = x.lock(&["q:node"]).unwrap();
    drop(guard);
    quorum.servers[0].restart();
    eventually(
        Duration::from_secs(5),
        "the node that came back holds locks",
        || {
            let Ok(Some(guard)) = x.try_lock(&["q:node"]) else {
                return false;
            };
            stored(&quorum.servers[0], "q:node").as_deref() == Some(guard.token())
        },
    );
}

#[test]
fn connections_cut_and_refused_give_errors_within_the_bounds_and_the_pool_recovers() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = behind(&proxy);
    let guard = locker.lock(&["w:cut"]).unwrap();
    proxy.set(|f| f.refuse = true);
    proxy.cut(Cut::Reset);
    let started = Instant::now();
    // (Its request may reach the server before the reset: then the key is taken by
    // nobody who knows it, until its TTL, as for any reply lost on acquire.)
    assert!(locker.try_lock(&["w:other"]).is_err());
    assert!(guard.ttl().is_err());
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "{:?}",
        started.elapsed()
    );
    proxy.heal();
    eventually(Duration::from_secs(3), "the pool recovers", || {
        locker.try_lock(&["w:after"]).is_ok_and(|g| g.is_some())
    });
    // The hold was never lost on the server: the guard still has it.
    assert!(guard.ttl().unwrap().is_some());
    guard.release().unwrap();
}

/// A release that gives the lock to a waiter of the same locker, whose reply is lost with
/// its connection: the request is sent again and finds the keys the waiter's already. The
/// waiter, which the lost reply was to tell, is served all the same.
#[test]
fn a_hand_over_whose_reply_was_lost_still_serves_the_waiter() {
    let server = RedisServer::start();
    let proxy = Proxy::start(server.port());
    let locker = behind(&proxy);
    // The release script loaded (else its first call is EVALSHA, NOSCRIPT, then EVAL).
    locker.lock(&["w:other"]).unwrap().release().unwrap();
    let holder = locker
        .lock_with(&["w:h"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let holder_token = holder.token().to_owned();
    let scripts = server.evalsha_calls();
    let waiter = {
        let locker = locker.clone();
        thread::spawn(move || {
            let patient = LockOptions::default()
                .retry(Retry::linear(Duration::from_secs(10)))
                .timeout(Duration::from_secs(20));
            locker.lock_with(&["w:h"], patient)
        })
    };
    // Queued: it attempted, subscribed, and attempted once more (as it does once its
    // subscription is confirmed).
    eventually(Duration::from_secs(5), "the waiter waits", || {
        server.queued("w:h") == 1 && server.evalsha_calls() >= scripts + 2
    });
    thread::sleep(Duration::from_millis(20)); // from its last reply to its sleep
    // The release (which gives the waiter the lock, and would tell it so in its reply)
    // reaches the server, its reply does not; then the connection is cut, and the request
    // goes out again on another.
    proxy.drop_replies_after(0);
    let releaser = thread::spawn(move || holder.release());
    eventually(Duration::from_secs(5), "the hand-over ran", || {
        stored(&server, "w:h").is_some_and(|value| !value.contains(&holder_token))
    });
    let handed = Instant::now();
    proxy.heal();
    proxy.cut(Cut::Reset);
    // The release sent again finds the keys the waiter's: it cannot tell that from a lock
    // lost (never the reverse).
    let released = releaser.join().unwrap();
    assert!(
        matches!(released, Ok(()) | Err(Error::LockLost)),
        "{released:?}"
    );
    // Told by nobody, the waiter learns it from its queue renewal (a third of the waiter
    // lifetime), which finds its place gone, and its own attempt finds the keys its own.
    let next = waiter.join().unwrap().expect("the waiter holds the lock");
    assert!(
        handed.elapsed() < Duration::from_secs(3),
        "{:?}",
        handed.elapsed()
    );
    assert!(stored(&server, "w:h").unwrap().contains(next.token()));
    next.release().unwrap();
}
