//! Networks that are never counted and never banned: loopback, this host's
//! own addresses, and the configured `allow:` list.

use std::net::IpAddr;

use ipnet::IpNet;

use crate::addr::NetSet;

#[derive(Clone, Debug, Default)]
pub struct AllowList(NetSet);

impl AllowList {
    /// Loopback, the host's interface addresses and `configured` (`allow:`
    /// and `proxies:`, [`crate::config::Config::never_banned`]).
    pub fn new(configured: &[IpNet]) -> AllowList {
        let mut nets = crate::addr::loopback().to_vec();
        nets.extend(local_addresses().into_iter().map(IpNet::from));
        nets.extend_from_slice(configured);
        AllowList::only(&nets)
    }

    /// Loopback and `configured`, not this host's addresses: for decisions
    /// about other hosts' logs (`fleetban test`) and for the CLI, which
    /// decides for the whole fleet.
    pub fn fleet(configured: &[IpNet]) -> AllowList {
        let mut nets = crate::addr::loopback().to_vec();
        nets.extend_from_slice(configured);
        AllowList::only(&nets)
    }

    /// Only the given networks (tests).
    pub fn only(nets: &[IpNet]) -> AllowList {
        AllowList(NetSet::new(nets))
    }

    /// Whether a network of the list holds `a` (IPv4-mapped IPv6 as IPv4),
    /// as `IpNet::contains` decides.
    #[inline]
    pub fn contains(&self, a: IpAddr) -> bool {
        self.0.contains(a)
    }

    /// The allowed networks.
    pub fn nets(&self) -> &[IpNet] {
        self.0.nets()
    }

    /// True when banning `net` would drop any allowed address.
    pub fn overlaps(&self, net: &IpNet) -> bool {
        self.0.overlaps(net)
    }
}

/// Loopback, this host's addresses now and `configured`, as networks: what
/// a blocklist never drops (`daemon::blocklist` subtracts them).
pub fn never_dropped(configured: &[IpNet]) -> Vec<IpNet> {
    let mut nets = crate::addr::loopback().to_vec();
    nets.extend(local_addresses().into_iter().map(IpNet::from));
    nets.extend_from_slice(configured);
    nets
}

/// This host's own addresses as they change (DHCP, a keepalived VIP): the
/// enforcer reads the interfaces again before each batch of bans and every
/// few seconds (`refresh`, one getifaddrs), so that an address added after
/// the start is never put into nft. The pipeline's [`AllowList`] is the one
/// built at start.
#[derive(Debug)]
pub struct OwnAddresses {
    /// `allow:` and `proxies:`, kept to rebuild the list.
    configured: Vec<IpNet>,
    /// The interfaces' addresses at the last read, sorted.
    seen: Vec<IpAddr>,
}

impl OwnAddresses {
    /// The current addresses, and the allow list they make with loopback
    /// and `configured` (as [`AllowList::new`]).
    pub fn new(configured: &[IpNet]) -> (OwnAddresses, AllowList) {
        let mut own = OwnAddresses {
            configured: configured.to_vec(),
            seen: Vec::new(),
        };
        let allow = own.build(sorted(local_addresses()));
        (own, allow)
    }

    /// Reads the interfaces again: when the addresses changed, the new
    /// allow list and the addresses that appeared since the last read.
    pub fn refresh(&mut self) -> Option<(AllowList, Vec<IpAddr>)> {
        self.refresh_from(local_addresses())
    }

    fn refresh_from(&mut self, now: Vec<IpAddr>) -> Option<(AllowList, Vec<IpAddr>)> {
        let now = sorted(now);
        if now == self.seen {
            return None;
        }
        let added = now
            .iter()
            .filter(|a| self.seen.binary_search(a).is_err())
            .copied()
            .collect();
        Some((self.build(now), added))
    }

    fn build(&mut self, addrs: Vec<IpAddr>) -> AllowList {
        let mut nets = crate::addr::loopback().to_vec();
        nets.extend(addrs.iter().copied().map(IpNet::from));
        nets.extend_from_slice(&self.configured);
        self.seen = addrs;
        AllowList::only(&nets)
    }
}

fn sorted(mut v: Vec<IpAddr>) -> Vec<IpAddr> {
    v.sort_unstable();
    v.dedup();
    v
}

