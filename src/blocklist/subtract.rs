//! Merging listed networks and taking the never-banned ones out of them.
//!
//! `allow:`, loopback, `proxies:` and the host's own addresses always win
//! over a blocklist. An interval set cannot say "this range except that
//! address", so a listed prefix that holds an allowed network is split into
//! the prefixes that cover the rest: 10.0.0.0/24 minus 10.0.0.5 is the eight
//! prefixes /25, /26, ... /32 around it. A listed prefix inside an allowed
//! one is dropped whole.

use ipnet::IpNet;

/// What [`subtract`] did.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Subtracted {
    /// The remaining networks, merged and sorted.
    pub nets: Vec<IpNet>,
    /// Listed networks that held an allowed one and were split.
    pub split: usize,
    /// Listed networks wholly inside an allowed one, dropped.
    pub dropped: usize,
}

/// Merges `listed` (overlaps and adjacent prefixes) and removes every
/// address of `allowed` from it.
pub fn subtract(listed: &[IpNet], allowed: &[IpNet]) -> Subtracted {
    let listed = IpNet::aggregate(&listed.to_vec());
    let allowed = IpNet::aggregate(&allowed.to_vec());
    let mut out = Subtracted::default();
    let mut nets = Vec::with_capacity(listed.len());
    for net in listed {
        // Allowed nets are few (a config's lists); a linear scan per listed
        // net costs ~1 ms per 100k listed and 10 allowed.
        let inside: Vec<&IpNet> = allowed.iter().filter(|a| overlaps(&net, a)).collect();
        if inside.is_empty() {
            nets.push(net);
            continue;
        }
        if inside.iter().any(|a| a.contains(&net)) {
            out.dropped += 1;
            continue;
        }
        out.split += 1;
        let mut parts = vec![net];
        for a in inside {
            parts = parts.into_iter().flat_map(|p| minus(p, a)).collect();
        }
        nets.extend(parts);
    }
    out.nets = IpNet::aggregate(&nets);
    out
}

/// Whether two prefixes share an address (one holds the other).
pub fn overlaps(a: &IpNet, b: &IpNet) -> bool {
    a.contains(b) || b.contains(a)
}

/// `net` without `hole`: `net` if they are apart, nothing if `hole` holds
/// it, else the sibling of each of `hole`'s ancestors below `net`.
fn minus(net: IpNet, hole: &IpNet) -> Vec<IpNet> {
    if !overlaps(&net, hole) {
        return vec![net];
    }
    if hole.contains(&net) {
        return Vec::new();
    }
    let mut out = Vec::with_capacity(usize::from(hole.prefix_len() - net.prefix_len()));
    for len in net.prefix_len() + 1..=hole.prefix_len() {
        // Both exist: len is within net's family's range.
        let (Ok(ancestor), Ok(parent)) = (IpNet::new(hole.addr(), len), IpNet::new(hole.addr(), len - 1)) else {
            continue;
        };
        let ancestor = ancestor.trunc();
        if let Ok(mut halves) = parent.trunc().subnets(len) {
            if let Some(sibling) = halves.find(|h| *h != ancestor) {
                out.push(sibling);
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;
    use std::net::{IpAddr, Ipv4Addr};

    use crate::addr::net as n;

    #[test]
    fn a_hole_in_a_slash_24_leaves_eight_prefixes() {
        let r = subtract(&[n("10.0.0.0/24")], &[n("10.0.0.5/32")]);
        assert_eq!(r.split, 1);
        assert_eq!(r.nets.len(), 8);
        assert!(!r.nets.iter().any(|x| x.contains(&n("10.0.0.5/32"))));
        assert!(r.nets.iter().any(|x| x.contains(&n("10.0.0.4/32"))));
        let total: u64 = r.nets.iter().map(|x| 1u64 << (32 - x.prefix_len())).sum();
        assert_eq!(total, 255);
    }

    #[test]
    fn merges_and_drops() {
        let r = subtract(
            &[
                n("10.0.0.0/25"),
                n("10.0.0.128/25"),
                n("10.0.0.7/32"),
                n("127.0.0.0/16"),
                n("2001:db8::/32"),
            ],
            &[n("127.0.0.0/8"), n("::1/128")],
        );
        assert_eq!(r.nets, vec![n("10.0.0.0/24"), n("2001:db8::/32")]);
        assert_eq!((r.split, r.dropped), (0, 1));
    }

    // Small space (10.0.0.0/16) so random holes and addresses meet.
    fn arb_v4(min_len: u8) -> impl Strategy<Value = IpNet> {
        (any::<u16>(), min_len..=32u8).prop_map(|(low, len)| {
            IpNet::new(IpAddr::V4(Ipv4Addr::from(0x0a00_0000 | u32::from(low))), len)
                .unwrap()
                .trunc()
        })
    }

    proptest! {
        /// The result holds exactly the addresses listed and not allowed.
        #[test]
        fn result_is_listed_minus_allowed(
            listed in prop::collection::vec(arb_v4(16), 0..12),
            allowed in prop::collection::vec(arb_v4(18), 0..6),
            probes in prop::collection::vec(any::<u16>(), 64),
        ) {
            let r = subtract(&listed, &allowed);
            let has = |set: &[IpNet], a: IpNet| set.iter().any(|x| x.contains(&a));
            let mut probes: Vec<IpNet> = probes.iter().map(|p| n(&format!("10.0.{}.{}/32", p >> 8, p & 0xff))).collect();
            // Also the edges of every hole and listed net.
            for x in listed.iter().chain(&allowed) {
                probes.push(IpNet::from(x.network()));
                probes.push(IpNet::from(x.broadcast()));
            }
            for a in probes {
                let want = has(&listed, a) && !has(&allowed, a);
                prop_assert_eq!(has(&r.nets, a), want, "{} listed {:?} allowed {:?} got {:?}", a, listed, allowed, r.nets);
            }
            // Interval-set ready: no two results overlap.
            for (i, x) in r.nets.iter().enumerate() {
                for y in &r.nets[i + 1..] {
                    prop_assert!(!overlaps(x, y), "{} {}", x, y);
                }
            }
        }
    }
}
