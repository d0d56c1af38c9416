//! Spread attackers over three hosts (issue 13), run by `bench/spread.sh`:
//! a `[[bench]]` target without libtest that measures only when named
//! `propagation` on its command line (so `cargo test --bench '*'` and a
//! bare `cargo bench` run nothing). The rig is the integration tests'
//! (`tests/common/fleet.rs`): three namespaces, each with Debian's nginx and
//! its own `fleetban run` (nft), one Redis, a client namespace holding the
//! attackers' addresses.
//!
//! Per repetition and build: a fresh fleet; ATTACKERS clients released
//! together, each sending LIMIT + 1 requests one after the other,
//! round-robin over the hosts (the last one to the third host), over HTTP
//! from this process; limit LIMIT / 60 s for the fleet. Per attacker: from
//! the instant its last request was written to the socket until its
//! element is in the sets of all three hosts, each host's addition seen by
//! `nft monitor elements` in its namespace (a netlink event at the
//! transaction's commit, read by a thread here and stamped on arrival:
//! the figure is late by the monitor's and the reader's wake-up, tens of
//! µs on an idle machine, up to a scheduling slice when both cores are
//! busy). Also the parts up to the ban in Redis (the ban event's stream
//! id: Redis's clock when `ban.lua` ran, ms resolution, same machine) and
//! up to the element on the first host (usually the one that decided).
//!
//! Env: BIN_NEW (the build measured; default this tree's), BIN_OLD (a
//! second build, alternated with it in every repetition), HOLD (`0s`:
//! `hold: 0s` in the daemons' `redis:` section; unset: the defaults),
//! ATTACKERS (20), LIMIT (20), REPS (5).

#[path = "../tests/common/mod.rs"]
mod common;

use std::collections::HashMap;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};
use std::process::{Child, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::fleet::{spread_requests, Fleet};

fn main() {
    if std::env::args().skip(1).any(|a| a == "propagation") {
        propagation();
    } else {
        eprintln!("usage: cargo bench --bench spread -- propagation (bench/spread.sh)");
    }
}

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    match std::env::var(name) {
        Ok(v) if !v.is_empty() => v.parse().unwrap_or_else(|_| panic!("{name}={v}: not a valid value")),
        _ => default,
    }
}

/// What one repetition of one build measured, per attacker, in ms.
struct Run {
    /// Last request -> element in all three hosts' sets.
    all: Vec<f64>,
    /// Last request -> the ban event in Redis.
    redis: Vec<f64>,
    /// Last request -> element in the first host's set.
    first: Vec<f64>,
}

fn propagation() {
    let attackers: usize = env_or("ATTACKERS", 20);
    let limit: usize = env_or("LIMIT", 20);
    let reps: usize = env_or("REPS", 5).max(1);
    let hold = std::env::var("HOLD").ok().filter(|h| !h.is_empty());
    let mut builds = vec![(
        "new",
        PathBuf::from(env_or("BIN_NEW", common::fleetban_bin().display().to_string())),
    )];
    if let Some(old) = std::env::var("BIN_OLD").ok().filter(|b| !b.is_empty()) {
        builds.push(("old", PathBuf::from(old)));
    }
    let redis_options = hold.as_ref().map_or(String::new(), |h| format!("hold: {h}"));
    let hold_text = hold.as_deref().unwrap_or("default");
    println!(
        "{attackers} attackers x {} requests round-robin over 3 hosts, limit {limit} / 60 s (fleet), \
         redis hold: {hold_text}, {reps} repetitions",
        limit + 1
    );
    let clock = Clock::new();
    let mut runs: HashMap<&str, Vec<Run>> = HashMap::new();
    for rep in 0..reps {
        // Alternate which build goes first.
        let order: Vec<usize> = if rep % 2 == 0 {
            (0..builds.len()).collect()
        } else {
            (0..builds.len()).rev().collect()
        };
        for b in order {
            let (name, bin) = &builds[b];
            let run = once(bin, attackers, limit, &redis_options, &clock);
            let (mut all, mut redis, mut first) = (run.all.clone(), run.redis.clone(), run.first.clone());
            println!(
                "  rep {} {name}: p50 {:.1} / p99 {:.1} / max {:.1} ms to all 3 hosts; \
                 p50 {:.1} ms to the ban in Redis, {:.1} ms to the first host",
                rep + 1,
                pct(&mut all, 0.5),
                pct(&mut all, 0.99),
                pct(&mut all, 1.0),
                pct(&mut redis, 0.5),
                pct(&mut first, 0.5)
            );
            runs.entry(name).or_default().push(run);
        }
    }

    println!();
    println!(
        "spread attackers, last request -> element on all 3 hosts (ms; hold: {hold_text}; \
         per repetition over {attackers} attackers, medians of {reps} repetitions; pooled: all {} attackers)",
        attackers * reps
    );
    println!("| build | p50 | p99 | max | to ban in Redis, p50 | to first host, p50 | pooled p50 | pooled p99 | pooled max |");
    println!("|---|---|---|---|---|---|---|---|---|");
    let rows: Vec<[f64; 8]> = builds.iter().map(|(name, _)| row(&runs[name])).collect();
    for ((name, bin), r) in builds.iter().zip(&rows) {
        let cells: Vec<String> = r.iter().map(|v| format!("{v:.1}")).collect();
        println!("| {name} ({}) | {} |", bin.display(), cells.join(" | "));
    }
    if let [new, old] = &rows[..] {
        let cells: Vec<String> = new
            .iter()
            .zip(old)
            .map(|(n, o)| format!("{:+.0}%", 100.0 * (n / o - 1.0)))
            .collect();
        println!("| change new / old | {} |", cells.join(" | "));
    }
}

