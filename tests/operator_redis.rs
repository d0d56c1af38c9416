//! The operator's commands over Redis (a redis-server of the test's own,
//! daemons with the `log` firewall): the stories of tests/operator.rs, and
//! with Redis killed: `status` says `down` within about a second, `ban` and
//! `unban` go through the daemon and reach Redis, in order, once it is back,
//! and another host of the fleet follows.

mod common;

use common::metrics::{http_get, sample};

use std::time::Duration;

use common::operator::{
    ban_of, explain_cases, rebanning_never_shortens, redis_rig, unban_names_the_narrower_bans,
    unban_names_the_wider_ban,
};
use common::{append, cli, combined_lines, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};

#[test]
fn rebanning_never_shortens_a_ban_and_keeps_its_reason_over_redis() {
    let redis = Redis::start();
    let r = redis_rig(&redis, "");
    rebanning_never_shortens(&r);
    let rec: serde_json::Value = redis.record("198.51.100.7");
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
fn unban_of_a_network_names_the_narrower_bans_it_leaves_over_redis() {
    let redis = Redis::start();
    let r = redis_rig(&redis, "");
    unban_names_the_narrower_bans(&r);
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
    // `bans` with Redis down: the daemon's view of what this host enforces,
    // said to be that; a queued ban with its record from the queue.
    let out = cli(&r.cfg, &["bans", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let lines: Vec<serde_json::Value> = out.stdout.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 1, "{}", out.stdout);
    assert_eq!(lines[0]["addr"], "198.51.100.32", "{}", out.stdout);
    assert!(lines[0]["since"].is_string(), "{}", out.stdout);
    assert_eq!(
        (lines[0]["queued"].as_bool(), lines[0]["reason"].as_str()),
        (Some(true), Some("while down")),
        "{}",
        out.stdout
    );
    assert!(lines[0]["until"].is_string(), "{}", out.stdout);
    assert!(
        out.stderr
            .contains("Redis is down: these are the bans this host enforces"),
        "{}",
        out.stderr
    );

    redis.restart();
    wait_until(Duration::from_secs(20), "the queued ban written", || {
        redis
            .try_cli(&["ZSCORE", "{fleetban}:bans", "198.51.100.32"])
            .is_some_and(|s| !s.is_empty())
    });
    wait_until(Duration::from_secs(10), "the queue empty", || {
        d.status()["redis"]["queued_bans"] == 0
    });
    let rec: serde_json::Value = redis.record("198.51.100.32");
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
        // The rig's configuration with a metrics endpoint (loopback).
        let metrics = format!("127.0.0.1:{}", common::free_port());
        let main = std::fs::read_to_string(&r.cfg).unwrap();
        std::fs::write(&r.cfg, format!("{main}metrics: '{metrics}'\n")).unwrap();
        let d = Daemon::start(None, &r.cfg, &r.control);
        wait_until(Duration::from_secs(10), "Redis connected", || {
            d.status()["redis"]["state"] == "connected"
        });
        let state = |s: &str| {
            sample(
                &http_get(&metrics, "/metrics"),
                &format!("fleetban_redis_state{{state=\"{s}\"}}"),
            )
        };
        assert_eq!(state("connected"), Some(1.0));
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
        // The same in Prometheus: the state, and since when.
        assert_eq!((state("down"), state("connected")), (Some(1.0), Some(0.0)));
        let exposition = http_get(&metrics, "/metrics");
        assert_eq!(
            // status' RFC 3339 has whole seconds; the metric, milliseconds.
            sample(&exposition, "fleetban_redis_down_since_seconds").map(f64::floor),
            Some((since_ms / 1000) as f64),
            "{exposition}"
        );
        let out = cli(&r.cfg, &["status"]);
        let line = out.stdout.lines().next().unwrap_or_default().to_owned();
        assert!(
            line.starts_with("redis:     down since ") && line.contains(&format!("({mode})")),
            "{line}"
        );
    }
}
