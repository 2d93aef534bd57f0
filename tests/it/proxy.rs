//! A fault-injecting TCP proxy between lockers and a `redis-server`, on loopback only:
//! latency (fixed and jittered), bytes dropped silently (a blackhole: the connection stays
//! open), every connection cut (RST or FIN), new connections refused, and replies dropped
//! after a set number of requests. Each direction on its own: `up` is client to server,
//! `down` server to client. Driven from the test thread; stopped with its handle.

use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, TcpListener, TcpStream};
use std::os::fd::AsRawFd;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

use parking_lot::Mutex;

/// What one direction does to the bytes passing through it.
#[derive(Clone, Copy, Debug, Default)]
pub struct Direction {
    /// Each chunk waits this long before it is passed on.
    pub latency: Duration,
    /// And up to this much more, at random.
    pub jitter: Duration,
    /// Dropped silently: the connection stays open.
    pub blackhole: bool,
}

/// Every fault at once.
#[derive(Clone, Copy, Debug, Default)]
pub struct Faults {
    pub up: Direction,
    pub down: Direction,
    /// New connections are reset as soon as they are accepted.
    pub refuse: bool,
}

/// How [`Proxy::cut`] ends the connections.
#[derive(Clone, Copy, Debug)]
pub enum Cut {
    /// RST: the peer's next read or write fails at once.
    Reset,
    /// FIN: an orderly close.
    Close,
}

/// One proxied connection: both ends, and what its pumps are told.
struct Link {
    client: TcpStream,
    server: TcpStream,
    state: Arc<LinkState>,
}

#[derive(Default)]
struct LinkState {
    /// Cut: nothing more is passed on (a shutdown of the reading side still delivers
    /// what was queued, so the pumps must be told).
    cut: AtomicBool,
    /// Cut by RST: the pumps close without a FIN.
    reset: AtomicBool,
    /// Pumps that ended (2: the link is gone).
    ended: AtomicU64,
}

pub struct Proxy {
    port: u16,
    shared: Arc<Shared>,
    accept: Option<JoinHandle<()>>,
}

struct Shared {
    upstream: u16,
    faults: Mutex<Faults>,
    /// Both ends of each live connection, to cut them.
    conns: Mutex<Vec<Link>>,
    stop: AtomicBool,
    /// Requests seen going up, and from which one on replies are dropped.
    requests: AtomicU64,
    drop_replies_from: AtomicU64,
    threads: Mutex<Vec<JoinHandle<()>>>,
    /// Cuts so far: a connection accepted while one was under way is cut too.
    cuts: AtomicU64,
}

impl Proxy {
    /// A proxy on a free port of 127.0.0.1 to the server on `upstream` (127.0.0.1).
    pub fn start(upstream: u16) -> Proxy {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind the proxy");
        let port = listener.local_addr().unwrap().port();
        listener.set_nonblocking(true).unwrap();
        let shared = Arc::new(Shared {
            upstream,
            faults: Mutex::default(),
            conns: Mutex::default(),
            stop: AtomicBool::new(false),
            requests: AtomicU64::new(0),
            drop_replies_from: AtomicU64::new(u64::MAX),
            threads: Mutex::default(),
            cuts: AtomicU64::new(0),
        });
        let accept = {
            let shared = Arc::clone(&shared);
            thread::spawn(move || accept_loop(&listener, &shared))
        };
        Proxy {
            port,
            shared,
            accept: Some(accept),
        }
    }

    pub fn port(&self) -> u16 {
        self.port
    }

    pub fn url(&self) -> String {
        format!("redis://127.0.0.1:{}/", self.port)
    }

    /// Changes the faults (for connections open now and later).
    pub fn set(&self, change: impl FnOnce(&mut Faults)) {
        change(&mut self.shared.faults.lock());
    }

    /// No faults any more (connections cut stay cut).
    pub fn heal(&self) {
        *self.shared.faults.lock() = Faults::default();
        self.shared
            .drop_replies_from
            .store(u64::MAX, Ordering::SeqCst);
    }

    /// Ends every open connection, both ends. A reset is sent once every copy of a
    /// socket is closed: the pumps are woken by a shutdown of the reading side (which
    /// sends nothing), and close without a FIN.
    pub fn cut(&self, how: Cut) {
        self.shared.cuts.fetch_add(1, Ordering::SeqCst);
        for link in self.shared.conns.lock().drain(..) {
            if let Cut::Reset = how {
                link.state.reset.store(true, Ordering::SeqCst);
            }
            link.state.cut.store(true, Ordering::SeqCst);
            for stream in [&link.client, &link.server] {
                match how {
                    Cut::Reset => {
                        reset_on_close(stream);
                        let _ = stream.shutdown(Shutdown::Read);
                    }
                    Cut::Close => {
                        let _ = stream.shutdown(Shutdown::Both);
                    }
                }
            }
        }
    }

    /// The next `n` requests pass, and so do their replies; the replies of every request
    /// after them are dropped (the requests still reach the server). Requests are counted
    /// over every connection together: for tests that send one request at a time.
    pub fn drop_replies_after(&self, n: u64) {
        let from = self.shared.requests.load(Ordering::SeqCst) + n;
        self.shared.drop_replies_from.store(from, Ordering::SeqCst);
    }

