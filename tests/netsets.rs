//! Network bans in their plain sets per prefix length (issue 27): a ban of
//! every length, IPv4 /8 to /31 and IPv6 /16 to /127 (but /64, which has
//! the fixed set `v6`), is enforced from the set `v4nL` / `v6nL` (a packet
//! probe in a namespace of the test's own), and an unban removes exactly
//! it, while the next address outside each network stays open throughout.
//!
//! Every address is on the namespace's `lo`; a connection to a local
//! address leaves from that address, so the probe's target is the source
//! the rules see. The enforcer rejects (`action: reject`) so that a refused
//! probe answers at once instead of waiting for a timeout.

mod common;

use std::net::IpAddr;

use common::{nft_set_elements, now_ms, NetNs};
use fleetban::enforce::{Action, Element, Enforcer, NftOptions, Until};
use ipnet::IpNet;

const HOUR: i64 = 3_600_000;

/// Helper for the probes, run inside the namespace as a child process;
/// does nothing in a normal test run.
#[test]
fn packet_probe_child() {
    common::probe::child();
}

/// One network per length, none inside another: IPv4 first octet
/// `100 + 2L`, IPv6 first group `0x2000 + 2L` (even, so the sibling of a
/// /8 or /16 is not another length's). Each with the address inside it
/// (its lowest address + 1) and the one outside (that address with the
/// last bit of the prefix flipped: in the sibling network).
fn networks(v6: bool) -> Vec<(IpNet, IpAddr, IpAddr)> {
    let mut out = Vec::new();
    if v6 {
        for len in (16..=127u8).filter(|l| *l != 64) {
            let base = (0x2000u128 + 2 * u128::from(len)) << 112;
            let inside = base | 1;
            let outside = inside ^ (1u128 << (128 - len));
            let net = IpNet::new(IpAddr::from(base.to_be_bytes()), len).unwrap();
            out.push((
                net,
                IpAddr::from(inside.to_be_bytes()),
                IpAddr::from(outside.to_be_bytes()),
            ));
        }
    } else {
        for len in 8..=31u8 {
            let base = (100u32 + 2 * u32::from(len)) << 24;
            let inside = base | 1;
            let outside = inside ^ (1u32 << (32 - len));
            let net = IpNet::new(IpAddr::from(base.to_be_bytes()), len).unwrap();
            out.push((
                net,
                IpAddr::from(inside.to_be_bytes()),
                IpAddr::from(outside.to_be_bytes()),
            ));
        }
    }
    out
}

/// `PROBE ADDR ok|fail` for each address, in the order given.
fn probe(ns: &NetNs, addrs: &[IpAddr]) -> Vec<(IpAddr, bool)> {
    let list: Vec<String> = addrs.iter().map(IpAddr::to_string).collect();
    let lines = common::probe::run(ns, &list.join(","));
    addrs
        .iter()
        .map(|a| {
            let line = lines
                .iter()
                .find(|l| l.split(' ').nth(1) == Some(a.to_string().as_str()))
                .unwrap_or_else(|| panic!("no probe line for {a}: {lines:?}"));
            (*a, line.ends_with(" ok"))
        })
        .collect()
}

/// The set a network of this length goes to.
fn set_name(net: &IpNet) -> String {
    let family = if net.addr().is_ipv4() { 4 } else { 6 };
    format!("v{family}n{}", net.prefix_len())
}

async fn every_length_from_its_own_set(v6: bool) {
    let ns = NetNs::new(if v6 { "sets6" } else { "sets4" });
    let nets = networks(v6);
    let mut batch = String::new();
    for (_, inside, outside) in &nets {
        for a in [inside, outside] {
            match v6 {
                true => batch.push_str(&format!("address add {a}/128 dev lo nodad\n")),
                false => batch.push_str(&format!("address add {a}/32 dev lo\n")),
            }
        }
    }
    let path = std::env::temp_dir().join(format!("fbt-netsets-{}-{v6}.batch", std::process::id()));
    std::fs::write(&path, batch).unwrap();
    ns.run(&["ip", "-batch", path.to_str().unwrap()]);
    let _ = std::fs::remove_file(&path);

    let opts = NftOptions {
        action: Action::Reject,
        command: ["ip", "netns", "exec", &ns.name, "nft"].map(String::from).to_vec(),
        ..NftOptions::default()
    };
    let mut e = Enforcer::nft(opts).unwrap();
    let now = now_ms();
    e.init(now).await.unwrap();
    let everyone: Vec<IpAddr> = nets.iter().flat_map(|(_, i, o)| [*i, *o]).collect();
    assert!(probe(&ns, &everyone).iter().all(|(_, ok)| *ok), "all open before a ban");

    let bans: Vec<Element> = nets
        .iter()
        .map(|(net, _, _)| Element {
            net: *net,
            until: Until::At(now + HOUR),
        })
        .collect();
    e.add(&bans, now).await.unwrap();
    for (net, _, _) in &nets {
        let held: Vec<String> = nft_set_elements(&ns, "fleetban", &set_name(net))
            .into_iter()
            .map(|(el, _)| el)
            .collect();
        assert_eq!(held, [net.network().to_string()], "{net} alone in its plain set");
    }
    for ((addr, ok), i) in probe(&ns, &everyone).into_iter().zip(0..) {
        let net = nets[i / 2].0;
        assert_eq!(ok, i % 2 == 1, "{addr}: the ban of {net} drops inside, not outside");
    }

    // Unban every other length: exactly those open again.
    let (lifted, kept): (Vec<_>, Vec<_>) = nets.iter().partition(|(net, _, _)| net.prefix_len() % 2 == 1);
    let lift: Vec<IpNet> = lifted.iter().map(|(net, _, _)| *net).collect();
    e.remove(&lift, now_ms()).await.unwrap();
    for (net, _, _) in &lifted {
        assert!(
            nft_set_elements(&ns, "fleetban", &set_name(net)).is_empty(),
            "{net} unbanned"
        );
    }
    for (net, _, _) in &kept {
        assert_eq!(nft_set_elements(&ns, "fleetban", &set_name(net)).len(), 1, "{net} kept");
    }
    for ((addr, ok), i) in probe(&ns, &everyone).into_iter().zip(0..) {
        let net = nets[i / 2].0;
        let banned = net.prefix_len() % 2 == 0 && i % 2 == 0;
        assert_eq!(ok, !banned, "{addr} after unbanning the odd lengths ({net})");
    }

    // A restarted enforcer reads the sets back: nothing to add or remove.
    let mut again = Enforcer::nft(NftOptions {
        action: Action::Reject,
        command: ["ip", "netns", "exec", &ns.name, "nft"].map(String::from).to_vec(),
        ..NftOptions::default()
    })
    .unwrap();
    again.init(now_ms()).await.unwrap();
    let want: Vec<Element> = kept
        .iter()
        .map(|(net, _, _)| Element {
            net: *net,
            until: Until::At(now + HOUR),
        })
        .collect();
    let stats = again.replace_all(&want, now_ms()).await.unwrap();
    assert_eq!(
        (stats.added, stats.removed, stats.unchanged),
        (0, 0, kept.len()),
        "{stats:?}"
    );
}

#[tokio::test]
async fn every_ipv4_length_is_enforced_from_its_plain_set() {
    every_length_from_its_own_set(false).await;
}

#[tokio::test]
async fn every_ipv6_length_is_enforced_from_its_plain_set() {
    every_length_from_its_own_set(true).await;
}
