//! `escalate_network:`: a rule that has banned enough distinct addresses of
//! one network within a period bans the network. The same decisions from
//! `lua/ban.lua` on a real redis-server (several hosts, each its own
//! connection, banning addresses of the same networks), from the embedded
//! list, and from the plain model (tests/common/escalation.rs), on random
//! ban sequences; then the whole path: `fleetban test` and the daemon ban
//! the /24 of five banned addresses and show what triggered it.

mod common;

use std::time::Duration;

use common::escalation::EscalationModel;
use common::{append, cli, combined_line, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};
use fleetban::bans::{BanList, BanRecord, BanRequest, Mode, Outcome};
use fleetban::config::{BanPolicy, NetworkEscalation};
use fleetban::store::Keys;
use ipnet::IpNet;
use proptest::prelude::*;
use proptest::test_runner::{Config, TestRunner};

const BAN_MS: i64 = 40_000;

fn esc() -> NetworkEscalation {
    NetworkEscalation {
        ipv4_prefix: 24,
        ipv6_prefix: 48,
        bans: 3,
        within_ms: 60_000,
        duration_ms: 120_000,
    }
}

fn policy() -> BanPolicy {
    BanPolicy {
        duration_ms: BAN_MS,
        factor: 1.0,
        max_ms: BAN_MS,
        forget_after_ms: 3_600_000,
        network: Some(esc()),
    }
}

/// The clients: several of two IPv4 /24s and of one IPv6 /48 (clients
/// are /64s), one alone in its /48.
fn pool() -> Vec<IpNet> {
    let mut p = Vec::new();
    p.extend((1..=6).map(|i| format!("203.0.113.{i}/32")));
    p.extend((1..=4).map(|i| format!("198.51.100.{i}/32")));
    p.extend((1..=5).map(|i| format!("2001:db8:1:{i}::/64")));
    p.push("2001:db8:2:1::/64".to_owned());
    p.into_iter().map(|s| s.parse().unwrap()).collect()
}

fn request(addr: IpNet, host: usize) -> BanRequest {
    BanRequest {
        addr,
        rule: "scan".into(),
        reason: String::new(),
        host: format!("host{host}"),
        hits: 9,
        mode: Mode::Auto(policy()),
    }
}

/// What one ban did: new or not, and the network ban (network, since, until).
type Step = (bool, Option<(IpNet, i64, i64)>);

fn step(out: &Outcome, net: Option<BanRecord>) -> Step {
    (
        matches!(out, Outcome::Banned(_)),
        net.map(|n| (n.addr, n.since, n.until.expect("a network ban ends"))),
    )
}

