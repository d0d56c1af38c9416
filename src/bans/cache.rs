//! This host's view of the ban list: who is banned until when. Filled from
//! the list at start, then from the events and our own decisions. The hot
//! path asks it whether a hit's client is banned at the hit's time, so a
//! banned client's hits are not counted (docs/design.md §2); the HTTP
//! endpoint asks it which bans cover an address ([`BanCache::covering`]).
//!
//! One view per process, shared ([`SharedView`]): the pipeline writes it
//! (its own decisions, the fleet's changes) and the endpoint reads the same
//! one, so a million bans are held once, compactly ([`NetMap`] of [`End`]).

use std::net::IpAddr;
use std::sync::{Arc, RwLock, RwLockReadGuard, RwLockWriteGuard};

use ipnet::IpNet;

use super::netmap::NetMap;
use crate::enforce::{End, Until};

#[derive(Clone, Debug, Default)]
pub struct BanCache(NetMap<End>);

impl BanCache {
    pub fn insert(&mut self, net: IpNet, until: Until) {
        self.0.insert(net, End::of(until));
    }

    pub fn remove(&mut self, net: &IpNet) {
        self.0.remove(net);
    }

    /// Replaces the whole view (after a reconcile).
    pub fn replace(&mut self, entries: impl IntoIterator<Item = (IpNet, Until)>) {
        *self = BanCache::built(entries);
    }

    /// A view of `entries`.
    pub fn built(entries: impl IntoIterator<Item = (IpNet, Until)>) -> BanCache {
        BanCache(entries.into_iter().map(|(n, u)| (n, End::of(u))).collect())
    }

    /// When the last ban covering the client `key` ends (its own, or a wider
    /// network's); None if it has none.
    pub fn until(&self, key: &IpNet) -> Option<Until> {
        self.0.holding(key, key.prefix_len()).map(|(_, e)| e.until()).max()
    }

    /// When the last ban covering the address `addr` ends, whatever its
    /// prefix: an IPv4 address or network, an IPv6 client prefix, a single
    /// IPv6 address, any wider network. IPv4-mapped IPv6 is its IPv4
    /// address. None if no ban covers it.
    pub fn covering(&self, addr: IpAddr) -> Option<Until> {
        let net = IpNet::from(crate::addr::normalize(addr));
        self.0.holding(&net, net.max_prefix_len()).map(|(_, e)| e.until()).max()
    }

    /// The ban of exactly `net`, if it has one.
    pub fn get(&self, net: &IpNet) -> Option<Until> {
        self.0.get(net).map(|e| e.until())
    }

    /// The bans of wider networks than `net` that cover it (`unban` says
    /// which still block an address it lifted).
    pub fn wider(&self, net: &IpNet) -> Vec<(IpNet, Until)> {
        match net.prefix_len() {
            0 => Vec::new(),
            len => self.0.holding(net, len - 1).map(|(n, e)| (n, e.until())).collect(),
        }
    }

    /// Whether the client `key` is banned at `at_ms`.
    pub fn is_banned(&self, key: &IpNet, at_ms: i64) -> bool {
        self.until(key).is_some_and(|u| u > Until::At(at_ms))
    }

    pub fn len(&self) -> usize {
        self.0.len()
    }

    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    /// Forgets bans that ended before `now_ms` (their tables shrink).
    pub fn expire(&mut self, now_ms: i64) {
        self.0.retain(|e| e.until() > Until::At(now_ms));
    }

    pub fn entries(&self) -> Vec<(IpNet, Until)> {
        let mut out = Vec::with_capacity(self.len());
        out.extend(self.0.iter().map(|(n, e)| (n, e.until())));
        out
    }
}

/// The one view of a process, shared by its writer (the ban owner, on the
/// pipeline) and its readers (the endpoint, `status`). Writes hold the
/// lock for a few entries or to swap in a view built beside it; reads for
/// one lookup.
#[derive(Clone, Default)]
pub struct SharedView(Arc<RwLock<BanCache>>);

impl SharedView {
    pub fn read(&self) -> RwLockReadGuard<'_, BanCache> {
        self.0.read().unwrap_or_else(|e| e.into_inner())
    }

    pub fn write(&self) -> RwLockWriteGuard<'_, BanCache> {
        self.0.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `new` in place; the old view is returned, to be dropped
    /// outside the lock.
    pub fn swap(&self, new: BanCache) -> BanCache {
        std::mem::replace(&mut *self.write(), new)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The view's entries carry no padding: an IPv4 ban 12 bytes, an IPv6
    /// /64 16, a longer IPv6 prefix 24 (a `u64` or `u128` key aligned them
    /// on 8 or 16).
    #[test]
    fn a_ban_of_the_view_takes_its_key_and_end() {
        assert_eq!(NetMap::<End>::entry_bytes(), [12, 16, 24]);
    }

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
        assert_eq!(c.len(), 2, "the /48 and the IPv4 address");
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
