//! [`Tree`]: the book's ordered tables (`cover.rs`), one table per family
//! keyed by integers, its entries in a sorted vector with the keys new
//! since its last rebuild in a small B-tree beside it ([`Table`]). An
//! IPv4 address is 4 bytes as a `u32` where an `IpAddr` takes 17, an IPv4
//! network 8 as a `u64` where an `IpNet` takes 18; an entry of the book is
//! 16 bytes (IPv4), 25 (an IPv6 network) or 27 (an IPv6 element applied),
//! where B-tree nodes filled one entry at a time held ~1.5 times that, in
//! a million small blocks. Keys of one family keep their order, and every
//! IPv4 key comes before every IPv6 one, as `IpAddr`'s and `IpNet`'s own
//! orders have it; a range or a neighbour is asked within one family (an
//! address or a network never overlaps the other family's).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::ops::Bound::{Excluded, Included, Unbounded};

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

use crate::sorted::{merged, sorted_last_wins, Gone};

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

/// An IPv6 address as its 16 bytes (ordered as the number they make),
/// aligned on one: 27 bytes with a `Slot`, where a `u128` took 32.
impl Split for IpAddr {
    type V4 = u32;
    type V6 = Ipv6Addr;
    fn split(self) -> Family<u32, Ipv6Addr> {
        match self {
            IpAddr::V4(a) => Family::V4(a.into()),
            IpAddr::V6(a) => Family::V6(a),
        }
    }
    fn from4(k: u32) -> IpAddr {
        IpAddr::V4(k.into())
    }
    fn from6(k: Ipv6Addr) -> IpAddr {
        IpAddr::V6(k)
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

/// The entries of one family, ordered by key: most of them in `base`,
/// sorted and exactly sized, the keys new since its last rebuild in
/// `recent` (a key is in at most one of them); an entry removed from
/// `base` is marked in `gone`, and an entry changed in `base` is changed
/// in place. Rebuilt (one merge) once the new and the removed pass an
/// eighth of `base`.
#[derive(Clone, Debug)]
struct Table<K, V> {
    base: Vec<(K, V)>,
    gone: Gone,
    recent: BTreeMap<K, V>,
}

/// Changes a table takes before its rebuild, at least.
const MIN_RECENT: usize = 1024;

impl<K, V> Default for Table<K, V> {
    fn default() -> Self {
        Table {
            base: Vec::new(),
            gone: Gone::default(),
            recent: BTreeMap::new(),
        }
    }
}

impl<K: Copy + Ord, V: Copy> Table<K, V> {
    fn built(entries: Vec<(K, V)>) -> Self {
        let base = sorted_last_wins(entries);
        Table {
            gone: Gone::new(base.len()),
            base,
            recent: BTreeMap::new(),
        }
    }

    fn len(&self) -> usize {
        self.base.len() - self.gone.count() + self.recent.len()
    }

    /// The index in `base` of `k`'s live entry.
    fn live(&self, k: &K) -> Option<usize> {
        let i = self.base.binary_search_by(|e| e.0.cmp(k)).ok()?;
        (!self.gone.is(i)).then_some(i)
    }

    fn get(&self, k: &K) -> Option<&V> {
        match self.live(k) {
            Some(i) => Some(&self.base[i].1),
            None => self.recent.get(k),
        }
    }

    fn get_mut(&mut self, k: &K) -> Option<&mut V> {
        match self.live(k) {
            Some(i) => Some(&mut self.base[i].1),
            None => self.recent.get_mut(k),
        }
    }

    fn insert(&mut self, k: K, v: V) -> Option<V> {
        match self.base.binary_search_by(|e| e.0.cmp(&k)) {
            Ok(i) if self.gone.is(i) => {
                self.gone.unmark(i);
                self.base[i].1 = v;
                None
            }
            Ok(i) => Some(std::mem::replace(&mut self.base[i].1, v)),
            Err(_) => {
                let old = self.recent.insert(k, v);
                self.rebuild_if_due();
                old
            }
        }
    }

    fn remove(&mut self, k: &K) -> Option<V> {
        let Some(i) = self.live(k) else {
            return self.recent.remove(k);
        };
        self.gone.mark(i);
        let v = self.base[i].1;
        self.rebuild_if_due();
        Some(v)
    }

    fn rebuild_if_due(&mut self) {
        if self.recent.len() + self.gone.count() > (self.base.len() / 8).max(MIN_RECENT) {
            self.rebuild();
        }
    }

    fn rebuild(&mut self) {
        let recent = std::mem::take(&mut self.recent).into_iter();
        self.base = merged(std::mem::take(&mut self.base), &self.gone, recent);
        self.gone = Gone::new(self.base.len());
    }

    fn retain(&mut self, keep: &mut impl FnMut(K, &mut V) -> bool) {
        self.recent.retain(|k, v| keep(*k, v));
        for i in 0..self.base.len() {
            let (k, v) = &mut self.base[i];
            if !self.gone.is(i) && !keep(*k, v) {
                self.gone.mark(i);
            }
        }
        self.rebuild_if_due();
    }

    /// The live entries of `base` from index `from` on.
    fn entries_from(&self, from: usize) -> impl Iterator<Item = (K, &V)> + '_ {
        let base = self.base[from.min(self.base.len())..].iter().enumerate();
        base.filter(move |(i, _)| !self.gone.is(from + i))
            .map(|(_, (k, v))| (*k, v))
    }

    fn iter(&self) -> impl Iterator<Item = (K, &V)> + '_ {
        merge(self.entries_from(0), self.recent.iter().map(|(k, v)| (*k, v)))
    }

    fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        let gone = &self.gone;
        let base = self.base.iter_mut().enumerate();
        base.filter(|(i, _)| !gone.is(*i))
            .map(|(_, e)| &mut e.1)
            .chain(self.recent.values_mut())
    }

    fn before(&self, k: K) -> Option<(K, &V)> {
        let at = self.base.partition_point(|e| e.0 < k);
        let base = self.gone.live_before(at).map(|i| (self.base[i].0, &self.base[i].1));
        let recent = self.recent.range(..k).next_back().map(|(k, v)| (*k, v));
        base.into_iter().chain(recent).max_by_key(|e| e.0)
    }

    fn after(&self, k: K) -> Option<(K, &V)> {
        let at = self.base.partition_point(|e| e.0 <= k);
        let base = self.gone.live_from(at, self.base.len());
        let base = base.map(|i| (self.base[i].0, &self.base[i].1));
        let recent = self.recent.range((Excluded(k), Unbounded)).next();
        base.into_iter().chain(recent.map(|(k, v)| (*k, v))).min_by_key(|e| e.0)
    }

    /// One search, for `lo`: its end is where the walk from there passes
    /// `hi`.
    fn range(&self, lo: K, hi: K) -> impl Iterator<Item = (K, &V)> + '_ {
        let from = self.base.partition_point(|e| e.0 < lo);
        let base = self.entries_from(from).take_while(move |e| e.0 <= hi);
        let recent = self.recent.range((Included(lo), Included(hi)));
        merge(base, recent.map(|(k, v)| (*k, v)))
    }
}

