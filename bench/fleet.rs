//! Whole-process fleet benchmarks (root: namespaces, nft), run by
//! `bench/fleet.sh`. A `[[bench]]` target without libtest that runs the
//! benchmarks named on its command line (`propagation_latency`,
//! `start_with_100k_bans`), so `cargo test --bench '*'` and a bare
//! `cargo bench` run none. They print figures; they assert only that the
//! work happened. Daemons, Redis and namespaces are the integration tests'
//! guards (`tests/common`).
//!
//! - `propagation_latency`: two hosts (namespaces), one Redis. A line pair
//!   that bans a fresh address is appended to host A's log; `nft monitor` in
//!   host B's namespace reports when the element is added there. Split at the
//!   ban event's stream id (the Redis clock of `ban.lua`, same machine):
//!   append -> ban written (A: follow poll, parse, window, ban.lua) and
//!   ban written -> element in B's set (B: XREAD, enforcer, nft).
//!   With `NOTIFY=silent`, both hosts have a `notify:` target on their
//!   loopback that accepts connections and never answers (a listening
//!   socket nobody accepts on: every attempt waits out its 5 s timeout):
//!   the figures against those without it say whether a dead webhook
//!   slows banning (BENCHMARKS.md "Notifications").
//! - `start_with_100k_bans`: 100,000 active bans in the list, a daemon
//!   starts; time from spawn to all of them in the kernel's sets.

#[path = "../tests/common/mod.rs"]
mod common;

use std::io::{BufRead, BufReader, Write};
use std::path::Path;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{combined_line, nft_bans, parse_rfc3339_us, strip_ansi, Daemon, NetNs, Redis};

fn main() {
    let mut ran = false;
    for name in std::env::args().skip(1) {
        match name.as_str() {
            "propagation_latency" => propagation_latency(),
            "start_with_100k_bans" => start_with_100k_bans(),
            _ => continue,
        }
        ran = true;
    }
    if !ran {
        eprintln!("usage: cargo bench --bench fleet -- propagation_latency start_with_100k_bans (bench/fleet.sh)");
    }
}

fn now_us() -> i64 {
    SystemTime::now().duration_since(UNIX_EPOCH).unwrap().as_micros() as i64
}

/// The loopback port of the silent webhook target (`NOTIFY=silent`).
const SILENT_PORT: u16 = 9499;

/// With `NOTIFY=silent`: in `ns`, a socket listening on [`SILENT_PORT`]
/// that never accepts: connections complete in the kernel's backlog, the
/// POST is sent, no answer ever comes.
fn silent_target(ns: &NetNs) -> Option<std::process::Child> {
    if std::env::var("NOTIFY").ok().as_deref() != Some("silent") {
        return None;
    }
    let script = format!(
        "import socket,time\ns=socket.socket()\ns.bind(('127.0.0.1',{SILENT_PORT}))\ns.listen(4096)\ntime.sleep(3600)\n"
    );
    Some(
        ns.exec(&["python3", "-c", &script])
            .spawn()
            .expect("python3 for the silent target"),
    )
}

fn write_config(dir: &Path, id: &str, log: &Path, redis: &Redis) -> (std::path::PathBuf, std::path::PathBuf) {
    let control = dir.join("control.sock");
    let notify = match std::env::var("NOTIFY").ok().as_deref() {
        Some("silent") => format!("notify: [{{ url: 'http://127.0.0.1:{SILENT_PORT}/hook' }}]\n"),
        _ => String::new(),
    };
    std::fs::write(
        dir.join("rules.yaml"),
        format!(
            "rules:\n  - name: bench\n    logs: [{}]\n    limit: {{ hits: 1, window: 60s }}\n    ban: {{ duration: 1h }}\n",
            log.display()
        ),
    )
    .unwrap();
    let cfg = dir.join("fleetban.yaml");
    std::fs::write(
        &cfg,
        format!(
            "host_id: {id}\nstate_dir: {}\ncontrol: {}\nredis: {{ url: '{}' }}\nsafety: {{ max_bans_per_minute: 100000 }}\n{notify}rules: [rules.yaml]\n",
            dir.join("state").display(),
            control.display(),
            redis.url()
        ),
    )
    .unwrap();
    (cfg, control)
}

