//! A long ban list, whole-process (issue 27; root: namespaces, nft), run by
//! `bench/scale.sh`, and at 100,000 bans by `scripts/test.sh` (CI) in a
//! debug build, for its assertions. A `[[bench]]` target without libtest: it runs only
//! with `scale` on its command line, so `cargo test --bench '*'` and a bare
//! `cargo bench` run nothing. It prints figures and asserts only that the
//! work happened (every element in nft, `/check` answering from them).
//!
//! One redis-server of its own; SCALE_BANS bans written into the list with
//! a record each, as `ban.lua` writes them (SCALE_SHAPE `addr`: 3/4 IPv4
//! addresses, 1/4 IPv6 /64s; `net`: IPv4 /16-/31 and IPv6 /32-/63
//! networks, mixed: 71% IPv4 at 100,000, but only ~23,000 IPv4 at
//! 1,000,000, the /16s of its range, which hold every longer one drawn:
//! 98% IPv6, the dearer family). Then, printed:
//! - Redis memory per ban: `INFO memory` used_memory before and after
//!   (the writer script loaded before, the slow log emptied after: what
//!   the list's keys take), and from the fresh server;
//! - daemon RSS idle (an empty list, 6 s after it is up: past the first
//!   table check; logging at info as the service does, the other hosts
//!   log at debug); before it and before each host's start the daemon's
//!   binary is dropped from the page cache, so that a build just copied
//!   and one read long ago start alike;
//! - host A starts in a namespace of its own: spawn -> "Ban list applied"
//!   (every element in nft, the view built) and spawn -> `/check` answers
//!   403 for the last entry of the list (polled on its unix socket);
//! - nft's own transaction of the same elements: the ruleset A made,
//!   listed and loaded with `nft -f` into a fresh namespace, timed alone
//!   three times (after A's start, twice after B's), and each host's
//!   start (the later of spawn -> all in nft and spawn -> `/check`
//!   answers) against their median;
//! - RSS of A with the bans;
//! - host B starts the same way; once the kernel is heard announcing an
//!   untimed ban in B's set (`nfevents.rs`: netlink, not `nft monitor`),
//!   ONE_BY_ONE (10) bans on top, as an address and as a /24 decided on A
//!   by `fleetban ban`, and as an address decided by A from its access log
//!   (a request for `/trip`, which the `trip` rule bans on sight), each
//!   timed to the kernel's announcement of its element in B's set, with B's
//!   own nft transaction (its debug line `nft transaction applied
//!   seconds=`);
//! - with SCALE_START_LOG=1, each host's log lines of its start, timed
//!   from the spawn;
//! - with SCALE_STEADY=SECS (and SCALE_RECONCILE, the hosts'
//!   `reconcile_every`), a ban on A every 0.5 s for SECS seconds, decided
//!   in turn from A's log and by the CLI, timed to B's set across B's
//!   periodic reconciles and drift repairs, the slow ones (over 50 ms),
//!   each with how the machine's CPU time went since the ban before (A, B,
//!   the rest, stolen by the hypervisor, idle), and B's log lines on its
//!   full reads printed.

#[path = "../tests/common/mod.rs"]
mod common;
#[path = "nfevents.rs"]
mod nfevents;

use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use common::{parse_rfc3339_us, strip_ansi, Daemon, NetNs, Redis};

