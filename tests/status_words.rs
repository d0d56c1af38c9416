//! `status` and `bans` say what their numbers and words mean, read through
//! the CLI against a running daemon: the bans decided here beside those
//! active, the Redis errors of an outage as the log counts them, every
//! SIGHUP counted, and queued bans not said to be in Redis.

mod common;

use std::time::Duration;

use common::{append, cli, combined_line, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};

fn rig(redis: Option<&Redis>) -> ConfigDir {
    let r = ConfigDir::new();
    let mut main = r.main_config().host_id("words-host").log_firewall();
    if let Some(redis) = redis {
        main = main.redis(&redis.url(), "reconcile_every: 1s");
    }
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    r
}

fn scrape(r: &ConfigDir, addr: &str) {
    let now = now_ms();
    let lines: String = (0..5).map(|i| combined_line(addr, now + i, "/page", 200)).collect();
    append(&r.log, &lines);
}

fn status_line(r: &ConfigDir, key: &str) -> String {
    let out = cli(&r.cfg, &["status"]);
    assert_eq!(out.code, 0, "{}", out.text());
    out.stdout
        .lines()
        .find(|l| l.starts_with(key))
        .unwrap_or_else(|| panic!("no {key} line in\n{}", out.stdout))
        .to_owned()
}

/// The largest `errors=N` the log shows.
fn logged_errors(d: &Daemon) -> u64 {
    d.log_text()
        .split_whitespace()
        .filter_map(|f| f.strip_prefix("errors=").and_then(|n| n.parse().ok()))
        .max()
        .unwrap_or(0)
}

#[test]
fn status_counts_the_bans_decided_here_apart_from_those_applied() {
    let redis = Redis::start();
    let r = rig(Some(&redis));
    let d = Daemon::start(None, &r.cfg, &r.control);
    // Another host's operator: applied here, decided elsewhere.
    let other = rig(Some(&redis));
    assert_eq!(cli(&other.cfg, &["ban", "198.51.100.7"]).code, 0);
    wait_until(Duration::from_secs(10), "the fleet's ban applied", || {
        d.status()["bans_active"] == 1
    });
    assert!(
        status_line(&r, "bans:").starts_with("bans:      1 active, 0 decided here;"),
        "{}",
        status_line(&r, "bans:")
    );
    scrape(&r, "203.0.113.9");
    wait_until(Duration::from_secs(10), "the rule's ban", || d.status()["bans"] == 1);
    assert!(
        status_line(&r, "bans:").starts_with("bans:      2 active, 1 decided here;"),
        "{}",
        status_line(&r, "bans:")
    );
}

#[test]
fn every_sighup_is_counted_the_refused_ones_among_them() {
    let r = rig(None);
    let d = Daemon::start(None, &r.cfg, &r.control);
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "the first reload", || {
        d.status()["reloads"] == 1
    });
    std::fs::write(&r.rules, "rules:\n  - name: scraper\n    limit: { hits: many }\n").unwrap();
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "the refused reload", || {
        d.status()["reload_errors"] == 1
    });
    r.write_rules(&[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")]);
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "the third reload", || {
        d.status()["reloads"] == 2
    });
    assert_eq!(status_line(&r, "reloads:"), "reloads:   3 (1 refused)");
}

#[test]
fn during_an_outage_status_counts_the_errors_the_log_counts() {
    let mut redis = Redis::start();
    let r = rig(Some(&redis));
    let d = Daemon::start(None, &r.cfg, &r.control);
    redis.kill();
    for i in 0..5 {
        scrape(&r, &format!("203.0.113.{}", 10 + i));
    }
    let shown = || {
        let status = status_line(&r, "redis:");
        status
            .split("; ")
            .nth(1)
            .and_then(|s| s.split(" error(s)").next())
            .and_then(|n| n.parse::<u64>().ok())
            .unwrap_or_else(|| panic!("no error count in {status}"))
    };
    // Every failed call counts (the heartbeat's, the fleet sync's, the
    // limiter's), as the warnings' `errors=` do.
    wait_until(
        Duration::from_secs(20),
        "failures counted as the outage goes on",
        || logged_errors(&d) >= 1 && shown() >= 5,
    );
    let logged = logged_errors(&d);
    let status = shown();
    assert!(status >= logged, "status {status} < log {logged}:\n{}", d.log_text());
}

#[test]
fn bans_during_an_outage_do_not_say_queued_bans_are_in_redis() {
    let mut redis = Redis::start();
    let r = rig(Some(&redis));
    let d = Daemon::start(None, &r.cfg, &r.control);
    redis.kill();
    scrape(&r, "203.0.113.60");
    wait_until(Duration::from_secs(10), "the local ban queued", || {
        d.status()["redis"]["queued_bans"] == 1
    });
    let out = cli(&r.cfg, &["bans"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(!out.stderr.contains("are in Redis"), "{}", out.stderr);
    assert!(
        out.stderr
            .contains("1 decided while it is down, queued: written to Redis when it answers"),
        "{}",
        out.stderr
    );
    // Its record is the queue's: the rule that decided it.
    let row = out
        .stdout
        .lines()
        .find(|l| l.contains("203.0.113.60"))
        .unwrap_or_default();
    assert!(row.contains("(queued)") && row.contains("scraper"), "{}", out.stdout);
    let out = cli(&r.cfg, &["bans", "--json"]);
    let line: serde_json::Value = serde_json::from_str(out.stdout.trim()).expect("one JSON line");
    assert_eq!(
        (line["queued"].as_bool(), line["rule"].as_str()),
        (Some(true), Some("scraper"))
    );
}
