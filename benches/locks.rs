//! Lock throughput and latency against the two-round-trip floor, on a private redis-server.
//!
//! ```text
//! cargo bench                       # every workload, Markdown table on stdout
//! BENCH_SECS=1 cargo bench          # shorter runs
//! cargo bench -- fan-out            # only Redlock on 5 nodes against a raw fan-out
//! cargo bench -- permits            # only W6 (and W1) against the floor
//! cargo bench -- reads              # only W8 and W9 (read locks)
//! cargo bench -- replicas           # only lock + release with replicas(1), one replica
//! cargo bench --bench contention    # W3, contention: benches/contention.rs
//! taskset -c 0 cargo bench -- fan-out   # the same, client and servers on one CPU
//! ```
//!
//! Every figure is measured in the same run as its floor, in alternating rounds, and
//! reported as a ratio (this is a noisy 2-core machine: absolute numbers drift).
//!
//! (Over 400 lines: one binary prints one report, workload after workload; W3 lives in
//! `contention.rs`.)

use std::sync::Barrier;
use std::sync::atomic::{AtomicU64, Ordering};
use std::thread;
use std::time::{Duration, Instant};

use redguard::{LockOptions, Locker};

#[allow(dead_code)] // the tests use more of the harness than the bench does
#[path = "../tests/it/server.rs"]
mod server;

#[allow(dead_code, unused_imports)] // its own tests are not built here
#[path = "../tests/it/cluster_server.rs"]
mod cluster_server;

use cluster_server::RedisCluster;
use server::RedisServer;

const ROUNDS: usize = 3;
const THREADS: usize = 8;

/// Compare-and-delete, as every Redis lock library releases.
const UNLOCK: &str =
    "if redis.call('get', KEYS[1]) == ARGV[1] then return redis.call('del', KEYS[1]) end return 0";

/// CPU time (user + system) a process has used, from /proc.
fn cpu_of(pid: u32) -> Duration {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    ticks(&stat)
}

/// utime + stime of a /proc `stat` line: the 12th and 13th fields after the ")" closing
/// the name, in ticks of 10 ms (USER_HZ is 100 on Linux).
fn ticks(stat: &str) -> Duration {
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    Duration::from_millis((field(11) + field(12)) * 10)
}

