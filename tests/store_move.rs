//! A host moving between stores keeps the bans it enforces: from the
//! embedded store to Redis (following README's Quick start: `redis:`
//! uncommented, the same `state_dir`), its `bans.json` goes into the
//! fleet's list beside what the fleet has; back from Redis to the embedded
//! store, what its nft set holds becomes its list. Each runs the real
//! daemon with nft in a namespace of its own and a redis-server of its own.

mod common;

use std::time::Duration;

use common::{append, cli, combined_line, nft_bans, now_ms, wait_until, ConfigDir, Daemon, NetNs, Redis, Rule};

fn rules(r: &ConfigDir) -> Vec<Rule> {
    vec![Rule::new("scraper", &r.log, "{ hits: 3, window: 60s }").ban("1h")]
}

fn in_set(ns: &NetNs, elem: &str) -> bool {
    nft_bans(ns, "fleetban", "v4").iter().any(|(e, _)| e == elem)
}

fn lines_with(log: &str, what: &str) -> Vec<String> {
    log.lines().filter(|l| l.contains(what)).map(str::to_owned).collect()
}

#[test]
fn a_host_joining_redis_writes_its_embedded_bans_to_the_fleets_list() {
    let redis = Redis::start();
    // The fleet already holds a ban of its own (an operator elsewhere).
    let other = ConfigDir::new();
    other.write(
        &other.main_config().host_id("elsewhere").redis(&redis.url(), ""),
        &rules(&other),
    );
    let out = cli(&other.cfg, &["ban", "203.0.113.77", "--for", "2h"]);
    assert_eq!(out.code, 0, "{}", out.text());

    // A single host: four operator bans and a rule's, in bans.json and nft.
    let r = ConfigDir::new();
    r.write(&r.main_config().host_id("mover"), &rules(&r));
    let ns = NetNs::new("mover");
    let mut d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    let mine = [
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
        "203.0.113.50",
    ];
    for a in &mine[..4] {
        let out = cli(&r.cfg, &["ban", a, "--for", "2h", "--reason", "by hand"]);
        assert_eq!(out.code, 0, "{}", out.text());
    }
    let now = now_ms();
    let scraping: String = (0..5).map(|i| combined_line(mine[4], now + i, "/page", 200)).collect();
    append(&r.log, &scraping);
    wait_until(Duration::from_secs(10), "five bans in nft", || {
        mine.iter().all(|a| in_set(&ns, a))
    });
    d.stop(Duration::from_secs(10));

    // The same state_dir, `redis:` added.
    r.write(
        &r.main_config()
            .host_id("mover")
            .redis(&redis.url(), "reconcile_every: 1s"),
        &rules(&r),
    );
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    let all: Vec<&str> = mine.iter().copied().chain(["203.0.113.77"]).collect();
    wait_until(Duration::from_secs(10), "all six in Redis's list and in nft", || {
        all.iter()
            .all(|a| !redis.cli(&["ZSCORE", "{fleetban}:bans", a]).is_empty() && in_set(&ns, a))
    });
    // Across reconciles, nothing is lifted.
    std::thread::sleep(Duration::from_millis(2500));
    for a in &all {
        assert!(in_set(&ns, a), "{a} lifted:\n{}", d.log_text());
    }
    // Records kept: who decided, and why.
    let rec: serde_json::Value = redis.record("203.0.113.50");
    assert_eq!(
        (rec["rule"].as_str(), rec["host"].as_str()),
        (Some("scraper"), Some("mover"))
    );
    let rec: serde_json::Value = redis.record("198.51.100.1");
    assert_eq!(
        (rec["rule"].as_str(), rec["reason"].as_str()),
        (Some("manual"), Some("by hand"))
    );
    // Said once, with the count; the file set aside (written once only).
    let said = lines_with(&d.log_text(), "Joined Redis with bans");
    assert_eq!(said.len(), 1, "{}", d.log_text());
    assert!(said[0].contains("count=5"), "{}", said[0]);
    assert!(!r.state.join("bans.json").exists() && r.state.join("bans.json.imported").exists());
}

#[test]
fn a_host_leaving_redis_keeps_the_bans_it_enforces() {
    let redis = Redis::start();
    let r = ConfigDir::new();
    r.write(&r.main_config().host_id("leaver").redis(&redis.url(), ""), &rules(&r));
    let ns = NetNs::new("leaver");
    let mut d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    let banned = ["198.51.100.1", "198.51.100.2", "198.51.100.3"];
    for a in banned {
        let out = cli(&r.cfg, &["ban", a, "--for", "2h"]);
        assert_eq!(out.code, 0, "{}", out.text());
    }
    wait_until(Duration::from_secs(10), "three bans in nft", || {
        banned.iter().all(|a| in_set(&ns, a))
    });
    d.stop(Duration::from_secs(10));

    // The same state_dir, `redis:` removed.
    r.write(&r.main_config().host_id("leaver"), &rules(&r));
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    // The host's view (the pipeline's and `/check`'s) holds them from the
    // start, as nft does: not the empty list it read.
    assert_eq!(d.status()["bans_active"], 3, "{}", d.log_text());
    wait_until(Duration::from_secs(10), "the daemon's list", || {
        let out = cli(&r.cfg, &["bans", "--json"]);
        out.code == 0 && banned.iter().all(|a| out.stdout.contains(&format!("\"addr\":\"{a}\"")))
    });
    for a in banned {
        assert!(in_set(&ns, a), "{a} lifted:\n{}", d.log_text());
    }
    let said = lines_with(&d.log_text(), "No bans.json");
    assert_eq!(said.len(), 1, "{}", d.log_text());
    assert!(said[0].contains("count=3"), "{}", said[0]);
    // The list is the embedded store's now: an unban lifts a ban.
    let out = cli(&r.cfg, &["unban", "198.51.100.2"]);
    assert_eq!(out.code, 0, "{}", out.text());
    wait_until(Duration::from_secs(10), "the unban in nft", || {
        !in_set(&ns, "198.51.100.2")
    });
    assert!(r.state.join("bans.json").exists());
}
