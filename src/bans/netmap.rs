//! [`NetMap`]: a map from networks (addresses, prefixes) to values, held
//! compactly for long ban lists: one table per prefix length in use,
//! keyed by the masked address as an integer (`u32` for IPv4, the top 64
//! bits for IPv6 prefixes up to /64, all 128 past it, as 32-bit words:
//! aligned on 4 like the values beside them) rather than an `IpNet` (18
//! bytes), its entries in a sorted vector with the latest changes beside
//! it (`Length`). A lookup of what holds a network asks each length
//! present (usually one or two; every length of a mixed network list at
//! most).

use std::collections::HashMap;
use std::hash::Hash;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::sorted::{merged, sorted_last_wins, Gone};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// The entries of one prefix length of one family, keyed by the masked
/// address: most of them in `base`, sorted and exactly sized (12 bytes an
/// IPv4 ban of the view, where a hash table's buckets held 26 at a
/// million: a table grows by doubling and stays at most 7/8 full), the
/// changes since its last rebuild in `recent`. A key is in at most one
/// of them; an entry removed from `base` is marked in `gone` until the
/// next rebuild, which comes once the changes reach a sixteenth of
/// `base` (750,000 IPv4 bans: one every ~47,000 changes, ~8 ms of the
/// view's write lock; `cargo bench --bench view`).
#[derive(Clone, Debug)]
struct Length<K, V> {
    len: u8,
    base: Vec<(K, V)>,
    /// Where in `base` each value of a key's top `bits` bits begins, for
    /// a large `base` (empty for a small one): a lookup reads one slot of
    /// it and searches the few entries it points at, where a binary
    /// search of a million entries touched ~20 cache lines (1.3 µs
    /// against a hash table's ~0.13). About a byte an entry.
    index: Vec<u32>,
    bits: u32,
    gone: Gone,
    recent: Map<K, V>,
}

/// Changes a table takes before its rebuild, at least.
const MIN_RECENT: usize = 256;

/// Entries of `base` from which it has an index; entries an index slot
/// covers, on average, when keys spread evenly.
const INDEXED: usize = 1024;
const PER_SLOT: usize = 4;

impl<K: Key + Ord, V: Copy> Length<K, V> {
    fn new(len: u8) -> Self {
        Length {
            len,
            base: Vec::new(),
            index: Vec::new(),
            bits: 0,
            gone: Gone::default(),
            recent: Map::default(),
        }
    }

    /// A table of `entries`, sorted and exactly sized; of equal keys the
    /// last wins (as inserting them one by one would).
    fn built(len: u8, base: Vec<(K, V)>) -> Self {
        let mut l = Length::new(len);
        l.base = sorted_last_wins(base);
        l.gone = Gone::new(l.base.len());
        l.reindex();
        l
    }

    /// The index of `base` as it now is.
    fn reindex(&mut self) {
        let n = self.base.len();
        if n < INDEXED {
            (self.index, self.bits) = (Vec::new(), 0);
            return;
        }
        // Never more bits than the keys hold (a /16 table's low 16 are 0).
        self.bits = (n / PER_SLOT).ilog2().min(u32::from(self.len));
        let mut index = Vec::with_capacity((1 << self.bits) + 1);
        for (i, e) in self.base.iter().enumerate() {
            let top = e.0.top(self.bits);
            while index.len() <= top {
                index.push(i as u32);
            }
        }
        index.resize((1 << self.bits) + 1, n as u32);
        self.index = index;
    }

    /// Where `key` is in `base`, or would be.
    fn find(&self, key: &K) -> Result<usize, usize> {
        if self.index.is_empty() {
            return self.base.binary_search_by_key(key, |e| e.0);
        }
        let top = key.top(self.bits);
        let (lo, hi) = (self.index[top] as usize, self.index[top + 1] as usize);
        match self.base[lo..hi].binary_search_by_key(key, |e| e.0) {
            Ok(i) => Ok(lo + i),
            Err(i) => Err(lo + i),
        }
    }

    /// The index in `base` of `key`'s live entry.
    fn live(&self, key: &K) -> Option<usize> {
        let i = self.find(key).ok()?;
        (!self.gone.is(i)).then_some(i)
    }

    fn len(&self) -> usize {
        self.base.len() - self.gone.count() + self.recent.len()
    }

    fn get(&self, key: &K) -> Option<&V> {
        match self.recent.get(key) {
            Some(v) => Some(v),
            None => self.live(key).map(|i| &self.base[i].1),
        }
    }

    fn get_mut(&mut self, key: &K) -> Option<&mut V> {
        if self.recent.contains_key(key) {
            return self.recent.get_mut(key);
        }
        let i = self.live(key)?;
        Some(&mut self.base[i].1)
    }

