//! [`TopNetworks`]: how many bans this host created per network (IPv4 /24,
//! IPv6 /48, or the ban's own network when wider), for the metric
//! `fleetban_banned_network_bans{network}` and the dashboard's "top banned
//! networks". Bounded: at most [`CAP`] networks are kept; when full, the
//! one with the fewest bans makes room (a storm's networks stay, one-off
//! ones go). Touched once per new ban, never per line.

use std::collections::HashMap;

use ipnet::IpNet;

/// Networks kept at most.
pub const CAP: usize = 4096;
/// Networks the metric shows.
pub const SHOWN: usize = 10;

#[derive(Default)]
pub struct TopNetworks {
    counts: HashMap<IpNet, u64>,
}

impl TopNetworks {
    /// One more ban of `addr`.
    pub fn add(&mut self, addr: &IpNet) {
        let net = crate::addr::ranked_network(addr);
        if !self.counts.contains_key(&net) && self.counts.len() >= CAP {
            if let Some(least) = self.counts.iter().min_by_key(|(n, c)| (**c, **n)).map(|(n, _)| *n) {
                self.counts.remove(&least);
            }
        }
        *self.counts.entry(net).or_default() += 1;
    }

    /// The [`SHOWN`] networks with the most bans, most first.
    pub fn top(&self) -> Vec<(IpNet, u64)> {
        let mut v: Vec<(IpNet, u64)> = self.counts.iter().map(|(n, c)| (*n, *c)).collect();
        v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
        v.truncate(SHOWN);
        v
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_per_network_bounded_and_sorted() {
        let mut t = TopNetworks::default();
        for i in 0..5 {
            t.add(&format!("10.0.0.{i}/32").parse().unwrap());
        }
        t.add(&"10.0.1.9/32".parse().unwrap());
        t.add(&"10.0.0.0/16".parse().unwrap());
        let top = t.top();
        assert_eq!(top[0], ("10.0.0.0/24".parse().unwrap(), 5));
        assert_eq!(top.len(), 3);
        for i in 0..(CAP as u32 + 10) {
            t.add(&IpNet::new(std::net::Ipv4Addr::from(0x0b00_0000 + (i << 8)).into(), 32).unwrap());
        }
        assert_eq!(t.counts.len(), CAP);
        assert_eq!(t.top()[0].1, 5, "the storm's network stays");
    }
}
