//! `fleetban run` = `fleetban test` (issue 24): the daemon following a log
//! and the offline replay of the same file decide the same bans (address
//! or network, rule, at, until, reason or hits), for every shipped rule and
//! for `escalate_network`, `distinct`, `hits: 0` and `key: network`, with
//! Redis and with the embedded store.
//!
//! Each case generates seeded traffic (a few hundred lines from addresses of
//! three /24s, some of them heavy, dated over the last ~40 s), starts the
//! real daemon on empty logs, appends the lines, waits until it has read
//! and decided all of them (`status`), and compares its `bans --json` with
//! `fleetban test --json` on the same files.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::time::Duration;

use common::{append, cli, combined_line, fleetban_test_json, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};

/// A small seeded generator (xorshift64*): the same traffic for a seed.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The traffic of one case: access-log and error-log text, lines in all.
struct Traffic {
    access: String,
    error: String,
    /// Lines of each.
    access_lines: u64,
    error_lines: u64,
}

/// `n` requests from addresses of 198.51.100.0/24, 203.0.113.0/24 and
/// 198.18.7.0/24 (a few heavy ones; not 192.0.2.0/24, which test machines
/// may have as their own, never counted by the daemon), dated from `start` on, 0–199 ms apart:
/// pages, logins refused, probes, scanners' agents, limit_req rejections,
/// and error-log lines (limit_req, basic auth) for some of them.
fn traffic(seed: u64, n: usize, start: i64, limit_req_suffix: bool) -> Traffic {
    let mut rng = Rng(seed | 1);
    let nets = ["198.51.100", "203.0.113", "198.18.7"];
    let (mut access, mut error) = (String::new(), String::new());
    let (mut access_lines, mut error_lines) = (0, 0);
    let mut t = start;
    for i in 0..n {
        t += rng.below(200) as i64;
        // A third of the lines from one heavy address (a scraper's 100 a
        // minute), a sixth from three others, the rest spread.
        let heavy = rng.below(6);
        let addr = match heavy {
            0 | 1 => "198.51.100.1".to_owned(),
            2 => format!("198.51.100.{}", 2 + rng.below(3)),
            _ => format!("{}.{}", nets[rng.below(3) as usize], 1 + rng.below(12)),
        };
        let (path, status): (String, u16) = match rng.below(10) {
            0 | 1 => (format!("/page/{}", rng.below(50)), 200),
            2 => (format!("/old/{}", rng.below(500)), 404),
            3 => ("/login".into(), 401),
            4 => ("/wp-login.php".into(), 404),
            5 => (format!("/missing/{}", rng.below(500)), 404),
            6 => (format!("/x{}.php", rng.below(20)), 404),
            7 if rng.below(8) == 0 => ("/.env".into(), 404),
            7 => ("/static/app.css".into(), 200),
            8 => ("/admin".into(), 403),
            _ => ("/".into(), 200),
        };
        let mut line = combined_line(&addr, t, &path, status);
        if rng.below(12) == 0 {
            line = line.replace("curl/7.88", "sqlmap/1.7");
        }
        if limit_req_suffix {
            let rejected = if rng.below(3) == 0 { "REJECTED" } else { "PASSED" };
            line = format!("{} {rejected}\n", line.trim_end());
        }
        access += &line;
        access_lines += 1;
        // Error-log lines: for every line of the heavy ones, for some of
        // the others.
        if heavy <= 2 || i % 4 == 0 {
            let when = chrono_local(t);
            let message = if rng.below(4) != 0 {
                "limiting requests, excess: 1.500 by zone \"one\"".to_owned()
            } else {
                format!("user \"u{}\": password mismatch", rng.below(3))
            };
            error += &format!(
                "{when} [error] 1234#0: *{i} {message}, client: {addr}, server: example.com, request: \"GET / HTTP/1.1\", host: \"example.com\"\n"
            );
            error_lines += 1;
        }
    }
    Traffic {
        access,
        error,
        access_lines,
        error_lines,
    }
}

/// Unix ms as nginx's error log writes its time, in UTC (the daemon and
/// the replay both run with `TZ=UTC`).
fn chrono_local(ms: i64) -> String {
    // `time_local` is `02/Dec/2026:05:10:00 +0000`: reorder its fields.
    let tl = fleetban::time_local(ms);
    let (date, rest) = tl.split_once(':').expect("date:time");
    let time = rest.split(' ').next().expect("time");
    let mut d = date.split('/');
    let (day, month, year) = (d.next().unwrap(), d.next().unwrap(), d.next().unwrap());
    let months = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let m = months.iter().position(|x| *x == month).expect("a month") + 1;
    format!("{year}/{m:02}/{day} {time}")
}