#[test]
fn escalation_is_the_same_in_redis_embedded_and_the_model() {
    let redis = Redis::start();
    let rt = common::runtime();
    let cfg = redis.config("fleetban", Duration::from_secs(2));
    // Three hosts, each with its own connection to the one Redis.
    let hosts: Vec<_> = (0..3)
        .map(|_| common::connect(&rt, &cfg, Duration::from_secs(2)))
        .collect();
    let pool = pool();
    let mut runner = TestRunner::new(Config {
        cases: 48,
        failure_persistence: None,
        ..Config::default()
    });
    let case = std::cell::Cell::new(0u32);
    // Network bans over all cases: the sequences must make some.
    let escalated = std::cell::Cell::new(0usize);
    let seq = proptest::collection::vec((0..pool.len(), 0i64..25_000, 0usize..3), 1..60);
    runner
        .run(&seq, |steps| {
            case.set(case.get() + 1);
            let case = case.get();
            let keys = Keys::new(&format!("case{case}"));
            let mut fleet: Vec<BanList> = hosts.iter().map(|c| BanList::redis(c.clone(), keys.clone())).collect();
            let mut embedded = BanList::memory(None);
            let mut model = EscalationModel::new(esc(), BAN_MS);
            let mut t = 1_700_000_000_000i64;
            let mut networks = 0;
            for &(a, dt, host) in &steps {
                t += dt;
                let req = request(pool[a], host);
                let (in_redis, in_memory) = rt.block_on(async {
                    let (o, n) = fleet[host].ban_escalating(&req, t).await.unwrap();
                    let r = step(&o, n);
                    let (o, n) = embedded.ban_escalating(&req, t).await.unwrap();
                    (r, step(&o, n))
                });
                let modelled = model.ban(pool[a], t);
                prop_assert_eq!(in_redis, modelled, "Redis, at {} banning {}", t, pool[a]);
                prop_assert_eq!(in_memory, modelled, "embedded, at {} banning {}", t, pool[a]);
                networks += usize::from(modelled.1.is_some());
            }
            escalated.set(escalated.get() + networks);
            // The lists agree too, records and all (the network's reason
            // names its trigger), read from any host.
            let (mut from_redis, mut from_memory) = rt.block_on(async {
                (
                    fleet[case as usize % 3].records(t).await.unwrap(),
                    embedded.records(t).await.unwrap(),
                )
            });
            from_redis.sort_by_key(|r| r.addr);
            from_memory.sort_by_key(|r| r.addr);
            prop_assert_eq!(&from_redis, &from_memory);
            for r in from_redis
                .iter()
                .filter(|r| r.addr.prefix_len() < 64 && r.addr.prefix_len() != 32)
            {
                prop_assert!(r.reason.starts_with("3 addresses of "), "{}", r.reason);
                prop_assert!(r.reason.ends_with("banned within 1m (rule scan)"), "{}", r.reason);
            }
            // Each network ban reached the other hosts as an event.
            let events = redis.cli(&["XLEN", &keys.events()]);
            let address_bans = model.addresses.len();
            prop_assert_eq!(events, (address_bans + networks).to_string());
            Ok(())
        })
        .unwrap();
    assert!(
        escalated.get() >= 10,
        "only {} network bans in all cases",
        escalated.get()
    );
}

/// The model's own cases, so that it cannot agree with a wrong
/// implementation by being wrong the same way: the third distinct
/// address within the period bans, a repeated one does not count twice,
/// an address banned too long ago does not count, and a banned network
/// is not banned again while active.
#[test]
fn the_model_bans_the_network_of_the_third_distinct_address_within_the_period() {
    let n = |s: &str| s.parse::<IpNet>().unwrap();
    let mut m = EscalationModel::new(esc(), BAN_MS);
    assert_eq!(m.ban(n("203.0.113.1/32"), 0), (true, None));
    assert_eq!(m.ban(n("203.0.113.1/32"), 30_000), (false, None));
    assert_eq!(m.ban(n("203.0.113.1/32"), 50_000), (true, None));
    assert_eq!(m.ban(n("198.51.100.1/32"), 50_000), (true, None));
    assert_eq!(m.ban(n("203.0.113.2/32"), 60_000), (true, None));
    let net = n("203.0.113.0/24");
    assert_eq!(m.ban(n("203.0.113.3/32"), 70_000), (true, Some((net, 70_000, 190_000))));
    assert_eq!(m.ban(n("203.0.113.4/32"), 80_000), (true, None));
    // Once it ends, a fourth and fifth within the period ban it again.
    assert_eq!(m.ban(n("203.0.113.5/32"), 190_000), (true, None));
    assert_eq!(m.ban(n("203.0.113.6/32"), 191_000), (true, None));
    assert_eq!(
        m.ban(n("203.0.113.7/32"), 192_000),
        (true, Some((net, 192_000, 312_000)))
    );
}

