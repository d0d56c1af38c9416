//! The fleet's log tells the whole story: two daemons sharing one
//! redis-server (the log firewall: no nft needed), each log read after a
//! rule's ban on one host, an operator's `fleetban ban` and `unban` written
//! straight to Redis, and a burst of bans.

mod common;

use std::time::Duration;

use common::{append, cli, combined_line, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};

fn host(redis: &Redis, id: &str) -> (ConfigDir, Daemon) {
    let r = ConfigDir::new();
    r.write(
        &r.main_config().host_id(id).log_firewall().redis(&redis.url(), ""),
        &[Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    (r, d)
}

/// Five requests each from `addrs`, over the limit, appended at once.
fn scrape(r: &ConfigDir, addrs: &[String]) {
    let now = now_ms();
    let lines: String = addrs
        .iter()
        .flat_map(|a| (0..5).map(move |i| combined_line(a, now + i, "/page", 200)))
        .collect();
    append(&r.log, &lines);
}

/// The log's lines with `message` and every one of `fields`.
fn lines(d: &Daemon, message: &str, fields: &[&str]) -> Vec<String> {
    d.log_text()
        .lines()
        .filter(|l| l.contains(message) && fields.iter().all(|f| l.contains(f)))
        .map(str::to_owned)
        .collect()
}

/// The bans of the 203.0.113.0/24 burst told: one line each, plus the
/// counts of the summary lines.
fn told(d: &Daemon, summary: &str) -> u64 {
    let one_by_one = lines(d, "Banned.", &["addr=203.0.113."]).len() as u64;
    let summed: u64 = lines(d, summary, &[])
        .iter()
        .filter_map(|l| {
            l.split_whitespace()
                .find_map(|f| f.strip_prefix("count=").and_then(|n| n.parse::<u64>().ok()))
        })
        .sum();
    one_by_one + summed
}

#[test]
fn every_host_logs_each_ban_it_applies_and_who_decided_it() {
    let redis = Redis::start();
    let (ra, a) = host(&redis, "host-a");
    let (_rb, b) = host(&redis, "host-b");

    // A rule's ban on A: A logs it as decided, B as applied from A's rule.
    scrape(&ra, &["192.0.2.50".into()]);
    wait_until(Duration::from_secs(10), "the rule's ban on both hosts", || {
        !lines(
            &a,
            "Banned.",
            &["addr=192.0.2.50", "rule=scraper", "host=host-a", "decided_by=rule"],
        )
        .is_empty()
            && !lines(
                &b,
                "Banned.",
                &["addr=192.0.2.50", "rule=scraper", "host=host-a", "decided_by=rule"],
            )
            .is_empty()
    });

    // An operator's ban written straight to Redis: logged by every daemon.
    let out = cli(&ra.cfg, &["ban", "198.51.100.7", "--for", "2h"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let operator = ["addr=198.51.100.7", "rule=manual", "host=host-a", "decided_by=operator"];
    wait_until(Duration::from_secs(10), "the operator's ban on both hosts", || {
        !lines(&a, "Banned.", &operator).is_empty() && !lines(&b, "Banned.", &operator).is_empty()
    });

    // Its unban: one line a host, naming who decided.
    let out = cli(&ra.cfg, &["unban", "198.51.100.7"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let unban = ["addr=198.51.100.7", "host=host-a", "decided_by=operator"];
    wait_until(Duration::from_secs(10), "the unban on both hosts", || {
        !lines(&a, "Unbanned.", &unban).is_empty() && !lines(&b, "Unbanned.", &unban).is_empty()
    });
    // A later event (a marker ban) shows each host is past the unban's.
    let out = cli(&ra.cfg, &["ban", "198.51.100.8", "--for", "2h"]);
    assert_eq!(out.code, 0, "{}", out.text());
    wait_until(Duration::from_secs(10), "the marker ban on both hosts", || {
        !lines(&a, "Banned.", &["addr=198.51.100.8"]).is_empty()
            && !lines(&b, "Banned.", &["addr=198.51.100.8"]).is_empty()
    });
    for d in [&a, &b] {
        assert_eq!(
            lines(d, "Unbanned.", &["addr=198.51.100.7"]).len(),
            1,
            "{}",
            d.log_text()
        );
        assert_eq!(lines(d, "Banned.", &["addr=192.0.2.50"]).len(), 1, "{}", d.log_text());
    }

    // A burst of 40 bans: each told once, a line or a summary's count, and
    // never a line each on the host applying them from the fleet.
    let burst: Vec<String> = (1..=40).map(|i| format!("203.0.113.{i}")).collect();
    scrape(&ra, &burst);
    wait_until(Duration::from_secs(15), "the burst told on both hosts", || {
        told(&a, "More bans decided here") == 40 && told(&b, "More bans and unbans applied from the fleet") == 40
    });
    // A few lines a second at most (a window of 1 s straddles two
    // seconds of the log's clock: at most twice 5 lines in one of them).
    for d in [&a, &b] {
        let mut per_second = std::collections::HashMap::<String, usize>::new();
        for l in lines(d, "Banned.", &["addr=203.0.113."]) {
            *per_second.entry(l.chars().take(19).collect()).or_default() += 1;
        }
        assert!(
            per_second.values().all(|&n| n <= 10),
            "{per_second:?}\n{}",
            d.log_text()
        );
    }
}