/// One build's row: medians over the repetitions of p50, p99 and max to
/// all hosts and of p50 to Redis and to the first host, then p50, p99 and
/// max to all hosts of all attackers of every repetition together.
fn row(runs: &[Run]) -> [f64; 8] {
    let median = |sel: fn(&Run) -> &Vec<f64>, p: f64| {
        let mut per_rep: Vec<f64> = runs.iter().map(|r| pct(&mut sel(r).clone(), p)).collect();
        pct(&mut per_rep, 0.5)
    };
    let mut pooled: Vec<f64> = runs.iter().flat_map(|r| r.all.iter().copied()).collect();
    [
        median(|r| &r.all, 0.5),
        median(|r| &r.all, 0.99),
        median(|r| &r.all, 1.0),
        median(|r| &r.redis, 0.5),
        median(|r| &r.first, 0.5),
        pct(&mut pooled, 0.5),
        pct(&mut pooled, 0.99),
        pct(&mut pooled, 1.0),
    ]
}

/// Nearest rank: the value at round((n - 1) p) of the sorted values (p99
/// of 20 values is their maximum).
fn pct(v: &mut [f64], p: f64) -> f64 {
    v.sort_by(f64::total_cmp);
    v[((v.len() as f64 - 1.0) * p).round() as usize]
}

/// Instants as wall-clock ms, to compare with Redis's stream ids.
struct Clock {
    instant: Instant,
    wall_us: i64,
}

impl Clock {
    fn new() -> Clock {
        let wall = SystemTime::now().duration_since(UNIX_EPOCH).expect("after 1970");
        Clock {
            instant: Instant::now(),
            wall_us: wall.as_micros() as i64,
        }
    }

    fn wall_ms(&self, at: Instant) -> f64 {
        (self.wall_us + at.duration_since(self.instant).as_micros() as i64) as f64 / 1000.0
    }
}