fn main() {
    if !std::env::args().skip(1).any(|a| a == "scale") {
        eprintln!("usage: bench/scale.sh [BANS] (cargo bench --bench scale -- scale)");
        return;
    }
    if cfg!(debug_assertions) {
        println!(
            "a debug build (scripts/test.sh runs it so in CI): the whole flow, asserted; its figures are not the release build's (bench/scale.sh, BENCHMARKS.md)"
        );
    }
    let n: u64 = env("SCALE_BANS", 100_000);
    let shape = std::env::var("SCALE_SHAPE").unwrap_or_else(|_| "addr".to_owned());
    let one_by_one: usize = env("ONE_BY_ONE", 10);
    let redis = Redis::start();
    let fresh = redis.used_memory();
    // What the list's keys take: counted from after the writer's load (a
    // script, ~57 kB) to after the preload with the slow log emptied (its
    // 1,000-member calls fill it: ~170 kB). A daemon's Redis holds its
    // scripts and a slow log whatever its list.
    let sha = redis.cli(&["SCRIPT", "LOAD", &writer()]).trim().to_owned();
    let before = redis.used_memory();
    let until = fleetban::now_ms() + 3_600_000;
    let last = preload(&redis, &sha, n, until, &shape);
    let with_log = redis.used_memory();
    redis.cli(&["SLOWLOG", "RESET"]);
    let after = redis.used_memory();
    println!(
        "Redis memory: {:.1} MB for {n} bans ({shape}): {:.0} B per ban (list member, record, expiry); {:.0} B from the fresh server, with the writer script and the slow log",
        (after - before) as f64 / 1e6,
        (after - before) as f64 / n as f64,
        (with_log - fresh) as f64 / n as f64
    );

    let idle = {
        let ns = NetNs::new("scaleidle");
        let empty = Redis::start();
        let host = Host::new("scale-idle", &empty);
        uncache_binary();
        // Logging as the service does (info): the debug lines the other
        // hosts log for their figures map code of their own.
        let d = Daemon::start_with_env(Some(&ns), &host.cfg, &host.control, &[("RUST_LOG", "info")]);
        // Past the first table check (every 5 s): what an idle daemon
        // maps once its periodic work has run.
        std::thread::sleep(Duration::from_secs(6));
        let idle = (common::rss_mb(d.pid()), common::anon_mb(d.pid()));
        drop(d);
        idle
    };
    println!(
        "daemon RSS idle (Redis, no bans): {:.1} MB (anonymous {:.1} MB)",
        idle.0, idle.1
    );

    let (ns_a, a, d_a, a_ms) = start(&redis, "scalea", "scale-a", &last, n);
    // Listed once (a million elements: ~66 s of nft), loaded three times.
    let ruleset = ruleset_of(&ns_a);
    let mut own = vec![nft_alone(&ruleset)];
    println!(
        "daemon RSS with {n} bans: {:.1} MB (anonymous {:.1} MB)",
        common::rss_mb(d_a.pid()),
        common::anon_mb(d_a.pid())
    );
    let (ns_b, _b, d_b, b_ms) = start(&redis, "scaleb", "scale-b", &last, n);
    // Three samples of nft's own, around the starts: one is as noisy as a start.
    own.extend([nft_alone(&ruleset), nft_alone(&ruleset)]);
    let shown: Vec<String> = own.iter().map(|s| format!("{s:.3}")).collect();
    own.sort_by(f64::total_cmp);
    println!(
        "nft's own transaction of the same ruleset (nft -f, fresh namespace; after A's start, then twice after B's): {} s, median {:.3} s; spawn -> all in nft and /check answering from them (the later) against it: A {:.2}x, B {:.2}x",
        shown.join(" / "),
        own[1],
        a_ms / 1000.0 / own[1],
        b_ms / 1000.0 / own[1]
    );

    // The kernel's own announcements of B's set elements (`nft monitor`
    // reads the million elements first: it spun a core for minutes and
    // reported nothing). One untimed ban first: a listener that hears
    // nothing fails here, not as a timed miss.
    let added = nfevents::Additions::listen(&ns_b.name);
    let before_warm = transactions(&d_b).len();
    timed_ban(&a, Decide::Cli, &added, &d_b, "198.18.255.254", "v4");
    // B logs its transaction after the kernel announced it.
    transactions_past(&d_b, before_warm + 1);
    for (kind, how, set, target) in [
        (
            "address",
            Decide::Cli,
            "v4",
            (|i: usize| format!("198.18.{}.{}", i / 250, i % 250 + 1)) as fn(usize) -> String,
        ),
        ("network /24", Decide::Cli, "v4n24", |i: usize| {
            format!("198.19.{i}.0/24")
        }),
        ("address", Decide::Log, "v4", |i: usize| {
            format!("198.20.{}.{}", i / 250, i % 250 + 1)
        }),
    ] {
        let seen_before = transactions(&d_b);
        let (mut e2e, mut cli_ms) = (Vec::new(), Vec::new());
        for i in 0..one_by_one {
            let (to_b, cli) = timed_ban(&a, how, &added, &d_b, &target(i), set);
            e2e.push(to_b);
            cli_ms.extend(cli);
            std::thread::sleep(Duration::from_millis(50));
        }
        let mut nft: Vec<f64> = transactions_past(&d_b, seen_before.len() + one_by_one)[seen_before.len()..]
            .iter()
            .map(|s| s * 1000.0)
            .collect();
        let cli = if cli_ms.is_empty() {
            String::new()
        } else {
            format!("; the CLI alone {}", stats(&mut cli_ms))
        };
        println!(
            "one ban on top of {n}, as {kind}: B's nft transaction {}; decided on A ({}) -> in B's set {}{cli}",
            stats(&mut nft),
            how.said(),
            stats(&mut e2e),
        );
    }
    steady(&a, &added, [&d_a, &d_b], n);
    drop(added);
    println!(
        "daemon RSS after them: A {:.1} MB (anonymous {:.1} MB), B {:.1} MB",
        common::rss_mb(d_a.pid()),
        common::anon_mb(d_a.pid()),
        common::rss_mb(d_b.pid())
    );
}