    fn insert(&mut self, key: K, v: V) -> Option<V> {
        if let Some(old) = self.recent.get_mut(&key) {
            return Some(std::mem::replace(old, v));
        }
        match self.find(&key) {
            Ok(i) if self.gone.is(i) => {
                self.gone.unmark(i);
                self.base[i].1 = v;
                None
            }
            Ok(i) => Some(std::mem::replace(&mut self.base[i].1, v)),
            Err(_) => {
                self.recent.insert(key, v);
                self.rebuild_if_due();
                None
            }
        }
    }

    fn remove(&mut self, key: &K) -> Option<V> {
        if let Some(v) = self.recent.remove(key) {
            return Some(v);
        }
        let i = self.live(key)?;
        self.gone.mark(i);
        let v = self.base[i].1;
        self.rebuild_if_due();
        Some(v)
    }

    fn rebuild_if_due(&mut self) {
        if self.recent.len() + self.gone.count() > (self.base.len() / 16).max(MIN_RECENT) {
            self.rebuild();
        }
    }

    /// `base` becomes every live entry, `recent` empty: one merge into a
    /// table allocated at its exact size.
    fn rebuild(&mut self) {
        let mut recent: Vec<(K, V)> = std::mem::take(&mut self.recent).into_iter().collect();
        recent.sort_unstable_by_key(|e| e.0);
        self.base = merged(std::mem::take(&mut self.base), &self.gone, recent.into_iter());
        self.gone = Gone::new(self.base.len());
        self.reindex();
    }

    fn retain(&mut self, keep: &mut impl FnMut(&mut V) -> bool) {
        self.recent.retain(|_, v| keep(v));
        for i in 0..self.base.len() {
            if !self.gone.is(i) && !keep(&mut self.base[i].1) {
                self.gone.mark(i);
            }
        }
        self.rebuild_if_due();
    }

    fn iter(&self) -> impl Iterator<Item = (K, &V)> + '_ {
        let base = self
            .base
            .iter()
            .enumerate()
            .filter(|(i, _)| !self.gone.is(*i))
            .map(|(_, (k, v))| (*k, v));
        base.chain(self.recent.iter().map(|(k, v)| (*k, v)))
    }
}

/// An integer form of a family's addresses, masked to a prefix length.
trait Key: Copy + Eq + Hash {
    fn of(net: &IpNet) -> Option<Self>;
    fn net(self, len: u8) -> IpNet;
    /// The top `bits` bits (at most 32), as an index.
    fn top(self, bits: u32) -> usize;
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
    fn top(self, bits: u32) -> usize {
        (u64::from(self) >> (32 - bits)) as usize
    }
}

/// An IPv6 key as 32-bit words, the most significant first: ordered as
/// the number they make, aligned on 4. A `u64` key (aligned on 8) padded
/// a remembered /64's entry from 36 bytes to 40, a `u128` (aligned on 16)
/// an address's in the view from 24 to 32.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
struct Words<const N: usize>([u32; N]);

impl<const N: usize> Words<N> {
    /// The top `N` words of `a`.
    fn of_addr(a: std::net::Ipv6Addr) -> Self {
        let bits = u128::from(a);
        Words(std::array::from_fn(|i| (bits >> (96 - 32 * i)) as u32))
    }

    /// The address whose top words these are, the rest 0.
    fn addr(self) -> std::net::Ipv6Addr {
        let bits = self
            .0
            .iter()
            .enumerate()
            .fold(0u128, |b, (i, w)| b | u128::from(*w) << (96 - 32 * i));
        bits.into()
    }

    /// The top `bits` bits (at most 32) of the number.
    fn top_bits(self, bits: u32) -> usize {
        (u128::from(self.addr()).checked_shr(128 - bits).unwrap_or(0)) as usize
    }
}

/// IPv6 prefixes up to /64, by their upper 64 bits.
impl Key for Words<2> {
    fn of(net: &IpNet) -> Option<Self> {
        match net {
            IpNet::V6(n) if n.prefix_len() <= 64 => Some(Words::of_addr(n.network())),
            _ => None,
        }
    }
    fn net(self, len: u8) -> IpNet {
        IpNet::V6(Ipv6Net::new(self.addr(), len).unwrap_or_default())
    }
    fn top(self, bits: u32) -> usize {
        self.top_bits(bits)
    }
}

