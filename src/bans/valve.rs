//! The safety valve: at most `max_bans_per_minute` new bans per host. Past
//! it, bans are logged and counted but not applied, so that a rule that
//! matches everything cannot cut a site off the internet. A ban counts by
//! the clients it covers (`addr::clients_covered`): a /24 weighs 256, so a
//! rule counting networks cannot cut off more clients a minute than one
//! counting addresses, and a network wider than the whole budget is never
//! banned by a rule.

use std::collections::VecDeque;

use ipnet::IpNet;

pub struct SafetyValve {
    max_per_minute: u32,
    /// The main `ipv6_prefix`: an IPv6 client is one prefix of this length.
    v6_prefix: u8,
    /// Times (ms) and weights of the bans let through in the last minute.
    recent: VecDeque<(i64, u64)>,
    /// The sum of `recent`'s weights.
    weight: u64,
    /// Bans refused since start.
    pub refused: u64,
}

impl SafetyValve {
    pub fn new(max_per_minute: u32, v6_prefix: u8) -> SafetyValve {
        SafetyValve {
            max_per_minute,
            v6_prefix,
            recent: VecDeque::new(),
            weight: 0,
            refused: 0,
        }
    }

    /// Whether a ban of `net` may be applied at `now_ms`; counts it if so.
    pub fn admit(&mut self, net: &IpNet, now_ms: i64) -> bool {
        if !self.fits(net, now_ms) {
            self.refused += 1;
            return false;
        }
        let w = self.weight_of(net);
        self.weight += w;
        self.recent.push_back((now_ms, w));
        true
    }

    /// Whether a ban of `net` would be admitted at `now_ms` (not counted).
    pub fn fits(&mut self, net: &IpNet, now_ms: i64) -> bool {
        while let Some(&(t, w)) = self.recent.front() {
            if t > now_ms - 60_000 {
                break;
            }
            self.weight -= w;
            self.recent.pop_front();
        }
        self.weight.saturating_add(self.weight_of(net)) <= u64::from(self.max_per_minute)
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

    #[test]
    fn caps_per_minute() {
        let mut v = SafetyValve::new(2, 64);
        assert!(v.admit(&net("192.0.2.1/32"), 0));
        assert!(v.admit(&net("192.0.2.2/32"), 10));
        assert!(!v.admit(&net("192.0.2.3/32"), 20));
        assert_eq!(v.refused, 1);
        assert!(v.admit(&net("192.0.2.3/32"), 60_001));
    }

    #[test]
    fn a_network_ban_counts_the_clients_it_covers() {
        let mut v = SafetyValve::new(600, 64);
        assert!(v.admit(&net("198.51.100.0/24"), 0));
        assert!(v.admit(&net("198.51.101.0/24"), 1));
        // 512 used: a third /24 does not fit, 88 addresses still do.
        assert!(!v.admit(&net("198.51.102.0/24"), 2));
        for i in 0..88 {
            assert!(v.admit(&net(&format!("192.0.2.{i}/32")), 3));
        }
        assert!(v.is_open());
        assert!(!v.admit(&net("192.0.2.200/32"), 4));
        // An IPv6 /56 is 256 client /64s; a /48 is wider than the budget.
        assert!(v.admit(&net("2001:db8:1:100::/56"), 60_001));
        assert!(v.too_wide(&net("2001:db8:2::/48")));
        assert!(!v.admit(&net("2001:db8:2::/48"), 60_002));
        assert!(!v.too_wide(&net("2001:db8:1:2::/64")));
        assert_eq!(v.refused, 3);
    }
}
