//! What is enforced for an address: decided here, once, and read by every
//! path that enforces or explains. The inputs are the ban list, the
//! blocklists and the never-banned set ([`never`]); the outputs are
//! - [`cover`]: what a ban puts into the firewall (the whole network, the
//!   networks around the never-banned addresses inside it, or nothing),
//!   which the enforcer writes to nft;
//! - [`verdict`]: for one address, never banned (and why), banned, dropped
//!   by a blocklist, or open, in that precedence, which `GET /check`,
//!   `explain`, `bans` and `test` answer from.
//!
//! The two agree by construction: an address is in a ban's cover exactly
//! when the ban holds it and the never-banned set does not (proptest
//! below), and a blocklist is cut around the same set before it is loaded.

pub mod never;

use std::net::IpAddr;

use ipnet::IpNet;

pub use never::{Kind, NeverBanned, Own, Why};

/// What a ban of one network puts into the firewall.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Cover {
    /// The network itself: nothing never-banned inside.
    Whole,
    /// The networks around the never-banned addresses inside it, which stay
    /// reachable (sorted, disjoint, their union the ban minus the set).
    Around(Vec<IpNet>),
    /// Nothing: the never-banned set holds all of it.
    Spared(Why),
}

/// What banning `net` enforces, given `never`.
pub fn cover(net: &IpNet, never: &NeverBanned) -> Cover {
    let net = crate::addr::canonical(net.trunc());
    if !never.overlaps(&net) {
        return Cover::Whole;
    }
    if let Some(why) = never.holding(&net) {
        return Cover::Spared(why);
    }
    let pieces = crate::blocklist::subtract(&[net], never.nets()).nets;
    match never.overlapping(&net).next() {
        // Several entries together can hold all of it.
        Some(why) if pieces.is_empty() => Cover::Spared(why),
        _ => Cover::Around(pieces),
    }
}

/// What is enforced for one address.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Verdict<B, K> {
    /// Never dropped, whatever bans or blocklists say.
    Never(Why),
    /// Dropped by a ban in force (what the caller's lookup found).
    Banned(B),
    /// Dropped by a blocklist (what the caller's lookup found).
    Blocked(K),
    /// Not dropped.
    Open,
}

impl<B, K> Verdict<B, K> {
    /// Whether packets (and checks) of the address are dropped.
    pub fn drops(&self) -> bool {
        matches!(self, Verdict::Banned(_) | Verdict::Blocked(_))
    }
}

/// The verdict for `a` (IPv4-mapped IPv6 as IPv4): the never-banned set
/// first, then `ban` (the ban in force covering it, if any), then `block`
/// (the blocklist network holding it). The lookups run only when needed.
pub fn verdict<B, K>(
    a: IpAddr,
    never: &NeverBanned,
    ban: impl FnOnce(IpAddr) -> Option<B>,
    block: impl FnOnce(IpAddr) -> Option<K>,
) -> Verdict<B, K> {
    let a = crate::addr::normalize(a);
    if never.contains(a) {
        if let Some(why) = never.why(a) {
            return Verdict::Never(why);
        }
    }
    if let Some(b) = ban(a) {
        return Verdict::Banned(b);
    }
    match block(a) {
        Some(k) => Verdict::Blocked(k),
        None => Verdict::Open,
    }
}

