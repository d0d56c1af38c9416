//! The operator's commands against a daemon with the embedded store (the
//! `log` firewall, or nft inside a namespace the test creates), run as the
//! real binary: they work while a rule file is broken; `flush` says what it
//! removed and refuses while a daemon runs; re-banning never shortens a
//! ban; `unban` names the wider bans that still cover an address and takes
//! what `ban` takes; `status` and `bans` print aligned tables; `explain`
//! says why an address is or is not banned. The same stories over Redis
//! (a redis-server of the test's own), and with Redis killed: `status`
//! says `down` within about a second, `ban` and `unban` go through the
//! daemon and reach Redis, in order, once it is back.

mod common;

use std::time::Duration;

use common::{append, cli, combined_lines, fleetban_bin, now_ms, wait_until, ConfigDir, Daemon, NetNs, Redis, Rule};

/// A daemon's files: `scraper` (at most 5 hits a minute) on `access.log`,
/// 192.0.2.0/24 allowed, the log firewall.
fn rig() -> ConfigDir {
    let r = ConfigDir::new();
    r.write(
        &r.main_config()
            .host_id("ops-host")
            .allow("[192.0.2.0/24]")
            .log_firewall(),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    r
}

/// As [`rig`], the bans and windows in `redis` (with `options`).
fn redis_rig(redis: &Redis, options: &str) -> ConfigDir {
    let r = ConfigDir::new();
    r.write(
        &r.main_config()
            .host_id("ops-host")
            .allow("[192.0.2.0/24]")
            .log_firewall()
            .redis(&redis.url(), options),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    r
}

/// The one line of `bans --json` about `addr`.
fn ban_of(r: &ConfigDir, addr: &str) -> Option<serde_json::Value> {
    let out = cli(&r.cfg, &["bans", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    out.stdout
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).expect("a JSON line"))
        .find(|b| b["addr"] == addr)
}

#[test]
fn commands_that_talk_to_the_daemon_work_while_a_rule_file_is_broken() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    // The rules break after the start: the daemon runs on its last good ones.
    std::fs::write(&r.rules, "rules:\n  - name: scraper\n    limit: { hits: many }\n").unwrap();
    assert_eq!(cli(&r.cfg, &["check"]).code, 2);
    for args in [
        &["status"][..],
        &["bans"],
        &["ban", "198.51.100.9", "--for", "1h"],
        &["explain", "198.51.100.9"],
        &["unban", "198.51.100.9"],
    ] {
        let out = cli(&r.cfg, args);
        assert_eq!(out.code, 0, "{args:?}: {}", out.text());
        assert!(
            out.stderr.contains("the rule files have 1 error(s)") && out.stderr.contains("fleetban check"),
            "{args:?}: {}",
            out.stderr
        );
    }
    // An error in the main file still fails, naming it.
    let main = std::fs::read_to_string(&r.cfg).unwrap();
    std::fs::write(&r.cfg, format!("{main}bogus_key: 1\n")).unwrap();
    let out = cli(&r.cfg, &["status"]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(out.stderr.contains("fleetban.yaml"), "{}", out.stderr);
}

#[test]
fn flush_says_there_was_nothing_and_refuses_while_a_daemon_runs() {
    let r = rig();
    let out = cli(&r.cfg, &["flush"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("nothing to remove"), "{}", out.stdout);
    assert!(!out.stdout.contains("removed table"), "{}", out.stdout);

    let mut d = Daemon::start(None, &r.cfg, &r.control);
    let out = cli(&r.cfg, &["flush"]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(
        out.stderr.contains("daemon is running") && out.stderr.contains("--force"),
        "{}",
        out.stderr
    );
    let out = cli(&r.cfg, &["flush", "--force"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("re-creates the table"), "{}", out.stdout);
    d.stop(Duration::from_secs(10));
    // Stopped: no refusal.
    assert_eq!(cli(&r.cfg, &["flush"]).code, 0);
}

#[test]
fn flush_counts_the_bans_of_the_table_it_removes() {
    let ns = NetNs::new("opsflush");
    let r = ConfigDir::new();
    r.write(
        &r.main_config().host_id("ops-host"),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }")],
    );
    let mut d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    for a in ["198.51.100.1", "198.51.100.2", "2001:db8:7::/64"] {
        assert_eq!(cli(&r.cfg, &["ban", a]).code, 0);
    }
    // A ban extended, then shortened with --replace: the kernel's element
    // takes each new end.
    let timeout = || {
        common::nft_bans(&ns, "fleetban", "v4")
            .into_iter()
            .find(|(e, _)| e == "198.51.100.1")
            .and_then(|(_, t)| t)
            .unwrap_or(0)
    };
    assert!(timeout() <= 3_600_000, "{}", timeout());
    assert!(cli(&r.cfg, &["ban", "198.51.100.1", "--for", "5h"])
        .stdout
        .contains("extended"));
    wait_until(Duration::from_secs(5), "the element's timeout extended", || {
        timeout() > 4 * 3_600_000
    });
    assert!(cli(&r.cfg, &["ban", "198.51.100.1", "--for", "10m", "--replace"])
        .stdout
        .contains("replaced"));
    wait_until(Duration::from_secs(5), "the element's timeout shortened", || {
        (1..=600_000).contains(&timeout())
    });
    d.stop(Duration::from_secs(10));
    let flush = || {
        let out = ns.run(&[fleetban_bin().to_str().unwrap(), "flush", "-c", r.cfg.to_str().unwrap()]);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let first = flush();
    assert!(
        first.contains("removed table inet fleetban and the 3 ban(s) in its sets"),
        "{first}"
    );
    let second = flush();
    assert!(
        second.contains("nothing to remove: there is no table inet fleetban"),
        "{second}"
    );
}

#[test]
fn a_ban_nft_refused_is_said_not_enforced_by_ban_and_bans() {
    let ns = NetNs::new("opsnft");
    let r = ConfigDir::new();
    r.write(
        &r.main_config().host_id("ops-host"),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }")],
    );
    let shim = common::NftShim::new();
    let _d = Daemon::start_with_env(Some(&ns), &r.cfg, &r.control, &shim.env());
    let out = cli(&r.cfg, &["ban", "203.0.113.90"]);
    assert!(!out.stdout.contains("not enforced"), "{}", out.stdout);
    shim.fail();
    let out = cli(&r.cfg, &["ban", "203.0.113.91"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("warning: not enforced yet"), "{}", out.stdout);
    let listed = cli(&r.cfg, &["bans"]).stdout;
    assert!(listed.contains("203.0.113.91 (not enforced)"), "{listed}");
    assert!(!listed.contains("203.0.113.90 (not enforced)"), "{listed}");
    assert_eq!(ban_of(&r, "203.0.113.91").unwrap()["enforced"], false);
    let out = cli(&r.cfg, &["status"]);
    assert!(
        out.stdout.contains("firewall:  failing (")
            && out.stdout.contains("1 ban(s) not enforced (retried): 203.0.113.91"),
        "{}",
        out.stdout
    );
    shim.heal();
}

#[test]
fn rebanning_never_shortens_a_ban_and_keeps_its_reason_in_the_embedded_store() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    rebanning_never_shortens(&r);
}

/// The same story whatever the store: `bans --json` after each step.
pub fn rebanning_never_shortens(r: &ConfigDir) {
    let until = |r: &ConfigDir| ban_of(r, "198.51.100.7").map(|b| (b["until"].clone(), b["reason"].clone()));
    let ban = |args: &[&str]| {
        let mut all = vec!["ban", "198.51.100.7"];
        all.extend_from_slice(args);
        let out = cli(&r.cfg, &all);
        assert_eq!(out.code, 0, "{}", out.text());
        out.stdout
    };
    let out = ban(&["--for", "2h", "--reason", "abuse report"]);
    assert!(out.starts_with("banned 198.51.100.7 until "), "{out}");
    let (two_hours, reason) = until(r).unwrap();
    assert_eq!(reason, "abuse report");
    // Shorter, no reason: kept, reason kept.
    let out = ban(&["--for", "10m"]);
    assert!(out.contains("already banned until") && out.contains("kept"), "{out}");
    assert_eq!(until(r).unwrap(), (two_hours.clone(), reason.clone()));
    // Longer with a reason: extended, the new reason.
    let out = ban(&["--for", "5h", "--reason", "again"]);
    assert!(out.contains("extended to"), "{out}");
    let (five_hours, reason) = until(r).unwrap();
    assert!(
        five_hours.as_str().unwrap() > two_hours.as_str().unwrap(),
        "{five_hours} {two_hours}"
    );
    assert_eq!(reason, "again");
    // Permanent stays permanent.
    assert!(ban(&["--permanent"]).contains("extended to forever"));
    assert!(ban(&["--for", "1h"]).contains("kept"));
    assert_eq!(until(r).unwrap().0, serde_json::Value::Null);
    // Shortening takes --replace; the reason is still kept.
    let out = ban(&["--for", "1h", "--replace"]);
    assert!(out.contains("was banned until forever; replaced"), "{out}");
    let (one_hour, reason) = until(r).unwrap();
    assert!(one_hour.as_str().unwrap() < five_hours.as_str().unwrap());
    assert_eq!(reason, "again");
}

#[test]
fn unban_names_the_wider_ban_that_still_covers_the_address() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    unban_names_the_wider_ban(&r);
}

pub fn unban_names_the_wider_ban(r: &ConfigDir) {
    for a in ["198.51.100.0/24", "198.51.100.5", "2001:db8:5::/64"] {
        assert_eq!(cli(&r.cfg, &["ban", a]).code, 0);
    }
    let out = cli(&r.cfg, &["unban", "198.51.100.5"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("unbanned 198.51.100.5"), "{}", out.stdout);
    assert!(
        out.stdout.contains("still banned: 198.51.100.0/24") && out.stdout.contains("fleetban unban 198.51.100.0/24"),
        "{}",
        out.stdout
    );
    // An address inside a banned /64 alone: no ban of its own, the /64 named.
    let out = cli(&r.cfg, &["unban", "2001:db8:5::1"]);
    assert!(out.stdout.contains("had no ban of its own"), "{}", out.stdout);
    assert!(out.stdout.contains("still banned: 2001:db8:5::/64"), "{}", out.stdout);
    // A prefix with host bits set: refused by both, with the network meant.
    for cmd in ["ban", "unban"] {
        let out = cli(&r.cfg, &[cmd, "2001:db8:5::1/64"]);
        assert_eq!(out.code, 2, "{cmd}: {}", out.text());
        assert!(
            out.stderr.contains("host bits set") && out.stderr.contains("`2001:db8:5::/64`"),
            "{}",
            out.stderr
        );
    }
    let out = cli(&r.cfg, &["unban", "2001:db8:5::/64"]);
    assert!(out.stdout.contains("unbanned 2001:db8:5::/64"), "{}", out.stdout);
    assert!(ban_of(r, "2001:db8:5::/64").is_none());
    assert!(ban_of(r, "198.51.100.0/24").is_some());
}

#[test]
fn status_and_bans_print_aligned_tables_and_bans_json_has_rfc3339_times() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &combined_lines("203.0.113.20", 1, "/", 200));
    d.wait_lines(1);
    assert_eq!(
        cli(&r.cfg, &["ban", "198.51.100.8", "--for", "2h", "--reason", "by hand"]).code,
        0
    );
    let out = cli(&r.cfg, &["status"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.starts_with("redis:     embedded"), "{}", out.stdout);
    assert!(out.stdout.contains("\nfirewall:  ok"), "{}", out.stdout);
    let rules: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| *l != "rules:")
        .skip(1)
        .take(2)
        .collect();
    assert_eq!(rules[0].trim_end(), "  RULE     HITS  BANS", "{}", out.stdout);
    assert!(rules[1].starts_with("  scraper     1     0"), "{}", out.stdout);
    let sources: Vec<&str> = out.stdout.lines().skip_while(|l| *l != "sources:").skip(1).collect();
    assert!(
        sources[0].starts_with("  FILE") && sources[0].ends_with("LAG  BEHIND"),
        "{}",
        out.stdout
    );
    assert!(sources[1].contains("access.log"), "{}", out.stdout);

    let out = cli(&r.cfg, &["bans"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("ADDRESS       RULE    SINCE"), "{}", out.stdout);
    let left = lines[0].find("LEFT").unwrap();
    assert_eq!(&lines[1][left..left + 6], "in 1h ", "{}", out.stdout);
    assert!(lines[1].ends_with("by hand"), "{}", out.stdout);
    assert_eq!(lines.last(), Some(&"1 active ban(s)"));

    let b = ban_of(&r, "198.51.100.8").unwrap();
    // The documented field order, as printed.
    let line = cli(&r.cfg, &["bans", "--json"]).stdout;
    let at: Vec<usize> = [
        "addr", "rule", "reason", "host", "since", "until", "left_s", "count", "hits", "enforced",
    ]
    .iter()
    .map(|k| {
        line.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k} in {line}"))
    })
    .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
    for t in ["since", "until"] {
        let s = b[t].as_str().unwrap();
        assert!(
            s.len() >= 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T',
            "{t}: {s}"
        );
    }
    assert!(b["left_s"].as_i64().unwrap() > 7000, "{b}");
    assert_eq!(
        (b["host"].as_str(), b["count"].as_u64(), b["enforced"].as_bool()),
        (Some("ops-host"), Some(1), Some(true))
    );
}

#[test]
fn explain_says_why_an_address_is_or_is_not_banned_in_the_embedded_store() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &combined_lines("203.0.113.9", 3, "/", 200));
    d.wait_lines(3);
    explain_cases(&r);
}

