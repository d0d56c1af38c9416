//! [`Tree`]: the book's ordered tables (`cover.rs`), one B-tree per
//! family keyed by integers. An IPv4 address is 4 bytes as a `u32` where
//! an `IpAddr` takes 17, an IPv4 network 8 as a `u64` where an `IpNet`
//! takes 18: with a million bans the two tables of the book shrink by
//! ~25 MB. Keys of one family keep their order, and every IPv4 key comes
//! before every IPv6 one, as `IpAddr`'s and `IpNet`'s own orders have it;
//! a range or a neighbour is asked within one family (an address or a
//! network never overlaps the other family's).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr};
use std::ops::Bound::{Excluded, Included, Unbounded};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// A key the tree splits by family, each part ordered as the key.
pub(crate) trait Split: Copy + Ord {
    type V4: Copy + Ord;
    type V6: Copy + Ord;
    fn split(self) -> Family<Self::V4, Self::V6>;
    fn from4(k: Self::V4) -> Self;
    fn from6(k: Self::V6) -> Self;
}

pub(crate) enum Family<A, B> {
    V4(A),
    V6(B),
}

impl Split for IpAddr {
    type V4 = u32;
    type V6 = u128;
    fn split(self) -> Family<u32, u128> {
        match self {
            IpAddr::V4(a) => Family::V4(a.into()),
            IpAddr::V6(a) => Family::V6(a.into()),
        }
    }
    fn from4(k: u32) -> IpAddr {
        IpAddr::V4(k.into())
    }
    fn from6(k: u128) -> IpAddr {
        IpAddr::V6(k.into())
    }
}

/// An IPv4 network as its address and prefix length in one `u64`
/// (`address << 8 | length`): ordered as `Ipv4Net` is, by address then
/// length.
impl Split for IpNet {
    type V4 = u64;
    type V6 = Ipv6Net;
    fn split(self) -> Family<u64, Ipv6Net> {
        match self {
            IpNet::V4(n) => Family::V4(u64::from(u32::from(n.addr())) << 8 | u64::from(n.prefix_len())),
            IpNet::V6(n) => Family::V6(n),
        }
    }
    fn from4(k: u64) -> IpNet {
        let addr = Ipv4Addr::from((k >> 8) as u32);
        IpNet::V4(Ipv4Net::new(addr, (k & 0xff) as u8).unwrap_or_default())
    }
    fn from6(k: Ipv6Net) -> IpNet {
        IpNet::V6(k)
    }
}

/// An ordered map from `K` to `V`, a B-tree per family.
#[derive(Clone, Debug)]
pub(crate) struct Tree<K: Split, V> {
    v4: BTreeMap<K::V4, V>,
    v6: BTreeMap<K::V6, V>,
}

impl<K: Split, V> Default for Tree<K, V> {
    fn default() -> Self {
        Tree {
            v4: BTreeMap::new(),
            v6: BTreeMap::new(),
        }
    }
}

impl<K: Split, V> Tree<K, V> {
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.v4.is_empty() && self.v6.is_empty()
    }

    pub fn clear(&mut self) {
        self.v4.clear();
        self.v6.clear();
    }

    pub fn get(&self, k: &K) -> Option<&V> {
        match k.split() {
            Family::V4(k) => self.v4.get(&k),
            Family::V6(k) => self.v6.get(&k),
        }
    }

    pub fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        match k.split() {
            Family::V4(k) => self.v4.get_mut(&k),
            Family::V6(k) => self.v6.get_mut(&k),
        }
    }

    pub fn contains_key(&self, k: &K) -> bool {
        self.get(k).is_some()
    }

    pub fn insert(&mut self, k: K, v: V) -> Option<V> {
        match k.split() {
            Family::V4(k) => self.v4.insert(k, v),
            Family::V6(k) => self.v6.insert(k, v),
        }
    }

    pub fn remove(&mut self, k: &K) -> Option<V> {
        match k.split() {
            Family::V4(k) => self.v4.remove(&k),
            Family::V6(k) => self.v6.remove(&k),
        }
    }

    /// In `K`'s order.
    pub fn iter(&self) -> impl Iterator<Item = (K, &V)> + '_ {
        let v4 = self.v4.iter().map(|(k, v)| (K::from4(*k), v));
        v4.chain(self.v6.iter().map(|(k, v)| (K::from6(*k), v)))
    }

    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.v4.values_mut().chain(self.v6.values_mut())
    }

    pub fn retain(&mut self, mut keep: impl FnMut(K, &mut V) -> bool) {
        self.v4.retain(|k, v| keep(K::from4(*k), v));
        self.v6.retain(|k, v| keep(K::from6(*k), v));
    }

    /// The same entries in full nodes (a B-tree filled one entry at a
    /// time keeps its nodes about 3/4 full); each old node is freed as
    /// it is read.
    pub fn rebuilt(self) -> Self {
        Tree {
            v4: self.v4.into_iter().collect(),
            v6: self.v6.into_iter().collect(),
        }
    }

    /// The entry with the greatest key below `k`, of `k`'s family.
    pub fn before(&self, k: &K) -> Option<(K, &V)> {
        match k.split() {
            Family::V4(k) => self.v4.range(..k).next_back().map(|(k, v)| (K::from4(*k), v)),
            Family::V6(k) => self.v6.range(..k).next_back().map(|(k, v)| (K::from6(*k), v)),
        }
    }

    /// The entry with the least key above `k`, of `k`'s family.
    pub fn after(&self, k: &K) -> Option<(K, &V)> {
        match k.split() {
            Family::V4(k) => self
                .v4
                .range((Excluded(k), Unbounded))
                .next()
                .map(|(k, v)| (K::from4(*k), v)),
            Family::V6(k) => self
                .v6
                .range((Excluded(k), Unbounded))
                .next()
                .map(|(k, v)| (K::from6(*k), v)),
        }
    }

    /// The entries from `lo` to `hi` included, of `lo`'s family (none
    /// when `hi` is of the other).
    pub fn range(&self, lo: &K, hi: &K) -> impl Iterator<Item = (K, &V)> + '_ {
        let (v4, v6) = match (lo.split(), hi.split()) {
            (Family::V4(lo), Family::V4(hi)) if lo <= hi => (Some(self.v4.range((Included(lo), Included(hi)))), None),
            (Family::V6(lo), Family::V6(hi)) if lo <= hi => (None, Some(self.v6.range((Included(lo), Included(hi))))),
            _ => (None, None),
        };
        let v4 = v4.into_iter().flatten().map(|(k, v)| (K::from4(*k), v));
        v4.chain(v6.into_iter().flatten().map(|(k, v)| (K::from6(*k), v)))
    }
}