/// Networks asked per address by binary search: the blocklists' union, as
/// sorted disjoint ranges per family (8 bytes an IPv4 range).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetRanges {
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl NetRanges {
    pub fn new(nets: &[IpNet]) -> NetRanges {
        let mut r = NetRanges::default();
        for n in nets.iter().map(|n| crate::addr::canonical(n.trunc())) {
            match n {
                IpNet::V4(n) => r.v4.push((n.network().to_bits(), n.broadcast().to_bits())),
                IpNet::V6(n) => r.v6.push((n.network().to_bits(), n.broadcast().to_bits())),
            }
        }
        merge(&mut r.v4, |a| a.checked_add(1));
        merge(&mut r.v6, |a| a.checked_add(1));
        r
    }

    /// Whether a network holds `a` (IPv4-mapped IPv6 as IPv4).
    pub fn contains(&self, a: IpAddr) -> bool {
        match crate::addr::normalize(a) {
            IpAddr::V4(a) => holds(&self.v4, a.to_bits()),
            IpAddr::V6(a) => holds(&self.v6, a.to_bits()),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }
}

/// Sorts `ranges` and merges those that overlap or touch (`succ`: the
/// next address, none past the last).
fn merge<T: Ord + Copy>(ranges: &mut Vec<(T, T)>, succ: fn(T) -> Option<T>) {
    ranges.sort_unstable();
    let mut out: Vec<(T, T)> = Vec::with_capacity(ranges.len());
    for &(lo, hi) in ranges.iter() {
        match out.last_mut() {
            Some(last) if lo <= last.1 || succ(last.1) == Some(lo) => last.1 = last.1.max(hi),
            _ => out.push((lo, hi)),
        }
    }
    *ranges = out;
}

fn holds<T: Ord + Copy>(ranges: &[(T, T)], a: T) -> bool {
    // The last range starting at or before `a`.
    let i = ranges.partition_point(|&(lo, _)| lo <= a);
    i > 0 && ranges[i - 1].1 >= a
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    use crate::addr::net;

    #[test]
    fn a_ban_is_whole_around_or_spared() {
        let never = NeverBanned::only(&[net("203.0.113.10/32"), net("10.0.0.0/8")]);
        assert_eq!(cover(&net("192.0.2.0/24"), &never), Cover::Whole);
        let Cover::Around(pieces) = cover(&net("203.0.113.0/24"), &never) else {
            panic!("split")
        };
        assert_eq!(pieces.len(), 8);
        assert!(pieces
            .iter()
            .all(|p| !p.contains(&"203.0.113.10".parse::<IpAddr>().unwrap())));
        assert_eq!(
            cover(&net("10.1.2.3/32"), &never),
            Cover::Spared(Why {
                kind: Kind::Allow,
                net: net("10.0.0.0/8")
            })
        );
        // Held by two entries together.
        let halves = NeverBanned::only(&[net("198.51.100.0/25"), net("198.51.100.128/25")]);
        assert!(matches!(cover(&net("198.51.100.0/24"), &halves), Cover::Spared(_)));
        // A mapped spelling is its IPv4 network.
        assert!(matches!(cover(&net("::ffff:10.0.0.0/120"), &never), Cover::Spared(_)));
    }

    #[test]
    fn never_banned_wins_then_bans_then_blocklists() {
        let never = NeverBanned::only(&[net("203.0.113.10/32")]);
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        let v = |addr: &str, ban: Option<u8>, block: Option<u8>| verdict(a(addr), &never, |_| ban, |_| block);
        assert!(matches!(v("203.0.113.10", Some(1), Some(2)), Verdict::Never(_)));
        assert!(matches!(v("::ffff:203.0.113.10", Some(1), None), Verdict::Never(_)));
        assert_eq!(v("203.0.113.11", Some(1), Some(2)), Verdict::Banned(1));
        assert_eq!(v("203.0.113.11", None, Some(2)), Verdict::Blocked(2));
        assert_eq!(v("203.0.113.11", None, None), Verdict::Open);
        assert!(v("203.0.113.11", None, Some(2)).drops());
        assert!(!v("203.0.113.10", Some(1), None).drops());
    }

    #[test]
    fn ranges_merge_and_find() {
        let r = NetRanges::new(&[
            net("10.0.0.0/25"),
            net("10.0.0.128/25"),
            net("10.0.1.0/24"),
            net("255.255.255.255/32"),
            net("::ffff:192.0.2.0/120"),
            net("2001:db8::/32"),
        ]);
        assert_eq!(r.v4.len(), 3, "{:?}", r.v4);
        let a = |s: &str| s.parse::<IpAddr>().unwrap();
        for yes in [
            "10.0.0.0",
            "10.0.1.255",
            "255.255.255.255",
            "192.0.2.9",
            "::ffff:10.0.0.7",
            "2001:db8:ffff::1",
        ] {
            assert!(r.contains(a(yes)), "{yes}");
        }
        for no in ["9.255.255.255", "10.0.2.0", "192.0.3.0", "2001:db9::", "::"] {
            assert!(!r.contains(a(no)), "{no}");
        }
    }

    fn any_net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<u32>(), 0u8..=32).prop_map(|(a, p)| IpNet::new(Ipv4Addr::from(a).into(), p).unwrap().trunc()),
            (any::<u128>(), 0u8..=128).prop_map(|(a, p)| IpNet::new(Ipv6Addr::from(a).into(), p).unwrap().trunc()),
            // IPv4-mapped spellings.
            (any::<u32>(), 96u8..=128).prop_map(|(a, p)| {
                IpNet::new(Ipv4Addr::from(a).to_ipv6_mapped().into(), p)
                    .unwrap()
                    .trunc()
            }),
        ]
    }

    /// Addresses at and around the edges of `nets`, in both spellings.
    fn edges(nets: &[IpNet], noise: u32) -> Vec<IpAddr> {
        let mut out = Vec::new();
        for n in nets {
            let (lo, hi) = match n {
                IpNet::V4(n) => (IpAddr::V4(n.network()), IpAddr::V4(n.broadcast())),
                IpNet::V6(n) => (IpAddr::V6(n.network()), IpAddr::V6(n.broadcast())),
            };
            for a in [lo, hi] {
                match a {
                    IpAddr::V4(v) => {
                        let b = v.to_bits();
                        for x in [b.wrapping_sub(1), b, b.wrapping_add(1), b ^ (noise & 0xff)] {
                            out.push(IpAddr::V4(Ipv4Addr::from(x)));
                            out.push(IpAddr::V6(Ipv4Addr::from(x).to_ipv6_mapped()));
                        }
                    }
                    IpAddr::V6(v) => {
                        let b = v.to_bits();
                        for x in [b.wrapping_sub(1), b, b.wrapping_add(1), b ^ u128::from(noise & 0xff)] {
                            out.push(IpAddr::V6(Ipv6Addr::from(x)));
                        }
                    }
                }
            }
        }
        out
    }

    proptest! {
        /// The cover holds exactly the addresses the ban holds and the set
        /// does not; the verdict agrees with it; the ranges with `contains`.
        #[test]
        fn cover_verdict_and_ranges_agree(
            bans in prop::collection::vec(any_net(), 1..4),
            never in prop::collection::vec(any_net(), 0..5),
            noise in any::<u32>(),
        ) {
            let set = NeverBanned::only(&never);
            let ranges = NetRanges::new(&bans);
            let canon: Vec<IpNet> = bans.iter().map(|b| crate::addr::canonical(*b)).collect();
            let mut all = bans.clone();
            all.extend(&never);
            for a in edges(&all, noise) {
                let n = crate::addr::normalize(a);
                let held = canon.iter().any(|b| b.contains(&n));
                prop_assert_eq!(ranges.contains(a), held, "ranges {}", a);
                let in_cover = canon.iter().any(|b| match cover(b, &set) {
                    Cover::Whole => b.contains(&n),
                    Cover::Around(p) => p.iter().any(|p| p.contains(&n)),
                    Cover::Spared(_) => false,
                });
                prop_assert_eq!(in_cover, held && !set.contains(a), "cover {}", a);
                let v = verdict(a, &set, |a| canon.iter().find(|b| b.contains(&a)).copied(), |_| None::<()>);
                prop_assert_eq!(v.drops(), in_cover, "verdict {}", a);
            }
        }
    }
}
