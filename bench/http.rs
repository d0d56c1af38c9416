//! The decision endpoint under load, whole process, run by `bench/http.sh`.
//! A `[[bench]]` target without libtest that runs the benchmark named on
//! its command line (`checks`), so `cargo test --bench '*'` and a bare
//! `cargo bench` run none. It prints figures; it asserts only that the work
//! happened (every banned address denied, every other allowed).
//!
//! `checks`: a redis-server holding BANS active bans (3/4 single IPv4
//! addresses, 1/4 IPv6 /64s, one hour left, as `bench/fleet.rs` makes
//! them), `fleetban run` on it (firewall `backend: log`: nft is not
//! measured here) with `http:` on a unix socket, its threads pinned to the
//! core `DAEMON_CPU` when set. CONNS kept-alive connections (nginx's
//! upstream pool) each ask `GET /check` in a closed loop for RUN_SECONDS, half
//! the addresses banned, half not; RUNS runs. Per run: checks/s, and the
//! client's p50/p99/p99.9 from writing a request to reading its whole
//! answer; then the daemon's own `fleetban_http_check_seconds` buckets.
//!
//! `flood`: `fleetban run` (embedded store, one banned address, 1024
//! descriptors as under the shipped unit) asked as nginx's pool asks it:
//! POOL kept-alive connections, each a check every PAUSE_MS, a connection
//! the daemon closed reconnected and the check retried once (nginx's
//! `proxy_next_upstream error`); RUN_SECONDS without, then with FLOOD
//! connections from another thread (`tests/common/flood.rs`: half
//! trickling heads, half idle, reopened once closed). Per phase: p50, p99,
//! p99.9, max, retries, and checks over 200 ms (what the snippet's
//! `proxy_read_timeout` would have let through).

#[path = "../tests/common/mod.rs"]
mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::{Daemon, Redis};
use tokio::io::{AsyncReadExt, AsyncWriteExt};

fn main() {
    let mut ran = false;
    for name in std::env::args().skip(1) {
        if name == "checks" {
            checks();
            ran = true;
        }
        if name == "flood" {
            flood();
            ran = true;
        }
    }
    if !ran {
        eprintln!("usage: cargo bench --bench http -- checks|flood (bench/http.sh)");
    }
}

