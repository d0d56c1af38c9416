//! The client behind trusted proxies, read from whole log lines: the
//! `X-Forwarded-For` list nginx logs (`"$http_x_forwarded_for"`) and the
//! PROXY protocol address, decided as nginx's realip module with
//! `real_ip_recursive on` decides, and never a client-written entry.

mod common;

use std::net::{IpAddr, Ipv4Addr};

use common::{cli, ConfigDir, MainConfig, Rule};

use fleetban::addr::NetSet;
use fleetban::parse::{Format, Parser, MAX_HOPS};
use ipnet::IpNet;
use proptest::prelude::*;

/// nginx's `main` format (Debian's example), the list quoted last.
const MAIN: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" "$http_x_forwarded_for""#;
const TIME: &str = "01/Dec/2026:10:00:00 +0000";

fn proxies() -> NetSet {
    NetSet::new(&["10.0.0.0/8".parse().unwrap(), "2001:db8:ff::/48".parse().unwrap()])
}

fn main_parser(proxies: &NetSet) -> Parser {
    Parser::trusting(&Format::LogFormat(MAIN.into()), proxies).unwrap()
}

fn main_line(peer: &str, xff: &str) -> String {
    format!(r#"{peer} - - [{TIME}] "GET / HTTP/1.1" 200 5 "-" "curl/8" "{xff}""#)
}

fn addr(parser: &Parser, line: &str) -> Option<String> {
    parser.parse(line.as_bytes()).map(|r| r.addr.to_string())
}

#[test]
fn the_rightmost_untrusted_hop_is_the_client() {
    let p = main_parser(&proxies());
    let cases = [
        // (peer, X-Forwarded-For as logged, client)
        ("10.0.0.4", "192.0.2.1", Some("192.0.2.1")),
        ("10.0.0.4", "203.0.113.66, 192.0.2.1", Some("192.0.2.1")),
        ("10.0.0.4", "192.0.2.1, 10.1.1.1, 10.2.2.2", Some("192.0.2.1")),
        ("10.0.0.4", "unknown, 192.0.2.1", Some("192.0.2.1")),
        ("10.0.0.4", "2001:db8::5", Some("2001:db8::5")),
        ("2001:db8:ff::4", "::ffff:192.0.2.1", Some("192.0.2.1")),
        // A peer that is not a proxy is the client, whatever it forged.
        ("198.51.100.9", "203.0.113.66", Some("198.51.100.9")),
        // No list: the proxy itself (never counted, like `allow`).
        ("10.0.0.4", "-", Some("10.0.0.4")),
        // Malformed where it is read: no address.
        ("10.0.0.4", "192.0.2.1:8080", None),
        ("10.0.0.4", "[2001:db8::5]", None),
        ("10.0.0.4", "unknown", None),
        ("10.0.0.4", "0x7f.0.0.1", None),
        ("10.0.0.4", "192.0.2.1, garbage", None),
    ];
    for (peer, xff, want) in cases {
        assert_eq!(addr(&p, &main_line(peer, xff)).as_deref(), want, "{peer} / {xff}");
    }
    // Without proxies the list is never believed.
    let untrusting = Parser::new(&Format::LogFormat(MAIN.into())).unwrap();
    assert_eq!(
        addr(&untrusting, &main_line("10.0.0.4", "192.0.2.1")).as_deref(),
        Some("10.0.0.4")
    );
}

#[test]
fn a_quoted_list_first_and_the_proxy_protocol_address() {
    let first = Parser::trusting(
        &Format::LogFormat(r#""$http_x_forwarded_for" $remote_addr [$time_local] "$request" $status"#.into()),
        &proxies(),
    )
    .unwrap();
    // A client-written quote is escaped by nginx and cannot end the field.
    let line = format!(r#""203.0.113.66\x22 198.51.100.1 [x, 192.0.2.1" 10.0.0.4 [{TIME}] "GET / HTTP/1.1" 200"#);
    assert_eq!(addr(&first, &line).as_deref(), Some("192.0.2.1"));

    let pp = Parser::trusting(
        &Format::LogFormat(r#"$proxy_protocol_addr $remote_addr [$time_local] "$request" $status"#.into()),
        &proxies(),
    )
    .unwrap();
    let line = |pp_addr: &str, peer: &str| format!(r#"{pp_addr} {peer} [{TIME}] "GET / HTTP/1.1" 200"#);
    assert_eq!(addr(&pp, &line("192.0.2.7", "10.0.0.4")).as_deref(), Some("192.0.2.7"));
    // A client that reached nginx directly is itself, whatever its header said.
    assert_eq!(
        addr(&pp, &line("192.0.2.7", "198.51.100.3")).as_deref(),
        Some("198.51.100.3")
    );
    assert_eq!(addr(&pp, &line("-", "10.0.0.4")).as_deref(), Some("10.0.0.4"));
}

#[test]
fn more_than_the_hop_limit_gives_no_address() {
    let p = main_parser(&proxies());
    let chain = |n: usize| {
        (0..n)
            .map(|i| format!("10.7.{}.{}", i / 250, i % 250))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let within = main_line("10.0.0.4", &format!("192.0.2.1, {}", chain(MAX_HOPS - 1)));
    assert_eq!(addr(&p, &within).as_deref(), Some("192.0.2.1"));
    let beyond = main_line("10.0.0.4", &format!("192.0.2.1, {}", chain(MAX_HOPS)));
    assert_eq!(addr(&p, &beyond), None);
}

/// `fleetban test` on a balancer's log: the client behind it is banned,
/// the balancer and a victim named in a forged header never are, and a
/// client that bypassed the balancer is judged as itself.
#[test]
fn replay_bans_the_client_behind_the_balancer_never_the_balancer_nor_a_forged_victim() {
    let r = ConfigDir::new();
    let mut log = String::new();
    for s in 0..30 {
        // The attacker forges a victim; the balancer appends the attacker.
        log += &main_line("10.0.0.4", "203.0.113.66, 192.0.2.50").replace("10:00:00", &format!("10:00:{s:02}"));
        log.push('\n');
        // A good client behind the same balancer, and health checks.
        if s % 10 == 0 {
            log += &main_line("10.0.0.4", "192.0.2.77");
            log.push('\n');
            log += &main_line("10.0.0.4", "-");
            log.push('\n');
        }
        // Someone reaching the backend directly, forging the same victim.
        log += &main_line("198.51.100.9", "203.0.113.66");
        log.push('\n');
    }
    std::fs::write(&r.log, log).unwrap();
    let format = format!("{{ log_format: '{MAIN}' }}");
    r.write_rules(&[Rule::new("any", "/unused", "{ hits: 10, window: 60s }").format(&format)]);
    let main = MainConfig::new().yaml() + "proxies: [10.0.0.0/8]\nhttp: { listen: /run/fleetban-test-http.sock }\n";
    std::fs::write(&r.cfg, main).unwrap();
    let out = cli(&r.cfg, &["test", "--json", r.log.to_str().expect("a UTF-8 temp path")]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    let banned: Vec<String> = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|v| v.get("addr").and_then(|a| a.as_str()).map(str::to_owned))
        .collect();
    assert!(banned.contains(&"192.0.2.50".to_owned()), "{}", out.stdout);
    assert!(banned.contains(&"198.51.100.9".to_owned()), "{}", out.stdout);
    for never in ["10.0.0.4", "203.0.113.66", "192.0.2.77"] {
        assert!(!banned.contains(&never.to_owned()), "{never} banned: {}", out.stdout);
    }
}

/// Text a client may put in its own `X-Forwarded-For` as nginx logs it
/// quoted (a `"` or `\` it sends is escaped to `\x22`, `\x5C`).
fn client_text() -> impl Strategy<Value = String> {
    prop_oneof![
        "[ -!#-\\[\\]-~]{0,24}",
        any::<[u8; 4]>().prop_map(|a| Ipv4Addr::from(a).to_string()),
        Just("unknown".to_owned()),
        Just("10.0.0.1".to_owned()),
        Just(", ,".to_owned()),
    ]
}

fn inside(net: &IpNet, noise: u128) -> IpAddr {
    match net {
        IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from_bits(
            n.network().to_bits() | (noise as u32 & !n.netmask().to_bits()),
        )),
        IpNet::V6(n) => IpAddr::V6(std::net::Ipv6Addr::from_bits(
            n.network().to_bits() | (noise & !n.netmask().to_bits()),
        )),
    }
}

proptest! {
    /// Whatever a client writes to the left, the address is the first
    /// untrusted hop from the right: never an entry to its left.
    #[test]
    fn no_client_written_entry_is_ever_the_address(
        written in prop::collection::vec(client_text(), 0..8),
        client in any::<[u8; 4]>(),
        hops in prop::collection::vec((any::<bool>(), any::<u128>()), 0..6),
        peer in (any::<bool>(), any::<u128>()),
        spaced in any::<bool>(),
    ) {
        let nets: [IpNet; 2] = ["10.0.0.0/8".parse().unwrap(), "2001:db8:ff::/48".parse().unwrap()];
        let client = IpAddr::V4(Ipv4Addr::from(client));
        prop_assume!(!proxies().contains(client));
        let pick = |(v6, noise): (bool, u128)| inside(&nets[usize::from(v6)], noise).to_string();
        let mut entries = written.clone();
        entries.push(client.to_string());
        entries.extend(hops.iter().copied().map(pick));
        let list = entries.join(if spaced { ", " } else { "," });
        let line = main_line(&pick(peer), &list);
        let parsed = main_parser(&proxies()).parse(line.as_bytes()).map(|r| r.addr);
        prop_assert_eq!(parsed, Some(client), "{}", line);
    }
}

/// A proxy banned before `proxies:` was set (its address read as the
/// client's): `check` names the ban and the way out; `ban` refuses a proxy.
#[test]
fn check_names_a_banned_proxy_and_ban_refuses_one() {
    let redis = common::Redis::start();
    let r = ConfigDir::new();
    let before = r.main_config().redis(&redis.url(), "");
    r.write(&before, &[Rule::new("any", &r.log, "{ hits: 10, window: 60s }")]);
    let out = cli(&r.cfg, &["ban", "198.51.100.4", "--for", "1h"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    std::fs::write(
        &r.cfg,
        before.yaml() + "proxies: [198.51.100.0/24]\nhttp: { listen: /run/fbt-unused.sock }\n",
    )
    .unwrap();
    let out = cli(&r.cfg, &["check"]);
    assert_eq!(out.code, 0, "{}", out.stderr);
    assert!(
        out.stdout
            .contains("198.51.100.4 is banned but overlaps the trusted proxy network 198.51.100.0/24")
            && out.stdout.contains("fleetban unban 198.51.100.4"),
        "{}",
        out.stdout
    );
    let out = cli(&r.cfg, &["ban", "198.51.100.7"]);
    assert_eq!(out.code, 2, "{}", out.stdout);
    assert!(
        out.stderr.contains("trusted proxy network 198.51.100.0/24"),
        "{}",
        out.stderr
    );
    // Once lifted, check is quiet about it.
    assert_eq!(cli(&r.cfg, &["unban", "198.51.100.4"]).code, 0);
    let out = cli(&r.cfg, &["check"]);
    assert!(!out.stdout.contains("is banned but"), "{}", out.stdout);
}
