//! Who is never banned: loopback, `allow:`, `proxies:` and, on a host, its
//! own addresses as they change. One set, [`NeverBanned`], that every path
//! asks: the scanner (never counted), the enforcer (never put into nft),
//! the decision endpoint (never denied), the blocklists (never dropped),
//! operators' bans (refused) and `explain` (why).
//!
//! On a running host the set follows the interfaces: [`Own`] reads them
//! (one getifaddrs) when asked, and publishes a new set through a watch
//! channel whenever they changed, so that every reader sees the same one.

use std::net::IpAddr;
use std::sync::Arc;

use ipnet::IpNet;
use tokio::sync::watch;

use crate::addr::{AddrText, NetSet};

/// Which part of the set holds an address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    Loopback,
    /// `allow:`.
    Allow,
    /// `proxies:`: banning one would cut off every client behind it.
    Proxy,
    /// One of this host's interface addresses.
    Own,
}

/// Why an address (or a network) is never banned: the entry of the set that
/// holds it.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Why {
    pub kind: Kind,
    pub net: IpNet,
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let net = AddrText(&self.net);
        match self.kind {
            Kind::Loopback => write!(f, "loopback ({})", self.net),
            Kind::Allow => write!(f, "allow: {net}"),
            Kind::Proxy => write!(f, "proxies: {net} (a trusted proxy)"),
            Kind::Own => write!(f, "this host's own address ({net})"),
        }
    }
}

/// The never-banned set: its entries in the order they are named (loopback,
/// `allow:`, `proxies:`, own addresses), and the same networks as integer
/// masks for the per-line and per-check question. Every network is in its
/// one form (`addr::canonical`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NeverBanned {
    entries: Vec<Why>,
    set: NetSet,
}

impl NeverBanned {
    /// Loopback, `allow`, `proxies` and `own` (this host's addresses; none
    /// for a decision made for the whole fleet: `fleetban test`, the CLI's
    /// refusal of a ban).
    pub fn new(allow: &[IpNet], proxies: &[IpNet], own: &[IpAddr]) -> NeverBanned {
        let loopback = crate::addr::loopback();
        let own: Vec<IpNet> = own.iter().map(|a| IpNet::from(*a)).collect();
        NeverBanned::of(&[
            (Kind::Loopback, &loopback),
            (Kind::Allow, allow),
            (Kind::Proxy, proxies),
            (Kind::Own, &own),
        ])
    }

    /// Only the given networks, each as `allow:` (tests).
    pub fn only(nets: &[IpNet]) -> NeverBanned {
        NeverBanned::of(&[(Kind::Allow, nets)])
    }

    fn of(parts: &[(Kind, &[IpNet])]) -> NeverBanned {
        let entries: Vec<Why> = parts
            .iter()
            .flat_map(|&(kind, nets)| {
                nets.iter().map(move |n| Why {
                    kind,
                    net: crate::addr::canonical(n.trunc()),
                })
            })
            .collect();
        let nets: Vec<IpNet> = entries.iter().map(|w| w.net).collect();
        NeverBanned {
            entries,
            set: NetSet::new(&nets),
        }
    }

    /// Whether the set holds `a` (IPv4-mapped IPv6 as IPv4). The per-line
    /// and per-check question: integer masks, no allocation.
    #[inline]
    pub fn contains(&self, a: IpAddr) -> bool {
        self.set.contains(a)
    }

    /// Why `a` is never banned, if it is: the first entry holding it.
    pub fn why(&self, a: IpAddr) -> Option<Why> {
        let a = crate::addr::normalize(a);
        self.entries.iter().find(|w| w.net.contains(&a)).copied()
    }

    /// The first entry that holds the whole of `net`.
    pub fn holding(&self, net: &IpNet) -> Option<Why> {
        let net = crate::addr::canonical(net.trunc());
        self.entries.iter().find(|w| w.net.contains(&net)).copied()
    }

    /// The entries that share any address with `net`, in order.
    pub fn overlapping<'a>(&'a self, net: &IpNet) -> impl Iterator<Item = Why> + 'a {
        let net = crate::addr::canonical(net.trunc());
        self.entries
            .iter()
            .filter(move |w| w.net.contains(&net) || net.contains(&w.net))
            .copied()
    }

    /// True when banning `net` would drop any never-banned address.
    pub fn overlaps(&self, net: &IpNet) -> bool {
        self.set.overlaps(net)
    }

    /// The networks of the set (what a cover is cut around).
    pub fn nets(&self) -> &[IpNet] {
        self.set.nets()
    }

    /// This host's addresses in the set.
    pub fn own(&self) -> impl Iterator<Item = IpAddr> + '_ {
        self.entries
            .iter()
            .filter(|w| w.kind == Kind::Own)
            .map(|w| w.net.addr())
    }
}

/// This host's set as its interfaces change: `allow:` and `proxies:`, and
/// the addresses read at the last [`Own::refresh`]. The daemon holds one
/// (`Arc`); its readers take [`Own::subscribe`]rs and see every change.
pub struct Own {
    allow: Vec<IpNet>,
    proxies: Vec<IpNet>,
    /// The interfaces' addresses at the last read, sorted.
    seen: std::sync::Mutex<Vec<IpAddr>>,
    tx: watch::Sender<Arc<NeverBanned>>,
}