    /// Requests seen going up so far.
    pub fn requests(&self) -> u64 {
        self.shared.requests.load(Ordering::SeqCst)
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.shared.stop.store(true, Ordering::SeqCst);
        self.cut(Cut::Close);
        if let Some(accept) = self.accept.take() {
            let _ = accept.join();
        }
        for pump in self.shared.threads.lock().drain(..) {
            let _ = pump.join();
        }
    }
}

fn accept_loop(listener: &TcpListener, shared: &Arc<Shared>) {
    while !shared.stop.load(Ordering::SeqCst) {
        let cuts = shared.cuts.load(Ordering::SeqCst);
        let client = match listener.accept() {
            Ok((client, _)) => client,
            // Also on any other error (out of descriptors): never spin.
            Err(_) => {
                thread::sleep(Duration::from_millis(2));
                continue;
            }
        };
        // Links and threads that ended are forgotten (a long run makes thousands).
        shared
            .conns
            .lock()
            .retain(|link| link.state.ended.load(Ordering::SeqCst) < 2);
        shared.threads.lock().retain(|pump| !pump.is_finished());
        let _ = client.set_nonblocking(false);
        if shared.faults.lock().refuse {
            reset_on_close(&client);
            continue;
        }
        let Ok(server) = TcpStream::connect(("127.0.0.1", shared.upstream)) else {
            reset_on_close(&client);
            continue;
        };
        let _ = client.set_nodelay(true);
        let _ = server.set_nodelay(true);
        let (Ok(c2), Ok(s2), Ok(c3), Ok(s3)) = (
            client.try_clone(),
            server.try_clone(),
            client.try_clone(),
            server.try_clone(),
        ) else {
            continue;
        };
        let state = Arc::new(LinkState::default());
        if shared.cuts.load(Ordering::SeqCst) != cuts {
            // A cut came while it was being accepted: it is cut too.
            let _ = c3.shutdown(Shutdown::Both);
            let _ = s3.shutdown(Shutdown::Both);
            state.cut.store(true, Ordering::SeqCst);
        }
        shared.conns.lock().push(Link {
            client: c3,
            server: s3,
            state: Arc::clone(&state),
        });
        let up = {
            let (shared, state) = (Arc::clone(shared), Arc::clone(&state));
            thread::spawn(move || pump(&shared, &state, client, server, true))
        };
        let down = {
            let shared = Arc::clone(shared);
            thread::spawn(move || pump(&shared, &state, s2, c2, false))
        };
        shared.threads.lock().extend([up, down]);
    }
}

/// Passes bytes from `from` to `to` as the faults say, until either end closes. Latency is
/// slept per chunk on the reading thread: queued chunks add up, and a heal does not cut
/// short a sleep already under way.
fn pump(shared: &Shared, state: &LinkState, mut from: TcpStream, mut to: TcpStream, up: bool) {
    let _ = from.set_read_timeout(Some(Duration::from_millis(20)));
    // A peer that stops reading must not hold the pump (and the proxy's drop) for ever.
    let _ = to.set_write_timeout(Some(Duration::from_secs(2)));
    let mut requests = Requests::default();
    let mut buf = vec![0u8; 64 * 1024];
    loop {
        if shared.stop.load(Ordering::SeqCst) || state.cut.load(Ordering::SeqCst) {
            break;
        }
        let n = match from.read(&mut buf) {
            Ok(0) => break,
            Ok(n) => n,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => continue,
            Err(_) => break,
        };
        if up {
            let started = requests.feed(&buf[..n]);
            shared.requests.fetch_add(started, Ordering::SeqCst);
        }
        let faults = *shared.faults.lock();
        let direction = if up { faults.up } else { faults.down };
        let dropping = !up
            && shared.requests.load(Ordering::SeqCst)
                > shared.drop_replies_from.load(Ordering::SeqCst);
        if direction.blackhole || dropping {
            continue;
        }
        let delay = direction.latency + jitter(direction.jitter);
        if !delay.is_zero() {
            thread::sleep(delay);
        }
        if state.cut.load(Ordering::SeqCst) || to.write_all(&buf[..n]).is_err() {
            break;
        }
    }
    if !state.reset.load(Ordering::SeqCst) {
        let _ = to.shutdown(Shutdown::Write);
    }
    state.ended.fetch_add(1, Ordering::SeqCst);
}

/// A random duration up to `max`.
fn jitter(max: Duration) -> Duration {
    if max.is_zero() {
        return Duration::ZERO;
    }
    let nanos = Instant::now().elapsed().subsec_nanos() as u64 ^ seed();
    Duration::from_nanos(nanos % max.as_nanos().max(1) as u64)
}

fn seed() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0x9e37_79b9_7f4a_7c15);
    let x = NEXT.fetch_add(0x9e37_79b9_7f4a_7c15, Ordering::Relaxed);
    (x ^ (x >> 31)).wrapping_mul(0xbf58_476d_1ce4_e5b9)
}