fn main() {
    let span = server::bench_span();
    let secs = span.as_secs_f64();
    if std::env::args().any(|arg| arg == "fan-out") {
        println!("{}", fan_out_floor(span));
        return;
    }
    if std::env::args().any(|arg| arg == "replicas") {
        println!("{}", replicated(span));
        return;
    }
    let server = RedisServer::start();
    let _ = SERVER_PID.set(server.pid());
    let url = server.url();
    if std::env::args().any(|arg| arg == "permits") {
        println!("{}", permits_only(&server, span));
        return;
    }
    if std::env::args().any(|arg| arg == "reads") {
        println!("{}", read_locks(&server, span));
        return;
    }
    let mut rows = Vec::new();

    let (setup, first_lock) = fresh_locker_cost(&url);
    let rtt = round_trip(&server, span);

    // Alternate floor and workload so that drift hits both alike; keep each one's median.
    let mut floor1 = Vec::new();
    let mut w1 = Vec::new();
    let mut w4 = Vec::new();
    let mut floor8 = Vec::new();
    let mut w2 = Vec::new();
    let mut w6 = Vec::new();
    let locker = Locker::builder()
        .pool_size(THREADS as u32 + 2)
        .build(url.as_str())
        .expect("locker");
    for _ in 0..ROUNDS {
        floor1.push(run(1, span, |_| floor_cycle(&server)));
        w1.push(run(1, span, |i| {
            lock_cycle(&locker, vec![format!("w1:{i}")])
        }));
        w4.push(run(1, span, |i| {
            lock_cycle(&locker, (0..3).map(|k| format!("w4:{i}:{k}")).collect())
        }));
        w6.push(run(1, span, |i| permit_cycle(&locker, &format!("w6:{i}"))));
        floor8.push(run(THREADS, span, |_| floor_cycle(&server)));
        w2.push(run(THREADS, span, |i| {
            lock_cycle(&locker, vec![format!("w2:{i}")])
        }));
    }
    let floor1 = median(floor1);
    let floor8 = median(floor8);
    rows.push(row(
        "floor: SET NX PX + EVALSHA del, 1 thread",
        &floor1,
        None,
        None,
    ));
    rows.push(row(
        "W1 uncontended try_lock + release, 1 thread",
        &median(w1),
        Some(&floor1),
        Some(0.97),
    ));
    rows.push(row(
        "W4 3 keys per lock, 1 thread",
        &median(w4),
        Some(&floor1),
        Some(0.95),
    ));
    rows.push(row(
        "W6 permit of a semaphore of 8: acquire + release, 1 thread",
        &median(w6),
        Some(&floor1),
        Some(0.85),
    ));
    rows.push(row(
        &format!("floor, {THREADS} threads, distinct keys"),
        &floor8,
        None,
        None,
    ));
    rows.push(row(
        &format!("W2 {THREADS} threads, distinct keys"),
        &median(w2),
        Some(&floor8),
        Some(0.90),
    ));

    let scaling = scaling_out(&locker, span);
    let fan_out = fan_out_floor(span);

    let reads = read_locks(&server, span);
    let replicas = replicated(span);
    let parked = parked_handoff(&locker, 200, round_trip(&server, span));
    drop(locker); // W5 counts its own locker's refresher thread alone
    let refresher = refresher_load(&server, &url, 0);
    let mixed = refresher_load(&server, &url, 100);

    println!("\n## redguard benchmarks\n");
    println!(
        "redis-server {}, {} CPUs, {secs} s per run, median of {ROUNDS} alternating rounds.\n",
        server
            .query::<String>(&["INFO", "server"])
            .lines()
            .find_map(|l| l.strip_prefix("redis_version:"))
            .unwrap_or("?")
            .trim(),
        thread::available_parallelism().map_or(0, |n| n.get())
    );
    println!(
        "| workload | cycles/s | p50 µs | p99 µs | server CPU µs/cycle | ratio to floor | target |"
    );
    println!("|---|---:|---:|---:|---:|---:|---|");
    for r in rows {
        println!("{r}");
    }
    println!("\nSingle round trip (PING): p50 {:.1} µs.", micros(rtt));
    println!(
        "New `Locker` (pool of 16 made): {:.2} ms; its first lock + release: {:.2} ms.\n",
        millis(setup),
        millis(first_lock)
    );
    println!("{scaling}\n");
    println!("{fan_out}\n");
    println!("{reads}\n");
    println!("{replicas}\n");
    println!("{parked}\n");
    println!("{refresher}\n");
    println!("{mixed}");
}

/// Redlock on 3 and 5 private servers and a private 3-master cluster, against the
/// single-server locker in alternating rounds: uncontended lock + release, 1 thread and
/// THREADS threads on distinct keys. Also the CPU each cycle costs the whole machine (this
/// process and every server it uses), and the rate that cost allows on this machine's
/// cores: with all servers on one 2-core box, fanning out to N servers is bounded by CPU
/// long before round trips.
fn scaling_out(single: &Locker, span: Duration) -> String {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let pids: Vec<u32> = servers.iter().map(RedisServer::pid).collect();
    let redlock = |n: usize| {
        Locker::builder()
            .pool_size(THREADS as u32 + 2)
            .build_redlock(&urls[..n])
            .expect("redlock locker")
    };
    let cluster = RedisCluster::start();
    let on_cluster = Locker::builder()
        .pool_size(THREADS as u32 + 2)
        .build_cluster(&cluster.urls())
        .expect("cluster locker");
    let single_pids: Vec<u32> = SERVER_PID.get().copied().into_iter().collect();
    let lockers = [
        ("Redlock, 3 nodes", redlock(3), pids[..3].to_vec(), None),
        ("Redlock, 5 nodes", redlock(5), pids.clone(), Some(0.80)),
        ("Cluster, 3 masters", on_cluster, cluster.pids(), None),
    ];
    let cores = thread::available_parallelism().map_or(1, |n| n.get()) as f64;
    let mut out = String::from(
        "### Scaling out: uncontended lock + release, as a ratio to one server (same run)\n\n\
         CPU/cycle: of this process and every server it uses (all), of this process alone \
         (client); ceiling: the rate at which the whole CPU cost fills all cores.\n\n\
         | deployment | threads | cycles/s | p50 µs | p99 µs | CPU µs/cycle, all | \
         CPU µs/cycle, client | ceiling/s | ratio to one server | target |\n\
         |---|---:|---:|---:|---:|---:|---:|---:|---:|---|\n",
    );
    for threads in [1, THREADS] {
        let keys = move |i: usize| vec![format!("s:{threads}:{i}")];
        let mut base = Vec::new();
        let mut each: Vec<Vec<(Stats, Cpu)>> = lockers.iter().map(|_| Vec::new()).collect();
        for _ in 0..ROUNDS {
            base.push(machine_cpu(&single_pids, || {
                run(threads, span, |i| lock_cycle(single, keys(i)))
            }));
            for ((_, locker, pids, _), runs) in lockers.iter().zip(&mut each) {
                runs.push(machine_cpu(pids, || {
                    run(threads, span, |i| lock_cycle(locker, keys(i)))
                }));
            }
        }
        let (base, base_cpu) = median_by(base, |(stats, _)| stats.rate);
        out += &scaling_row("one server", threads, &base, base_cpu, cores, None, None);
        for ((name, _, _, target), runs) in lockers.iter().zip(each) {
            let (stats, cpu) = median_by(runs, |(stats, _)| stats.rate);
            out += &scaling_row(name, threads, &stats, cpu, cores, Some(&base), *target);
        }
    }
    out
}

