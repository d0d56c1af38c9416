//! [`NetMap`]: a map from networks (addresses, prefixes) to values, held
//! compactly for long ban lists: one hash map per prefix length in use,
//! keyed by the masked address as an integer (`u32` for IPv4, `u64` for
//! IPv6 prefixes up to /64, `u128` past it) rather than an `IpNet` (18
//! bytes). A lookup of what holds a network asks each length present
//! (usually one or two; every length of a mixed network list at most).

use std::collections::HashMap;
use std::hash::Hash;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The entries of one prefix length of one family, keyed by the masked
/// address.
#[derive(Clone, Debug)]
struct Length<K, V> {
    len: u8,
    map: Map<K, V>,
}

/// An integer form of a family's addresses, masked to a prefix length.
trait Key: Copy + Eq + Hash {
    fn of(net: &IpNet) -> Option<Self>;
    fn net(self, len: u8) -> IpNet;
}

impl Key for u32 {
    fn of(net: &IpNet) -> Option<u32> {
        match net {
            IpNet::V4(n) => Some(u32::from(n.network())),
            IpNet::V6(_) => None,
        }
    }
    fn net(self, len: u8) -> IpNet {
        IpNet::V4(Ipv4Net::new(self.into(), len).unwrap_or_default())
    }
}

impl Key for u64 {
    fn of(net: &IpNet) -> Option<u64> {
        match net {
            IpNet::V6(n) if n.prefix_len() <= 64 => Some((u128::from(n.network()) >> 64) as u64),
            _ => None,
        }
    }
    fn net(self, len: u8) -> IpNet {
        IpNet::V6(Ipv6Net::new((u128::from(self) << 64).into(), len).unwrap_or_default())
    }
}

impl Key for u128 {
    fn of(net: &IpNet) -> Option<u128> {
        match net {
            IpNet::V6(n) if n.prefix_len() > 64 => Some(u128::from(n.network())),
            _ => None,
        }
    }
    fn net(self, len: u8) -> IpNet {
        IpNet::V6(Ipv6Net::new(self.into(), len).unwrap_or_default())
    }
}

/// The lengths in use of one key type, sorted by length.
#[derive(Clone, Debug)]
struct Lengths<K, V>(Vec<Length<K, V>>);

impl<K, V> Default for Lengths<K, V> {
    fn default() -> Self {
        Lengths(Vec::new())
    }
}

impl<K: Key, V> Lengths<K, V> {
    fn map(&self, len: u8) -> Option<&Map<K, V>> {
        self.0.iter().find(|l| l.len == len).map(|l| &l.map)
    }

    fn map_mut(&mut self, len: u8) -> Option<&mut Map<K, V>> {
        self.0.iter_mut().find(|l| l.len == len).map(|l| &mut l.map)
    }

    fn insert(&mut self, len: u8, key: K, v: V) -> Option<V> {
        let at = match self.0.binary_search_by_key(&len, |l| l.len) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(
                    i,
                    Length {
                        len,
                        map: Map::default(),
                    },
                );
                i
            }
        };
        self.0[at].map.insert(key, v)
    }

    /// A length left empty goes.
    fn remove(&mut self, len: u8, key: K) -> Option<V> {
        let i = self.0.binary_search_by_key(&len, |l| l.len).ok()?;
        let removed = self.0[i].map.remove(&key);
        if self.0[i].map.is_empty() {
            self.0.remove(i);
        }
        removed
    }

    fn len(&self) -> usize {
        self.0.iter().map(|l| l.map.len()).sum()
    }

    /// Keeps the entries `keep` accepts; a table left mostly empty shrinks.
    fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        for l in &mut self.0 {
            l.map.retain(|_, v| keep(v));
            if l.map.len() * 4 < l.map.capacity() {
                l.map.shrink_to_fit();
            }
        }
        self.0.retain(|l| !l.map.is_empty());
    }

    fn iter(&self) -> impl Iterator<Item = (IpNet, &V)> + '_ {
        self.0
            .iter()
            .flat_map(|l| l.map.iter().map(move |(k, v)| (k.net(l.len), v)))
    }

    /// The entries of `net` truncated to each length present up to `max`.
    fn holding(&self, net: IpNet, max: u8) -> impl Iterator<Item = (IpNet, &V)> + '_ {
        self.0.iter().take_while(move |l| l.len <= max).filter_map(move |l| {
            let p = IpNet::new(net.addr(), l.len).ok()?.trunc();
            l.map.get(&K::of(&p)?).map(|v| (p, v))
        })
    }
}

/// Networks to values, one table per family and prefix length.
#[derive(Clone, Debug)]
pub struct NetMap<V> {
    v4: Lengths<u32, V>,
    /// IPv6 prefixes up to /64 (client prefixes, networks), by their
    /// upper 64 bits.
    v6: Lengths<u64, V>,
    /// IPv6 prefixes longer than /64 (an operator's single address).
    v6_long: Lengths<u128, V>,
    len: usize,
}

impl<V> Default for NetMap<V> {
    fn default() -> Self {
        NetMap {
            v4: Lengths::default(),
            v6: Lengths::default(),
            v6_long: Lengths::default(),
            len: 0,
        }
    }
}