fn env(name: &str, default: u64) -> u64 {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// The address asked for ban number `i`: the banned address itself, or
/// one inside the banned /64.
fn banned(i: u64) -> String {
    if i % 4 == 3 {
        format!("2001:db8:{:x}:{:x}::1", i / 65_536, i % 65_536)
    } else {
        format!(
            "{}.{}.{}.{}",
            100 + (i / 16_777_216) % 50,
            (i / 65_536) % 256,
            (i / 256) % 256,
            i % 256
        )
    }
}

/// An address no ban covers, of the same two kinds.
fn free(i: u64) -> String {
    if i % 4 == 3 {
        format!("2001:db9:{:x}:{:x}::1", i / 65_536, i % 65_536)
    } else {
        format!("198.18.{}.{}", (i / 256) % 256, i % 256)
    }
}

fn checks() {
    let n = env("BANS", 100_000);
    let conns = env("CONNS", 8) as usize;
    let seconds = env("RUN_SECONDS", 5);
    let runs = env("RUNS", 3).max(1);
    let redis = Redis::start();
    let until = fleetban::now_ms() + 3_600_000;
    redis.preload_bans(n, until);

    let (dir, control, sock) = bench_dir();
    let metrics = format!("127.0.0.1:{}", common::free_port());
    let cfg = dir.path().join("fleetban.yaml");
    std::fs::write(
        &cfg,
        format!(
            "host_id: bench-http\nstate_dir: {}\ncontrol: {}\nfirewall: {{ backend: log }}\nmetrics: {metrics}\n\
             http: {{ listen: '{}' }}\nredis: {{ url: '{}' }}\nrules: [rules.yaml]\n",
            dir.path().join("state").display(),
            control.display(),
            sock.display(),
            redis.url()
        ),
    )
    .unwrap();
    let d = Daemon::start(None, &cfg, &control);
    common::wait_until(Duration::from_secs(30), "the bans in the daemon's view", || {
        d.status()["bans_active"].as_u64() == Some(n)
    });
    if let Ok(cpu) = std::env::var("DAEMON_CPU") {
        let ok = Command::new("taskset")
            .args(["-a", "-p", "-c", &cpu, &d.pid().to_string()])
            .output()
            .is_ok_and(|o| o.status.success());
        println!("daemon pinned to CPU {cpu}: {ok}");
    }
    println!("{n} active bans, {conns} kept-alive connections, {seconds} s per run, {runs} runs");
    println!(
        "daemon RSS with the bans, before any check: {:.1} MB",
        common::rss_mb(d.pid())
    );

    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let mut rates = Vec::new();
    for run in 1..=runs {
        let (cpu_before, client_before) = (cpu_seconds(d.pid()), cpu_seconds(std::process::id()));
        let (count, mut lat) = rt.block_on(load(&sock, n, conns, Duration::from_secs(seconds)));
        let cpu = cpu_seconds(d.pid()) - cpu_before;
        let client = cpu_seconds(std::process::id()) - client_before;
        lat.sort_unstable();
        let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0;
        let rate = count as f64 / seconds as f64;
        rates.push(rate);
        println!(
            "run {run}: {rate:.0} checks/s; latency p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs; \
             daemon CPU {cpu:.2} s ({:.0} checks per CPU second), client CPU {client:.2} s",
            q(0.5),
            q(0.99),
            q(0.999),
            q(1.0),
            count as f64 / cpu
        );
    }
    rates.sort_by(f64::total_cmp);
    println!("median {:.0} checks/s over {runs} runs", rates[rates.len() / 2]);
    println!("daemon RSS after the runs: {:.1} MB", common::rss_mb(d.pid()));
    let status = d.status();
    println!("daemon status http: {}", status["http"]);
    daemon_histogram(&metrics);
}

/// User + system CPU seconds of process `pid` so far (all its threads).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the command's closing parenthesis; utime and stime are
    // the 14th and 15th of the whole line, in clock ticks (100 per second).
    let rest = stat.rsplit_once(')').map_or("", |(_, r)| r);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<f64>().ok()).unwrap_or(0.0);
    (tick(11) + tick(12)) / 100.0
}

/// `conns` connections asking for `length` in a closed loop: the checks
/// answered and each one's latency (ns).
async fn load(sock: &Path, n: u64, conns: usize, length: Duration) -> (u64, Vec<u64>) {
    let end = Instant::now() + length;
    let mut tasks = Vec::new();
    for c in 0..conns {
        let sock = sock.to_path_buf();
        // On the current-thread runtime: every client shares one thread.
        tasks.push(tokio::spawn(async move {
            let mut s = tokio::net::UnixStream::connect(&sock).await.expect("connect");
            let mut lat = Vec::with_capacity(1 << 20);
            let mut buf = [0u8; 512];
            // Ban number `i` and the free address beside it, one after the other.
            let mut i = (c as u64 * 7_919) % n;
            let mut ask_banned = true;
            while Instant::now() < end {
                let addr = if ask_banned { banned(i) } else { free(i) };
                let req = format!("GET /check HTTP/1.1\r\nHost: fleetban\r\nX-Client-Addr: {addr}\r\n\r\n");
                let t = Instant::now();
                s.write_all(req.as_bytes()).await.expect("send");
                let mut got = 0;
                loop {
                    let k = s.read(&mut buf[got..]).await.expect("read");
                    assert!(k > 0, "the endpoint closed the connection");
                    got += k;
                    if buf[..got].ends_with(b"\r\n\r\n") {
                        break;
                    }
                }
                lat.push(t.elapsed().as_nanos() as u64);
                let status = &buf[9..12];
                let want: &[u8] = if ask_banned { b"403" } else { b"204" };
                assert_eq!(status, want, "{addr}: {}", String::from_utf8_lossy(&buf[..got]));
                if !ask_banned {
                    i = (i + 1) % n;
                }
                ask_banned = !ask_banned;
            }
            lat
        }));
    }
    let mut all = Vec::new();
    for t in tasks {
        all.extend(t.await.expect("a client task"));
    }
    (all.len() as u64, all)
}