/// Redlock on 5 private servers against its floor, in alternating rounds, 1 thread: a raw
/// fan-out over five plain sockets (SET NX PX written to all five, then the five replies
/// read; then the compare-and-delete EVALSHA the same way), which is the same ten requests
/// and replies as a Redlock cycle with nothing else. With everything on one CPU
/// (`taskset -c 0`) the client's own CPU shows in the rate.
fn fan_out_floor(span: Duration) -> String {
    let servers: Vec<RedisServer> = (0..5).map(|_| RedisServer::start()).collect();
    let urls: Vec<String> = servers.iter().map(RedisServer::url).collect();
    let pids: Vec<u32> = servers.iter().map(RedisServer::pid).collect();
    let redlock = Locker::builder()
        .pool_size(THREADS as u32 + 2)
        .build_redlock(&urls)
        .expect("redlock locker");
    let mut floor = Vec::new();
    let mut ours = Vec::new();
    for _ in 0..ROUNDS {
        floor.push(machine_cpu(&pids, || {
            run(1, span, |_| raw_fan_out_cycle(&servers))
        }));
        ours.push(machine_cpu(&pids, || {
            run(1, span, |i| lock_cycle(&redlock, vec![format!("f:{i}")]))
        }));
    }
    let (floor, floor_cpu) = median_by(floor, |(stats, _)| stats.rate);
    let (ours, ours_cpu) = median_by(ours, |(stats, _)| stats.rate);
    let pinned = std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|status| {
            status
                .lines()
                .find_map(|l| l.strip_prefix("Cpus_allowed_list:"))
                .map(|cpus| cpus.trim().to_string())
        })
        .unwrap_or_default();
    let line = |name: &str, stats: &Stats, cpu: Cpu, base: Option<&Stats>| {
        let (shown, _) = ratio_cells(stats, base, "floor", None);
        format!(
            "| {name} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {shown} |\n",
            stats.rate,
            micros(stats.p50),
            micros(stats.p99),
            cpu.all_us,
            cpu.client_us,
        )
    };
    let mut out = format!(
        "### Redlock's client cost: 5 nodes against a raw fan-out, 1 thread (CPUs {pinned})\n\n\
         | workload | cycles/s | p50 µs | p99 µs | CPU µs/cycle, all | CPU µs/cycle, client | \
         ratio to floor |\n|---|---:|---:|---:|---:|---:|---:|\n"
    );
    out += &line(
        "floor: SET NX PX, then EVALSHA del, each to 5 sockets at once",
        &floor,
        floor_cpu,
        None,
    );
    out += &line(
        "Redlock, 5 nodes: try_lock + release",
        &ours,
        ours_cpu,
        Some(&floor),
    );
    out
}