impl<V> NetMap<V> {
    /// Sets `net`'s value (host bits ignored); the old one if it had one.
    pub fn insert(&mut self, net: IpNet, v: V) -> Option<V> {
        let net = net.trunc();
        let len = net.prefix_len();
        let old = match (u32::of(&net), u64::of(&net), u128::of(&net)) {
            (Some(k), _, _) => self.v4.insert(len, k, v),
            (_, Some(k), _) => self.v6.insert(len, k, v),
            (_, _, Some(k)) => self.v6_long.insert(len, k, v),
            _ => None,
        };
        self.len += usize::from(old.is_none());
        old
    }

    pub fn remove(&mut self, net: &IpNet) -> Option<V> {
        let net = net.trunc();
        let len = net.prefix_len();
        let old = match (u32::of(&net), u64::of(&net), u128::of(&net)) {
            (Some(k), _, _) => self.v4.remove(len, k),
            (_, Some(k), _) => self.v6.remove(len, k),
            (_, _, Some(k)) => self.v6_long.remove(len, k),
            _ => None,
        };
        self.len -= usize::from(old.is_some());
        old
    }

    /// The value of exactly `net`.
    pub fn get(&self, net: &IpNet) -> Option<&V> {
        let net = net.trunc();
        let len = net.prefix_len();
        match (u32::of(&net), u64::of(&net), u128::of(&net)) {
            (Some(k), _, _) => self.v4.map(len)?.get(&k),
            (_, Some(k), _) => self.v6.map(len)?.get(&k),
            (_, _, Some(k)) => self.v6_long.map(len)?.get(&k),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, net: &IpNet) -> Option<&mut V> {
        let net = net.trunc();
        let len = net.prefix_len();
        match (u32::of(&net), u64::of(&net), u128::of(&net)) {
            (Some(k), _, _) => self.v4.map_mut(len)?.get_mut(&k),
            (_, Some(k), _) => self.v6.map_mut(len)?.get_mut(&k),
            (_, _, Some(k)) => self.v6_long.map_mut(len)?.get_mut(&k),
            _ => None,
        }
    }

    pub fn contains(&self, net: &IpNet) -> bool {
        self.get(net).is_some()
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Keeps the entries `keep` accepts.
    pub fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        self.v4.retain(&mut keep);
        self.v6.retain(&mut keep);
        self.v6_long.retain(&mut keep);
        self.len = self.v4.len() + self.v6.len() + self.v6_long.len();
    }

    pub fn iter(&self) -> impl Iterator<Item = (IpNet, &V)> + '_ {
        self.v4.iter().chain(self.v6.iter()).chain(self.v6_long.iter())
    }

    /// The entries of `net` and of every network present that holds it,
    /// up to prefix length `max`.
    pub fn holding(&self, net: &IpNet, max: u8) -> impl Iterator<Item = (IpNet, &V)> + '_ {
        let max = max.min(net.prefix_len());
        let (v4, v6, v6_long) = match net {
            IpNet::V4(_) => (Some(&self.v4), None, None),
            IpNet::V6(_) => (None, Some(&self.v6), Some(&self.v6_long)),
        };
        let net = *net;
        v4.into_iter()
            .flat_map(move |l| l.holding(net, max))
            .chain(v6.into_iter().flat_map(move |l| l.holding(net, max)))
            .chain(v6_long.into_iter().flat_map(move |l| l.holding(net, max)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every key type and the edges of each (/0, /32, /64, /65, /128)
    /// come back as the network they were inserted as.
    #[test]
    fn networks_of_every_key_type_round_trip() {
        let nets: Vec<IpNet> = [
            "0.0.0.0/0",
            "192.0.2.7/32",
            "198.51.100.0/24",
            "::/0",
            "2001:db8::/32",
            "2001:db8:1:2::/64",
            "2001:db8:1:2:8000::/65",
            "2001:db8::7/128",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let mut m = NetMap::default();
        for (i, n) in nets.iter().enumerate() {
            assert_eq!(m.insert(*n, i), None);
        }
        assert_eq!(m.insert("192.0.2.7/32".parse().unwrap(), 9), Some(1));
        assert_eq!(m.len(), nets.len());
        let mut back: Vec<IpNet> = m.iter().map(|(n, _)| n).collect();
        back.sort_unstable();
        let mut want = nets.clone();
        want.sort_unstable();
        assert_eq!(back, want);
        // Host bits are ignored; what holds an address, by length.
        assert_eq!(m.get(&"198.51.100.9/24".parse().unwrap()), Some(&2));
        let held: Vec<u8> = m
            .holding(&"2001:db8:1:2:8000::1/128".parse().unwrap(), 128)
            .map(|(n, _)| n.prefix_len())
            .collect();
        assert_eq!(held, [0, 32, 64, 65]);
        *m.get_mut(&"::/0".parse().unwrap()).unwrap() = 100;
        m.retain(|v| *v >= 5);
        assert_eq!(m.len(), 5, "the IPv4 address (9), IPv6's /0 (100), /64, /65, /128");
        assert_eq!(m.remove(&"2001:db8::7/128".parse().unwrap()), Some(7));
        assert!(!m.contains(&"2001:db8::7/128".parse().unwrap()) && m.len() == 4);
    }
}