/// An unbanned address with a partial count, a covered one, an allowed one.
pub fn explain_cases(r: &ConfigDir) {
    let explain = |addr: &str| {
        let out = cli(&r.cfg, &["explain", addr, "--json"]);
        assert_eq!(out.code, 0, "{}", out.text());
        serde_json::from_str::<serde_json::Value>(&out.stdout).unwrap()
    };
    wait_until(Duration::from_secs(10), "the 3 hits counted", || {
        explain("203.0.113.9")["windows"][0]["count"] == 3
    });
    let e = explain("203.0.113.9");
    assert_eq!(e["banned"], false, "{e}");
    assert_eq!(e["ban"], serde_json::Value::Null);
    assert_eq!(e["never_banned"], serde_json::json!([]));
    assert_eq!(e["windows"][0]["rule"], "scraper");
    assert_eq!(e["windows"][0]["limit"], 5);
    assert_eq!(e["windows"][0]["algorithm"], "sliding_window");
    let human = cli(&r.cfg, &["explain", "203.0.113.9"]).stdout;
    assert!(human.starts_with("203.0.113.9: not banned"), "{human}");
    assert!(human.contains("scraper  sliding_window      3      5"), "{human}");

    assert_eq!(
        cli(&r.cfg, &["ban", "198.51.100.0/24", "--reason", "net abuse"]).code,
        0
    );
    let e = explain("198.51.100.7");
    assert_eq!(e["banned"], true, "{e}");
    assert_eq!(e["ban"], serde_json::Value::Null);
    assert_eq!(e["covering"][0]["addr"], "198.51.100.0/24");
    assert_eq!(e["covering"][0]["reason"], "net abuse");
    assert_eq!(e["covering"][0]["rule"], "manual");

    let e = explain("192.0.2.44");
    assert_eq!(e["never_banned"], serde_json::json!(["allow: 192.0.2.0/24"]), "{e}");
    let e = explain("127.0.0.1");
    assert_eq!(e["never_banned"][0], "loopback (127.0.0.0/8)", "{e}");
}