fn pct(sorted: &[f64], p: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i]
}

fn report(name: &str, v: &mut [f64]) {
    v.sort_by(|a, b| a.total_cmp(b));
    println!(
        "{name:<28} n={} p50={:.1} ms p90={:.1} ms p99={:.1} ms max={:.1} ms",
        v.len(),
        pct(v, 0.5),
        pct(v, 0.9),
        pct(v, 0.99),
        v[v.len() - 1]
    );
}

fn propagation_latency() {
    let n: usize = std::env::var("BANS").ok().and_then(|s| s.parse().ok()).unwrap_or(200);
    let redis = Redis::start();
    let (a, b) = (NetNs::new("bencha"), NetNs::new("benchb"));
    let (da, db) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    let (log_a, log_b) = (da.path().join("access.log"), db.path().join("access.log"));
    std::fs::write(&log_a, "").unwrap();
    std::fs::write(&log_b, "").unwrap();
    let (cfg_a, ctl_a) = write_config(da.path(), "bench-a", &log_a, &redis);
    let (cfg_b, ctl_b) = write_config(db.path(), "bench-b", &log_b, &redis);
    let silent: Vec<std::process::Child> = [&a, &b].into_iter().filter_map(silent_target).collect();
    let ha = Daemon::start(Some(&a), &cfg_a, &ctl_a);
    let _hb = Daemon::start(Some(&b), &cfg_b, &ctl_b);

    let mut mon = b
        .exec(&["nft", "monitor", "elements"])
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let (tx, rx) = mpsc::channel::<(i64, String)>();
    let out = mon.stdout.take().unwrap();
    std::thread::spawn(move || {
        for line in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send((now_us(), line)).is_err() {
                break;
            }
        }
    });
    std::thread::sleep(Duration::from_millis(300));

    let mut log = std::fs::OpenOptions::new().append(true).open(&log_a).unwrap();
    let (mut total, mut to_list, mut to_set) = (Vec::new(), Vec::new(), Vec::new());
    for i in 0..n {
        let addr = format!("198.18.{}.{}", i / 250, i % 250 + 1);
        let ms = fleetban::now_ms();
        let text = combined_line(&addr, ms, "/", 200) + &combined_line(&addr, ms, "/", 200);
        let t0 = now_us();
        log.write_all(text.as_bytes()).unwrap();
        let deadline = Instant::now() + Duration::from_secs(5);
        let mut seen = None;
        while let Ok((t, line)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) {
            if line.contains("add element") && line.contains(&format!("{{ {addr} ")) {
                seen = Some(t);
                break;
            }
        }
        let t1 = seen.unwrap_or_else(|| panic!("ban of {addr} not seen in B within 5 s"));
        // The ban event's id is the Redis clock (ms) when ban.lua ran.
        let ev = redis.cli(&["XREVRANGE", "{fleetban}:events", "+", "-", "COUNT", "1"]);
        let id_ms: i64 = ev
            .lines()
            .next()
            .and_then(|l| l.split('-').next())
            .and_then(|s| s.parse().ok())
            .unwrap();
        total.push((t1 - t0) as f64 / 1000.0);
        to_list.push((id_ms * 1000 - t0) as f64 / 1000.0);
        to_set.push((t1 - id_ms * 1000) as f64 / 1000.0);
        // Spread the appends over the follower's poll period.
        std::thread::sleep(Duration::from_millis(7 + (i as u64 * 13) % 40));
    }
    let _ = mon.kill();
    let _ = mon.wait();
    if !silent.is_empty() {
        // The daemon's own account: nothing delivered, everything queued,
        // retried or failed; the ban path never waited for it.
        let st = ha.status();
        println!("notify (A, silent target): {}", st["notify"]);
    }
    for mut c in silent {
        let _ = c.kill();
        let _ = c.wait();
    }
    println!("propagation over {n} bans (append on A -> element in B's nft set):");
    report("append -> element on B", &mut total);
    report("append -> ban in Redis (A)", &mut to_list);
    report("ban in Redis -> B (±1 ms)", &mut to_set);
}

