//! One truth per address (issue 24): for random ban lists (addresses and
//! networks of every length, both families, IPv4-mapped spellings),
//! blocklists, `allow:`, `proxies:` and this host's own addresses (one of
//! them taken while the daemon runs), each address drawn at and around the
//! edges of those networks gets the same answer from
//! - the kernel: a TCP connection from it, through a veth from a client
//!   namespace, passes or is refused by the host's nft table;
//! - `GET /check` (in both spellings of an IPv4 address);
//! - `fleetban explain ADDR --json`'s verdict;
//! - `fleetban bans --json`: some ban holds it and spares it not;
//!
//! and all four equal a plain model: never banned (loopback, allow,
//! proxies, own) wins, then a ban holding it, then a blocklist network.

mod common;

use std::collections::BTreeSet;
use std::io::Write as _;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr, SocketAddr, TcpListener};
use std::time::Duration;

use ipnet::IpNet;
use proptest::prelude::*;
use serde_json::Value;

use common::{connect_from, fleetban_bin, veth_pair, wait_until, Checker, ConfigDir, Daemon, NetNs, Rule};

/// The host's end of the link, in both families, and the client's.
const HOST4: &str = "10.213.200.1";
const CLIENT4: &str = "10.213.200.2";
const HOST6: &str = "fd00:213:200::1";
const CLIENT6: &str = "fd00:213:200::2";
/// An address of the host besides its link: drawn bans often hold it.
const OWN: &str = "198.18.7.7";
/// The port the host listens on for the probes.
const PORT: u16 = 8080;

/// Two namespaces: `host` runs the daemon and its nft table, `client` sends
/// the probes from any address (each put on its loopback first);
/// `host` routes every address back through the client.
struct Rig {
    host: NetNs,
    client: NetNs,
}

fn rig() -> Rig {
    let host = NetNs::new("vhost");
    let client = NetNs::new("vclient");
    let (if_h, if_c) = veth_pair(&host, &format!("{HOST4}/24"), &client, &format!("{CLIENT4}/24"));
    for (ns, ifname, a6) in [(&host, &if_h, HOST6), (&client, &if_c, CLIENT6)] {
        for k in ["net.ipv4.conf.all.rp_filter=0", "net.ipv4.conf.default.rp_filter=0"] {
            ns.run(&["sysctl", "-qw", k]);
        }
        ns.run(&["ip", "-6", "addr", "add", &format!("{a6}/64"), "dev", ifname, "nodad"]);
    }
    host.run(&["ip", "route", "add", "default", "via", CLIENT4]);
    host.run(&["ip", "-6", "route", "add", "default", "via", CLIENT6]);
    host.run(&["ip", "addr", "add", &format!("{OWN}/32"), "dev", "lo"]);
    // Accepts and closes: a probe passes when its handshake completes.
    for bind in [format!("{HOST4}:{PORT}"), format!("[{HOST6}]:{PORT}")] {
        let listener = host
            .spawn(move || TcpListener::bind(&bind).unwrap_or_else(|e| panic!("bind {bind}: {e}")))
            .join()
            .unwrap();
        std::thread::spawn(move || {
            for c in listener.incoming() {
                drop(c);
            }
        });
    }
    let rig = Rig { host, client };
    // The neighbours resolved before the first burst of probes.
    assert_eq!(
        rig.probe(&["198.51.100.1".parse().unwrap(), "2001:db8:ffff::1".parse().unwrap()]),
        vec![true, true],
        "the link works"
    );
    rig
}