/// The addresses of this host's interfaces (getifaddrs).
fn local_addresses() -> Vec<IpAddr> {
    let mut out = Vec::new();
    // SAFETY: getifaddrs fills a linked list we only read and then free.
    unsafe {
        let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
        if libc::getifaddrs(&mut head) != 0 {
            return out;
        }
        let mut cur = head;
        while !cur.is_null() {
            let sa = (*cur).ifa_addr;
            if !sa.is_null() {
                match i32::from((*sa).sa_family) {
                    libc::AF_INET => {
                        let sin = &*(sa as *const libc::sockaddr_in);
                        out.push(IpAddr::from(u32::from_be(sin.sin_addr.s_addr).to_be_bytes()));
                    }
                    libc::AF_INET6 => {
                        let sin6 = &*(sa as *const libc::sockaddr_in6);
                        out.push(IpAddr::from(sin6.sin6_addr.s6_addr));
                    }
                    _ => {}
                }
            }
            cur = (*cur).ifa_next;
        }
        libc::freeifaddrs(head);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_address_that_appears_is_allowed_and_named_once() {
        let (mut own, _) = OwnAddresses::new(&[]);
        let a: IpAddr = "10.213.99.7".parse().unwrap();
        let mut now = own.seen.clone();
        assert!(own.refresh_from(now.clone()).is_none(), "unchanged");
        now.push(a);
        let (allow, added) = own.refresh_from(now.clone()).expect("changed");
        assert_eq!(added, vec![a]);
        assert!(allow.contains(a) && allow.contains("127.0.0.1".parse().unwrap()));
        assert!(own.refresh_from(now).is_none(), "named once");
        let (allow, added) = own.refresh_from(Vec::new()).expect("gone");
        assert!(added.is_empty() && !allow.contains(a));
    }

    #[test]
    fn loopback_and_configured() {
        let a = AllowList::new(&["192.0.2.0/24".parse().unwrap()]);
        assert!(a.contains("127.0.0.1".parse().unwrap()));
        assert!(a.contains("::1".parse().unwrap()));
        assert!(a.contains("192.0.2.77".parse().unwrap()));
        assert!(a.contains("::ffff:192.0.2.77".parse().unwrap()));
        assert!(!a.contains("198.51.100.1".parse().unwrap()));
        assert!(a.overlaps(&"192.0.0.0/16".parse().unwrap()));
    }

    use std::net::{Ipv4Addr, Ipv6Addr};

    use proptest::prelude::*;

    fn net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<[u8; 4]>(), 0u8..=32).prop_map(|(a, p)| IpNet::new(IpAddr::from(a), p).unwrap()),
            (any::<[u8; 16]>(), 0u8..=128).prop_map(|(a, p)| IpNet::new(IpAddr::from(a), p).unwrap()),
        ]
    }

    proptest! {
        /// The integer masks decide as `IpNet::contains` on the normalized
        /// address, addresses drawn near the networks as well as anywhere.
        #[test]
        fn contains_agrees_with_ipnet(
            nets in prop::collection::vec(net(), 0..6),
            near in prop::collection::vec((any::<prop::sample::Index>(), any::<u128>()), 1..20),
            far in any::<[u8; 16]>(),
        ) {
            let list = AllowList::only(&nets);
            let mut addrs = vec![IpAddr::from(far), IpAddr::from([far[0], far[1], far[2], far[3]])];
            for (i, noise) in near {
                if nets.is_empty() {
                    break;
                }
                // The network's address with a few low bits changed.
                let bits = (noise % 5) as u32;
                let change = (noise >> 8) & ((1 << bits) - 1);
                addrs.push(match nets[i.index(nets.len())] {
                    IpNet::V4(n) => IpAddr::V4(Ipv4Addr::from_bits(n.addr().to_bits() ^ change as u32)),
                    IpNet::V6(n) => IpAddr::V6(Ipv6Addr::from_bits(n.addr().to_bits() ^ change)),
                });
            }
            for a in addrs {
                let n = crate::addr::normalize(a);
                prop_assert_eq!(list.contains(a), nets.iter().any(|net| net.contains(&n)), "{}", a);
            }
        }
    }
}