/// IPv6 prefixes past /64, whole.
impl Key for Words<4> {
    fn of(net: &IpNet) -> Option<Self> {
        match net {
            IpNet::V6(n) if n.prefix_len() > 64 => Some(Words::of_addr(n.network())),
            _ => None,
        }
    }
    fn net(self, len: u8) -> IpNet {
        IpNet::V6(Ipv6Net::new(self.addr(), len).unwrap_or_default())
    }
    fn top(self, bits: u32) -> usize {
        self.top_bits(bits)
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

impl<K: Key + Ord, V: Copy> Lengths<K, V> {
    fn at(&self, len: u8) -> Option<&Length<K, V>> {
        self.0.iter().find(|l| l.len == len)
    }

    fn at_mut(&mut self, len: u8) -> Option<&mut Length<K, V>> {
        self.0.iter_mut().find(|l| l.len == len)
    }

    fn insert(&mut self, len: u8, key: K, v: V) -> Option<V> {
        let at = match self.0.binary_search_by_key(&len, |l| l.len) {
            Ok(i) => i,
            Err(i) => {
                self.0.insert(i, Length::new(len));
                i
            }
        };
        self.0[at].insert(key, v)
    }

    /// A length left empty goes.
    fn remove(&mut self, len: u8, key: K) -> Option<V> {
        let i = self.0.binary_search_by_key(&len, |l| l.len).ok()?;
        let removed = self.0[i].remove(&key);
        if self.0[i].len() == 0 {
            self.0.remove(i);
        }
        removed
    }

    fn len(&self) -> usize {
        self.0.iter().map(Length::len).sum()
    }

    fn retain(&mut self, mut keep: impl FnMut(&mut V) -> bool) {
        for l in &mut self.0 {
            l.retain(&mut keep);
        }
        self.0.retain(|l| l.len() > 0);
    }

    fn iter(&self) -> impl Iterator<Item = (IpNet, &V)> + '_ {
        self.0
            .iter()
            .flat_map(|l| l.iter().map(move |(k, v)| (k.net(l.len), v)))
    }

    /// The entries of `net` truncated to each length present up to `max`.
    fn holding(&self, net: IpNet, max: u8) -> impl Iterator<Item = (IpNet, &V)> + '_ {
        self.0.iter().take_while(move |l| l.len <= max).filter_map(move |l| {
            let p = IpNet::new(net.addr(), l.len).ok()?.trunc();
            l.get(&K::of(&p)?).map(|v| (p, v))
        })
    }

    /// Tables built from `entries` (of this key type), one per length.
    fn built(entries: Vec<(u8, K, V)>) -> Self {
        let mut by_len: Vec<(u8, Vec<(K, V)>)> = Vec::new();
        for (len, k, v) in entries {
            match by_len.binary_search_by_key(&len, |l| l.0) {
                Ok(i) => by_len[i].1.push((k, v)),
                Err(i) => by_len.insert(i, (len, vec![(k, v)])),
            }
        }
        Lengths(by_len.into_iter().map(|(len, e)| Length::built(len, e)).collect())
    }
}

/// Networks to values, one table per family and prefix length.
#[derive(Clone, Debug)]
pub struct NetMap<V> {
    v4: Lengths<u32, V>,
    /// IPv6 prefixes up to /64 (client prefixes, networks), by their
    /// upper 64 bits.
    v6: Lengths<Words<2>, V>,
    /// IPv6 prefixes longer than /64 (an operator's single address).
    v6_long: Lengths<Words<4>, V>,
    len: usize,
}