/// Two iterators in key order with no key in both, as one in key order.
fn merge<'a, K: Ord + Copy, V: 'a>(
    a: impl Iterator<Item = (K, &'a V)>,
    b: impl Iterator<Item = (K, &'a V)>,
) -> impl Iterator<Item = (K, &'a V)> {
    let (mut a, mut b) = (a.peekable(), b.peekable());
    std::iter::from_fn(move || match (a.peek(), b.peek()) {
        (Some(x), Some(y)) if y.0 < x.0 => b.next(),
        (Some(_), _) => a.next(),
        (None, _) => b.next(),
    })
}

/// An ordered map from `K` to `V`, a [`Table`] per family.
#[derive(Clone, Debug)]
pub(crate) struct Tree<K: Split, V> {
    v4: Table<K::V4, V>,
    v6: Table<K::V6, V>,
}

impl<K: Split, V> Tree<K, V> {
    /// The bytes of one entry, IPv4 and IPv6, in the sorted vectors.
    #[cfg(test)]
    pub(crate) const fn entry_bytes() -> [usize; 2] {
        [size_of::<(K::V4, V)>(), size_of::<(K::V6, V)>()]
    }
}

impl<K: Split, V> Default for Tree<K, V> {
    fn default() -> Self {
        Tree {
            v4: Table::default(),
            v6: Table::default(),
        }
    }
}

impl<K: Split, V: Copy> Tree<K, V> {
    pub fn len(&self) -> usize {
        self.v4.len() + self.v6.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    pub fn clear(&mut self) {
        *self = Tree::default();
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
        let v4 = self.v4.iter().map(|(k, v)| (K::from4(k), v));
        v4.chain(self.v6.iter().map(|(k, v)| (K::from6(k), v)))
    }

    pub fn keys(&self) -> impl Iterator<Item = K> + '_ {
        self.iter().map(|(k, _)| k)
    }

    pub fn values_mut(&mut self) -> impl Iterator<Item = &mut V> + '_ {
        self.v4.values_mut().chain(self.v6.values_mut())
    }

    pub fn retain(&mut self, mut keep: impl FnMut(K, &mut V) -> bool) {
        self.v4.retain(&mut |k, v| keep(K::from4(k), v));
        self.v6.retain(&mut |k, v| keep(K::from6(k), v));
    }

    /// The same entries, each family's in one vector of its exact size
    /// (after the start's one-by-one preloads).
    pub fn rebuilt(mut self) -> Self {
        self.v4.rebuild();
        self.v6.rebuild();
        self
    }

    /// The entry with the greatest key below `k`, of `k`'s family.
    pub fn before(&self, k: &K) -> Option<(K, &V)> {
        match k.split() {
            Family::V4(k) => self.v4.before(k).map(|(k, v)| (K::from4(k), v)),
            Family::V6(k) => self.v6.before(k).map(|(k, v)| (K::from6(k), v)),
        }
    }

    /// The entry with the least key above `k`, of `k`'s family.
    pub fn after(&self, k: &K) -> Option<(K, &V)> {
        match k.split() {
            Family::V4(k) => self.v4.after(k).map(|(k, v)| (K::from4(k), v)),
            Family::V6(k) => self.v6.after(k).map(|(k, v)| (K::from6(k), v)),
        }
    }

    /// The entries from `lo` to `hi` included, of `lo`'s family (none
    /// when `hi` is of the other).
    pub fn range(&self, lo: &K, hi: &K) -> impl Iterator<Item = (K, &V)> + '_ {
        let (v4, v6) = match (lo.split(), hi.split()) {
            (Family::V4(lo), Family::V4(hi)) if lo <= hi => (Some(self.v4.range(lo, hi)), None),
            (Family::V6(lo), Family::V6(hi)) if lo <= hi => (None, Some(self.v6.range(lo, hi))),
            _ => (None, None),
        };
        let v4 = v4.into_iter().flatten().map(|(k, v)| (K::from4(k), v));
        v4.chain(v6.into_iter().flatten().map(|(k, v)| (K::from6(k), v)))
    }
}