/// One fleet running `bin`, one attack, torn down.
fn once(bin: &Path, attackers: usize, limit: usize, redis_options: &str, clock: &Clock) -> Run {
    let fleet = Fleet::start(
        3,
        &format!("{{ hits: {limit}, window: 60s, scope: fleet }}"),
        redis_options,
        bin,
    );
    let (tx, rx) = mpsc::channel::<(usize, Instant, String)>();
    let mut monitors: Vec<Child> = Vec::new();
    for (h, host) in fleet.hosts.iter().enumerate() {
        let mut mon = host
            .ns
            .exec(&["nft", "monitor", "elements"])
            .stdout(Stdio::piped())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn nft monitor");
        let out = mon.stdout.take().expect("its stdout");
        let tx = tx.clone();
        std::thread::spawn(move || {
            for line in BufReader::new(out).lines().map_while(Result::ok) {
                if tx.send((h, Instant::now(), line)).is_err() {
                    break;
                }
            }
        });
        monitors.push(mon);
    }
    // A monitor is listening once it reports an element added to a table
    // of our own: a new element every 50 ms until each one has (it may
    // subscribe after the first), for 5 s at most.
    for host in &fleet.hosts {
        host.ns.run(&["nft", "add", "table", "inet", "fbbench"]);
        host.ns
            .run(&["nft", "add", "set", "inet", "fbbench", "ready", "{ type ipv4_addr; }"]);
    }
    let mut ready = vec![false; fleet.hosts.len()];
    for n in 1..=100u8 {
        for (host, _) in fleet.hosts.iter().zip(&ready).filter(|(_, r)| !**r) {
            let element = format!("{{ 10.213.0.{n} }}");
            host.ns
                .run(&["nft", "add", "element", "inet", "fbbench", "ready", &element]);
        }
        let until = Instant::now() + Duration::from_millis(50);
        while let Ok((h, _, line)) = rx.recv_timeout(until.saturating_duration_since(Instant::now())) {
            ready[h] |= line.contains("fbbench");
        }
        if ready.iter().all(|r| *r) {
            break;
        }
    }
    assert!(
        ready.iter().all(|r| *r),
        "nft monitor not listening within 5 s: {ready:?}"
    );

    let sent = fleet.each_client(attackers, move |i, hosts| {
        spread_requests(Fleet::client(i), hosts, limit + 1, Duration::from_secs(5))
    });
    let last: Vec<Instant> = sent
        .into_iter()
        .enumerate()
        .map(|(i, r)| r.unwrap_or_else(|e| panic!("attacker {i}: {e}\n{}", fleet.logs())))
        .collect();
    let index: HashMap<String, usize> = (0..attackers).map(|i| (Fleet::client(i).to_string(), i)).collect();
    let mut seen: Vec<Vec<Option<Instant>>> = vec![vec![None; attackers]; fleet.hosts.len()];
    let mut missing = attackers * fleet.hosts.len();
    let deadline = Instant::now() + Duration::from_secs(20);
    while missing > 0 {
        let Ok((h, at, line)) = rx.recv_timeout(deadline.saturating_duration_since(Instant::now())) else {
            panic!("{missing} elements not seen within 20 s\n{}", fleet.logs());
        };
        for addr in added_v4(&line) {
            if let Some(&i) = index.get(addr) {
                if seen[h][i].is_none() {
                    seen[h][i] = Some(at);
                    missing -= 1;
                }
            }
        }
    }
    for mut m in monitors {
        let _ = m.kill();
        let _ = m.wait();
    }
    let banned_ms = ban_event_ms(&fleet);
    let mut run = Run {
        all: Vec::new(),
        redis: Vec::new(),
        first: Vec::new(),
    };
    let ms = |at: Instant, sent: &Instant| at.duration_since(*sent).as_secs_f64() * 1000.0;
    for (i, sent) in last.iter().enumerate() {
        let at: Vec<Instant> = (0..fleet.hosts.len()).filter_map(|h| seen[h][i]).collect();
        run.all.push(ms(*at.iter().max().expect("seen"), sent));
        run.first.push(ms(*at.iter().min().expect("seen"), sent));
        let addr = Fleet::client(i).to_string();
        let ban = banned_ms
            .get(&addr)
            .unwrap_or_else(|| panic!("no ban event for {addr}"));
        run.redis.push(ban - clock.wall_ms(*sent));
    }
    run
}

/// The addresses a `nft monitor` line adds to fleetban's `v4` set:
/// `add element inet fleetban v4 { 10.213.64.1 timeout 10m expires ... , ... }`.
fn added_v4(line: &str) -> Vec<&str> {
    let Some(rest) = line.strip_prefix("add element inet fleetban v4 {") else {
        return Vec::new();
    };
    let body = rest.split('}').next().unwrap_or_default();
    body.split(',').filter_map(|e| e.split_whitespace().next()).collect()
}

/// Address -> ms of its ban event's stream id (Redis's clock at `ban.lua`).
fn ban_event_ms(fleet: &Fleet) -> HashMap<String, f64> {
    // --raw: an entry's id, then its field and value lines.
    let text = fleet.redis.cli(&["XRANGE", "{fleetban}:events", "-", "+"]);
    let mut out = HashMap::new();
    let mut id_ms = None;
    let mut lines = text.lines();
    while let Some(l) = lines.next() {
        if let Some((ms, seq)) = l.split_once('-') {
            if !ms.is_empty() && ms.bytes().chain(seq.bytes()).all(|b| b.is_ascii_digit()) {
                id_ms = ms.parse::<f64>().ok();
                continue;
            }
        }
        if l == "addr" {
            if let (Some(addr), Some(ms)) = (lines.next(), id_ms) {
                out.entry(addr.to_owned()).or_insert(ms);
            }
        }
    }
    out
}