impl Rig {
    /// Whether a connection from each of `addrs` reaches the host.
    fn probe(&self, addrs: &[IpAddr]) -> Vec<bool> {
        let batch = |verb: &str| {
            let mut text = String::new();
            for a in addrs {
                match a {
                    IpAddr::V4(a) => text += &format!("addr {verb} {a}/32 dev lo\n"),
                    IpAddr::V6(a) => text += &format!("addr {verb} {a}/128 dev lo nodad\n"),
                }
            }
            let mut child = self
                .client
                .exec(&["ip", "-force", "-batch", "-"])
                .stdin(std::process::Stdio::piped())
                .spawn()
                .unwrap();
            child.stdin.take().unwrap().write_all(text.as_bytes()).unwrap();
            assert!(child.wait().unwrap().success(), "ip -batch: {text}");
        };
        batch("add");
        // A few threads in the client namespace, each a share of the addresses.
        let threads: Vec<_> = addrs
            .chunks(addrs.len().div_ceil(8).max(1))
            .map(|chunk| {
                let chunk = chunk.to_vec();
                self.client.spawn(move || {
                    chunk
                        .iter()
                        .map(|&a| {
                            let to: SocketAddr = match a {
                                IpAddr::V4(_) => format!("{HOST4}:{PORT}").parse().unwrap(),
                                IpAddr::V6(_) => format!("[{HOST6}]:{PORT}").parse().unwrap(),
                            };
                            // Long enough for a SYN sent again (1 s): a
                            // refused one fails at once (`action: reject`).
                            connect_from(a, to, Duration::from_millis(2500)).is_ok()
                        })
                        .collect::<Vec<bool>>()
                })
            })
            .collect();
        let passed = threads.into_iter().flat_map(|t| t.join().unwrap()).collect();
        batch("del");
        passed
    }
}

/// One drawn case.
#[derive(Clone, Debug)]
struct Case {
    /// Ban list members as written into `bans.json` (mapped spellings too).
    bans: Vec<IpNet>,
    /// One more ban, typed by an operator while the daemon runs.
    live_ban: IpNet,
    allow: Vec<IpNet>,
    proxies: Vec<IpNet>,
    blocks: Vec<IpNet>,
    /// An address the host takes while the daemon runs.
    taken: IpAddr,
    /// Addresses asked about besides the edges.
    extra: Vec<IpAddr>,
}

/// Networks near each other, so that bans, allowed networks and blocklists
/// overlap: inside 198.18.0.0/15 (the host's [`OWN`] among them) and
/// 2001:db8:1::/48 mostly, anywhere sometimes, and IPv4-mapped spellings.
fn net() -> impl Strategy<Value = IpNet> {
    let v4 = |base: u32, bits: u32| {
        (any::<u32>(), 8u8..=32).prop_map(move |(r, len)| {
            let a = base | (r & ((1u64 << (32 - bits)) as u32).wrapping_sub(1));
            IpNet::new(Ipv4Addr::from(a).into(), len.max(bits as u8))
                .unwrap()
                .trunc()
        })
    };
    let v6 = |len_min: u8| {
        (any::<u128>(), len_min..=128u8).prop_map(|(r, len)| {
            let base: u128 = 0x2001_0db8_0001_u128 << 80;
            let a = base | (r & ((1u128 << 80) - 1));
            IpNet::new(Ipv6Addr::from(a).into(), len).unwrap().trunc()
        })
    };
    prop_oneof![
        4 => v4(0xc612_0000, 15),
        1 => v4(0, 0).prop_filter("a routable unicast network", |n| routable(&n.addr())),
        3 => v6(48),
        1 => v6(16),
        // `::ffff:198.18.x.y/(96 + len)`: the IPv4 network in another spelling.
        1 => v4(0xc612_0000, 15).prop_map(|n| match n {
            IpNet::V4(n) => IpNet::new(n.addr().to_ipv6_mapped().into(), 96 + n.prefix_len()).unwrap(),
            other => other,
        }),
    ]
}

fn addr() -> impl Strategy<Value = IpAddr> {
    net().prop_map(|n| n.addr())
}

fn case() -> impl Strategy<Value = Case> {
    (
        prop::collection::vec(net(), 1..8),
        net(),
        prop::collection::vec(net(), 0..3),
        prop::collection::vec(net(), 0..2),
        prop::collection::vec(net(), 0..4),
        addr(),
        prop::collection::vec(addr(), 0..6),
    )
        .prop_map(|(bans, live_ban, allow, proxies, blocks, taken, extra)| Case {
            bans,
            live_ban,
            allow,
            proxies,
            blocks,
            taken,
            extra,
        })
}

/// IPv4-mapped IPv6 as IPv4, a mapped network as the IPv4 one.
fn canon(n: &IpNet) -> IpNet {
    match n {
        IpNet::V6(v6) if v6.prefix_len() >= 96 => match v6.addr().to_ipv4_mapped() {
            Some(a) => IpNet::new(a.into(), v6.prefix_len() - 96).unwrap(),
            None => *n,
        },
        _ => *n,
    }
}

fn canon_addr(a: IpAddr) -> IpAddr {
    canon(&IpNet::from(a)).addr()
}

