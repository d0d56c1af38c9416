//! Counting networks (`limit.key: network`), end to end. Three hosts
//! (namespaces with Debian's nginx and their own `fleetban run` and nft
//! table) share one Redis. Fifty addresses of one /24 each send three
//! requests spread over the hosts: far below any per-address limit, over
//! the network's limit together. The /24 is banned once in the fleet's
//! list and dropped by every host, for addresses that never sent anything
//! too, while an allow-listed address inside it is still served by every
//! host: each enforcer split the ban around it. `fleetban test` reads the
//! same pattern from a log and names the network, and `explain` shows each
//! rule's count under its own key.

mod common;

use std::time::Duration;

use common::fleet::{spread_requests, Fleet, PAGE};
use common::{cli, combined_line, fleetban_bin, get_from, wait_until, ConfigDir, Rule};

/// Fleet::client(i) is 10.213.64.(i + 1): the first 250 share this /24.
const NETWORK: &str = "10.213.64.0/24";
/// Fleet::client(199), allow-listed.
const ALLOWED: &str = "10.213.64.200";

#[test]
fn fifty_addresses_of_one_network_are_dropped_as_a_24_by_every_host_and_an_allowed_one_inside_is_served() {
    const SENDERS: usize = 50;
    const EACH: usize = 3;
    const LIMIT: usize = 100;
    let fleet = Fleet::start_with(
        3,
        &format!("{{ key: network, ipv4_prefix: 24, hits: {LIMIT}, window: 60s, scope: fleet }}"),
        "",
        &fleetban_bin(),
        |m| m.allow(&format!("[{ALLOWED}]")),
    );
    // The allowed address is served, and counts for nothing: ten requests.
    let allowed = Fleet::client(199);
    assert_eq!(allowed.to_string(), ALLOWED);
    let warm = fleet.each_client(1, move |_, hosts| {
        spread_requests(allowed, hosts, 10, Duration::from_secs(5))
    });
    assert!(warm[0].is_ok(), "{:?}\n{}", warm[0], fleet.logs());
    // 50 x 3 = 150 requests of the /24, each address at 3: over the
    // network's 100, never near a per-address limit. Each request waits
    // for its answer, and the ban drops what comes after it, so a sender
    // may see its last requests fail: the count is asserted in Redis.
    let sent = fleet.each_client(SENDERS, move |i, hosts| {
        spread_requests(Fleet::client(i), hosts, EACH, Duration::from_secs(2))
    });
    let answered = sent.iter().filter(|r| r.is_ok()).count();
    assert!(
        answered >= LIMIT / EACH,
        "only {answered} senders answered\n{}",
        fleet.logs()
    );

    wait_until(Duration::from_secs(15), "the /24 in the fleet's list", || {
        fleet
            .redis
            .cli(&["ZSCORE", "{fleetban}:bans", NETWORK])
            .parse::<f64>()
            .is_ok()
    });
    // One ban, of the network, decided by the rule: no address of it alone.
    assert_eq!(fleet.redis.cli(&["ZCARD", "{fleetban}:bans"]), "1", "{}", fleet.logs());
    let rec: serde_json::Value = fleet.redis.record(NETWORK);
    assert_eq!(rec["rule"], common::fleet::RULE, "{rec}");
    assert_eq!(rec["hits"], LIMIT + 1, "{rec}");
    assert_eq!(
        rec["reason"],
        format!("{} hits of the network within 1m", LIMIT + 1),
        "{rec}"
    );
    // explain: a sender is covered by the network's ban, and the rule's
    // window is read under the network.
    let out = cli(&fleet.hosts[1].files.cfg, &["explain", "10.213.64.18", "--json"]);
    assert!(out.success(), "{out:?}");
    let e: serde_json::Value = serde_json::from_str(&out.stdout).expect("JSON");
    assert_eq!(e["banned"], true, "{e}");
    assert_eq!(e["covering"][0]["addr"], NETWORK, "{e}");
    assert_eq!(e["covering"][0]["rule"], common::fleet::RULE, "{e}");
    assert_eq!(e["windows"][0]["key"], NETWORK, "{e}");
    assert!(e["windows"][0]["count"].as_u64().unwrap() >= LIMIT as u64, "{e}");

    // Every host: every sender, and an address of the /24 that never sent
    // anything, unanswered; the allowed address answered.
    let hosts = fleet.hosts.len();
    let probes = [0usize, 17, 49, 120];
    wait_until(Duration::from_secs(15), "every host to drop the /24", || {
        let dropped = fleet.each_client(probes.len() * hosts, move |i, to| {
            get_from(
                Fleet::client(probes[i / hosts]),
                to[i % hosts],
                PAGE,
                Duration::from_millis(500),
            )
            .is_err()
        });
        dropped.iter().all(|d| *d)
    });
    let served = fleet.each_client(hosts, move |j, to| {
        get_from(allowed, to[j], PAGE, Duration::from_secs(5))
    });
    for (j, r) in served.iter().enumerate() {
        assert!(
            matches!(r, Ok((_, 200))),
            "host {j} to the allowed {ALLOWED}: {r:?}\n{}",
            fleet.logs()
        );
    }
    // In each kernel: pieces of the /24 (the /32 ones in the plain set), none holding the allowed address,
    // covering the other 255 addresses.
    for (j, h) in fleet.hosts.iter().enumerate() {
        // The /32 pieces are in the plain set v4, the others in the sets per length.
        let nets: Vec<ipnet::Ipv4Net> = common::nft_bans(&h.ns, "fleetban", "v4")
            .iter()
            .map(|(e, _)| match e.contains('/') {
                true => e.parse().unwrap_or_else(|_| panic!("host {j}: element {e}")),
                false => ipnet::Ipv4Net::from(e.parse::<std::net::Ipv4Addr>().expect("an address")),
            })
            .collect();
        let allowed: std::net::Ipv4Addr = ALLOWED.parse().unwrap();
        assert!(nets.iter().all(|n| !n.contains(&allowed)), "host {j}: {nets:?}");
        let covered: u32 = nets.iter().map(|n| 1u32 << (32 - n.prefix_len())).sum();
        assert_eq!(covered, 255, "host {j}: {nets:?}");
        assert!(
            h.daemon
                .log_text()
                .contains("Network ban applied around the never-banned addresses"),
            "host {j}: {}",
            h.daemon.log_text()
        );
    }

    // Unbanned on one host: every piece leaves every kernel.
    let out = cli(&fleet.hosts[0].files.cfg, &["unban", NETWORK]);
    assert!(out.success(), "{out:?}");
    wait_until(Duration::from_secs(15), "every host's sets empty", || {
        fleet
            .hosts
            .iter()
            .all(|h| common::nft_bans(&h.ns, "fleetban", "v4").is_empty())
    });
    let back = fleet.each_client(hosts, move |j, to| {
        get_from(Fleet::client(0), to[j], PAGE, Duration::from_secs(5))
    });
    for (j, r) in back.iter().enumerate() {
        assert!(matches!(r, Ok((_, 200))), "host {j} after the unban: {r:?}");
    }
}

