//! The ban list's own rules: escalation for repeat offenders (Redis script
//! and embedded list alike), an active ban not re-banned, an operator's
//! re-ban that never shortens (alike too), the safety valve, and the host's
//! own addresses never banned.

mod common;

use std::time::Duration;

use common::{append, cli, combined_lines, now_ms, veth_pair, wait_until, ConfigDir, Daemon, NetNs, Redis, Rule};
use fleetban::bans::{BanList, BanRequest, Effect, Mode, Outcome};
use fleetban::config::BanPolicy;
use fleetban::enforce::Until;
use fleetban::store::Keys;

fn policy() -> BanPolicy {
    BanPolicy {
        duration_ms: 60_000,
        factor: 3.0,
        max_ms: 300_000,
        forget_after_ms: 3_600_000,
        network: None,
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
    let t0 = now_ms();
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
    let rt = common::runtime();
    let con = common::connect(
        &rt,
        &redis.config("fleetban", Duration::from_secs(2)),
        Duration::from_secs(2),
    );
    rt.block_on(async {
        escalation(&mut BanList::redis(con, Keys::new("fleetban"))).await;
        escalation(&mut BanList::memory(None)).await;
    });
    // The record, the event and the offence count were written with the ban.
    let rec: serde_json::Value = redis.record("203.0.113.7");
    assert_eq!(rec["count"], 3);
    assert_eq!(rec["hits"], 7);
    assert_eq!(redis.cli(&["GET", "{fleetban}:off:203.0.113.7"]), "3");
    let ttl: i64 = redis.cli(&["PTTL", "{fleetban}:off:203.0.113.7"]).parse().unwrap();
    assert!(ttl > 3_500_000, "offence count lives forget_after, got {ttl}");
    assert_eq!(redis.cli(&["XLEN", "{fleetban}:events"]), "4");
}

/// An operator's bans of one address, one after the other: what each did
/// (effect, end, reason), whatever the list.
async fn rebans(list: &mut BanList, t0: i64) -> Vec<(Option<Effect>, Until, String)> {
    let manual =
        |mode: Mode, reason: &str| BanRequest::manual("198.51.100.77/32".parse().unwrap(), mode, reason, "ops");
    let steps = [
        (Mode::manual(Some(7_200_000), false, false).unwrap(), "first"),
        (Mode::manual(Some(600_000), false, false).unwrap(), ""),
        (Mode::manual(Some(18_000_000), false, false).unwrap(), "second"),
        (Mode::manual(None, true, false).unwrap(), ""),
        (Mode::manual(Some(3_600_000), false, false).unwrap(), "third"),
        (Mode::manual(Some(3_600_000), false, true).unwrap(), ""),
        (Mode::Auto(policy()), ""),
    ];
    let mut out = Vec::new();
    for (i, (mode, reason)) in steps.into_iter().enumerate() {
        let now = t0 + i as i64 * 1000;
        out.push(match list.ban(&manual(mode, reason), now).await.unwrap() {
            Outcome::Banned(rec) => (Some(Effect::New), rec.until(), rec.reason),
            Outcome::Changed { rec, effect, .. } => (Some(effect), rec.until(), rec.reason),
            Outcome::AlreadyBanned(u) => (None, u, String::new()),
        });
    }
    out
}

#[test]
fn an_operators_reban_never_shortens_in_redis_and_embedded_alike() {
    let redis = Redis::start();
    let rt = common::runtime();
    let con = common::connect(
        &rt,
        &redis.config("fleetban", Duration::from_secs(2)),
        Duration::from_secs(2),
    );
    let t0 = now_ms();
    let (in_redis, embedded) = rt.block_on(async {
        (
            rebans(&mut BanList::redis(con, Keys::new("fleetban")), t0).await,
            rebans(&mut BanList::memory(None), t0).await,
        )
    });
    assert_eq!(in_redis, embedded);
    let at = |ms: i64| Until::At(ms);
    assert_eq!(
        in_redis,
        vec![
            (Some(Effect::New), at(t0 + 7_200_000), "first".to_owned()),
            (Some(Effect::Kept), at(t0 + 7_200_000), "first".to_owned()),
            (Some(Effect::Extended), at(t0 + 2000 + 18_000_000), "second".to_owned()),
            (Some(Effect::Extended), Until::Permanent, "second".to_owned()),
            (Some(Effect::Kept), Until::Permanent, "third".to_owned()),
            (Some(Effect::Replaced), at(t0 + 5000 + 3_600_000), "third".to_owned()),
            (None, at(t0 + 5000 + 3_600_000), String::new()),
        ]
    );
}

#[test]
fn the_safety_valve_caps_new_bans_and_own_addresses_are_never_banned() {
    // The daemon runs in a namespace that owns 10.213.9.1: that address is
    // "this host" and must never be banned, whatever its log says.
    let ns = NetNs::new("valve");
    let peer = NetNs::new("valvep");
    veth_pair(&ns, "10.213.9.1/24", &peer, "10.213.9.2/24");
    let r = ConfigDir::new();
    r.write(
        &r.main_config().log_firewall().safety("{ max_bans_per_minute: 2 }"),
        &[Rule::new("r", &r.log, "{ hits: 3, window: 60s }")],
    );
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    let text: String = [
        "10.213.9.1",
        "198.51.100.1",
        "198.51.100.2",
        "198.51.100.3",
        "198.51.100.4",
    ]
    .iter()
    .map(|addr| combined_lines(addr, 5, "/", 200))
    .collect();
    append(&r.log, &text);
    wait_until(Duration::from_secs(10), "all lines read", || d.status()["lines"] == 25);
    wait_until(Duration::from_secs(5), "the valve to act", || {
        d.status()["safety_refused"].as_u64() >= Some(2)
    });
    let st = d.status();
    assert_eq!(st["bans"], 2, "{st}");
    assert_eq!(st["safety_refused"], 2, "{st}");
    let out = cli(&r.cfg, &["bans", "--json"]).stdout;
    assert!(!out.contains("10.213.9.1"), "own address banned: {out}");
    assert_eq!(out.lines().count(), 2, "{out}");
}