/// One raw fan-out cycle over a plain socket per server (see [`fan_out_floor`]).
fn raw_fan_out_cycle(servers: &[RedisServer]) -> Box<dyn FnMut()> {
    use std::io::{Read, Write};
    let sha: String = servers[0].query(&["SCRIPT", "LOAD", UNLOCK]);
    let mut socks: Vec<std::net::TcpStream> = servers
        .iter()
        .map(|server| {
            let _: String = server.query(&["SCRIPT", "LOAD", UNLOCK]);
            let addr = server.url();
            let addr = addr.trim_start_matches("redis://").trim_end_matches('/');
            let sock = std::net::TcpStream::connect(addr).expect("connect");
            sock.set_nodelay(true).expect("nodelay");
            sock.set_read_timeout(Some(Duration::from_secs(2)))
                .expect("timeout");
            sock
        })
        .collect();
    let key = format!("raw:{}", thread_id());
    let set = redis::cmd("SET")
        .arg(&key)
        .arg("token")
        .arg("NX")
        .arg("PX")
        .arg(30_000)
        .get_packed_command();
    let del = redis::cmd("EVALSHA")
        .arg(&sha)
        .arg(1)
        .arg(&key)
        .arg("token")
        .get_packed_command();
    let mut buf = [0u8; 64];
    let mut fan_out = move |request: &[u8], reply: &[u8]| {
        for sock in &mut socks {
            sock.write_all(request).expect("write");
        }
        for sock in &mut socks {
            let mut got = 0;
            while !buf[..got].ends_with(b"\r\n") {
                match sock.read(&mut buf[got..]).expect("read") {
                    0 => panic!("server closed the connection"),
                    n => got += n,
                }
            }
            assert_eq!(&buf[..got], reply);
        }
    };
    Box::new(move || {
        fan_out(&set, b"+OK\r\n");
        fan_out(&del, b":1\r\n");
    })
}

/// Runs `work`, and gives its stats with the CPU per cycle of this process and `pids`
/// together, and of this process alone.
fn machine_cpu(pids: &[u32], work: impl FnOnce() -> Stats) -> (Stats, Cpu) {
    let servers = || -> Duration { pids.iter().map(|&pid| cpu_of(pid)).sum() };
    let (servers_before, client_before) = (servers(), self_cpu());
    let stats = work();
    let cycles = (stats.rate * stats.span.as_secs_f64()).max(1.0);
    let client = self_cpu().saturating_sub(client_before);
    let all = client + servers().saturating_sub(servers_before);
    let cpu = Cpu {
        all_us: micros(all) / cycles,
        client_us: micros(client) / cycles,
    };
    (stats, cpu)
}

/// CPU time per cycle, µs: of the whole machine (client and servers), of the client alone.
#[derive(Clone, Copy)]
struct Cpu {
    all_us: f64,
    client_us: f64,
}

fn self_cpu() -> Duration {
    ticks(&std::fs::read_to_string("/proc/self/stat").unwrap_or_default())
}

fn scaling_row(
    name: &str,
    threads: usize,
    stats: &Stats,
    cpu: Cpu,
    cores: f64,
    base: Option<&Stats>,
    target: Option<f64>,
) -> String {
    let (shown, goal) = ratio_cells(stats, base, "base", target);
    format!(
        "| {name} | {threads} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {:.0} | {shown} | {goal} |\n",
        stats.rate,
        micros(stats.p50),
        micros(stats.p99),
        cpu.all_us,
        cpu.client_us,
        cores * 1e6 / cpu.all_us.max(1.0),
    )
}