/// Five addresses of one /24, each over the rule's limit: the fifth ban
/// bans the /24, in `fleetban test` and in the daemon, whose `bans --json`
/// and `explain` show the network ban and what triggered it.
#[test]
fn five_banned_addresses_ban_their_24_in_test_and_in_the_daemon() {
    let r = ConfigDir::new();
    let rule = || {
        Rule::new("burst", &r.log, "{ hits: 2, window: 60s }")
            .ban("10m")
            .escalate_network("{ ipv4_prefix: 24, bans: 5, within: 1h, duration: 1d }")
    };
    // fleetban test: three hits from each of five addresses and of one
    // address of another /24.
    let t0 = 1_700_000_000_000;
    let mut text = String::new();
    for (i, a) in [
        "203.0.113.1",
        "203.0.113.2",
        "198.51.100.9",
        "203.0.113.3",
        "203.0.113.4",
        "203.0.113.5",
    ]
    .iter()
    .enumerate()
    {
        for k in 0..3 {
            text += &combined_line(a, t0 + (i as i64 * 10 + k) * 1000, "/", 200);
        }
    }
    let replayed = r.path().join("replay.log");
    std::fs::write(&replayed, &text).unwrap();
    r.write(&r.main_config().log_firewall(), &[rule()]);
    let out = cli(&r.cfg, &["test", "--json", replayed.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.text());
    let bans = out.test_bans();
    let addrs: Vec<&str> = bans.iter().map(|b| b["addr"].as_str().unwrap()).collect();
    assert_eq!(
        addrs,
        [
            "203.0.113.1",
            "203.0.113.2",
            "198.51.100.9",
            "203.0.113.3",
            "203.0.113.4",
            "203.0.113.5",
            "203.0.113.0/24"
        ],
        "{}",
        out.stdout
    );
    let net = &bans[6];
    assert_eq!(net["rule"], "burst");
    assert_eq!(
        net["reason"],
        "5 addresses of 203.0.113.0/24 banned within 1h (rule burst)"
    );
    assert_eq!(net["line"], bans[5]["line"], "at the line of the fifth address's ban");
    assert_eq!(net["until"], fleetban::rfc3339(t0 + 52_000 + 86_400_000));
    assert!(bans[..6].iter().all(|b| b.get("reason").is_none()));
    // A rule's bans are counted as `status` counts them, the network apart.
    let summary: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["rules"]["burst"]["bans"], 6, "{summary}");
    assert_eq!(summary["rules"]["burst"]["network_bans"], 1, "{summary}");
    // The human report names the network's trigger under its table, a
    // blank line before the files' table; the counts say the network.
    let human = cli(&r.cfg, &["test", replayed.to_str().unwrap()]);
    let lines: Vec<&str> = human.stdout.lines().collect();
    let at = lines
        .iter()
        .position(|l| *l == "203.0.113.0/24: 5 addresses of 203.0.113.0/24 banned within 1h (rule burst)")
        .unwrap_or_else(|| panic!("{}", human.text()));
    assert_eq!(lines[at + 1], "", "{}", human.stdout);
    assert!(lines[at + 2].starts_with("FILE "), "{}", human.stdout);
    assert!(
        lines
            .iter()
            .any(|l| l.starts_with("burst ") && l.ends_with(" 6 + 1 network")),
        "{}",
        human.stdout
    );
    assert!(human.stdout.contains("  bans: 6 + 1 network"), "{}", human.stdout);

    // The daemon (with Redis, log firewall): the same, live, ban.lua
    // deciding.
    let redis = Redis::start();
    r.write(
        &r.main_config().log_firewall().redis(&redis.url(), "hold: 10ms"),
        &[rule()],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &three_hits_each("203.0.113", 11..=15));
    let mut listed: Vec<serde_json::Value> = Vec::new();
    wait_until(Duration::from_secs(20), "the /24 in `bans --json`", || {
        let out = cli(&r.cfg, &["bans", "--json"]);
        listed = out
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        listed.iter().any(|b| b["addr"] == "203.0.113.0/24")
    });
    let net = listed.iter().find(|b| b["addr"] == "203.0.113.0/24").unwrap();
    assert_eq!(net["rule"], "burst", "{net}");
    assert_eq!(
        net["reason"],
        "5 addresses of 203.0.113.0/24 banned within 1h (rule burst)"
    );
    // The daemon counts the rule's five bans, the network apart, as `test` does.
    assert_eq!(d.status()["rules"][0]["bans"], 5, "{}", d.status());
    let explained = cli(&r.cfg, &["explain", "203.0.113.200"]);
    assert!(
        explained.stdout.contains("203.0.113.0/24") && explained.stdout.contains("5 addresses of 203.0.113.0/24"),
        "{}",
        explained.text()
    );
    drop(d);
}