/// How a timed ban is decided on A.
#[derive(Clone, Copy, PartialEq)]
enum Decide {
    /// `fleetban ban TARGET --for 1h`: a process started per ban, which
    /// asks A on its control socket.
    Cli,
    /// A request for `/trip` appended to A's access log: A's `trip` rule
    /// (`hits: 0`) bans on that line, as a detection does. Addresses only.
    Log,
}

impl Decide {
    fn said(self) -> &'static str {
        match self {
            Decide::Cli => "CLI",
            Decide::Log => "its log",
        }
    }
}

/// `target` banned on A as `how` says, timed to the kernel's announcement
/// of its element in B's set `set`: (that, the CLI alone), in ms. Panics if
/// it is not there within 60 s, with B's log.
fn timed_ban(
    a: &Host,
    how: Decide,
    added: &nfevents::Additions,
    d_b: &Daemon,
    target: &str,
    set: &str,
) -> (f64, Option<f64>) {
    // A network's element is keyed by its first address.
    let key: std::net::IpAddr = target.split('/').next().unwrap().parse().unwrap();
    while added.rx.try_recv().is_ok() {}
    let t0 = Instant::now();
    let cli = match how {
        Decide::Cli => {
            ban_for_an_hour(&a.cfg, target);
            Some(t0.elapsed().as_secs_f64() * 1000.0)
        }
        Decide::Log => {
            common::append(&a.log, &common::combined_line(target, fleetban::now_ms(), "/trip", 404));
            None
        }
    };
    let deadline = t0 + Duration::from_secs(60);
    let mut seen = Vec::new();
    while let Ok((t1, e)) = added
        .rx
        .recv_timeout(deadline.saturating_duration_since(Instant::now()))
    {
        if e.key == key {
            assert_eq!(e.set, set, "{target} went into B's set {}, not {set}", e.set);
            return ((t1 - t0).as_secs_f64() * 1000.0, cli);
        }
        seen.push(e);
    }
    panic!(
        "{target} not in B's set within 60 s; heard {seen:?}; B's log ends:\n{}",
        log_tail(d_b, 15)
    );
}

