//! A long ban list (issue 27): a host loads a list whatever its length.
//! Against a redis-server of its own with the daemon's log firewall; the
//! figures (start, memory, one ban on top of 1,000,000) are
//! `bench/scale.sh`'s, never asserted here.

mod common;

use std::time::Duration;

use common::{wait_until, ConfigDir, Daemon, Redis, Rule};

/// The whole list in one reply was unbounded: past `redis.timeout` with
/// 1,000,000 bans (a host retried its first read forever), and here past
/// the server's output limit for a client (1 MB; 100,000 members are
/// ~3 MB of reply), which closes the connection just as deterministically.
/// Read in pages, every entry arrives once, although all 100,000 share one
/// end (one tie across every page boundary).
#[test]
fn a_list_longer_than_one_reply_can_carry_is_loaded_whole() {
    let redis = Redis::start_with(&["--client-output-buffer-limit", "normal 1mb 1mb 0"]);
    let n = 100_000;
    redis.preload_bans(n, common::now_ms() + 3_600_000);
    let r = ConfigDir::new();
    let main = r
        .main_config()
        .host_id("long-list")
        .log_firewall()
        .redis(&redis.url(), "");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    wait_until(Duration::from_secs(120), "the list applied at start", || {
        d.log_text().contains("Ban list applied")
    });
    let log = d.log_text();
    let applied = log.lines().find(|l| l.contains("Ban list applied")).unwrap_or_default();
    assert!(applied.contains(&format!("bans={n}")), "{applied}\n{}", tail(&log));
}

fn tail(log: &str) -> String {
    let lines: Vec<&str> = log.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}