/// Built in bulk: each family's B-tree sorted once, its nodes full. Of
/// equal keys the last wins, as inserting one by one would.
impl<K: Split, V> FromIterator<(K, V)> for Tree<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (k, v) in entries {
            match k.split() {
                Family::V4(k) => v4.push((k, v)),
                Family::V6(k) => v6.push((k, v)),
            }
        }
        Tree {
            v4: v4.into_iter().collect(),
            v6: v6.into_iter().collect(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(list: &[&str]) -> Vec<IpNet> {
        list.iter().map(|s| s.parse().unwrap()).collect()
    }

    /// The tree's order, neighbours and ranges are `BTreeMap<IpNet, _>`'s
    /// and `BTreeMap<IpAddr, _>`'s within a family, both families and
    /// every edge of a key (/0, /32, the last address) included.
    #[test]
    fn order_neighbours_and_ranges_are_those_of_the_plain_keys() {
        let all = nets(&[
            "0.0.0.0/0",
            "10.0.0.0/8",
            "10.0.0.0/24",
            "10.0.0.0/32",
            "10.0.0.1/32",
            "255.255.255.255/32",
            "::/0",
            "2001:db8::/32",
            "2001:db8::/64",
            "2001:db8::1/128",
            "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff/128",
        ]);
        let plain: BTreeMap<IpNet, usize> = all.iter().enumerate().map(|(i, n)| (*n, i)).collect();
        let mut tree: Tree<IpNet, usize> = Tree::default();
        for (i, n) in all.iter().enumerate().rev() {
            tree.insert(*n, i);
        }
        assert_eq!(
            tree.iter().map(|(k, v)| (k, *v)).collect::<Vec<_>>(),
            plain.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>()
        );
        let same = |a: &IpNet, b: &IpNet| a.addr().is_ipv4() == b.addr().is_ipv4();
        for n in &all {
            let after = plain.range((Excluded(*n), Unbounded)).next().map(|(k, _)| *k);
            assert_eq!(tree.after(n).map(|(k, _)| k), after.filter(|k| same(k, n)), "after {n}");
            let before = plain.range(..*n).next_back().map(|(k, _)| *k);
            assert_eq!(
                tree.before(n).map(|(k, _)| k),
                before.filter(|k| same(k, n)),
                "before {n}"
            );
            for m in &all {
                let want: Vec<IpNet> = match same(n, m) && n <= m {
                    true => plain.range(*n..=*m).map(|(k, _)| *k).collect(),
                    false => Vec::new(),
                };
                assert_eq!(tree.range(n, m).map(|(k, _)| k).collect::<Vec<_>>(), want, "{n}..={m}");
            }
        }
        let addrs: Vec<IpAddr> = ["0.0.0.0", "10.0.0.1", "255.255.255.255", "::", "::1", "ffff::"]
            .iter()
            .map(|s| s.parse().unwrap())
            .collect();
        let t: Tree<IpAddr, ()> = addrs.iter().map(|a| (*a, ())).collect();
        assert_eq!(t.keys().collect::<Vec<_>>(), addrs);
        assert_eq!(
            t.before(&"::1".parse().unwrap()).map(|(k, _)| k),
            Some("::".parse().unwrap())
        );
        assert_eq!(
            t.before(&"::".parse().unwrap()).map(|(k, _)| k),
            None,
            "not the last IPv4 key"
        );
    }

    #[test]
    fn changes_and_a_bulk_build_keep_the_last_value() {
        let [a, b] = [nets(&["192.0.2.0/24"])[0], nets(&["2001:db8::/48"])[0]];
        let mut t: Tree<IpNet, u8> = [(a, 1), (b, 2), (a, 3)].into_iter().collect();
        assert_eq!((t.len(), t.get(&a), t.get(&b)), (2, Some(&3), Some(&2)));
        *t.get_mut(&b).unwrap() = 4;
        assert_eq!(t.insert(a, 5), Some(3));
        t.retain(|k, v| k == a || *v != 4);
        assert_eq!((t.len(), t.contains_key(&b), t.remove(&a)), (1, false, Some(5)));
        assert!(t.is_empty());
    }
}