/// SCALE_STEADY=SECS (with SCALE_RECONCILE, the hosts' `reconcile_every`):
/// a ban on A every 0.5 s for SECS seconds, decided in turn from A's log
/// and by the CLI, each timed to B's set, while B's periodic reconciles
/// (and every 10th, the drift repair) come and go; prints the spread of
/// each, the bans over 50 ms, B's log lines on its full reads and repairs,
/// and how many of B's reconciles of its whole set fell inside.
fn steady(a: &Host, added: &nfevents::Additions, [d_a, d_b]: [&Daemon; 2], n: u64) {
    /// Bans slower than this are printed with when they were decided.
    const SLOW_MS: f64 = 50.0;
    let secs: u64 = env("SCALE_STEADY", 0);
    if secs == 0 {
        return;
    }
    let reconciled = |d: &Daemon| d.log_text().matches("nftables reconciled").count();
    let before = reconciled(d_b);
    let (mut from_log, mut e2e, mut alone) = (Vec::new(), Vec::new(), Vec::new());
    let end = Instant::now() + Duration::from_secs(secs);
    let seen_before = transactions(d_b).len();
    let mut cpu = Cpu::read(d_a, d_b);
    // Bounded by time and by count (two a second).
    for i in 0..secs as usize * 2 {
        if Instant::now() >= end {
            break;
        }
        let before = std::mem::replace(&mut cpu, Cpu::read(d_a, d_b));
        let target = format!("198.18.{}.{}", 100 + i / 250, i % 250 + 1);
        let how = if i % 2 == 0 { Decide::Log } else { Decide::Cli };
        let (took, cli) = timed_ban(a, how, added, d_b, &target, "v4");
        if took > SLOW_MS {
            println!(
                "  {target}: {took:.0} ms, decided ({}) at {} UTC; the machine since the ban before: {}",
                how.said(),
                utc_clock(now_us() - (took * 1000.0) as i64),
                Cpu::read(d_a, d_b).since(&before)
            );
        }
        match cli {
            Some(cli) => {
                e2e.push(took);
                alone.push(cli);
            }
            None => from_log.push(took),
        }
        std::thread::sleep(Duration::from_millis(500));
    }
    let longest = transactions(d_b)[seen_before..]
        .iter()
        .fold(0.0f64, |m, s| m.max(s * 1000.0));
    // B's lines of the window that tell where a slow ban waited.
    let log = d_b.log_text();
    let told: Vec<String> = log
        .lines()
        .map(strip_ansi)
        .filter(|l| {
            ["reconcil", "snapshot", "listed=true", "Ban list", "Drift", "WARN"]
                .iter()
                .any(|w| l.contains(w))
                && !l.contains("the list not read")
        })
        .collect();
    println!("  B's log, its last lines on reconciles and reads of the list:");
    for l in &told[told.len().saturating_sub(12)..] {
        println!("    {l}");
    }
    println!(
        "bans on top of {n} for {secs} s, one every 0.5 s, reconcile_every {}: decided on A (its log) -> in B's set {}; decided on A (CLI) -> in B's set {}; the CLI alone {}; B's reconciles of its whole set meanwhile: {}, its longest nft transaction {longest:.1} ms",
        std::env::var("SCALE_RECONCILE").unwrap_or_else(|_| "60s (default)".to_owned()),
        stats(&mut from_log),
        stats(&mut e2e),
        stats(&mut alone),
        reconciled(d_b) - before
    );
}

/// The machine's CPU time (`/proc/stat`, clock ticks), and A's and B's own:
/// a slow ban says whether the hosts or something else had the cores.
struct Cpu {
    total: u64,
    idle: u64,
    steal: u64,
    a: u64,
    b: u64,
}

impl Cpu {
    fn read(d_a: &Daemon, d_b: &Daemon) -> Cpu {
        let stat = std::fs::read_to_string("/proc/stat").unwrap_or_default();
        // cpu  user nice system idle iowait irq softirq steal ...
        let f: Vec<u64> = stat
            .lines()
            .next()
            .unwrap_or_default()
            .split_whitespace()
            .skip(1)
            .filter_map(|v| v.parse().ok())
            .collect();
        let at = |i: usize| f.get(i).copied().unwrap_or(0);
        Cpu {
            total: f.iter().take(8).sum(),
            idle: at(3) + at(4),
            steal: at(7),
            a: process_ticks(d_a.pid()),
            b: process_ticks(d_b.pid()),
        }
    }

    /// Shares of the machine's time since `before`: A, B, the rest busy,
    /// stolen by the hypervisor, idle.
    fn since(&self, before: &Cpu) -> String {
        let total = self.total.saturating_sub(before.total).max(1) as f64;
        let pct = |v: u64| v as f64 * 100.0 / total;
        let (a, b) = (self.a.saturating_sub(before.a), self.b.saturating_sub(before.b));
        let (idle, steal) = (
            self.idle.saturating_sub(before.idle),
            self.steal.saturating_sub(before.steal),
        );
        let rest = (total as u64).saturating_sub(a + b + idle + steal);
        // SAFETY: sysconf reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get()) as f64;
        format!(
            "A {:.0}%, B {:.0}%, the rest {:.0}%, stolen {:.0}%, idle {:.0}% of {:.2} s of {cores} cores",
            pct(a),
            pct(b),
            pct(rest),
            pct(steal),
            pct(idle),
            total / hz / cores
        )
    }
}