/// `escalate_network:` errors name the file, line and column, and what is
/// expected.
#[test]
fn bad_escalate_network_keys_are_errors_at_their_place() {
    let r = ConfigDir::new();
    for (yaml, want) in [
        (
            "{ bans: 1, within: 1h, duration: 1d }",
            "`escalate_network.bans` is 1: expected at least 2",
        ),
        (
            "{ ipv4_prefix: 32, bans: 5, within: 1h, duration: 1d }",
            "`escalate_network.ipv4_prefix` is 32",
        ),
        (
            "{ ipv6_prefix: 64, bans: 5, within: 1h, duration: 1d }",
            "shorter than `ipv6_prefix` (64",
        ),
        (
            "{ bans: 5, within: 1h, duration: 9999999999999999s }",
            "`escalate_network.duration` is",
        ),
        (
            "{ bans: 5, within: 0s, duration: 1d }",
            "`escalate_network.within` is 0s, below a second",
        ),
        ("{ bans: 5, within: 1h }", "duration"),
        ("{ bans: 5, within: 1h, duration: 1d, every: 2 }", "every"),
    ] {
        r.write(
            &r.main_config(),
            &[Rule::new("burst", &r.log, "{ hits: 2, window: 60s }").escalate_network(yaml)],
        );
        let out = cli(&r.cfg, &["check"]);
        assert_ne!(out.code, 0, "{yaml}");
        let rules = r.rules.display().to_string();
        let line = out
            .stderr
            .lines()
            .chain(out.stdout.lines())
            .find(|l| l.contains(want))
            .unwrap_or_else(|| panic!("no error {want:?} for {yaml}: {}", out.text()));
        assert!(line.starts_with(&format!("{rules}:5:")), "{line}");
    }
}

/// On a three-master Cluster the escalation's key is in the list's slot
/// (`{fleetban}:esc:...`): the daemon's fifth ban bans the /24 there too.
#[test]
fn the_network_ban_goes_through_a_cluster_in_the_same_script() {
    let nodes = Redis::start_cluster();
    let r = ConfigDir::new();
    r.write(
        &r.main_config().log_firewall().redis_yaml(&format!(
            "redis: {{ cluster: ['redis://127.0.0.1:{}'], hold: 10ms }}\n",
            nodes[0].port()
        )),
        &[Rule::new("burst", &r.log, "{ hits: 2, window: 60s }")
            .ban("10m")
            .escalate_network("{ bans: 5, within: 1h, duration: 1d }")],
    );
    let _d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &three_hits_each("198.51.100", 1..=5));
    wait_until(Duration::from_secs(20), "the /24 banned through the Cluster", || {
        cli(&r.cfg, &["bans", "--json"])
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
            .any(|b| {
                b["addr"] == "198.51.100.0/24" && b["reason"].as_str().is_some_and(|s| s.starts_with("5 addresses"))
            })
    });
}

/// The safety valve weighs the network an escalation would ban by its
/// clients: with `max_bans_per_minute: 100`, the fifth address's ban is
/// written, but its /24 (256 clients) has no room and is not decided; the
/// log says why. With room (300), the same traffic bans the /24.
#[test]
fn an_escalation_without_room_in_the_safety_valve_is_not_decided() {
    for (max, escalates) in [(100u32, false), (300, true)] {
        let r = ConfigDir::new();
        let rule = Rule::new("burst", &r.log, "{ hits: 2, window: 60s }")
            .ban("10m")
            .escalate_network("{ ipv4_prefix: 24, bans: 5, within: 1h, duration: 1d }");
        let redis = Redis::start();
        r.write(
            &r.main_config()
                .log_firewall()
                .redis(&redis.url(), "hold: 10ms")
                .safety(&format!("{{ max_bans_per_minute: {max} }}")),
            &[rule],
        );
        let d = Daemon::start(None, &r.cfg, &r.control);
        append(&r.log, &three_hits_each("203.0.113", 21..=25));
        wait_until(Duration::from_secs(20), "the five address bans", || {
            (21..=25).all(|a| {
                !redis
                    .cli(&["ZSCORE", "{fleetban}:bans", &format!("203.0.113.{a}")])
                    .is_empty()
            })
        });
        let network = || !redis.cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.0/24"]).is_empty();
        if escalates {
            wait_until(Duration::from_secs(10), "the /24 banned", network);
        } else {
            wait_until(Duration::from_secs(10), "the valve's warning", || {
                d.log_text()
                    .contains("no room this minute for the network this ban may escalate to")
            });
            assert!(!network(), "{}", d.log_text());
            assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), "5", "{}", d.log_text());
        }
    }
}