impl<V> NetMap<V> {
    /// The bytes of one entry in the sorted vectors: IPv4, IPv6 up to
    /// /64, IPv6 past it.
    #[cfg(test)]
    pub(crate) const fn entry_bytes() -> [usize; 3] {
        [
            size_of::<(u32, V)>(),
            size_of::<(Words<2>, V)>(),
            size_of::<(Words<4>, V)>(),
        ]
    }
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

impl<V: Copy> NetMap<V> {
    /// Sets `net`'s value (host bits ignored); the old one if it had one.
    pub fn insert(&mut self, net: IpNet, v: V) -> Option<V> {
        let net = net.trunc();
        let len = net.prefix_len();
        let old = match (u32::of(&net), Words::<2>::of(&net), Words::<4>::of(&net)) {
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
        let old = match (u32::of(&net), Words::<2>::of(&net), Words::<4>::of(&net)) {
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
        match (u32::of(&net), Words::<2>::of(&net), Words::<4>::of(&net)) {
            (Some(k), _, _) => self.v4.at(len)?.get(&k),
            (_, Some(k), _) => self.v6.at(len)?.get(&k),
            (_, _, Some(k)) => self.v6_long.at(len)?.get(&k),
            _ => None,
        }
    }

    pub fn get_mut(&mut self, net: &IpNet) -> Option<&mut V> {
        let net = net.trunc();
        let len = net.prefix_len();
        match (u32::of(&net), Words::<2>::of(&net), Words::<4>::of(&net)) {
            (Some(k), _, _) => self.v4.at_mut(len)?.get_mut(&k),
            (_, Some(k), _) => self.v6.at_mut(len)?.get_mut(&k),
            (_, _, Some(k)) => self.v6_long.at_mut(len)?.get_mut(&k),
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

/// Built in bulk (a view or a remembered list of a million bans at
/// start): each table sorted once and exactly sized. Of equal networks
/// the last wins, as inserting them one by one would.
impl<V: Copy> FromIterator<(IpNet, V)> for NetMap<V> {
    fn from_iter<I: IntoIterator<Item = (IpNet, V)>>(entries: I) -> Self {
        let (mut v4, mut v6, mut v6_long) = (Vec::new(), Vec::new(), Vec::new());
        for (net, v) in entries {
            let net = net.trunc();
            let len = net.prefix_len();
            match (u32::of(&net), Words::<2>::of(&net), Words::<4>::of(&net)) {
                (Some(k), _, _) => v4.push((len, k, v)),
                (_, Some(k), _) => v6.push((len, k, v)),
                (_, _, Some(k)) => v6_long.push((len, k, v)),
                _ => {}
            }
        }
        let mut m = NetMap {
            v4: Lengths::built(v4),
            v6: Lengths::built(v6),
            v6_long: Lengths::built(v6_long),
            len: 0,
        };
        m.len = m.v4.len() + m.v6.len() + m.v6_long.len();
        m
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

    /// Random inserts, updates and removals, across rebuilds, indexes,
    /// bulk builds and retains, agree with a plain hash map at every step.
    #[test]
    fn random_changes_agree_with_a_hash_map() {
        use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        // Enough keys of /32 and /64 for their tables to be indexed,
        // spread over the whole space and crowded in one corner of it.
        let net = |r: u64| -> IpNet {
            let (addr, len): (IpAddr, u8) = match r % 6 {
                0 => (Ipv4Addr::from((r % 1999) as u32 * 2_148_000).into(), 32),
                1 => (Ipv4Addr::new(10, 0, (r % 7) as u8, (r % 251) as u8).into(), 32),
                2 => (Ipv4Addr::new(10, (r % 5) as u8, 0, 0).into(), 16),
                3 => (Ipv6Addr::from(u128::from(r % 2999) * (1 << 115)).into(), 64),
                4 => (Ipv6Addr::from(0x2001_0db8 << 96 | u128::from(r % 300) << 64).into(), 64),
                _ => (Ipv6Addr::from(0x2001_0db8 << 96 | u128::from(r % 200)).into(), 128),
            };
            IpNet::new(addr, len).unwrap().trunc()
        };
        let mut model: HashMap<IpNet, u64> = HashMap::new();
        let mut m: NetMap<u64> = NetMap::default();
        for step in 0..60_000u64 {
            let n = net(rnd(1 << 20));
            match rnd(10) {
                0..=5 => assert_eq!(m.insert(n, step), model.insert(n, step), "insert {n}"),
                6..=8 => assert_eq!(m.remove(&n), model.remove(&n), "remove {n}"),
                _ => {
                    if let (Some(a), Some(b)) = (m.get_mut(&n), model.get_mut(&n)) {
                        *a += 1;
                        *b += 1;
                    }
                }
            }
            if step % 9_973 == 0 {
                m.retain(|v| *v % 3 != 0);
                model.retain(|_, v| *v % 3 != 0);
            }
            if step % 15_013 == 0 {
                m = m.iter().map(|(n, v)| (n, *v)).chain([(n, step)]).collect();
                model.insert(n, step);
            }
            assert_eq!(m.len(), model.len());
            assert_eq!(m.get(&n), model.get(&n), "get {n}");
        }
        let v4 = m.v4.0.iter().any(|l| !l.index.is_empty());
        let v6 = m.v6.0.iter().any(|l| !l.index.is_empty());
        assert!(v4 && v6, "the /32 and /64 tables are indexed");
        let mut all: Vec<(IpNet, u64)> = m.iter().map(|(n, v)| (n, *v)).collect();
        let mut want: Vec<(IpNet, u64)> = model.into_iter().collect();
        all.sort_unstable();
        want.sort_unstable();
        assert_eq!(all, want);
    }

    /// A table built in bulk keeps the last of equal networks, and takes
    /// changes after it.
    #[test]
    fn a_bulk_build_keeps_the_last_of_equal_networks() {
        let a: IpNet = "192.0.2.7/32".parse().unwrap();
        let b: IpNet = "198.51.100.0/24".parse().unwrap();
        let mut m: NetMap<u8> = [(a, 1), (b, 2), (a, 3), ("198.51.100.9/24".parse().unwrap(), 4)]
            .into_iter()
            .collect();
        assert_eq!((m.len(), m.get(&a), m.get(&b)), (2, Some(&3), Some(&4)));
        assert_eq!(m.remove(&a), Some(3));
        assert_eq!(m.insert(a, 5), None, "a removed entry comes back as new");
        assert_eq!((m.len(), m.get(&a)), (2, Some(&5)));
    }
}