fn start_with_100k_bans() {
    let n: usize = std::env::var("START_BANS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(100_000);
    let redis = Redis::start();
    // Idle: the same daemon on an empty list, 1 s after it is up.
    {
        let ns = NetNs::new("benchidle");
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("access.log");
        std::fs::write(&log, "").unwrap();
        let (cfg, control) = write_config(dir.path(), "bench-idle", &log, &redis);
        let mut d = Daemon::start(Some(&ns), &cfg, &control);
        std::thread::sleep(Duration::from_secs(1));
        println!("daemon RSS idle (Redis, no bans): {:.1} MB", common::rss_mb(d.pid()));
        d.stop(Duration::from_secs(10));
    }
    // 100k members: 3/4 single v4 addresses, 1/4 v6 /64s, one hour left.
    let until = fleetban::now_ms() + 3_600_000;
    redis.preload_bans(n as u64, until);
    // START_REPS starts of a fresh daemon in a fresh namespace on the same
    // list (medians printed); the bans one by one go on top of the last.
    let reps: usize = std::env::var("START_REPS")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(5)
        .max(1);
    let mut runs = Vec::new();
    let mut last = None;
    for rep in 0..reps {
        let (started, figures) = start_once(&redis, n, rep + 1 == reps);
        runs.push(figures);
        if let Some(mut prev) = last.replace(started) {
            prev.3.stop(Duration::from_secs(10));
        }
    }
    let median = |i: usize| {
        let mut v: Vec<f64> = runs.iter().map(|r| r[i]).collect();
        v.sort_by(f64::total_cmp);
        (v[v.len() / 2], v[0], v[v.len() - 1])
    };
    let names = [
        "spawn -> applied (ms)",
        "list read (ms)",
        "nft transaction (s)",
        "RSS with the bans (MB)",
    ];
    println!("start with {n} active bans, medians of {reps} starts (min, max):");
    for (i, name) in names.iter().enumerate() {
        let (m, lo, hi) = median(i);
        println!("  {name:<24} {m:.3} ({lo:.3}, {hi:.3})");
    }
    let Some((_ns, _dir, cfg, d)) = last else {
        unreachable!("at least one start")
    };
    // Bans one by one on top of 100k: what every later transaction costs.
    let text = d.log_text();
    let before = text.matches("nft transaction applied").count();
    let before_lines = before + text.matches("nft plan ready").count();
    let one_by_one: usize = std::env::var("ONE_BY_ONE")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(20);
    let mut ms = Vec::new();
    for i in 0..one_by_one {
        let seen = d.log_text().matches("nft transaction applied").count();
        let t = Instant::now();
        Command::new(fleetban_bin_path())
            .args(["ban", &format!("198.18.{}.{}", i / 256, i % 256), "--for", "1h", "-c"])
            .arg(&cfg)
            .output()
            .unwrap();
        common::wait_until(Duration::from_secs(30), "one more ban", || {
            d.log_text().matches("nft transaction applied").count() > seen
        });
        ms.push(t.elapsed().as_secs_f64() * 1000.0);
    }
    ms.sort_by(f64::total_cmp);
    println!(
        "bans one by one on top of {n}: median {:.1} ms (min {:.1}, max {:.1}, {} bans) from the CLI to the transaction logged",
        ms[ms.len() / 2],
        ms[0],
        ms[ms.len() - 1],
        ms.len()
    );
    println!("daemon RSS after them: {:.1} MB", common::rss_mb(d.pid()));
    // What the enforcer itself spent per ban (its debug lines).
    let field = |l: &str, name: &str| -> Option<f64> {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(seconds)
    };
    let after = d.log_text();
    let lines: Vec<String> = after
        .lines()
        .filter(|l| l.contains("nft transaction applied") || l.contains("nft plan ready"))
        .skip(before_lines)
        .map(strip_ansi)
        .collect();
    let mut plan: Vec<f64> = lines
        .iter()
        .filter(|l| l.contains("plan ready"))
        .filter_map(|l| field(l, "took="))
        .collect();
    let mut nft: Vec<f64> = lines
        .iter()
        .filter(|l| l.contains("transaction applied"))
        .filter_map(|l| field(l, "took="))
        .collect();
    for v in [&mut plan, &mut nft] {
        v.sort_by(f64::total_cmp);
    }
    if !plan.is_empty() && !nft.is_empty() {
        println!(
            "per ban on top of {n}: plan median {:.3} ms, nft transaction median {:.2} ms (min {:.2}, max {:.2})",
            plan[plan.len() / 2] * 1000.0,
            nft[nft.len() / 2] * 1000.0,
            nft[0] * 1000.0,
            nft[nft.len() - 1] * 1000.0
        );
    }
}

/// One start on the list: (namespace, its dir, config, daemon) and
/// [applied ms, list read ms, nft transaction s, RSS MB]. `verbose` prints
/// the start's phases.
fn start_once(
    redis: &Redis,
    n: usize,
    verbose: bool,
) -> ((NetNs, tempfile::TempDir, std::path::PathBuf, Daemon), [f64; 4]) {
    let ns = NetNs::new("bench100k");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    let (cfg, control) = write_config(dir.path(), "bench-start", &log, redis);
    let t0 = now_us();
    let d = Daemon::start(Some(&ns), &cfg, &control);
    let up = (now_us() - t0) as f64 / 1000.0;
    let text = d.log_text();
    let line = text
        .lines()
        .find(|l| l.contains("Ban list applied"))
        .expect("ban list applied");
    // The log's own timestamp (RFC 3339, UTC, µs) of that line.
    let plain = strip_ansi(line);
    let applied = parse_rfc3339_us(plain.split_whitespace().next().unwrap());
    let v4 = nft_bans(&ns, "fleetban", "v4").len();
    let v6 = nft_bans(&ns, "fleetban", "v6").len();
    println!("start with {n} active bans: spawn -> ban list applied {:.0} ms (control socket up after {up:.0} ms); kernel sets v4={v4} v6={v6}",
        (applied - t0) as f64 / 1000.0);
    // The start's phases, as ms after the spawn (debug level).
    let phases = [
        "nftables ready",
        "Ban list read",
        "Ban list entries read",
        "nft plan ready",
        "nft transaction applied",
        "reconciled",
        "Ban list applied",
    ];
    for l in text.lines().filter(|l| verbose && phases.iter().any(|p| l.contains(p))) {
        let l = strip_ansi(l.trim());
        let at = l.split_whitespace().next().map_or(0, parse_rfc3339_us);
        println!("  +{:.1} ms {l}", (at - t0) as f64 / 1000.0);
    }
    assert_eq!(v4 + v6, n);
    println!("daemon RSS with {n} active bans: {:.1} MB", common::rss_mb(d.pid()));
    let field = |l: &str, name: &str| -> Option<f64> {
        l.split_whitespace()
            .find_map(|w| w.strip_prefix(name))
            .and_then(seconds)
    };
    let plain: Vec<String> = text.lines().map(strip_ansi).collect();
    let read = plain
        .iter()
        .find(|l| l.contains("Ban list read."))
        .and_then(|l| field(l, "took="))
        .unwrap_or(f64::NAN);
    let nft = plain
        .iter()
        .find(|l| l.contains("nft transaction applied") && l.contains(&format!("added={n} ")))
        .and_then(|l| field(l, "took="))
        .unwrap_or(f64::NAN);
    let rss = common::rss_mb(d.pid());
    (
        (ns, dir, cfg, d),
        [(applied - t0) as f64 / 1000.0, read * 1000.0, nft, rss],
    )
}

fn fleetban_bin_path() -> std::path::PathBuf {
    common::fleetban_bin()
}

/// Seconds of a logged duration (`took=0.42ms`, `took=2.5s`).
fn seconds(v: &str) -> Option<f64> {
    match v.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().ok().map(|ms| ms / 1000.0),
        None => v.strip_suffix('s')?.parse().ok(),
    }
}