/// utime + stime of `pid`, in clock ticks.
fn process_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let rest = stat.rfind(')').map_or("", |i| &stat[i + 2..]);
    let f: Vec<&str> = rest.split_whitespace().collect();
    let tick = |i: usize| f.get(i).and_then(|v| v.parse::<u64>().ok()).unwrap_or(0);
    tick(11) + tick(12)
}

/// The last `n` lines of `d`'s log, without colours.
fn log_tail(d: &Daemon, n: usize) -> String {
    let lines: Vec<String> = d.log_text().lines().map(strip_ansi).collect();
    lines[lines.len().saturating_sub(n)..].join("\n")
}

/// `fleetban ban TARGET --for 1h` on the host of `cfg`; panics unless it succeeds.
fn ban_for_an_hour(cfg: &Path, target: &str) {
    let o = Command::new(common::fleetban_bin())
        .args(["ban", target, "--for", "1h", "-c"])
        .arg(cfg)
        .output()
        .expect("fleetban ban");
    assert!(o.status.success(), "{}", String::from_utf8_lossy(&o.stderr));
}

fn env<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name).ok().and_then(|s| s.parse().ok()).unwrap_or(default)
}

/// A host's files: configuration, control socket, `/check` socket.
struct Host {
    _dir: tempfile::TempDir,
    /// Its access log: the `trip` rule bans the first request for `/trip`.
    log: PathBuf,
    cfg: PathBuf,
    control: PathBuf,
    http: PathBuf,
}

impl Host {
    fn new(id: &str, redis: &Redis) -> Host {
        let dir = tempfile::tempdir().expect("tempdir");
        let log = dir.path().join("access.log");
        std::fs::write(&log, "").expect("log");
        std::fs::write(
            dir.path().join("rules.yaml"),
            format!(
                "rules:\n  - name: bench\n    logs: [{0}]\n    limit: {{ hits: 1000, window: 60s }}\n    ban: {{ duration: 1h }}\n  - name: trip\n    logs: [{0}]\n    match: {{ path: '^/trip$' }}\n    limit: {{ hits: 0, window: 60s }}\n    ban: {{ duration: 1h }}\n",
                log.display()
            ),
        )
        .expect("rules");
        let (cfg, control, http) = (
            dir.path().join("fleetban.yaml"),
            dir.path().join("control.sock"),
            dir.path().join("http.sock"),
        );
        std::fs::write(
            &cfg,
            format!(
                "host_id: {id}\nstate_dir: {}\ncontrol: {}\nhttp: {{ listen: {} }}\nredis: {{ url: '{}'{} }}\nsafety: {{ max_bans_per_minute: 100000 }}\nrules: [rules.yaml]\n",
                dir.path().join("state").display(),
                control.display(),
                http.display(),
                redis.url(),
                std::env::var("SCALE_RECONCILE")
                    .map(|r| format!(", reconcile_every: {r}"))
                    .unwrap_or_default()
            ),
        )
        .expect("config");
        Host {
            _dir: dir,
            log,
            cfg,
            control,
            http,
        }
    }
}