/// An address a packet can come from through the veth: unicast, not
/// loopback, not the link's own, not mapped.
fn routable(a: &IpAddr) -> bool {
    let link: [IpNet; 2] = ["10.213.200.0/24".parse().unwrap(), "fd00:213:200::/64".parse().unwrap()];
    if link.iter().any(|n| n.contains(a)) {
        return false;
    }
    match a {
        IpAddr::V4(v) => {
            let o = v.octets()[0];
            o != 0 && o != 127 && o < 224 && !v.is_link_local()
        }
        IpAddr::V6(v) => (v.segments()[0] & 0xe000) == 0x2000,
    }
}

/// What the model says: 0 never banned, 1 banned, 2 blocklisted, 3 open.
fn model(case: &Case, own: &[IpAddr], a: IpAddr) -> u8 {
    let a = canon_addr(a);
    let loopback: [IpNet; 2] = ["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()];
    let never = loopback
        .iter()
        .chain(&case.allow)
        .chain(&case.proxies)
        .map(canon)
        .chain(own.iter().map(|o| IpNet::from(*o)))
        .any(|n| n.contains(&a));
    if never {
        return 0;
    }
    let banned = case
        .bans
        .iter()
        .chain([&case.live_ban])
        .map(canon)
        .any(|n| n.contains(&a));
    if banned {
        return 1;
    }
    if case.blocks.iter().map(canon).any(|n| n.contains(&a)) {
        return 2;
    }
    3
}

/// The edges of every network of the case, one step in and out, in both
/// spellings of IPv4, and the extra addresses.
fn addresses(case: &Case) -> Vec<IpAddr> {
    let mut set = BTreeSet::new();
    let nets = case
        .bans
        .iter()
        .chain([&case.live_ban])
        .chain(&case.allow)
        .chain(&case.proxies)
        .chain(&case.blocks)
        .map(canon);
    for n in nets {
        let (lo, hi): (u128, u128) = match n {
            IpNet::V4(n) => (n.network().to_bits().into(), n.broadcast().to_bits().into()),
            IpNet::V6(n) => (n.network().to_bits(), n.broadcast().to_bits()),
        };
        for x in [lo.wrapping_sub(1), lo, lo + (hi - lo) / 2, hi, hi.wrapping_add(1)] {
            set.insert(match n {
                IpNet::V4(_) => IpAddr::V4(Ipv4Addr::from(x as u32)),
                IpNet::V6(_) => IpAddr::V6(Ipv6Addr::from(x)),
            });
        }
    }
    set.insert(case.taken);
    set.insert(OWN.parse().unwrap());
    set.extend(case.extra.iter().copied());
    set.into_iter()
        .map(canon_addr)
        .collect::<BTreeSet<_>>()
        .into_iter()
        .collect()
}

fn write_case(c: &ConfigDir, case: &Case) {
    let list = |nets: &[IpNet]| {
        let items: Vec<String> = nets.iter().map(|n| format!("'{n}'")).collect();
        format!("[{}]", items.join(", "))
    };
    std::fs::write(
        c.path().join("block.netset"),
        case.blocks.iter().map(|n| format!("{n}\n")).collect::<String>(),
    )
    .unwrap();
    let main = c
        .main_config()
        .allow(&list(&case.allow))
        .proxies(&list(&case.proxies))
        .firewall("{ action: reject }")
        .http(&format!("{{ listen: '{}' }}", c.path().join("http.sock").display()));
    let yaml = format!(
        "{}blocklists: [{{ file: block.netset, format: netset, refresh: 1h }}]\n",
        main.yaml()
    );
    std::fs::write(&c.cfg, yaml).unwrap();
    c.write_rules(&[Rule::new("r", &c.log, "{ hits: 100, window: 60s }")]);
    std::fs::create_dir_all(&c.state).unwrap();
    let now = common::now_ms();
    let bans: Vec<Value> = case
        .bans
        .iter()
        .map(|n| {
            // A single address as fleetban writes one, a network in CIDR form.
            let addr = match n.prefix_len() == n.max_prefix_len() {
                true => n.addr().to_string(),
                false => n.to_string(),
            };
            serde_json::json!({"addr": addr, "rule": "r", "since": now, "until": now + 3_600_000})
        })
        .collect();
    std::fs::write(c.state.join("bans.json"), serde_json::to_vec(&bans).unwrap()).unwrap();
}

/// `fleetban ARGS -c CFG` in the host's namespace (its own addresses):
/// whether it succeeded, and its stdout.
fn try_cli(rig: &Rig, c: &ConfigDir, args: &[&str]) -> (bool, String) {
    let bin = fleetban_bin();
    let mut argv = vec![bin.to_str().unwrap()];
    argv.extend_from_slice(args);
    argv.extend(["-c", c.cfg.to_str().unwrap()]);
    let out = rig.host.exec(&argv).output().unwrap();
    (out.status.success(), String::from_utf8(out.stdout).unwrap())
}

/// As [`try_cli`]; it must succeed.
fn cli_in(rig: &Rig, c: &ConfigDir, args: &[&str]) -> String {
    let (ok, out) = try_cli(rig, c, args);
    assert!(ok, "fleetban {args:?} failed: {out}");
    out
}

fn run_case(rig: &Rig, case: &Case) -> Result<(), TestCaseError> {
    let c = ConfigDir::new();
    write_case(&c, case);
    let d = Daemon::start(Some(&rig.host), &c.cfg, &c.control);
    let mut own: Vec<IpAddr> = vec![HOST4.parse().unwrap(), HOST6.parse().unwrap(), OWN.parse().unwrap()];
    // An operator's ban while it runs (refused when it overlaps the allow
    // list or a proxy: then it is no ban in the model either).
    let (accepted, _) = try_cli(rig, &c, &["ban", &case.live_ban.to_string(), "--for", "1h", "--json"]);
    let mut case = case.clone();
    if !accepted {
        case.live_ban = case.bans[0];
    }
    // An address the host takes now: never banned here from then on.
    let taken = canon_addr(case.taken);
    let fresh = !own.contains(&taken) && routable(&taken);
    if fresh {
        match taken {
            IpAddr::V4(a) => rig
                .host
                .run(&["ip", "addr", "replace", &format!("{a}/32"), "dev", "lo"]),
            IpAddr::V6(a) => rig
                .host
                .run(&["ip", "addr", "replace", &format!("{a}/128"), "dev", "lo", "nodad"]),
        };
        own.push(taken);
        // Seen within about a second (the pipeline reads the interfaces
        // every second), then applied by the enforcer and the endpoint.
        wait_until(Duration::from_secs(10), "the new address seen", || {
            d.log_text().contains("This host has a new address")
        });
        std::thread::sleep(Duration::from_millis(500));
    }
    let addrs = addresses(&case);
    let mut checker = Checker::unix(&c.path().join("http.sock"));
    let bans: Vec<Value> = cli_in(rig, &c, &["bans", "--json"])
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    let probed: Vec<IpAddr> = addrs
        .iter()
        .copied()
        .filter(|a| routable(a) && !own.contains(a))
        .collect();
    let passed = rig.probe(&probed);
    let mut wrong = Vec::new();
    for a in &addrs {
        let want = model(&case, &own, *a);
        let dropped = want == 1 || want == 2;
        let mut spellings = vec![a.to_string()];
        if let IpAddr::V4(v4) = a {
            spellings.push(v4.to_ipv6_mapped().to_string());
        }
        for s in &spellings {
            let status = checker.check(s).status;
            if (status == 403) != dropped {
                wrong.push(format!("{a}: /check {s} answered {status}, model {want}"));
            }
        }
        let explained: Value =
            serde_json::from_str(cli_in(rig, &c, &["explain", &a.to_string(), "--json"]).trim()).unwrap();
        let verdict = ["never_banned", "banned", "blocklisted", "not_banned"][usize::from(want)];
        if explained["verdict"] != verdict {
            wrong.push(format!("{a}: explain says {}, model {verdict}", explained["verdict"]));
        }
        let in_bans = bans.iter().any(|b| {
            let net: IpNet = parse_net(b["addr"].as_str().unwrap());
            let spared = b["spared"]
                .as_array()
                .is_some_and(|s| s.iter().any(|s| parse_net(s.as_str().unwrap_or_default()).contains(a)));
            net.contains(a) && !spared
        });
        if in_bans != (want == 1) {
            wrong.push(format!("{a}: bans --json membership {in_bans}, model {want}"));
        }
        if let Some(i) = probed.iter().position(|p| p == a) {
            if passed[i] == dropped {
                wrong.push(format!(
                    "{a}: the kernel {} it, model {want}",
                    if passed[i] { "passes" } else { "drops" }
                ));
            }
        }
    }
    if fresh {
        let prefix = if taken.is_ipv4() { "32" } else { "128" };
        let _ = rig
            .host
            .exec(&["ip", "addr", "del", &format!("{taken}/{prefix}"), "dev", "lo"])
            .output();
    }
    let log = d.log_text();
    drop(d);
    let _ = rig.host.exec(&["nft", "delete", "table", "inet", "fleetban"]).output();
    prop_assert!(wrong.is_empty(), "{case:?}\n{}\n{log}", wrong.join("\n"));
    Ok(())
}

fn parse_net(s: &str) -> IpNet {
    s.parse()
        .unwrap_or_else(|_| IpNet::from(s.parse::<IpAddr>().unwrap_or_else(|_| panic!("an address: {s}"))))
}

#[test]
fn the_kernel_check_explain_and_bans_agree_on_every_address() {
    let rig = rig();
    let cases = std::env::var("FLEETBAN_VERDICT_CASES")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(6);
    let config = ProptestConfig {
        cases,
        max_shrink_iters: 16,
        failure_persistence: None,
        ..ProptestConfig::default()
    };
    proptest!(config, |(case in case())| {
        run_case(&rig, &case)?;
    });
}

/// The spellings of issue 24: `proxies: ["::ffff:10.0.0.0/104"]` and
/// `allow: ["::ffff:192.0.2.0/120"]` are the IPv4 networks they carry
/// (never counted, never banned, an operator's ban of them refused), and
/// `ban ::ffff:198.51.100.0/120` is the IPv4 /24, in the IPv4 set, denied
/// by `/check` in either spelling.
#[test]
fn ipv4_mapped_spellings_are_their_ipv4_networks_everywhere() {
    let rig = rig();
    let c = ConfigDir::new();
    let main = c
        .main_config()
        .allow("['::ffff:192.0.2.0/120']")
        .proxies("['::ffff:10.0.0.0/104']")
        .http(&format!("{{ listen: '{}' }}", c.path().join("http.sock").display()));
    c.write(&main, &[Rule::new("r", &c.log, "{ hits: 100, window: 60s }")]);
    let check = cli_in(&rig, &c, &["check"]);
    assert!(check.contains("ok"), "{check}");
    let _d = Daemon::start(Some(&rig.host), &c.cfg, &c.control);
    for refused in ["10.0.0.9", "::ffff:10.0.0.9", "192.0.2.7", "10.0.0.0/16"] {
        let (ok, out) = try_cli(&rig, &c, &["ban", refused, "--for", "1h"]);
        assert!(!ok, "ban {refused} refused: {out}");
    }
    let out = cli_in(&rig, &c, &["ban", "::ffff:198.51.100.0/120", "--for", "1h", "--json"]);
    let ban: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(ban["addr"], "198.51.100.0/24", "{out}");
    assert_eq!(ban["enforced"], true, "{out}");
    let v4n24: Vec<String> = common::nft_set_elements(&rig.host, "fleetban", "v4n24")
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(v4n24, ["198.51.100.0"]);
    assert_eq!(
        common::ban_sets(&rig.host, "fleetban", "v6").len(),
        1,
        "no IPv6 network set"
    );
    let mut checker = Checker::unix(&c.path().join("http.sock"));
    for (addr, status) in [
        ("198.51.100.7", 403),
        ("::ffff:198.51.100.7", 403),
        ("10.0.0.5", 204),
        ("192.0.2.7", 204),
    ] {
        assert_eq!(checker.check(addr).status, status, "{addr}");
    }
    for (addr, verdict) in [
        ("192.0.2.7", "never_banned"),
        ("::ffff:10.0.0.5", "never_banned"),
        ("198.51.100.9", "banned"),
    ] {
        let e: Value = serde_json::from_str(cli_in(&rig, &c, &["explain", addr, "--json"]).trim()).unwrap();
        assert_eq!(e["verdict"], verdict, "{addr}: {e}");
    }
    let passed = rig.probe(&["198.51.100.7".parse().unwrap(), "192.0.2.7".parse().unwrap()]);
    assert_eq!(passed, [false, true]);
}