/// What a ban is compared by: address or network, rule, at, until (RFC
/// 3339), and its reason for a network ban, its hits otherwise (an
/// address's reason is written from them).
type Key = (String, String, String, Option<String>, String);

#[derive(Clone, Copy, Debug)]
enum Store {
    Redis,
    Embedded,
}

/// Which rules a case runs: shipped rule files, or rules written here.
enum Rules {
    Shipped(Vec<&'static str>),
    Own(Vec<Rule>),
}

/// Runs the case with `store`, returns the bans of the daemon and of the
/// replay that are still active a while after the daemon was asked.
fn run_case(r: ConfigDir, name: &str, rules: &Rules, store: Store, seed: u64) -> (BTreeSet<Key>, BTreeSet<Key>) {
    let error_log = r.empty_log("error.log");
    let redis = matches!(store, Store::Redis).then(Redis::start);
    let mut main = r
        .main_config()
        .log_firewall()
        .safety("{ max_bans_per_minute: 1000000 }");
    if let Some(redis) = &redis {
        main = main.redis(&redis.url(), "hold: 100ms");
    }
    // Whether the access log is in limit_req's format, and whether a rule
    // reads the error log (the daemon counts the lines it reads).
    let (limit_req, (reads_access, reads_error)) = match rules {
        Rules::Shipped(files) => {
            let paths: Vec<PathBuf> = files.iter().map(|f| shipped(&r, f, &error_log)).collect();
            main = main.rule_files(&paths);
            main.write(&r.cfg);
            let error_rule = |p: &PathBuf| std::fs::read_to_string(p).is_ok_and(|t| t.contains("format: nginx_error"));
            let reads = (!paths.iter().all(error_rule), paths.iter().any(error_rule));
            (files.contains(&"nginx-limit-req"), reads)
        }
        Rules::Own(own) => {
            r.write(&main, own);
            (false, (true, false))
        }
    };
    let env = [("TZ", "UTC")];
    let d = Daemon::start_with_env(None, &r.cfg, &r.control, &env);
    let t = traffic(seed, 400, now_ms() - 40_000, limit_req);
    append(&r.log, &t.access);
    append(&error_log, &t.error);
    let read = |yes: bool, n: u64| if yes { n } else { 0 };
    settle(
        &d,
        read(reads_access, t.access_lines) + read(reads_error, t.error_lines),
    );
    let asked = now_ms();
    let out = cli(&r.cfg, &["bans", "--json"]);
    assert!(out.success(), "{name} {store:?}: {}", out.text());
    // Bans that end within a few seconds of the question are left out on
    // both sides: the daemon may have dropped them already.
    let live = |until: &Option<String>| {
        until
            .as_deref()
            .is_none_or(|u| u > fleetban::rfc3339(asked + 5_000).as_str())
    };
    let daemon: BTreeSet<Key> = out
        .stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .map(|b| {
            let network = b["hits"] == 0;
            key(&b, "since", network)
        })
        .filter(|k| live(&k.3))
        .collect();
    let replayed = fleetban_test_json(&r.cfg, &[], "UTC");
    let summary = replayed.last().map(|s| s["rules"].to_string()).unwrap_or_default();
    assert!(
        replayed.iter().any(|v| v["event"] == "ban"),
        "{name}: the traffic bans no one in the replay: {summary}"
    );
    let replay: BTreeSet<Key> = replayed
        .into_iter()
        .filter(|v| v["event"] == "ban")
        .map(|b| {
            let network = b.get("reason").is_some();
            key(&b, "at", network)
        })
        .filter(|k| live(&k.3))
        .collect();
    if daemon != replay && std::env::var("FLEETBAN_RUN_TEST").is_ok() {
        eprintln!("{name} {store:?}: the daemon's log:\n{}", d.log_text());
        eprintln!(
            "the access log:\n{}",
            std::fs::read_to_string(&r.log).unwrap_or_default()
        );
    }
    (daemon, replay)
}

/// A ban line's comparison key; `at` names its time field.
fn key(b: &serde_json::Value, at: &str, network: bool) -> Key {
    let text = |f: &str| b[f].as_str().unwrap_or_else(|| panic!("no {f} in {b}")).to_owned();
    let detail = if network {
        text("reason")
    } else {
        format!("{} hits", b["hits"])
    };
    (
        text("addr"),
        text("rule"),
        text(at),
        b["until"].as_str().map(str::to_owned),
        detail,
    )
}

/// Waits (bounded) until the daemon has read `lines` lines and holds no
/// hit, pending or in a round trip.
fn settle(d: &Daemon, lines: u64) {
    let read = || d.status()["lines"].as_u64().unwrap_or(0);
    let deadline = std::time::Instant::now() + Duration::from_secs(20);
    while read() < lines {
        assert!(
            std::time::Instant::now() < deadline,
            "{lines} lines never read: {}\n{}",
            d.status(),
            d.log_text()
        );
        std::thread::sleep(Duration::from_millis(20));
    }
    assert_eq!(read(), lines, "lines read: {}", d.status());
    let mut quiet = 0;
    wait_until(Duration::from_secs(20), "the daemon to decide every hit", || {
        let s = d.status();
        let redis = &s["redis"];
        let idle = redis["held_hits"] == 0 && redis["inflight_hits"] == 0 && redis["queued_bans"] == 0;
        quiet = if idle { quiet + 1 } else { 0 };
        // Idle at several polls in a row: the last verdicts are applied.
        quiet >= 10
    });
}

/// The shipped rule file `name`, its logs pointed at this case's files.
fn shipped(r: &ConfigDir, name: &str, error_log: &Path) -> PathBuf {
    let root = Path::new(env!("CARGO_MANIFEST_DIR"));
    let text = std::fs::read_to_string(root.join("rules").join(format!("{name}.yaml"))).expect("a shipped rule");
    let text = text
        .replace("/var/log/nginx/access.log", &r.log.display().to_string())
        .replace("/var/log/nginx/error.log", &error_log.display().to_string());
    let path = r.path().join(format!("{name}.yaml"));
    std::fs::write(&path, text).expect("write a rule file");
    path
}

/// Every case: each shipped rule file, all of them at once, and the four
/// features alone and together.
fn cases(log: &Path) -> Vec<(String, Rules)> {
    let shipped = [
        "nginx-bad-bots",
        "nginx-first-hit",
        "nginx-http-auth",
        "nginx-limit-req-error",
        "nginx-limit-req",
        "nginx-login",
        "nginx-php-probes",
        "nginx-probing-distinct",
        "nginx-probing",
        "nginx-scraper",
    ];
    let mut all: Vec<(String, Rules)> = shipped
        .iter()
        .map(|s| (s.to_string(), Rules::Shipped(vec![s])))
        .collect();
    let together: Vec<&'static str> = shipped.iter().copied().filter(|s| *s != "nginx-limit-req").collect();
    all.push(("shipped together".into(), Rules::Shipped(together)));
    let per_addr = || {
        Rule::new("per-addr", log, "{ hits: 3, window: 60s }")
            .ban("10m")
            .escalate_network("{ ipv4_prefix: 24, bans: 3, within: 10m, duration: 1h }")
    };
    let pool = || Rule::new("pool", log, "{ key: network, ipv4_prefix: 24, hits: 40, window: 60s }").ban("10m");
    all.push(("escalate_network".into(), Rules::Own(vec![per_addr()])));
    all.push((
        "distinct".into(),
        Rules::Own(vec![Rule::new(
            "paths",
            log,
            "{ distinct: path, hits: 6, window: 60s }",
        )
        .ban("10m")]),
    ));
    all.push((
        "hits: 0".into(),
        Rules::Own(vec![Rule::new("first", log, "{ hits: 0, window: 60s }")
            .matching("{ path: '^/x1[0-9]\\.php$' }")
            .ban("10m")]),
    ));
    all.push(("key: network".into(), Rules::Own(vec![pool()])));
    all.push((
        "escalate_network and key: network".into(),
        Rules::Own(vec![per_addr(), pool()]),
    ));
    all
}

#[test]
fn run_and_test_ban_the_same_on_the_same_lines() {
    let mut failures = Vec::new();
    let count = cases(Path::new("access.log")).len();
    for i in 0..count {
        for store in [Store::Redis, Store::Embedded] {
            // A fresh dir per run: its rules name its own log.
            let r = ConfigDir::new();
            let (name, rules) = cases(&r.log).swap_remove(i);
            // `FLEETBAN_RUN_TEST=NAME` runs the cases whose name holds NAME.
            if std::env::var("FLEETBAN_RUN_TEST").is_ok_and(|only| !name.contains(&only)) {
                continue;
            }
            let seed = 0x5eed_0000 + i as u64;
            let (daemon, replay) = run_case(r, &name, &rules, store, seed);
            if daemon != replay {
                let only_run: Vec<_> = daemon.difference(&replay).collect();
                let only_test: Vec<_> = replay.difference(&daemon).collect();
                failures.push(format!(
                    "{name} ({store:?}, seed {seed:#x}): {} bans alike\n  only in run:  {only_run:?}\n  only in test: {only_test:?}",
                    daemon.intersection(&replay).count()
                ));
            }
        }
    }
    assert!(failures.is_empty(), "run and test differ:\n{}", failures.join("\n"));
}