/// Starts a host in a namespace of its own on the loaded list, prints its
/// start figures, checks every element is in its sets; with them, ms from
/// the spawn until every element was in nft and `/check` answered from
/// them, whichever came later.
fn start(redis: &Redis, ns_tag: &str, id: &str, last: &str, n: u64) -> (NetNs, Host, Daemon, f64) {
    let ns = NetNs::new(ns_tag);
    let host = Host::new(id, redis);
    uncache_binary();
    let t0 = now_us();
    let started = Instant::now();
    // The socket exists once the endpoint serves; a 403 for the list's last
    // entry says the view holds it. Asked from the spawn on, beside the
    // wait for the control socket (which comes later in a start).
    let asker = {
        let (socket, last) = (host.http.clone(), last.to_owned());
        std::thread::spawn(move || {
            for _ in 0..60_000 {
                if check(&socket, &last) == Some(403) {
                    return Some(started.elapsed());
                }
                std::thread::sleep(Duration::from_millis(2));
            }
            None
        })
    };
    let d = Daemon::start(Some(&ns), &host.cfg, &host.control);
    let answered = asker
        .join()
        .expect("the /check asker")
        .expect("/check never answered 403 for the last entry");
    // The kernel's sets: the transactions that load the pages as they are
    // read and the first sync's (or, from an older build, the first sync's
    // alone), each logged with the count it added; in nft once they sum to
    // the list.
    let mut in_nft = None;
    for _ in 0..6_000 {
        let text = d.log_text();
        let mut added = 0;
        for l in text
            .lines()
            .map(strip_ansi)
            .filter(|l| l.contains("nft transaction applied"))
        {
            added += l
                .split_whitespace()
                .find_map(|w| w.strip_prefix("added="))
                .and_then(|v| v.parse::<u64>().ok())
                .unwrap_or(0);
            if added >= n {
                in_nft = Some(parse_rfc3339_us(l.split_whitespace().next().unwrap_or_default()));
                break;
            }
        }
        if in_nft.is_some() {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let in_nft = in_nft.expect("the list never reached nft");
    let text = d.log_text();
    if env("SCALE_START_LOG", 0) == 1 {
        // The start's timeline: each log line, ms after the spawn.
        for l in text
            .lines()
            .map(strip_ansi)
            .take_while(|l| !l.contains("fleetban running"))
        {
            let at = (parse_rfc3339_us(l.split_whitespace().next().unwrap_or_default()) - t0) as f64 / 1000.0;
            println!("  {id} +{at:.1} ms {}", &l[l.find(' ').unwrap_or(0)..l.len().min(220)]);
        }
    }
    for l in text.lines().map(strip_ansi).filter(|l| l.contains("WARN")) {
        println!("  {id} warned: {}", &l[..l.len().min(300)]);
    }
    let applied = text
        .lines()
        .map(strip_ansi)
        .find(|l| l.contains("Ban list applied"))
        .map(|l| parse_rfc3339_us(l.split_whitespace().next().unwrap_or_default()))
        .expect("Ban list applied");
    // The fixed sets and those per length (or, from an older build, v4net/v6net).
    let count: usize = ["v4", "v6"]
        .iter()
        .flat_map(|f| common::ban_sets(&ns, "fleetban", f))
        .map(|(s, _)| set_len(&ns, &s))
        .sum();
    println!(
        "start of {id} with {n} bans: spawn -> ban list applied {:.0} ms; spawn -> /check answers from it {:.0} ms; spawn -> all in nft {:.0} ms; {count} elements in nft",
        (applied - t0) as f64 / 1000.0,
        answered.as_secs_f64() * 1000.0,
        (in_nft - t0) as f64 / 1000.0
    );
    assert_eq!(count as u64, n, "every ban in nft");
    // The start as the issue has it: every element in nft and `/check`
    // answering from them.
    let started = ((in_nft - t0) as f64 / 1000.0).max(answered.as_secs_f64() * 1000.0);
    (ns, host, d, started)
}

/// Drops the daemon's binary from the page cache (what no running daemon
/// maps). Around each page of code a process touches the kernel maps the
/// 64 KiB of neighbours that are cached, so a binary just built or copied,
/// cached whole, showed ~0.5-1 MB more RSS than one read a while ago
/// (BENCHMARKS.md, "Large element changes as netlink batches"): each
/// build starts from its file as exec reads it.
fn uncache_binary() {
    use std::os::fd::AsRawFd;
    if let Ok(f) = std::fs::File::open(common::fleetban_bin()) {
        // Dirty pages (a file just copied) are written first: only clean
        // ones can go.
        let _ = f.sync_all();
        // SAFETY: advice on a file we hold open; no memory is passed.
        unsafe {
            libc::posix_fadvise(f.as_raw_fd(), 0, 0, libc::POSIX_FADV_DONTNEED);
        }
    }
}

/// The status code of `GET /check` for `addr`, or None (no socket yet).
fn check(socket: &Path, addr: &str) -> Option<u16> {
    let mut s = UnixStream::connect(socket).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let client = addr.split('/').next().unwrap_or(addr);
    write!(
        s,
        "GET /check HTTP/1.1\r\nHost: x\r\nX-Client-Addr: {client}\r\nConnection: close\r\n\r\n"
    )
    .ok()?;
    let mut head = [0u8; 12];
    s.read_exact(&mut head).ok()?;
    std::str::from_utf8(&head[9..12]).ok()?.parse().ok()
}

/// Elements of one set of the ban table, counted from `nft -j`.
fn set_len(ns: &NetNs, set: &str) -> usize {
    common::nft_set_elements_detailed(ns, "fleetban", set).len()
}

/// The ruleset a daemon made in `ns`, as `nft -f` input (its listing, the
/// elements' `expires` left out).
fn ruleset_of(ns: &NetNs) -> tempfile::NamedTempFile {
    let out = ns.run(&["nft", "list", "table", "inet", "fleetban"]);
    let text = String::from_utf8_lossy(&out.stdout);
    // `expires ...` is the listing's, not input.
    let mut input = String::with_capacity(text.len());
    for part in text.split(" expires ") {
        if input.is_empty() {
            input.push_str(part);
        } else {
            let cut = part.find([',', ' ', '\n', '}']).unwrap_or(part.len());
            input.push_str(&part[cut..]);
        }
    }
    let file = tempfile::NamedTempFile::new().expect("temp file");
    std::fs::write(file.path(), input).expect("ruleset");
    file
}

/// `nft -f file` into a fresh namespace, timed alone: what nft itself
/// needs for the same elements.
fn nft_alone(file: &tempfile::NamedTempFile) -> f64 {
    let fresh = NetNs::new("scalenft");
    let t = Instant::now();
    let o = fresh.run(&[Path::new("nft").as_os_str(), "-f".as_ref(), file.path().as_os_str()]);
    let secs = t.elapsed().as_secs_f64();
    assert!(o.status.success(), "nft -f: {}", String::from_utf8_lossy(&o.stderr));
    secs
}

/// The script that writes list members with a record each, as `ban.lua`
/// does (`lua/record.lua`'s `rec_put`): a rule's ban by one of three
/// hosts, its reason as `Limit::reason` words it. ARGV: end, now, then
/// the members; KEYS: the list and `{fleetban}:banrec`.
fn writer() -> String {
    format!(
        "{}\n{}",
        fleetban::store::RECORD_LUA,
        r#"
local u, now = ARGV[1], tonumber(ARGV[2])
for i = 3, #ARGV do
  local m, hits = ARGV[i], 101 + i % 7
  redis.call('ZADD', KEYS[1], u, m)
  rec_put(m, {rule = 'nginx-scraper', reason = hits .. ' hits within 1m', host = 'web-' .. (1 + i % 3),
    since = now, ['until'] = tonumber(u), count = 1, hits = hits})
end
return #ARGV - 2"#
    )
}

/// Writes `n` list members and their records as `ban.lua` does (`sha`:
/// [`writer`], loaded), all ending at `until`; returns the list's last
/// member.
fn preload(redis: &Redis, sha: &str, n: u64, until: i64, shape: &str) -> String {
    let members: Vec<String> = if shape == "net" {
        nets(n).iter().map(ToString::to_string).collect()
    } else {
        (0..n).map(address).collect()
    };
    let now = fleetban::now_ms().to_string();
    let until = until.to_string();
    // EVALSHA calls of 1,000 members each, through redis-cli's pipe.
    let mut cmds = String::new();
    for some in members.chunks(1000) {
        let mut args = vec![
            "EVALSHA",
            sha,
            "2",
            "{fleetban}:bans",
            "{fleetban}:banrec",
            &until,
            &now,
        ];
        args.extend(some.iter().map(String::as_str));
        cmds += &format!("*{}\r\n", args.len());
        for a in args {
            cmds += &format!("${}\r\n{a}\r\n", a.len());
        }
    }
    let mut pipe = redis.cli_command();
    let mut child = pipe
        .arg("--pipe")
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .spawn()
        .expect("redis-cli --pipe");
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(cmds.as_bytes())
        .expect("pipe");
    assert!(child.wait().expect("redis-cli").success());
    assert_eq!(
        redis.cli(&["ZCARD", "{fleetban}:bans"]).trim(),
        n.to_string(),
        "the list loaded"
    );
    last_member(redis)
}

/// `addr` shape: the `i`-th member, 3/4 IPv4 addresses, 1/4 IPv6 /64s.
fn address(i: u64) -> String {
    if i % 4 == 3 {
        format!("2001:db8:{:x}:{:x}::/64", i / 65536, i % 65536)
    } else {
        format!(
            "{}.{}.{}.{}",
            100 + (i / 16_777_216) % 50,
            (i / 65536) % 256,
            (i / 256) % 256,
            i % 256
        )
    }
}

/// The list's last entry in its order (all share one end: by member).
fn last_member(redis: &Redis) -> String {
    redis
        .cli(&["ZRANGE", "{fleetban}:bans", "-1", "-1"])
        .lines()
        .next()
        .map(str::to_owned)
        .expect("a loaded list")
}

/// `net` shape: networks (IPv4 /16-/31, IPv6 /32-/63), each written as
/// its network address, none inside another (a ban inside a wider one is
/// not put into nft: `enforce/cover.rs`). Draws fill the IPv4 range's
/// 22,784 /16s, which hold every longer IPv4 network drawn: a long list
/// is mostly IPv6.
fn nets(n: u64) -> Vec<ipnet::IpNet> {
    use std::collections::BTreeSet;
    let mut candidates = BTreeSet::new();
    let mut i: u64 = 0;
    let nets = loop {
        for _ in 0..n {
            let h = splitmix(i);
            let net: ipnet::IpNet = if i % 4 == 3 {
                let len = 32 + (h % 32) as u8;
                let bits = (0x2u128 << 124) | (u128::from(h) << 60);
                ipnet::Ipv6Net::new(std::net::Ipv6Addr::from(bits), len)
                    .expect("len")
                    .trunc()
                    .into()
            } else {
                let len = 16 + (h % 16) as u8;
                // 11.0.0.0 to 99.255.255.255: no loopback, no private range of the harness.
                let v = (11u32 << 24) + ((h >> 32) as u32 % (89 << 24));
                ipnet::Ipv4Net::new(std::net::Ipv4Addr::from(v), len)
                    .expect("len")
                    .trunc()
                    .into()
            };
            candidates.insert(net);
            i += 1;
        }
        // Sorted by address then length: a wider network comes before those inside it.
        let mut kept: Vec<ipnet::IpNet> = Vec::new();
        for net in &candidates {
            if kept.last().is_some_and(|k| k.contains(net)) {
                continue;
            }
            kept.push(*net);
        }
        if kept.len() as u64 >= n {
            kept.truncate(n as usize);
            break kept;
        }
    };
    nets
}

/// A well-mixed 64-bit value of `i` (splitmix64).
fn splitmix(i: u64) -> u64 {
    let mut z = i.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// B's nft transactions so far (seconds), from its debug lines
/// (`took=0.42ms`, `took=12ms`, `took=1.2s`).
fn transactions(d: &Daemon) -> Vec<f64> {
    d.log_text()
        .lines()
        .map(strip_ansi)
        .filter(|l| l.contains("nft transaction applied"))
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|w| w.strip_prefix("took="))
                .and_then(seconds)
        })
        .collect()
}

