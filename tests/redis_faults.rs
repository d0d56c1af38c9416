//! Redis faults that are not an outage, and an outage's messages: `fleetban
//! run` against a redis-server of its own, answering with errors (a damaged
//! ban record, `maxmemory` with `noeviction`) or losing its data. Each case
//! checks the host's state (`status`, the list in Redis) and its log,
//! counted over a bounded period.

mod common;

use std::time::{Duration, Instant};

use common::{append, combined_line, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};

/// A daemon with the log firewall (no nft needed) on `redis`: rule
/// `scraper`, at most 3 GETs a minute, bans of 1h; `redis_options` added.
fn rig(redis: &Redis, redis_options: &str) -> ConfigDir {
    let r = ConfigDir::new();
    let main = r
        .main_config()
        .host_id("fault-host")
        .log_firewall()
        .redis(&redis.url(), redis_options);
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    r
}

/// Lines over the limit for each of `addrs`, appended at once.
fn scrape(r: &ConfigDir, addrs: &[String]) {
    let now = now_ms();
    let mut lines = String::new();
    for a in addrs {
        for i in 0..5 {
            lines += &combined_line(a, now + i, "/page", 200);
        }
    }
    append(&r.log, &lines);
}

fn warnings(log: &str) -> usize {
    log.lines().filter(|l| l.contains("WARN")).count()
}

/// A list entry whose record is not JSON (written by hand, damaged) used
/// to fail `ban.lua` and send the host into outage mode; the new ban now
/// replaces the record, keeping the later end, and the host stays with Redis.
#[test]
fn a_damaged_ban_record_is_replaced_by_the_next_ban_and_is_no_outage() {
    let redis = Redis::start();
    // No reconcile during the test: the hand-written entry stays unknown
    // to the host's view, so its hits reach ban.lua.
    let r = rig(&redis, "reconcile_every: 1h");
    let d = Daemon::start(None, &r.cfg, &r.control);
    let later = now_ms() + 7_200_000;
    redis.cli(&["ZADD", "{fleetban}:bans", &later.to_string(), "203.0.113.95"]);
    redis.cli(&["HSET", "{fleetban}:banrec", "203.0.113.95", "not json"]);

    scrape(&r, &["203.0.113.95".into()]);
    wait_until(Duration::from_secs(10), "the damaged record replaced", || {
        redis.cli(&["HGET", "{fleetban}:banrec", "203.0.113.95"]) != "not json"
    });
    let rec: serde_json::Value = serde_json::from_str(&redis.cli(&["HGET", "{fleetban}:banrec", "203.0.113.95"]))
        .unwrap_or_else(|e| panic!("record not JSON ({e}):\n{}", d.log_text()));
    assert_eq!(
        (rec["rule"].as_str(), rec["host"].as_str()),
        (Some("scraper"), Some("fault-host"))
    );
    let score: i64 = redis
        .cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.95"])
        .parse()
        .unwrap();
    assert_eq!(score, later, "the later end (the hand-written one) kept");
    // Another client still bans through Redis: no outage was declared.
    scrape(&r, &["203.0.113.96".into()]);
    wait_until(Duration::from_secs(10), "the next ban in the list", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.96"]).is_empty()
    });
    let st = d.status();
    assert_eq!(st["redis"]["connected"], true, "{st}");
    assert_eq!(st["redis"]["local_decisions"], 0, "{st}");
    assert_eq!(st["redis"]["queued_bans"], 0, "{st}");
    let log = d.log_text();
    assert!(!log.contains("locally"), "decided locally:\n{log}");
    assert_eq!(warnings(&log), 0, "{log}");
}

/// Redis at `maxmemory` with `noeviction` refuses every write: that is
/// said once as OOM, the host stays connected, bans are enforced here and
/// queued, retried with a growing wait (a handful of lines in 5 s, not
/// two every 100 ms), and written once memory is raised.
#[test]
fn redis_out_of_memory_is_reported_as_such_retried_with_backoff_and_recovered() {
    let redis = Redis::start();
    let r = rig(&redis, "reconcile_every: 1h");
    let d = Daemon::start(None, &r.cfg, &r.control);
    // A first ban with memory to spare: the scripts are loaded.
    scrape(&r, &["203.0.113.10".into()]);
    wait_until(Duration::from_secs(10), "a first ban", || {
        !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.10"]).is_empty()
    });
    redis.cli(&["CONFIG", "SET", "maxmemory-policy", "noeviction"]);
    redis.cli(&["CONFIG", "SET", "maxmemory", "1"]);
    let before = d.log_text().lines().count();

    // Five seconds of scrapers, a new one every half second.
    let started = Instant::now();
    let mut addrs = Vec::new();
    for i in 0..10 {
        let a = format!("203.0.113.{}", 20 + i);
        scrape(&r, std::slice::from_ref(&a));
        addrs.push(a);
        std::thread::sleep(Duration::from_millis(500));
    }
    assert!(started.elapsed() >= Duration::from_secs(5));
    let log = d.log_text();
    let during: Vec<&str> = log.lines().skip(before).collect();
    let st = d.status();
    assert!(
        during
            .iter()
            .any(|l| l.contains("WARN") && l.contains("out of memory") && l.contains("noeviction")),
        "no OOM warning:\n{log}"
    );
    let warned = during.iter().filter(|l| l.contains("WARN")).count();
    assert!(warned <= 4, "{warned} warnings in 5 s:\n{log}");
    assert!(
        during.len() <= 40,
        "{} lines in 5 s (10 bans, one line each, and a few warnings):\n{log}",
        during.len()
    );
    assert_eq!(st["redis"]["connected"], true, "an OOM is no outage: {st}");
    assert!(st["redis"]["queued_bans"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert!(redis.cli(&["ZSCORE", "{fleetban}:bans", &addrs[0]]).is_empty());

    // Memory raised: the queued bans reach the list.
    redis.cli(&["CONFIG", "SET", "maxmemory", "0"]);
    wait_until(Duration::from_secs(15), "the queued bans written", || {
        d.status()["redis"]["queued_bans"] == 0
    });
    let listed = addrs
        .iter()
        .filter(|a| !redis.cli(&["ZSCORE", "{fleetban}:bans", a]).is_empty())
        .count();
    assert_eq!(listed, addrs.len(), "queued bans not written:\n{}", d.log_text());
    assert!(d.log_text().contains("takes bans again"), "{}", d.log_text());
}