impl Own {
    /// The set with this host's addresses now.
    pub fn new(allow: &[IpNet], proxies: &[IpNet]) -> Own {
        Own::from_interfaces(allow, proxies, local_addresses())
    }

    fn from_interfaces(allow: &[IpNet], proxies: &[IpNet], now: Vec<IpAddr>) -> Own {
        let now = sorted(now);
        let set = NeverBanned::new(allow, proxies, &now);
        Own {
            allow: allow.to_vec(),
            proxies: proxies.to_vec(),
            seen: std::sync::Mutex::new(now),
            tx: watch::channel(Arc::new(set)).0,
        }
    }

    /// The set now.
    pub fn current(&self) -> Arc<NeverBanned> {
        self.tx.borrow().clone()
    }

    /// A receiver that sees each new set.
    pub fn subscribe(&self) -> watch::Receiver<Arc<NeverBanned>> {
        self.tx.subscribe()
    }

    /// Reads the interfaces again (one getifaddrs); when they changed, the
    /// new set is published and the addresses that appeared are returned
    /// (said once, by whoever read them first).
    pub fn refresh(&self) -> Option<Vec<IpAddr>> {
        self.refresh_from(local_addresses())
    }

    fn refresh_from(&self, now: Vec<IpAddr>) -> Option<Vec<IpAddr>> {
        let now = sorted(now);
        let mut seen = self.seen.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        if *seen == now {
            return None;
        }
        let added: Vec<IpAddr> = now.iter().filter(|a| seen.binary_search(a).is_err()).copied().collect();
        let set = NeverBanned::new(&self.allow, &self.proxies, &now);
        *seen = now;
        self.tx.send_replace(Arc::new(set));
        for a in &added {
            tracing::info!(addr = %a, "This host has a new address: never counted nor banned here.");
        }
        Some(added)
    }
}

fn sorted(mut v: Vec<IpAddr>) -> Vec<IpAddr> {
    for a in &mut v {
        *a = crate::addr::normalize(*a);
    }
    v.sort_unstable();
    v.dedup();
    v
}

/// The addresses of this host's interfaces (getifaddrs).
pub fn local_addresses() -> Vec<IpAddr> {
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

    use crate::addr::net;

    #[test]
    fn an_address_that_appears_is_published_and_named_once() {
        let own = Own::from_interfaces(&[], &[], vec!["10.213.0.1".parse().unwrap()]);
        let mut rx = own.subscribe();
        let a: IpAddr = "10.213.99.7".parse().unwrap();
        let mut now = own.seen.lock().unwrap().clone();
        assert!(own.refresh_from(now.clone()).is_none(), "unchanged");
        assert!(!rx.has_changed().unwrap());
        now.push(a);
        assert_eq!(own.refresh_from(now.clone()), Some(vec![a]));
        assert!(rx.has_changed().unwrap());
        let set = rx.borrow_and_update().clone();
        assert!(set.contains(a) && set.contains("127.0.0.1".parse().unwrap()));
        assert_eq!(set.why(a).map(|w| w.kind), Some(Kind::Own));
        assert!(own.refresh_from(now).is_none(), "named once");
        assert_eq!(own.refresh_from(Vec::new()), Some(vec![]), "gone");
        assert!(!own.current().contains(a));
    }

    #[test]
    fn every_part_is_named_and_mapped_spellings_are_ipv4() {
        let set = NeverBanned::new(
            &[net("::ffff:192.0.2.0/120")],
            &[net("::ffff:10.0.0.0/104")],
            &["::ffff:198.51.100.5".parse().unwrap()],
        );
        let why = |s: &str| set.why(s.parse().unwrap()).map(|w| w.to_string());
        assert_eq!(why("127.0.0.1").as_deref(), Some("loopback (127.0.0.0/8)"));
        assert_eq!(why("::1").as_deref(), Some("loopback (::1/128)"));
        assert_eq!(why("192.0.2.7").as_deref(), Some("allow: 192.0.2.0/24"));
        assert_eq!(why("::ffff:192.0.2.7").as_deref(), Some("allow: 192.0.2.0/24"));
        assert_eq!(
            why("10.0.0.5").as_deref(),
            Some("proxies: 10.0.0.0/8 (a trusted proxy)")
        );
        assert_eq!(
            why("198.51.100.5").as_deref(),
            Some("this host's own address (198.51.100.5)")
        );
        assert_eq!(why("198.51.100.6"), None);
        assert!(set.contains("10.0.0.5".parse().unwrap()));
        assert!(set.overlaps(&net("10.0.0.0/7")));
        assert_eq!(set.holding(&net("10.1.0.0/16")).map(|w| w.kind), Some(Kind::Proxy));
        assert_eq!(set.holding(&net("10.0.0.0/7")), None);
        assert_eq!(
            set.overlapping(&net("192.0.0.0/8")).map(|w| w.kind).collect::<Vec<_>>(),
            vec![Kind::Allow]
        );
        assert_eq!(
            set.own().collect::<Vec<_>>(),
            vec!["198.51.100.5".parse::<IpAddr>().unwrap()]
        );
    }
}