/// Runs `cycle` on `threads` threads for `span`; each thread's cycle gets its index.
fn run(threads: usize, span: Duration, cycle: impl Fn(usize) -> Box<dyn FnMut()> + Sync) -> Stats {
    let start = Barrier::new(threads);
    let server_cpu = SERVER_PID.get().map(|&pid| cpu_of(pid));
    let samples: Vec<Vec<Duration>> = thread::scope(|s| {
        let workers: Vec<_> = (0..threads)
            .map(|i| {
                let (start, cycle) = (&start, &cycle);
                s.spawn(move || {
                    let mut one = cycle(i);
                    let mut times = Vec::with_capacity(100_000);
                    one(); // warm up: connections, script loads
                    start.wait();
                    let began = Instant::now();
                    while began.elapsed() < span {
                        let t = Instant::now();
                        one();
                        times.push(t.elapsed());
                    }
                    times
                })
            })
            .collect();
        workers
            .into_iter()
            .map(|w| w.join().expect("worker"))
            .collect()
    });
    let mut stats = Stats::new(samples.into_iter().flatten().collect(), span);
    if let (Some(&pid), Some(before)) = (SERVER_PID.get(), server_cpu) {
        let cycles = stats.rate * span.as_secs_f64();
        stats.server_us = micros(cpu_of(pid).saturating_sub(before)) / cycles.max(1.0);
    }
    stats
}

/// The bench's redis-server, whose CPU time per cycle each run reports.
static SERVER_PID: std::sync::OnceLock<u32> = std::sync::OnceLock::new();

fn floor_cycle(server: &RedisServer) -> Box<dyn FnMut()> {
    let mut con = server.connection();
    let script = redis::Script::new(UNLOCK);
    let key = format!("floor:{}", thread_id());
    Box::new(move || {
        let ok: bool = redis::cmd("SET")
            .arg(&key)
            .arg("token")
            .arg("NX")
            .arg("PX")
            .arg(30_000)
            .query(&mut con)
            .expect("set");
        assert!(ok, "floor key held");
        let deleted: i64 = script
            .key(&key)
            .arg("token")
            .invoke(&mut con)
            .expect("unlock");
        assert_eq!(deleted, 1);
    })
}

fn lock_cycle(locker: &Locker, keys: Vec<String>) -> Box<dyn FnMut()> {
    let locker = locker.clone();
    Box::new(move || {
        let guard = locker.try_lock(&keys).expect("lock").expect("uncontended");
        guard.release().expect("release");
    })
}

/// W6 and W1 against the floor, alone, in alternating rounds.
fn permits_only(server: &RedisServer, span: Duration) -> String {
    let locker = Locker::connect(server.url()).expect("locker");
    let (mut floor, mut w1, mut w6) = (Vec::new(), Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        floor.push(run(1, span, |_| floor_cycle(server)));
        w1.push(run(1, span, |i| {
            lock_cycle(&locker, vec![format!("w1:{i}")])
        }));
        w6.push(run(1, span, |i| permit_cycle(&locker, &format!("w6:{i}"))));
    }
    let floor = median(floor);
    [
        row("floor, 1 thread", &floor, None, None),
        row("W1 lock, 1 thread", &median(w1), Some(&floor), Some(0.97)),
        row("W6 permit, 1 thread", &median(w6), Some(&floor), Some(0.85)),
    ]
    .join("\n")
}

/// Lock + release with `replicas(1)` on a master with one replica (both private), against
/// the same without it, in alternating rounds, 1 thread: the price of WAIT.
fn replicated(span: Duration) -> String {
    let group = redguard::testing::Replicated::start(1, 0).expect("a master and a replica");
    let locker = Locker::connect(group.servers()[0].url()).expect("locker");
    let (mut plain, mut waited) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        plain.push(run(1, span, |i| {
            options_cycle(&locker, format!("r0:{i}"), LockOptions::default())
        }));
        waited.push(run(1, span, |i| {
            let options = LockOptions::default().replicas(1);
            options_cycle(&locker, format!("r1:{i}"), options)
        }));
    }
    let (plain, waited) = (median(plain), median(waited));
    let line = |name: &str, stats: &Stats, ratio: String| {
        format!(
            "| {name} | {:.0} | {:.0} | {:.0} | {ratio} |",
            stats.rate,
            micros(stats.p50),
            micros(stats.p99)
        )
    };
    [
        "| replicas, 1 thread, master + 1 replica | cycles/s | p50 µs | p99 µs | ratio |"
            .to_string(),
        "|---|---:|---:|---:|---:|".to_string(),
        line("lock + release", &plain, "1 (base)".into()),
        line(
            "lock with replicas(1) + release",
            &waited,
            format!("{:.2}", waited.rate / plain.rate),
        ),
    ]
    .join("\n")
}