/// Three requests now from each address `NET.i` of `hosts`.
fn three_hits_each(net: &str, hosts: std::ops::RangeInclusive<u8>) -> String {
    let now = now_ms();
    let mut live = String::new();
    for i in hosts {
        for k in 0..3 {
            live += &combined_line(&format!("{net}.{i}"), now + k, "/", 200);
        }
    }
    live
}

/// Draining the safety valve (issue 25, item 3): a first-hit rule with
/// `escalate_network: { bans: 5 }` and a brute-force rule share the
/// default budget of 600. `/.env` from 100.64.1.1-5, 100.64.2.1-5 (two /24
/// escalations, 512) and 78 single addresses (88 requests) used to spend
/// the whole minute, and the real attacker's `/login` ×10 got "Safety
/// valve: too many bans this minute". Half the budget is reserved, split
/// between the rules: the decoys take at most 450 (the second /24 is not
/// escalated, 300 more decoys are refused), the brute-force ban is
/// applied, and the refusals are loud (log, `status`).
#[test]
fn one_rule_flooded_with_decoys_cannot_drain_the_valve_for_the_others() {
    let r = ConfigDir::new();
    let first = Rule::new("first-hit", &r.log, "{ hits: 0, window: 60s }")
        .matching(r"{ path: '^/\.env$' }")
        .ban("1h")
        .escalate_network("{ ipv4_prefix: 24, bans: 5, within: 1h, duration: 1d }");
    let brute = Rule::new("brute", &r.log, "{ hits: 5, window: 60s }")
        .matching("{ path: '^/login$' }")
        .ban("1h");
    let redis = Redis::start();
    r.write(
        &r.main_config().log_firewall().redis(&redis.url(), "hold: 10ms"),
        &[first, brute],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    let now = now_ms();
    let mut lines = String::new();
    let decoys = (1..=5)
        .map(|i| format!("100.64.1.{i}"))
        .chain((1..=5).map(|i| format!("100.64.2.{i}")))
        .chain((1..=78).map(|i| format!("198.18.{i}.1")))
        // And 300 more: more than the first rule's share.
        .chain((1..=300).map(|i| format!("198.19.{}.{}", i / 200, 1 + i % 200)));
    for (k, a) in decoys.enumerate() {
        lines += &combined_line(&a, now + k as i64, "/.env", 404);
    }
    for k in 0..10 {
        lines += &combined_line("192.0.2.77", now + 100 + k, "/login", 200);
    }
    append(&r.log, &lines);
    let banned = |a: &str| !redis.cli(&["ZSCORE", "{fleetban}:bans", a]).is_empty();
    wait_until(Duration::from_secs(20), "the brute-force ban", || banned("192.0.2.77"));
    wait_until(Duration::from_secs(20), "every decoy decided", || {
        let st = d.status();
        st["lines"] == 398 && st["redis"]["held_hits"] == 0 && st["redis"]["inflight_hits"] == 0
    });
    let st = d.status();
    assert!(banned("100.64.1.0/24"), "the first /24 fits: {}", d.log_text());
    assert!(!banned("100.64.2.0/24"), "the second does not: {}", d.log_text());
    assert!(
        d.log_text().contains("no room this minute for the network"),
        "{}",
        d.log_text()
    );
    assert_eq!(st["safety"]["state"], "tripped", "{st}");
    assert!(st["safety"]["refused"].as_u64().unwrap_or(0) >= 1, "{st}");
    assert!(
        d.log_text().contains("this rule used its share of the minute's bans"),
        "{}",
        d.log_text()
    );
}
