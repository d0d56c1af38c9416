//! The safety valve: at most `max_bans_per_minute` new bans per host. Past
//! it, bans are logged and counted but not applied, so that a rule that
//! matches everything cannot cut a site off the internet. A ban counts by
//! the clients it covers (`addr::clients_covered`): a /24 weighs 256, so a
//! rule counting networks cannot cut off more clients a minute than one
//! counting addresses, and a network wider than the whole budget is never
//! banned by a rule.
//!
//! No rule may drain the budget the others need (docs/design.md §2): half
//! of it is reserved, split evenly between the configured rules, and a
//! rule's ban is admitted only if what stays of the minute's budget still
//! holds every other rule's unused reserve. A first-hit rule flooded with
//! decoys (and their network escalations) takes at most the budget less
//! the others' reserves; the brute-force rule's bans still go through.

use std::collections::{HashMap, VecDeque};

use ipnet::IpNet;

pub struct SafetyValve {
    max_per_minute: u32,
    /// The main `ipv6_prefix`: an IPv6 client is one prefix of this length.
    v6_prefix: u8,
    /// The configured rules, each with its reserve (the same for all).
    rules: Vec<String>,
    /// Times (ms), weights and rules of the bans let through in the last minute.
    recent: VecDeque<(i64, u64, std::sync::Arc<str>)>,
    /// The sum of `recent`'s weights, in all and per rule.
    weight: u64,
    used: HashMap<std::sync::Arc<str>, u64>,
    /// Bans refused since start.
    pub refused: u64,
}

/// Why a ban does not fit this minute.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Full {
    /// The minute's budget is spent.
    Budget,
    /// What is left is the other rules' reserve.
    Reserved,
}

impl SafetyValve {
    pub fn new(max_per_minute: u32, v6_prefix: u8) -> SafetyValve {
        SafetyValve {
            max_per_minute,
            v6_prefix,
            rules: Vec::new(),
            recent: VecDeque::new(),
            weight: 0,
            used: HashMap::new(),
            refused: 0,
        }
    }

    /// The configured rules, which share the reserve.
    pub fn set_rules(&mut self, rules: &[String]) {
        self.rules = rules.to_vec();
    }

    /// Whether a ban of `net` by `rule` may be applied at `now_ms`; counts
    /// it if so.
    pub fn admit(&mut self, rule: &str, net: &IpNet, now_ms: i64) -> Result<(), Full> {
        if let Err(full) = self.fits(rule, net, now_ms) {
            self.refused += 1;
            return Err(full);
        }
        let w = self.weight_of(net);
        self.weight += w;
        let rule: std::sync::Arc<str> = match self.used.get_key_value(rule) {
            Some((k, _)) => k.clone(),
            None => rule.into(),
        };
        *self.used.entry(rule.clone()).or_default() += w;
        self.recent.push_back((now_ms, w, rule));
        Ok(())
    }

    /// Whether a ban of `net` by `rule` would be admitted at `now_ms` (not
    /// counted).
    pub fn fits(&mut self, rule: &str, net: &IpNet, now_ms: i64) -> Result<(), Full> {
        while let Some((t, w, r)) = self.recent.front() {
            if *t > now_ms - 60_000 {
                break;
            }
            self.weight -= w;
            if let Some(u) = self.used.get_mut(r) {
                *u -= w;
            }
            self.recent.pop_front();
        }
        let after = self.weight.saturating_add(self.weight_of(net));
        let max = u64::from(self.max_per_minute);
        if after > max {
            return Err(Full::Budget);
        }
        if max - after < self.reserved_for_others(rule) {
            return Err(Full::Reserved);
        }
        Ok(())
    }

    /// Each rule's reserve: half the budget, split evenly (none with one rule).
    pub fn reserve(&self) -> u64 {
        match self.rules.len() {
            0 | 1 => 0,
            n => u64::from(self.max_per_minute) / 2 / n as u64,
        }
    }