/// SO_LINGER 0: closing the socket sends RST, not FIN.
fn reset_on_close(stream: &TcpStream) {
    let linger = libc::linger {
        l_onoff: 1,
        l_linger: 0,
    };
    // SAFETY: a valid socket descriptor of a live TcpStream, and a linger struct of the
    // size passed.
    let set = unsafe {
        libc::setsockopt(
            stream.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_LINGER,
            (&linger as *const libc::linger).cast(),
            std::mem::size_of::<libc::linger>() as libc::socklen_t,
        )
    };
    assert_eq!(set, 0, "SO_LINGER: a reset would quietly be a close");
}

/// Counts the requests in a stream of RESP requests (arrays of bulk strings, as redis-rs
/// sends them), across chunk boundaries.
#[derive(Default)]
struct Requests {
    /// The header line being read (`*3`, `$5`).
    line: Vec<u8>,
    /// Bulk strings left in the current request.
    args_left: u64,
    /// Bytes of the current bulk string (and its CRLF) left to skip.
    skip: u64,
}

impl Requests {
    /// Feeds `bytes`; how many requests began in them.
    fn feed(&mut self, bytes: &[u8]) -> u64 {
        let mut started = 0;
        let mut i = 0;
        while i < bytes.len() {
            if self.skip > 0 {
                let take = self.skip.min((bytes.len() - i) as u64);
                self.skip -= take;
                i += take as usize;
                continue;
            }
            let byte = bytes[i];
            i += 1;
            if byte != b'\n' {
                self.line.push(byte);
                continue;
            }
            let line = std::mem::take(&mut self.line);
            let line = line.strip_suffix(b"\r").unwrap_or(&line);
            let number = || {
                std::str::from_utf8(&line[1..])
                    .ok()
                    .and_then(|n| n.parse::<u64>().ok())
                    .unwrap_or(0)
            };
            match line.first() {
                Some(b'*') if self.args_left == 0 => {
                    started += 1;
                    self.args_left = number();
                }
                Some(b'$') if self.args_left > 0 => {
                    self.args_left -= 1;
                    self.skip = number() + 2;
                }
                _ => {} // inline commands: not sent by redis-rs
            }
        }
        started
    }
}

#[test]
fn requests_are_counted_across_chunks() {
    let mut requests = Requests::default();
    let two = b"*2\r\n$3\r\nGET\r\n$1\r\n*\r\n*1\r\n$4\r\nPING\r\n";
    assert_eq!(requests.feed(two), 2);
    let mut split = Requests::default();
    let counted: u64 = two.chunks(3).map(|chunk| split.feed(chunk)).sum();
    assert_eq!(counted, 2);
}

#[test]
fn the_proxy_passes_delays_blackholes_cuts_and_refuses() {
    let server = crate::server::RedisServer::start();
    let proxy = Proxy::start(server.port());
    let client = redis::Client::open(proxy.url()).unwrap();
    let connect = || {
        let con = client
            .get_connection_with_timeout(Duration::from_millis(500))
            .unwrap();
        con.set_read_timeout(Some(Duration::from_millis(300)))
            .unwrap();
        con
    };
    let mut con = connect();
    let ping = |con: &mut redis::Connection| redis::cmd("PING").query::<String>(con);
    assert_eq!(ping(&mut con).unwrap(), "PONG");
    let seen = proxy.requests();
    assert!(seen >= 1, "{seen}");
    proxy.set(|f| f.down.latency = Duration::from_millis(100));
    let started = Instant::now();
    ping(&mut con).unwrap();
    assert!(started.elapsed() >= Duration::from_millis(100));
    proxy.heal();
    // A reply dropped: the request ran all the same.
    proxy.drop_replies_after(0);
    assert!(
        redis::cmd("SET")
            .arg("p")
            .arg("1")
            .query::<()>(&mut con)
            .is_err()
    );
    assert_eq!(
        server.query::<Option<String>>(&["GET", "p"]).as_deref(),
        Some("1")
    );
    proxy.heal();
    let mut con = connect();
    proxy.set(|f| f.up.blackhole = true);
    assert!(ping(&mut con).unwrap_err().is_timeout());
    proxy.heal();
    // A reset is a reset, not an orderly close.
    let mut raw = TcpStream::connect(("127.0.0.1", proxy.port)).unwrap();
    raw.set_read_timeout(Some(Duration::from_secs(2))).unwrap();
    raw.write_all(b"*1\r\n$4\r\nPING\r\n").unwrap();
    let mut reply = [0u8; 7];
    raw.read_exact(&mut reply).unwrap();
    proxy.cut(Cut::Reset);
    let after = raw.read(&mut reply);
    assert_eq!(
        after.map_err(|e| e.kind()),
        Err(ErrorKind::ConnectionReset),
        "a reset"
    );
    let mut con = connect();
    proxy.cut(Cut::Close);
    assert!(ping(&mut con).is_err());
    proxy.set(|f| f.refuse = true);
    let refused = client
        .get_connection_with_timeout(Duration::from_millis(500))
        .and_then(|mut con| ping(&mut con));
    assert!(refused.is_err());
}