/// Fifty addresses of 198.51.100.0/24, five requests each a second apart,
/// and one busy address of 203.0.113.0/24: the network rule bans the first
/// /24 (not the second, whose one address stays under 100), the
/// per-address rule only the busy address.
#[test]
fn fleetban_test_names_the_network_a_pool_of_addresses_is_banned_as() {
    let files = ConfigDir::new();
    let t0 = 1_780_000_000_000i64;
    let mut log = String::new();
    for round in 0..5i64 {
        for a in 1..=50 {
            log += &combined_line(&format!("198.51.100.{a}"), t0 + round * 1000 + a, "/item", 200);
        }
    }
    for i in 0..30i64 {
        log += &combined_line("203.0.113.9", t0 + 5000 + i * 100, "/item", 200);
    }
    std::fs::write(&files.log, log).unwrap();
    let rules = [
        Rule::new("pool", &files.log, "{ key: network, hits: 100, window: 60s }"),
        Rule::new("address", &files.log, "{ hits: 20, window: 60s }"),
    ];
    files.write(&files.main_config().log_firewall(), &rules);
    let out = cli(&files.cfg, &["test", "--json", files.log.to_str().unwrap()]);
    assert!(out.success(), "{out:?}");
    let bans: Vec<(String, String)> = out
        .test_bans()
        .iter()
        .map(|b| {
            (
                b["rule"].as_str().unwrap().to_owned(),
                b["addr"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert!(bans.contains(&("pool".into(), "198.51.100.0/24".into())), "{bans:?}");
    assert!(bans.contains(&("address".into(), "203.0.113.9".into())), "{bans:?}");
    assert_eq!(bans.len(), 2, "{bans:?}");
    let check = cli(&files.cfg, &["check"]);
    assert!(
        check
            .stdout
            .contains("pool: 100 hits per 1m (sliding_window), per network (/24, /56)"),
        "{check:?}"
    );
}

/// A network wider than the safety valve's whole budget would never be
/// banned: `check` says so, naming the rule, the length and the budget.
#[test]
fn check_warns_of_a_network_the_safety_valve_would_always_refuse() {
    let files = ConfigDir::new();
    let rules = [Rule::new(
        "wide",
        &files.log,
        "{ key: network, ipv4_prefix: 16, ipv6_prefix: 56, hits: 100, window: 60s }",
    )];
    files.write(&files.main_config().log_firewall(), &rules);
    let out = cli(&files.cfg, &["check"]);
    assert!(out.success(), "{out:?}");
    assert!(
        out.stdout.contains("rule wide (")
            && out.stdout.contains(
                "a /16 ban (key: network) covers 65536 clients, more than `safety.max_bans_per_minute` (600)"
            ),
        "{out:?}"
    );
    // The /56 (256 client /64s) fits: one warning only.
    assert_eq!(out.stdout.matches("warning:").count(), 1, "{out:?}");
    files.write(
        &files
            .main_config()
            .log_firewall()
            .safety("{ max_bans_per_minute: 70000 }"),
        &rules,
    );
    let out = cli(&files.cfg, &["check"]);
    assert!(!out.stdout.contains("warning:"), "{out:?}");
}
