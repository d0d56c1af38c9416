//! Escalation from addresses to their network (`escalate_network:`): when a
//! rule has banned `bans` distinct addresses of one network within
//! `within`, fleet-wide, the network is banned for `duration`. The decision
//! is taken in the same atomic step as the address's ban: `lua/ban.lua` for
//! a fleet, [`Tracker`] beside the embedded list, with the same rules:
//!
//! - only a rule's *new* ban of an address counts (not one that found the
//!   address already banned, not an operator's);
//! - the addresses are counted per (rule, network); an address banned again
//!   counts once, at its latest ban;
//! - a ban at `t` counts the addresses whose latest ban is later than
//!   `t - within`; when they are `bans` or more and the network itself is
//!   not banned at `t`, the network is banned from `t` to `t + duration`.

use std::collections::HashMap;

use ipnet::IpNet;

use super::{BanRecord, BanRequest};
use crate::addr::AddrText;
use crate::config::NetworkEscalation;

/// The network of `addr` that `e` counts in: `None` when `addr` is not
/// narrower than it (a network ban is not counted towards a wider one).
pub fn network_of(addr: &IpNet, e: &NetworkEscalation) -> Option<IpNet> {
    let len = match addr {
        IpNet::V4(_) => e.ipv4_prefix,
        IpNet::V6(_) => e.ipv6_prefix,
    };
    if addr.prefix_len() <= len {
        return None;
    }
    IpNet::new(addr.network(), len).ok().map(|n| n.trunc())
}

/// The reason of a network ban, naming what triggered it.
pub fn reason(e: &NetworkEscalation, net: &IpNet, rule: &str) -> String {
    format!(
        "{} addresses of {} banned within {} (rule {rule})",
        e.bans,
        AddrText(net),
        crate::duration_text(e.within_ms)
    )
}

/// The record of the network ban `req` (the address's ban) triggered at
/// `now_ms`.
pub fn record(req: &BanRequest, e: &NetworkEscalation, net: IpNet, now_ms: i64, until_ms: i64) -> BanRecord {
    BanRecord {
        addr: net,
        rule: req.rule.clone(),
        reason: reason(e, &net, &req.rule),
        host: req.host.clone(),
        since: now_ms,
        until: Some(until_ms),
        count: 1,
        hits: 0,
    }
}

/// The embedded list's counts: per (rule, network), each address's latest
/// ban. Kept in memory only: a restart forgets them (the bans themselves
/// are saved), as if the earlier bans were older than `within`.
#[derive(Default)]
pub struct Tracker {
    /// The rule's `within` (for the sweep) and each address's latest ban.
    seen: HashMap<(String, IpNet), (i64, HashMap<IpNet, i64>)>,
    /// Notes since the last sweep of every network (`SWEEP_EVERY`).
    notes: u32,
}

/// Every this many notes, networks whose addresses have all aged out are
/// dropped, so that the memory follows the bans of the last `within`.
const SWEEP_EVERY: u32 = 1024;

impl Tracker {
    /// Notes `addr`'s new ban by `rule` at `now_ms` in `net`: how many
    /// distinct addresses of `net` the rule has banned within `within_ms`.
    pub fn note(&mut self, rule: &str, net: IpNet, addr: IpNet, now_ms: i64, within_ms: i64) -> u32 {
        self.notes += 1;
        if self.notes >= SWEEP_EVERY {
            self.notes = 0;
            self.seen
                .retain(|_, (within, m)| m.values().any(|&t| t > now_ms - *within));
        }
        let (within, m) = self.seen.entry((rule.to_owned(), net)).or_default();
        *within = within_ms;
        let t = m.entry(addr).or_insert(now_ms);
        *t = (*t).max(now_ms);
        m.retain(|_, t| *t > now_ms - within_ms);
        u32::try_from(m.len()).unwrap_or(u32::MAX)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn esc() -> NetworkEscalation {
        NetworkEscalation {
            ipv4_prefix: 24,
            ipv6_prefix: 48,
            bans: 3,
            within_ms: 60_000,
            duration_ms: 86_400_000,
        }
    }

    #[test]
    fn the_network_of_an_address_is_its_prefix_and_none_for_a_wider_ban() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(network_of(&n("203.0.113.77/32"), &esc()), Some(n("203.0.113.0/24")));
        assert_eq!(network_of(&n("2001:db8:1:2::/64"), &esc()), Some(n("2001:db8:1::/48")));
        assert_eq!(network_of(&n("203.0.113.0/24"), &esc()), None);
        assert_eq!(network_of(&n("2001:db8::/32"), &esc()), None);
    }

    #[test]
    fn distinct_addresses_are_counted_within_the_period() {
        let n = |s: &str| s.parse::<IpNet>().unwrap();
        let net = n("203.0.113.0/24");
        let mut t = Tracker::default();
        assert_eq!(t.note("r", net, n("203.0.113.1/32"), 0, 60_000), 1);
        assert_eq!(t.note("r", net, n("203.0.113.1/32"), 10_000, 60_000), 1);
        assert_eq!(t.note("other", net, n("203.0.113.2/32"), 10_000, 60_000), 1);
        assert_eq!(t.note("r", net, n("203.0.113.2/32"), 60_000, 60_000), 2);
        // The first address's latest ban (10 s) is still within at 69.999 s, not at 70 s.
        assert_eq!(t.note("r", net, n("203.0.113.3/32"), 69_999, 60_000), 3);
        assert_eq!(t.note("r", net, n("203.0.113.4/32"), 70_000, 60_000), 3);
        assert!(reason(&esc(), &net, "r").starts_with("3 addresses of 203.0.113.0/24 banned within 1m"));
    }
}