/// One uncontended lock with `options` and its release.
fn options_cycle(locker: &Locker, key: String, options: LockOptions) -> Box<dyn FnMut()> {
    let locker = locker.clone();
    Box::new(move || {
        let guard = locker
            .try_lock_with(&[key.as_str()], options.clone())
            .expect("lock")
            .expect("uncontended");
        guard.release().expect("release");
    })
}

/// W8: 4 threads taking and releasing read locks on one key, against 4 threads locking
/// distinct keys, in alternating rounds: shared holds must not serialize. W9: 4 threads on
/// one key, 90% reads and 10% locks.
fn read_locks(server: &RedisServer, span: Duration) -> String {
    const THREADS: usize = 4;
    let locker = Locker::builder()
        .pool_size(THREADS as u32 + 2)
        .build(server.url())
        .expect("locker");
    let (mut locks, mut reads) = (Vec::new(), Vec::new());
    for _ in 0..ROUNDS {
        locks.push(run(THREADS, span, |i| {
            lock_cycle(&locker, vec![format!("w8:{i}")])
        }));
        reads.push(run(THREADS, span, |_| read_cycle(&locker, "w8:shared")));
    }
    let locks = median(locks);
    let mut text = [
        "| workload | cycles/s | p50 µs | p99 µs | server CPU µs/cycle | ratio | target |",
        "|---|---:|---:|---:|---:|---:|---|",
    ]
    .join("\n");
    text += "\n";
    text += &row(
        &format!("{THREADS} threads, locks on distinct keys"),
        &locks,
        None,
        None,
    );
    text += "\n";
    let w8 = format!("W8 {THREADS} threads, read locks on one key");
    text += &row(&w8, &median(reads), Some(&locks), Some(0.9));
    text + "\n\n" + &mixed(&locker, THREADS, span)
}

fn read_cycle(locker: &Locker, key: &str) -> Box<dyn FnMut()> {
    let (locker, key) = (locker.clone(), key.to_string());
    Box::new(move || {
        let guard = locker.read(&[&key]).expect("read");
        guard.release().expect("release");
    })
}

/// W9: `threads` threads on one key, each cycle a read lock (9 in 10) or a lock (1 in
/// 10), taken and released: acquisitions per second, and how long the locks waited.
fn mixed(locker: &Locker, threads: usize, span: Duration) -> String {
    let (done, writes) = (AtomicU64::new(0), std::sync::Mutex::new(Vec::new()));
    thread::scope(|s| {
        for t in 0..threads {
            let (locker, done, writes) = (locker.clone(), &done, &writes);
            s.spawn(move || {
                let began = Instant::now();
                let mut waits = Vec::new();
                let mut n = t as u64;
                while began.elapsed() < span {
                    n += 1;
                    if n.is_multiple_of(10) {
                        let asked = Instant::now();
                        let guard = locker.lock(&["w9"]).expect("lock");
                        waits.push(asked.elapsed());
                        drop(guard);
                    } else {
                        drop(locker.read(&["w9"]).expect("read"));
                    }
                    done.fetch_add(1, Ordering::Relaxed);
                }
                writes.lock().expect("no panic").extend(waits);
            });
        }
    });
    let waits = Stats::new(writes.into_inner().expect("no panic"), span);
    format!(
        "W9 {threads} threads on one key, 90% read locks and 10% locks: {:.0} acquisitions/s; \
         the locks waited p50 {:.0} µs, p99 {:.0} µs.",
        done.load(Ordering::Relaxed) as f64 / span.as_secs_f64(),
        micros(waits.p50),
        micros(waits.p99),
    )
}

fn permit_cycle(locker: &Locker, name: &str) -> Box<dyn FnMut()> {
    let semaphore = locker.semaphore(name, 8).expect("semaphore");
    Box::new(move || {
        let permit = semaphore.try_acquire().expect("acquire").expect("free");
        permit.release().expect("release");
    })
}

fn thread_id() -> u64 {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    NEXT.fetch_add(1, Ordering::Relaxed)
}