    /// What the other rules have not used of their reserves this minute.
    fn reserved_for_others(&self, rule: &str) -> u64 {
        let reserve = self.reserve();
        self.rules
            .iter()
            .filter(|r| r.as_str() != rule)
            .map(|r| reserve - self.used.get(r.as_str()).copied().unwrap_or(0).min(reserve))
            .sum()
    }

    /// What `rule` used of this minute's budget.
    pub fn used_by(&self, rule: &str) -> u64 {
        self.used.get(rule).copied().unwrap_or(0)
    }

    /// How many clients a ban of `net` counts as.
    pub fn weight_of(&self, net: &IpNet) -> u64 {
        crate::addr::clients_covered(net, self.v6_prefix)
    }

    /// Whether a ban of `net` weighs more than a whole minute's budget.
    pub fn too_wide(&self, net: &IpNet) -> bool {
        self.weight_of(net) > u64::from(self.max_per_minute)
    }

    pub fn max(&self) -> u32 {
        self.max_per_minute
    }

    pub fn is_open(&self) -> bool {
        self.weight >= u64::from(self.max_per_minute)
    }

    pub fn set_max(&mut self, max_per_minute: u32) {
        self.max_per_minute = max_per_minute;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    use crate::addr::net;

    /// Whether `v` admits a ban of `n` by rule `r` at `t`.
    fn ok(v: &mut SafetyValve, n: &str, t: i64) -> bool {
        v.admit("r", &net(n), t).is_ok()
    }

    #[test]
    fn caps_per_minute() {
        let mut v = SafetyValve::new(2, 64);
        assert!(ok(&mut v, "192.0.2.1/32", 0));
        assert!(ok(&mut v, "192.0.2.2/32", 10));
        assert!(!ok(&mut v, "192.0.2.3/32", 20));
        assert_eq!(v.refused, 1);
        assert!(ok(&mut v, "192.0.2.3/32", 60_001));
    }

    #[test]
    fn a_network_ban_counts_the_clients_it_covers() {
        let mut v = SafetyValve::new(600, 64);
        assert!(ok(&mut v, "198.51.100.0/24", 0));
        assert!(ok(&mut v, "198.51.101.0/24", 1));
        // 512 used: a third /24 does not fit, 88 addresses still do.
        assert!(!ok(&mut v, "198.51.102.0/24", 2));
        for i in 0..88 {
            assert!(v.admit("r", &net(&format!("192.0.2.{i}/32")), 3).is_ok());
        }
        assert!(v.is_open());
        assert!(!ok(&mut v, "192.0.2.200/32", 4));
        // An IPv6 /56 is 256 client /64s; a /48 is wider than the budget.
        assert!(ok(&mut v, "2001:db8:1:100::/56", 60_001));
        assert!(v.too_wide(&net("2001:db8:2::/48")));
        assert!(!ok(&mut v, "2001:db8:2::/48", 60_002));
        assert!(!v.too_wide(&net("2001:db8:1:2::/64")));
        assert_eq!(v.refused, 3);
    }

    /// Issue 25, item 3: a first-hit rule flooded with decoys and their /24
    /// escalations cannot take the reserve of the brute-force rule.
    #[test]
    fn one_rule_cannot_drain_the_reserve_of_the_others() {
        let mut v = SafetyValve::new(600, 64);
        v.set_rules(&["first-hit".into(), "brute".into()]);
        assert_eq!(v.reserve(), 150);
        assert!(v.admit("first-hit", &net("100.64.1.0/24"), 0).is_ok());
        assert_eq!(v.admit("first-hit", &net("100.64.2.0/24"), 1), Err(Full::Reserved));
        let mut admitted = 0;
        for i in 0..200 {
            if v.admit("first-hit", &net(&format!("192.0.2.{}/32", i % 250)), 2)
                .is_ok()
            {
                admitted += 1;
            }
        }
        // 600 - 150 reserved for brute - 256 used = 194 more.
        assert_eq!(admitted, 194);
        assert_eq!(v.used_by("first-hit"), 450);
        assert!(v.admit("brute", &net("198.51.100.77/32"), 3).is_ok());
        // A minute later the first rule's weight is gone.
        assert!(v.admit("first-hit", &net("100.64.2.0/24"), 60_003).is_ok());
    }
}
