//! This host's view of the ban list: who is banned until when. Filled from
//! the list at start, then from the events and our own decisions. The hot
//! path asks it whether a hit's client is banned at the hit's time, so a
//! banned client's hits are not counted (docs/design.md §2); the HTTP
//! endpoint asks it which bans cover an address ([`BanCache::covering`]).

use std::collections::HashMap;
use std::net::IpAddr;

use ipnet::IpNet;

use crate::enforce::Until;

/// Bans at least this long are kept in the exact map and looked up per
/// length present (an address, an IPv6 client prefix, the networks of
/// `limit.key: network` and `escalate_network`); shorter ones are `wide`,
/// few, scanned linearly.
const V4_EXACT_MIN: u8 = 8;
const V6_EXACT_MIN: u8 = 48;

#[derive(Clone)]
pub struct BanCache {
    /// Bans of an exact length: addresses, client prefixes, networks.
    exact: HashMap<IpNet, Until, foldhash::fast::RandomState>,
    /// How many IPv4 entries of `exact` have each prefix length: the
    /// lengths an address is looked up at (usually 32, and 24 with
    /// network rules).
    v4_lengths: [u32; 33],
    /// The same for IPv6 (usually only `ipv6_prefix`, and 128 for manual
    /// bans of one address).
    v6_lengths: [u32; 129],
    /// Wider networks (an operator's /4, a /32 of IPv6); few.
    wide: Vec<(IpNet, Until)>,
}

impl Default for BanCache {
    fn default() -> BanCache {
        BanCache {
            exact: HashMap::default(),
            v4_lengths: [0; 33],
            v6_lengths: [0; 129],
            wide: Vec::new(),
        }
    }
}

fn is_exact(net: &IpNet) -> bool {
    match net {
        IpNet::V4(n) => n.prefix_len() >= V4_EXACT_MIN,
        IpNet::V6(n) => n.prefix_len() >= V6_EXACT_MIN,
    }
}

impl BanCache {
    pub fn insert(&mut self, net: IpNet, until: Until) {
        let net = net.trunc();
        if is_exact(&net) {
            if self.exact.insert(net, until).is_none() {
                self.count_length(&net, 1);
            }
        } else {
            self.wide.retain(|(n, _)| *n != net);
            self.wide.push((net, until));
        }
    }

    pub fn remove(&mut self, net: &IpNet) {
        let net = &net.trunc();
        if is_exact(net) {
            if self.exact.remove(net).is_some() {
                self.count_length(net, -1);
            }
        } else {
            self.wide.retain(|(n, _)| n != net);
        }
    }

    fn count_length(&mut self, net: &IpNet, by: i32) {
        let c = match net {
            IpNet::V4(n) => &mut self.v4_lengths[usize::from(n.prefix_len())],
            IpNet::V6(n) => &mut self.v6_lengths[usize::from(n.prefix_len())],
        };
        *c = c.saturating_add_signed(by);
    }

    /// Replaces the whole view (after a reconcile).
    pub fn replace(&mut self, entries: impl IntoIterator<Item = (IpNet, Until)>) {
        *self = BanCache::default();
        for (n, u) in entries {
            self.insert(n, u);
        }
    }