/// A notified hand-off alone: a waiter parked in `lock` (past its first attempts), a holder
/// that releases; timed from the start of the release call to the waiter holding the lock.
/// Its floor is two round trips (the release, then the waiter's acquire) plus the message.
fn parked_handoff(locker: &Locker, rounds: usize, rtt: Duration) -> String {
    let mut samples = Vec::with_capacity(rounds);
    for _ in 0..rounds {
        let guard = locker.lock(&["parked"]).expect("lock");
        let waiter = {
            let locker = locker.clone();
            thread::spawn(move || {
                let guard = locker.lock(&["parked"]).expect("lock");
                let acquired = Instant::now();
                drop(guard);
                acquired
            })
        };
        thread::sleep(Duration::from_millis(5)); // the waiter subscribes and parks
        let released = Instant::now();
        guard.release().expect("release");
        let acquired = waiter.join().expect("waiter");
        samples.push(acquired.saturating_duration_since(released));
    }
    let stats = Stats::new(samples, Duration::from_secs(1));
    format!(
        "Parked waiter woken by a release, {rounds} hand-offs: p50 {:.0} µs ({:.1} round trips) / p99 {:.0} µs.",
        micros(stats.p50),
        stats.p50.as_secs_f64() / rtt.as_secs_f64().max(1e-9),
        micros(stats.p99),
    )
}

/// W5: 10,000 auto-refreshed guards (TTL 3 s) held for 10 s. W7, with `semaphores`: as
/// many permits again, over that many semaphores, kept by the same refresher thread.
fn refresher_load(server: &RedisServer, url: &str, semaphores: usize) -> String {
    const GUARDS: usize = 10_000;
    let hold = Duration::from_secs(10);
    server.query::<String>(&["FLUSHALL"]);
    let locker = Locker::connect(url).expect("locker");
    let options = LockOptions::default().ttl(Duration::from_secs(3));
    let guards: Vec<_> = (0..GUARDS)
        .map(|i| {
            locker
                .lock_with(&[format!("w5:{i}")], options.clone())
                .expect("lock")
        })
        .collect();
    let permits: Vec<_> = (0..semaphores)
        .flat_map(|i| {
            let limit = GUARDS / semaphores;
            let semaphore = locker
                .semaphore(&format!("w7:{i}"), limit as u32)
                .expect("semaphore");
            (0..limit)
                .map(|_| semaphore.acquire_with(options.clone()).expect("permit"))
                .collect::<Vec<_>>()
        })
        .collect();
    // Load the refresh script first, so that the counts below are refresh round trips only.
    guards[0].refresh(Duration::from_secs(3)).expect("refresh");
    let (evalsha, pexpire) = (stat(server, "evalsha"), stat(server, "pexpire"));
    let cpu = refresher_cpu();
    // Each second is one refresh period (a third of the TTL): count its round trips, and
    // check that every key is still there.
    let (mut per_period, mut fewest_held) = (Vec::new(), usize::MAX);
    let mut last = evalsha;
    for _ in 0..hold.as_secs() {
        thread::sleep(Duration::from_secs(1));
        let now = stat(server, "evalsha");
        per_period.push(now - last);
        last = now;
        fewest_held = fewest_held.min(server.query(&["DBSIZE"]));
    }
    let cpu = refresher_cpu() - cpu;
    let round_trips = last - evalsha;
    let refreshed = stat(server, "pexpire") - pexpire;
    let lost = guards.iter().filter(|g| g.is_lost()).count()
        + permits.iter().filter(|p| p.is_lost()).count();
    let what = if semaphores == 0 {
        format!("W5 refresher, {GUARDS} guards")
    } else {
        format!(
            "W7 refresher, {GUARDS} guards and {} permits of {semaphores} semaphores",
            permits.len()
        )
    };
    format!(
        "{what} (TTL 3 s) held {} s: {lost} lost, at least {fewest_held} keys held \
         at every second; {} refresher thread(s); refresh round trips per 1 s period {per_period:?} \
         ({round_trips} in all, {:.0} lock keys each on average); refresher CPU {:.2}% of one core.",
        hold.as_secs(),
        refresher_threads(),
        refreshed as f64 / round_trips.max(1) as f64,
        100.0 * cpu.as_secs_f64() / hold.as_secs_f64(),
    )
}