/// The daemon's own histogram of check latency, from its metrics endpoint:
/// the bucket each quantile falls in.
fn daemon_histogram(metrics: &str) {
    use std::io::{Read, Write};
    let Ok(mut s) = std::net::TcpStream::connect(metrics) else {
        println!("daemon histogram: metrics endpoint not reachable");
        return;
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(b"GET /metrics HTTP/1.0\r\n\r\n");
    let mut text = String::new();
    let _ = s.read_to_string(&mut text);
    let buckets: Vec<(String, u64)> = text
        .lines()
        .filter_map(|l| l.strip_prefix("fleetban_http_check_seconds_bucket{le=\""))
        .filter_map(|l| {
            let (le, rest) = l.split_once("\"} ")?;
            Some((le.to_owned(), rest.trim().parse().ok()?))
        })
        .collect();
    let Some(&(_, total)) = buckets.last() else {
        println!("daemon histogram: none in the metrics");
        return;
    };
    let at = |p: f64| {
        buckets
            .iter()
            .find(|(_, c)| *c as f64 >= p * total as f64)
            .map_or("?".to_owned(), |(le, _)| le.clone())
    };
    println!(
        "daemon's own (read -> answer written), {total} checks: p50 <= {} s, p99 <= {} s, p99.9 <= {} s",
        at(0.5),
        at(0.99),
        at(0.999)
    );
}

fn flood() {
    let pool = env("POOL", 16) as usize;
    let pause = Duration::from_millis(env("PAUSE_MS", 10));
    let seconds = env("RUN_SECONDS", 5);
    let flood_n = env("FLOOD", 2000) as usize;
    common::flood::raise_nofile(flood_n as u64 + 1024);
    let (dir, control, sock) = bench_dir();
    let cfg = dir.path().join("fleetban.yaml");
    std::fs::write(
        &cfg,
        format!(
            "host_id: bench-flood\nstate_dir: {}\ncontrol: {}\nfirewall: {{ backend: log }}\n\
             http: {{ listen: '{}' }}\nrules: [rules.yaml]\n",
            dir.path().join("state").display(),
            control.display(),
            sock.display(),
        ),
    )
    .unwrap();
    let d = Daemon::start_with_nofile(None, &cfg, &control, &[], 1024);
    let out = common::cli(&cfg, &["ban", "203.0.113.7"]);
    assert!(out.success(), "{}", out.text());
    common::wait_until(Duration::from_secs(10), "the ban in the daemon's view", || {
        d.status()["bans_active"].as_u64() == Some(1)
    });
    println!("{pool} pooled connections, a check every {pause:?} each, {seconds} s per phase; flood {flood_n}");
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let phase = |name: &str| {
        let (mut lat, retries, lost) = rt.block_on(pooled(&sock, pool, pause, Duration::from_secs(seconds)));
        lat.sort_unstable();
        if lat.is_empty() {
            println!("{name}: no check answered; {retries} retried on a new connection, {lost} unanswered");
            return;
        }
        let q = |p: f64| lat[((lat.len() as f64 * p) as usize).min(lat.len() - 1)] as f64 / 1000.0;
        let slow = lat.iter().filter(|&&ns| ns > 200_000_000).count();
        println!(
            "{name}: {} checks; p50 {:.1} µs, p99 {:.1} µs, p99.9 {:.1} µs, max {:.1} µs; {retries} retried on a new \
             connection, {slow} over 200 ms, {lost} unanswered",
            lat.len(),
            q(0.5),
            q(0.99),
            q(0.999),
            q(1.0)
        );
    };
    phase("no flood");
    let (stop, opened, reopened) = (
        std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false)),
        std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)),
        std::sync::Arc::new(std::sync::atomic::AtomicU64::new(0)),
    );
    let flooder = {
        let (path, stop, opened, reopened) = (sock.clone(), stop.clone(), opened.clone(), reopened.clone());
        std::thread::spawn(move || common::flood::flood(&path, flood_n, &stop, &opened, &reopened))
    };
    common::wait_until(Duration::from_secs(60), "the flood open", || {
        opened.load(std::sync::atomic::Ordering::Relaxed) > 0
    });
    std::thread::sleep(Duration::from_secs(3));
    phase("flood");
    stop.store(true, std::sync::atomic::Ordering::Relaxed);
    flooder.join().unwrap();
    println!(
        "flood reopened {} connections; daemon status http: {}",
        reopened.load(std::sync::atomic::Ordering::Relaxed),
        d.status()["http"]
    );
}