#[test]
fn rebanning_never_shortens_a_ban_and_keeps_its_reason_over_redis() {
    let redis = Redis::start();
    let r = redis_rig(&redis, "");
    rebanning_never_shortens(&r);
    let rec: serde_json::Value =
        serde_json::from_str(&redis.cli(&["HGET", "{fleetban}:banrec", "198.51.100.7"])).unwrap();
    assert_eq!(
        (rec["reason"].as_str(), rec["rule"].as_str()),
        (Some("again"), Some("manual")),
        "{rec}"
    );
}

#[test]
fn unban_names_the_wider_ban_that_still_covers_the_address_over_redis() {
    let redis = Redis::start();
    let r = redis_rig(&redis, "");
    unban_names_the_wider_ban(&r);
}

#[test]
fn explain_reads_the_windows_in_redis_under_the_limiters_key_names() {
    let redis = Redis::start();
    let r = redis_rig(&redis, "hold: 0s");
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &combined_lines("203.0.113.9", 3, "/", 200));
    d.wait_lines(3);
    explain_cases(&r);
}

#[test]
fn ban_and_unban_while_redis_is_down_go_through_the_daemon_and_reach_redis_in_order() {
    let mut redis = Redis::start();
    let r = redis_rig(&redis, "");
    let d = Daemon::start(None, &r.cfg, &r.control);
    // A second host of the fleet, which gets the ban once it is written.
    let other = ConfigDir::new();
    other.write(
        &other
            .main_config()
            .host_id("ops-host-2")
            .log_firewall()
            .redis(&redis.url(), ""),
        &[Rule::new("scraper", &other.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    let d2 = Daemon::start(None, &other.cfg, &other.control);
    wait_until(Duration::from_secs(10), "Redis connected", || {
        d.status()["redis"]["state"] == "connected" && d2.status()["redis"]["state"] == "connected"
    });
    redis.kill();
    wait_until(Duration::from_secs(10), "Redis seen down", || {
        d.status()["redis"]["state"] == "down"
    });
    let ban = |addr: &str, reason: &str| {
        let out = cli(&r.cfg, &["ban", addr, "--for", "2h", "--reason", reason]);
        assert_eq!(out.code, 0, "{}", out.text());
        assert!(out.stdout.contains(&format!("banned {addr} until")), "{}", out.stdout);
        assert!(
            out.stdout.contains("Redis is down: the daemon enforces it"),
            "{}",
            out.stdout
        );
    };
    ban("198.51.100.31", "gone again");
    let out = cli(&r.cfg, &["unban", "198.51.100.31"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("unbanned 198.51.100.31"), "{}", out.stdout);
    assert!(out.stdout.contains("writes the unban to Redis"), "{}", out.stdout);
    ban("198.51.100.32", "while down");
    let st = d.status();
    assert_eq!(st["redis"]["queued_bans"], 3, "{st}");
    assert_eq!(st["bans_active"], 1, "{st}");

    redis.restart();
    wait_until(Duration::from_secs(20), "the queued ban written", || {
        redis
            .try_cli(&["ZSCORE", "{fleetban}:bans", "198.51.100.32"])
            .is_some_and(|s| !s.is_empty())
    });
    wait_until(Duration::from_secs(10), "the queue empty", || {
        d.status()["redis"]["queued_bans"] == 0
    });
    let rec: serde_json::Value =
        serde_json::from_str(&redis.cli(&["HGET", "{fleetban}:banrec", "198.51.100.32"])).unwrap();
    assert_eq!(rec["reason"], "while down", "{rec}");
    // Banned then unbanned while down: written in that order, so not banned.
    assert_eq!(redis.cli(&["ZSCORE", "{fleetban}:bans", "198.51.100.31"]), "");
    assert_eq!(ban_of(&r, "198.51.100.31"), None);
    assert!(ban_of(&r, "198.51.100.32").is_some());
    wait_until(Duration::from_secs(20), "the other host to hold the ban", || {
        d2.status()["bans_active"] == 1
    });
}

#[test]
fn status_says_redis_is_down_within_about_a_second_deciding_locally_or_paused() {
    for (options, mode) in [("", "deciding locally"), ("on_down: pause", "paused")] {
        let mut redis = Redis::start();
        let r = redis_rig(&redis, options);
        let d = Daemon::start(None, &r.cfg, &r.control);
        wait_until(Duration::from_secs(10), "Redis connected", || {
            d.status()["redis"]["state"] == "connected"
        });
        let killed = now_ms();
        redis.kill();
        // Polled with no traffic at all: the states seen, in order.
        let mut seen: Vec<String> = Vec::new();
        wait_until(Duration::from_secs(10), "Redis seen down", || {
            let s = d.status()["redis"]["state"].as_str().unwrap_or("").to_owned();
            if seen.last() != Some(&s) {
                seen.push(s.clone());
            }
            s == "down"
        });
        for _ in 0..10 {
            let s = d.status()["redis"]["state"].as_str().unwrap_or("").to_owned();
            if seen.last() != Some(&s) {
                seen.push(s);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        assert!(
            seen == ["down"] || seen == ["connected", "down"],
            "{options}: connected, then down, and nothing after: {seen:?}"
        );
        let st = d.status();
        let since = humantime::parse_rfc3339(st["redis"]["down_since"].as_str().unwrap()).unwrap();
        let since_ms = since.duration_since(std::time::UNIX_EPOCH).unwrap().as_millis() as i64;
        assert!(since_ms >= killed - 1000, "down since {since_ms}, killed at {killed}");
        let out = cli(&r.cfg, &["status"]);
        let line = out.stdout.lines().next().unwrap_or_default().to_owned();
        assert!(
            line.starts_with("redis:     down since ") && line.contains(&format!("({mode})")),
            "{line}"
        );
    }
}