/// `transactions(d)` once it holds `count` (polled up to 5 s: the daemon
/// writes the line after the kernel has the change); as it is then.
fn transactions_past(d: &Daemon, count: usize) -> Vec<f64> {
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        let all = transactions(d);
        if all.len() >= count || Instant::now() >= deadline {
            return all;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}

/// A duration as `fleetban::took` writes it, in seconds.
fn seconds(v: &str) -> Option<f64> {
    match v.strip_suffix("ms") {
        Some(ms) => ms.parse::<f64>().ok().map(|ms| ms / 1000.0),
        None => v.strip_suffix('s')?.parse().ok(),
    }
}

/// `p50 X ms, p99 Y ms (n)` of `v`.
fn stats(v: &mut [f64]) -> String {
    if v.is_empty() {
        return "none".to_owned();
    }
    v.sort_by(f64::total_cmp);
    let at = |p: f64| v[((v.len() as f64 - 1.0) * p).round() as usize];
    format!(
        "p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms (n={})",
        at(0.5),
        at(0.99),
        v[v.len() - 1],
        v.len()
    )
}

/// `HH:MM:SS.mmm` of a unix time in µs (UTC), as B's log lines begin.
fn utc_clock(us: i64) -> String {
    let (s, ms) = (us / 1_000_000, us / 1000 % 1000);
    format!("{:02}:{:02}:{:02}.{ms:03}", s / 3600 % 24, s / 60 % 60, s % 60)
}

fn now_us() -> i64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as i64)
}