/// `pool` connections as nginx's upstream pool: each asks a check every
/// `pause` (the banned address and a free one in turn), reconnects and
/// retries once when the daemon closed it. Latencies (ns, a retry
/// included), retries, and checks unanswered within a second.
async fn pooled(sock: &Path, pool: usize, pause: Duration, length: Duration) -> (Vec<u64>, u64, u64) {
    let end = Instant::now() + length;
    let mut tasks = Vec::new();
    for c in 0..pool {
        let sock = sock.to_path_buf();
        tasks.push(tokio::spawn(async move {
            let (mut lat, mut retries, mut lost) = (Vec::new(), 0u64, 0u64);
            let mut conn: Option<tokio::net::UnixStream> = None;
            let mut i = c;
            while Instant::now() < end {
                tokio::time::sleep(pause).await;
                i += 1;
                let (addr, want): (&str, &[u8]) = if i % 2 == 0 {
                    ("203.0.113.7", b"403")
                } else {
                    ("198.18.0.1", b"204")
                };
                let req = format!("GET /check HTTP/1.1\r\nHost: fleetban\r\nX-Client-Addr: {addr}\r\n\r\n");
                let t = Instant::now();
                let mut answered = false;
                for attempt in 0..2 {
                    if attempt > 0 {
                        retries += 1;
                    }
                    if conn.is_none() {
                        conn = tokio::net::UnixStream::connect(&sock).await.ok();
                    }
                    let Some(s) = conn.as_mut() else { continue };
                    match tokio::time::timeout(Duration::from_secs(1), ask(s, req.as_bytes())).await {
                        Ok(Some(status)) => {
                            assert_eq!(status, want, "{addr}");
                            answered = true;
                            break;
                        }
                        Ok(None) => conn = None,
                        Err(_) => {
                            conn = None;
                            break;
                        }
                    }
                }
                if answered {
                    lat.push(t.elapsed().as_nanos() as u64);
                } else {
                    lost += 1;
                }
            }
            (lat, retries, lost)
        }));
    }
    let (mut all, mut retries, mut lost) = (Vec::new(), 0, 0);
    for t in tasks {
        let (l, r, x) = t.await.expect("a pool task");
        all.extend(l);
        retries += r;
        lost += x;
    }
    (all, retries, lost)
}

/// One check on `s`: the answer's status, or None if the connection was
/// closed or failed.
async fn ask(s: &mut tokio::net::UnixStream, req: &[u8]) -> Option<[u8; 3]> {
    s.write_all(req).await.ok()?;
    let mut buf = [0u8; 512];
    let mut got = 0;
    while !buf[..got].ends_with(b"\r\n\r\n") {
        let k = s.read(&mut buf[got..]).await.ok()?;
        if k == 0 || got + k == buf.len() {
            return None;
        }
        got += k;
    }
    buf.get(9..12)?.try_into().ok()
}

/// A temporary directory with an empty access log and one rule reading it:
/// (the directory, the control socket's path, the endpoint's).
fn bench_dir() -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let (log, control, sock) = (
        dir.path().join("access.log"),
        dir.path().join("control.sock"),
        dir.path().join("http.sock"),
    );
    std::fs::write(&log, "").unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        format!(
            "rules:\n  - name: bench\n    logs: [{}]\n    limit: {{ hits: 100, window: 60s }}\n",
            log.display()
        ),
    )
    .unwrap();
    (dir, control, sock)
}