/// Calls of one command, from the server's own counters.
fn stat(server: &RedisServer, command: &str) -> u64 {
    let info: String = server.query(&["INFO", "commandstats"]);
    let prefix = format!("cmdstat_{command}:calls=");
    info.lines()
        .find_map(|l| l.strip_prefix(prefix.as_str()))
        .and_then(|rest| rest.split(',').next())
        .map_or(0, |n| n.parse().expect("calls"))
}

fn refresher_tasks() -> Vec<std::path::PathBuf> {
    std::fs::read_dir("/proc/self/task")
        .map(|tasks| {
            tasks
                .filter_map(|t| t.ok().map(|t| t.path()))
                .filter(|p| {
                    std::fs::read_to_string(p.join("comm"))
                        .is_ok_and(|c| c.trim_end() == "redguard-refres")
                })
                .collect()
        })
        .unwrap_or_default()
}

fn refresher_threads() -> usize {
    refresher_tasks().len()
}

/// CPU time (user + system) of the refresher threads, from /proc.
fn refresher_cpu() -> Duration {
    refresher_tasks()
        .iter()
        .filter_map(|p| std::fs::read_to_string(p.join("stat")).ok())
        .map(|stat| ticks(&stat))
        .sum()
}

fn fresh_locker_cost(url: &str) -> (Duration, Duration) {
    let t = Instant::now();
    let locker = Locker::connect(url).expect("locker");
    let setup = t.elapsed();
    let t = Instant::now();
    locker
        .lock(&["fresh"])
        .expect("lock")
        .release()
        .expect("release");
    (setup, t.elapsed())
}

/// The median of a plain PING round trip.
fn round_trip(server: &RedisServer, span: Duration) -> Duration {
    let stats = run(1, span / 2, |_| {
        let mut con = server.connection();
        Box::new(move || {
            let _: String = redis::cmd("PING").query(&mut con).expect("ping");
        })
    });
    stats.p50
}

struct Stats {
    rate: f64,
    span: Duration,
    p50: Duration,
    p99: Duration,
    /// redis-server CPU per cycle, µs (10 ms resolution over the run).
    server_us: f64,
}

impl Stats {
    fn new(mut samples: Vec<Duration>, span: Duration) -> Stats {
        samples.sort_unstable();
        let at = |q: f64| {
            samples
                .get(((samples.len() as f64 - 1.0) * q) as usize)
                .copied()
                .unwrap_or_default()
        };
        Stats {
            rate: samples.len() as f64 / span.as_secs_f64(),
            span,
            server_us: 0.0,
            p50: at(0.5),
            p99: at(0.99),
        }
    }
}

fn median(runs: Vec<Stats>) -> Stats {
    median_by(runs, |stats| stats.rate)
}

/// The run with the median of `rate`.
fn median_by<T>(mut runs: Vec<T>, rate: impl Fn(&T) -> f64) -> T {
    runs.sort_by(|a, b| rate(a).total_cmp(&rate(b)));
    runs.swap_remove(runs.len() / 2)
}

/// A table row; `target` is the least ratio to the floor that meets the goal.
fn row(name: &str, stats: &Stats, floor: Option<&Stats>, target: Option<f64>) -> String {
    let (shown, goal) = ratio_cells(stats, floor, "floor", target);
    format!(
        "| {name} | {:.0} | {:.0} | {:.0} | {:.1} | {shown} | {goal} |",
        stats.rate,
        micros(stats.p50),
        micros(stats.p99),
        stats.server_us,
    )
}

/// The ratio cell (`1 (<base_name>)` for the base itself) and the target cell of a row.
fn ratio_cells(
    stats: &Stats,
    base: Option<&Stats>,
    base_name: &str,
    target: Option<f64>,
) -> (String, String) {
    let ratio = base.map(|b| stats.rate / b.rate);
    let shown = ratio.map_or(format!("1 ({base_name})"), |r| format!("{r:.2}"));
    let goal = match (ratio, target) {
        (Some(r), Some(t)) => format!("≥ {t:.2}: {}", if r >= t { "met" } else { "MISSED" }),
        _ => String::new(),
    };
    (shown, goal)
}

fn micros(d: Duration) -> f64 {
    d.as_secs_f64() * 1e6
}

fn millis(d: Duration) -> f64 {
    d.as_secs_f64() * 1e3
}