    /// The exact-length bans of `net` and of the networks of each length
    /// present up to `max` that hold it, with their ends.
    fn exact_holding(&self, net: &IpNet, max: u8) -> impl Iterator<Item = (IpNet, Until)> + '_ {
        let (min, lengths): (u8, &[u32]) = match net {
            IpNet::V4(_) => (V4_EXACT_MIN, &self.v4_lengths),
            IpNet::V6(_) => (V6_EXACT_MIN, &self.v6_lengths),
        };
        let net = *net;
        (min..=max.min(net.prefix_len()))
            .filter(move |&len| lengths[usize::from(len)] > 0)
            .filter_map(move |len| {
                let p = IpNet::new(net.addr(), len).ok()?.trunc();
                self.exact.get(&p).map(|u| (p, *u))
            })
    }

    /// When the last ban covering the client `key` ends (its own, or a wider
    /// network's); None if it has none.
    pub fn until(&self, key: &IpNet) -> Option<Until> {
        let own = self.exact_holding(key, key.prefix_len()).map(|(_, u)| u).max();
        own.max(self.wide_covering(|n| n.contains(key)))
    }

    /// When the last ban covering the address `addr` ends, whatever its
    /// prefix: an IPv4 address or network, an IPv6 client prefix, a single
    /// IPv6 address, any wider network. IPv4-mapped IPv6 is its IPv4
    /// address. None if no ban covers it.
    pub fn covering(&self, addr: IpAddr) -> Option<Until> {
        let addr = crate::addr::normalize(addr);
        let net = IpNet::from(addr);
        let own = self.exact_holding(&net, net.max_prefix_len()).map(|(_, u)| u).max();
        own.max(self.wide_covering(|n| n.contains(&addr)))
    }

    /// The ban of exactly `net`, if it has one.
    pub fn get(&self, net: &IpNet) -> Option<Until> {
        let net = net.trunc();
        if is_exact(&net) {
            self.exact.get(&net).copied()
        } else {
            self.wide.iter().find(|(n, _)| *n == net).map(|(_, u)| *u)
        }
    }

    /// The bans of wider networks than `net` that cover it (`unban` says
    /// which still block an address it lifted).
    pub fn wider(&self, net: &IpNet) -> Vec<(IpNet, Until)> {
        let mut out: Vec<(IpNet, Until)> = self
            .wide
            .iter()
            .filter(|(n, _)| n != net && n.contains(net))
            .copied()
            .collect();
        if net.prefix_len() > 0 {
            out.extend(self.exact_holding(net, net.prefix_len() - 1));
        }
        out
    }

    /// The latest end of the wide bans `covers` accepts.
    fn wide_covering(&self, covers: impl Fn(&IpNet) -> bool) -> Option<Until> {
        self.wide.iter().filter(|(n, _)| covers(n)).map(|(_, u)| *u).max()
    }

    /// Whether the client `key` is banned at `at_ms`.
    pub fn is_banned(&self, key: &IpNet, at_ms: i64) -> bool {
        self.until(key).is_some_and(|u| u > Until::At(at_ms))
    }

    pub fn len(&self) -> usize {
        self.exact.len() + self.wide.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Forgets bans that ended before `now_ms`.
    pub fn expire(&mut self, now_ms: i64) {
        let live = |u: &Until| matches!(u, Until::Permanent) || matches!(u, Until::At(t) if *t > now_ms);
        let (v4, v6) = (&mut self.v4_lengths, &mut self.v6_lengths);
        self.exact.retain(|n, u| {
            let keep = live(u);
            match (keep, n) {
                (true, _) => {}
                (false, IpNet::V4(n)) => v4[usize::from(n.prefix_len())] -= 1,
                (false, IpNet::V6(n)) => v6[usize::from(n.prefix_len())] -= 1,
            }
            keep
        });
        self.wide.retain(|(_, u)| live(u));
    }

    pub fn entries(&self) -> Vec<(IpNet, Until)> {
        self.exact
            .iter()
            .map(|(n, u)| (*n, *u))
            .chain(self.wide.iter().copied())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exact_and_wide() {
        let mut c = BanCache::default();
        c.insert("192.0.2.1/32".parse().unwrap(), Until::At(1000));
        c.insert("198.51.100.0/24".parse().unwrap(), Until::Permanent);
        assert!(c.is_banned(&"192.0.2.1/32".parse().unwrap(), 999));
        assert!(!c.is_banned(&"192.0.2.1/32".parse().unwrap(), 1000));
        assert!(c.is_banned(&"198.51.100.7/32".parse().unwrap(), i64::MAX));
        c.remove(&"198.51.100.0/24".parse().unwrap());
        assert!(!c.is_banned(&"198.51.100.7/32".parse().unwrap(), 0));
    }

    use crate::addr::at;

    #[test]
    fn covering_finds_every_prefix_length() {
        let mut c = BanCache::default();
        c.insert("2001:db8:1:2::/64".parse().unwrap(), Until::At(10));
        c.insert("2001:db8:1:2::7/128".parse().unwrap(), Until::At(20));
        c.insert("2001:db8:9::/48".parse().unwrap(), Until::At(30));
        c.insert("2001:db8::/32".parse().unwrap(), Until::At(5));
        c.insert("192.0.2.1/32".parse().unwrap(), Until::Permanent);
        assert_eq!(c.covering(at("2001:db8:1:2::7")), Some(Until::At(20)));
        assert_eq!(c.covering(at("2001:db8:1:2::8")), Some(Until::At(10)));
        assert_eq!(c.covering(at("2001:db8:9:ffff::1")), Some(Until::At(30)));
        assert_eq!(c.covering(at("2001:db8:7::1")), Some(Until::At(5)));
        assert_eq!(c.covering(at("2001:db9::1")), None);
        assert_eq!(c.covering(at("::ffff:192.0.2.1")), Some(Until::Permanent));
        assert_eq!(c.covering(at("192.0.2.2")), None);
        // The client key asks for its own entry and wider ones only.
        assert_eq!(c.until(&"2001:db8:1:2::/64".parse().unwrap()), Some(Until::At(10)));
        c.remove(&"2001:db8:1:2::7/128".parse().unwrap());
        assert_eq!(c.covering(at("2001:db8:1:2::7")), Some(Until::At(10)));
        c.expire(15);
        assert_eq!(c.covering(at("2001:db8:1:2::7")), None);
        assert_eq!(c.v6_lengths.iter().sum::<u32>(), 1);
    }

    mod model {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

        use ipnet::IpNet;
        use proptest::prelude::*;

        use super::super::BanCache;
        use crate::enforce::Until;

        /// Networks and addresses drawn from a few bits of each family,
        /// so that bans and addresses meet.
        fn v4(bits: u8) -> Ipv4Addr {
            Ipv4Addr::new(198, 51, bits >> 4, bits & 0xf)
        }

        fn v6(bits: u8) -> Ipv6Addr {
            let b = u16::from(bits);
            Ipv6Addr::new(0x2001, 0xdb8, b >> 6, (b >> 4) & 3, 0, 0, 0, b & 0xf)
        }

        fn net() -> impl Strategy<Value = IpNet> {
            prop_oneof![
                (any::<u8>(), prop_oneof![4u8..8, 20u8..=32])
                    .prop_map(|(b, len)| IpNet::new(v4(b).into(), len).unwrap().trunc()),
                (any::<u8>(), prop_oneof![Just(64u8), Just(128u8), 30u8..=128]).prop_map(|(b, len)| IpNet::new(
                    v6(b).into(),
                    len
                )
                .unwrap()
                .trunc()),
            ]
        }

        fn addr() -> impl Strategy<Value = IpAddr> {
            prop_oneof![
                any::<u8>().prop_map(|b| IpAddr::V4(v4(b))),
                any::<u8>().prop_map(|b| IpAddr::V6(v6(b))),
                any::<u8>().prop_map(|b| IpAddr::V6(v4(b).to_ipv6_mapped())),
            ]
        }

        #[derive(Clone, Debug)]
        enum Op {
            Insert(IpNet, Until),
            Remove(IpNet),
            Expire(i64),
        }

        fn op() -> impl Strategy<Value = Op> {
            let until = prop_oneof![(0i64..100).prop_map(Until::At), Just(Until::Permanent)];
            prop_oneof![
                4 => (net(), until).prop_map(|(n, u)| Op::Insert(n, u)),
                1 => net().prop_map(Op::Remove),
                1 => (0i64..100).prop_map(Op::Expire),
            ]
        }

        proptest! {
            /// `covering` is "the latest end of any ban whose network
            /// contains the address", over inserts, removes and expiry.
            #[test]
            fn covering_is_any_ban_containing_the_address(ops in prop::collection::vec(op(), 0..60), probes in prop::collection::vec(addr(), 1..40), keys in prop::collection::vec(net(), 1..20)) {
                let mut cache = BanCache::default();
                let mut model: Vec<(IpNet, Until)> = Vec::new();
                for op in ops {
                    match op {
                        Op::Insert(n, u) => {
                            cache.insert(n, u);
                            model.retain(|(m, _)| *m != n);
                            model.push((n, u));
                        }
                        Op::Remove(n) => {
                            cache.remove(&n);
                            model.retain(|(m, _)| *m != n);
                        }
                        Op::Expire(now) => {
                            cache.expire(now);
                            model.retain(|(_, u)| *u > Until::At(now));
                        }
                    }
                }
                // Every banned network's first and last address, and others.
                    let edges = model.iter().flat_map(|(n, _)| [n.network(), n.broadcast()]);
                for a in probes.into_iter().chain(edges.collect::<Vec<_>>()) {
                    let a4 = crate::addr::normalize(a);
                    let want = model.iter().filter(|(n, _)| n.contains(&a4)).map(|(_, u)| *u).max();
                    prop_assert_eq!(cache.covering(a), want, "{}", a);
                }
                // `until` of a client key (an address, a prefix, a network)
                // and `wider`: the bans containing it, and those but its own.
                for k in keys.into_iter().chain(model.iter().map(|(n, _)| *n).collect::<Vec<_>>()) {
                    let want = model.iter().filter(|(n, _)| n.contains(&k)).map(|(_, u)| *u).max();
                    prop_assert_eq!(cache.until(&k), want, "{}", k);
                    let mut wider = cache.wider(&k);
                    wider.sort_unstable();
                    let mut want: Vec<(IpNet, Until)> = model.iter().filter(|(n, _)| *n != k && n.contains(&k)).copied().collect();
                    want.sort_unstable();
                    prop_assert_eq!(wider, want, "{}", k);
                }
                prop_assert_eq!(cache.len(), model.len());
            }
        }
    }
}
