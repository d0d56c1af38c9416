//! The ban list's own rules: escalation for repeat offenders (Redis script
//! and embedded list alike), an active ban not re-banned, the safety valve,
//! and the host's own addresses never banned.

mod common;

use std::io::Write;
use std::time::Duration;

use common::{combined_line, veth_pair, wait_until, Daemon, NetNs, Redis};
use fleetban::bans::{BanList, BanRequest, Mode, Outcome};
use fleetban::config::{BanPolicy, RedisConfig};
use fleetban::store::{self, Keys};

fn policy() -> BanPolicy {
    BanPolicy {
        duration_ms: 60_000,
        factor: 3.0,
        max_ms: 300_000,
        forget_after_ms: 3_600_000,
    }
}

fn request(addr: &str) -> BanRequest {
    BanRequest {
        addr: addr.parse().unwrap(),
        rule: "r".into(),
        reason: String::new(),
        host: "h".into(),
        hits: 7,
        mode: Mode::Auto(policy()),
    }
}

/// Bans `addr` at `now`, expecting a new ban; returns its duration.
async fn ban_len(list: &mut BanList, addr: &str, now: i64) -> i64 {
    match list.ban(&request(addr), now).await.unwrap() {
        Outcome::Banned(rec) => rec.until.unwrap() - now,
        other => panic!("expected a new ban, got {other:?}"),
    }
}

async fn escalation(list: &mut BanList) {
    let t0 = fleetban::now_ms();
    // 1st ban: 60 s; while active, another decision changes nothing.
    assert_eq!(ban_len(list, "203.0.113.7/32", t0).await, 60_000);
    assert!(matches!(
        list.ban(&request("203.0.113.7/32"), t0 + 1000).await.unwrap(),
        Outcome::AlreadyBanned(_)
    ));
    // After it ends: 3x, then 9x capped at max (300 s).
    assert_eq!(ban_len(list, "203.0.113.7/32", t0 + 61_000).await, 180_000);
    assert_eq!(ban_len(list, "203.0.113.7/32", t0 + 250_000).await, 300_000);
    // Another address starts from the base duration.
    assert_eq!(ban_len(list, "203.0.113.8/32", t0 + 250_000).await, 60_000);
    let active = list.active(t0 + 250_001).await.unwrap();
    assert_eq!(active.len(), 2);
}

#[test]
fn escalation_is_the_same_in_redis_and_embedded() {
    let redis = Redis::start();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    let cfg = RedisConfig::single(redis.url(), Duration::from_secs(2));
    rt.block_on(async {
        let con = store::connect(&cfg, Some(Duration::from_secs(2))).await.unwrap();
        escalation(&mut BanList::redis(con, Keys::new("fleetban"))).await;
        escalation(&mut BanList::memory(None)).await;
    });
    // The record, the event and the offence count were written with the ban.
    let rec: serde_json::Value =
        serde_json::from_str(&redis.cli(&["HGET", "{fleetban}:banrec", "203.0.113.7"])).unwrap();
    assert_eq!(rec["count"], 3);
    assert_eq!(rec["hits"], 7);
    assert_eq!(redis.cli(&["GET", "{fleetban}:off:203.0.113.7"]), "3");
    let ttl: i64 = redis.cli(&["PTTL", "{fleetban}:off:203.0.113.7"]).parse().unwrap();
    assert!(ttl > 3_500_000, "offence count lives forget_after, got {ttl}");
    assert_eq!(redis.cli(&["XLEN", "{fleetban}:events"]), "4");
}

fn write_config(dir: &std::path::Path, log: &std::path::Path, extra: &str) -> std::path::PathBuf {
    std::fs::write(
        dir.join("rules.yaml"),
        format!(
            "rules:\n  - name: r\n    logs: [{}]\n    limit: {{ hits: 3, window: 60s }}\n",
            log.display()
        ),
    )
    .unwrap();
    let cfg = dir.join("fleetban.yaml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir: {}\ncontrol: {}\nfirewall: {{ backend: log }}\n{extra}rules: [rules.yaml]\n",
            dir.join("state").display(),
            dir.join("control.sock").display()
        ),
    )
    .unwrap();
    cfg
}

#[test]
fn the_safety_valve_caps_new_bans_and_own_addresses_are_never_banned() {
    // The daemon runs in a namespace that owns 10.213.9.1: that address is
    // "this host" and must never be banned, whatever its log says.
    let ns = NetNs::new("valve");
    let peer = NetNs::new("valvep");
    veth_pair(&ns, "10.213.9.1/24", &peer, "10.213.9.2/24");
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    let cfg = write_config(dir.path(), &log, "safety: { max_bans_per_minute: 2 }\n");
    let d = Daemon::start(Some(&ns), &cfg, &dir.path().join("control.sock"));
    let now = fleetban::now_ms();
    let mut text = String::new();
    for addr in [
        "10.213.9.1",
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
    ] {
        for i in 0..5 {
            text += &combined_line(addr, now + i, "/", 200);
        }
    }
    std::fs::OpenOptions::new()
        .append(true)
        .open(&log)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
    wait_until(Duration::from_secs(10), "all lines read", || d.status()["lines"] == 25);
    wait_until(Duration::from_secs(5), "the valve to act", || {
        d.status()["safety_refused"].as_u64() >= Some(2)
    });
    let st = d.status();
    assert_eq!(st["bans"], 2, "{st}");
    assert_eq!(st["safety_refused"], 2, "{st}");
    let (_, out, _) = {
        let o = std::process::Command::new(common::fleetban_bin())
            .args(["bans", "--json", "-c"])
            .arg(&cfg)
            .output()
            .unwrap();
        (o.status, String::from_utf8_lossy(&o.stdout).into_owned(), ())
    };
    assert!(!out.contains("10.213.9.1"), "own address banned: {out}");
    assert_eq!(out.lines().count(), 2, "{out}");
}