/// Built in bulk: each family's entries sorted once into a vector of its
/// exact size. Of equal keys the last wins, as inserting one by one would.
impl<K: Split, V: Copy> FromIterator<(K, V)> for Tree<K, V> {
    fn from_iter<I: IntoIterator<Item = (K, V)>>(entries: I) -> Self {
        let (mut v4, mut v6) = (Vec::new(), Vec::new());
        for (k, v) in entries {
            match k.split() {
                Family::V4(k) => v4.push((k, v)),
                Family::V6(k) => v6.push((k, v)),
            }
        }
        Tree {
            v4: Table::built(v4),
            v6: Table::built(v6),
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

    /// Random inserts, updates, removals, retains and rebuilds against a
    /// `BTreeMap<IpNet, _>`: every answer the same, the ordered ones
    /// (neighbours, ranges, the whole walk) included, with enough
    /// changes that the tables are rebuilt, carry removed entries and
    /// hold new keys beside them at once (asserted).
    #[test]
    fn random_changes_agree_with_a_btree_map() {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        let mut rnd = move |n: u64| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        };
        // Few enough keys that changes meet existing ones, in runs (one
        // /24's addresses) so that removals leave runs of marked entries.
        let net = |r: u64| -> IpNet {
            let (addr, len): (IpAddr, u8) = match r % 5 {
                0 | 1 => (Ipv4Addr::new(10, 0, (r % 29) as u8, (r % 241) as u8).into(), 32),
                2 => (Ipv4Addr::new(10, (r % 3) as u8, (r % 37) as u8, 0).into(), 24),
                3 => (
                    Ipv6Addr::from(0x2001_0db8 << 96 | u128::from(r % 1500) << 64).into(),
                    64,
                ),
                _ => (Ipv6Addr::from(0x2001_0db8 << 96 | u128::from(r % 900)).into(), 128),
            };
            IpNet::new(addr, len).unwrap().trunc()
        };
        let mut model: BTreeMap<IpNet, u64> = BTreeMap::new();
        let mut t: Tree<IpNet, u64> = Tree::default();
        let (mut marked_with_recent, mut rebuilds) = (false, 0);
        for step in 0..40_000u64 {
            let n = net(rnd(1 << 20));
            let before_rebuild = t.v4.base.len();
            match rnd(10) {
                0..=4 => assert_eq!(t.insert(n, step), model.insert(n, step), "insert {n}"),
                5..=8 => assert_eq!(t.remove(&n), model.remove(&n), "remove {n}"),
                _ => {
                    if let (Some(a), Some(b)) = (t.get_mut(&n), model.get_mut(&n)) {
                        *a += 1;
                        *b += 1;
                    }
                }
            }
            rebuilds += usize::from(t.v4.base.len() != before_rebuild);
            marked_with_recent |= t.v4.gone.count() > 0 && !t.v4.recent.is_empty();
            if step % 7_919 == 0 {
                t.retain(|_, v| *v % 3 != 0);
                model.retain(|_, v| *v % 3 != 0);
            }
            if step % 12_007 == 0 {
                t = t.rebuilt();
            }
            if step % 17_011 == 0 {
                t = t.iter().map(|(n, v)| (n, *v)).chain([(n, step)]).collect();
                model.insert(n, step);
            }
            assert_eq!(t.len(), model.len());
            assert_eq!(t.get(&n), model.get(&n), "get {n}");
            let same = |k: &IpNet| k.addr().is_ipv4() == n.addr().is_ipv4();
            let after = model.range((Excluded(n), Unbounded)).next().filter(|e| same(e.0));
            assert_eq!(t.after(&n), after.map(|(k, v)| (*k, v)), "after {n}");
            let before = model.range(..n).next_back().filter(|e| same(e.0));
            assert_eq!(t.before(&n), before.map(|(k, v)| (*k, v)), "before {n}");
            if step % 97 == 0 {
                let hi = n.broadcast().max(net(rnd(1 << 20)).addr());
                let hi = IpNet::new(hi, n.max_prefix_len()).unwrap();
                let want: Vec<(IpNet, &u64)> = match same(&hi) {
                    true => model.range(n..=hi).map(|(k, v)| (*k, v)).collect(),
                    false => Vec::new(),
                };
                assert_eq!(t.range(&n, &hi).collect::<Vec<_>>(), want, "{n}..={hi}");
            }
            if step % 1_009 == 0 {
                let all: Vec<(IpNet, u64)> = t.iter().map(|(k, v)| (k, *v)).collect();
                assert_eq!(all, model.iter().map(|(k, v)| (*k, *v)).collect::<Vec<_>>());
                t.values_mut().for_each(|v| *v += 1);
                model.values_mut().for_each(|v| *v += 1);
            }
        }
        assert!(marked_with_recent, "removed entries and new keys held at once");
        assert!(rebuilds > 3, "the IPv4 table rebuilt by its changes ({rebuilds})");
    }
}
