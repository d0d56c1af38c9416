//! This host's view of the ban list: who is banned until when. Filled from
//! the list at start, then from the events and our own decisions. The hot
//! path asks it whether a hit's client is banned at the hit's time, so a
//! banned client's hits are not counted (docs/design.md §2).

use std::collections::HashMap;

use ipnet::IpNet;

use crate::enforce::Until;

#[derive(Default)]
pub struct BanCache {
    /// Keys banned one by one (an address, or an IPv6 client prefix).
    exact: HashMap<IpNet, Until, foldhash::fast::RandomState>,
    /// Wider networks banned by an operator; few, scanned linearly.
    wide: Vec<(IpNet, Until)>,
}

impl BanCache {
    pub fn insert(&mut self, net: IpNet, until: Until) {
        self.remove(&net);
        if net.prefix_len() == net.max_prefix_len() || (net.max_prefix_len() == 128 && net.prefix_len() >= 48) {
            self.exact.insert(net, until);
        } else {
            self.wide.push((net, until));
        }
    }

    pub fn remove(&mut self, net: &IpNet) {
        self.exact.remove(net);
        self.wide.retain(|(n, _)| n != net);
    }

    /// Replaces the whole view (after a reconcile).
    pub fn replace(&mut self, entries: impl IntoIterator<Item = (IpNet, Until)>) {
        self.exact.clear();
        self.wide.clear();
        for (n, u) in entries {
            self.insert(n, u);
        }
    }

    /// When the last ban covering the client `key` ends (its own, or a wider
    /// network's); None if it has none.
    pub fn until(&self, key: &IpNet) -> Option<Until> {
        let wide = self.wide.iter().filter(|(n, _)| n.contains(key)).map(|(_, u)| *u);
        self.exact.get(key).copied().into_iter().chain(wide).max()
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
        self.exact.retain(|_, u| live(u));
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
}
