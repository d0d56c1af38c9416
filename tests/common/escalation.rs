//! The model of `escalate_network:` (README, "Escalation to the network"),
//! written as plainly as the text: every ban ever made is kept in a list,
//! nothing expires or is pruned. A rule's ban of an address at `t` is new
//! unless a ban of that address started at or before `t` and ends after it;
//! a new one counts the distinct addresses of its network with a ban
//! started later than `t - within`; when they are `bans` or more and no ban
//! of the network itself is active at `t`, the network is banned from `t`
//! to `t + duration`. The address bans last a fixed `ban_ms` (no repeat
//! offender factor here).

use std::collections::HashSet;

use fleetban::config::NetworkEscalation;
use ipnet::IpNet;

/// A ban in the model: what, from, until.
pub type ModelBan = (IpNet, i64, i64);

pub struct EscalationModel {
    pub esc: NetworkEscalation,
    pub ban_ms: i64,
    pub addresses: Vec<ModelBan>,
    pub networks: Vec<ModelBan>,
}

impl EscalationModel {
    pub fn new(esc: NetworkEscalation, ban_ms: i64) -> EscalationModel {
        EscalationModel {
            esc,
            ban_ms,
            addresses: Vec::new(),
            networks: Vec::new(),
        }
    }

    fn network(&self, addr: &IpNet) -> IpNet {
        let len = match addr {
            IpNet::V4(_) => self.esc.ipv4_prefix,
            IpNet::V6(_) => self.esc.ipv6_prefix,
        };
        IpNet::new(addr.addr(), len).unwrap().trunc()
    }

    /// The rule bans `addr` at `t`: whether the ban is new, and the network
    /// ban it triggered.
    pub fn ban(&mut self, addr: IpNet, t: i64) -> (bool, Option<ModelBan>) {
        let active =
            |bans: &[ModelBan], what: IpNet| bans.iter().any(|&(a, from, to)| a == what && from <= t && t < to);
        if active(&self.addresses, addr) {
            return (false, None);
        }
        self.addresses.push((addr, t, t + self.ban_ms));
        let net = self.network(&addr);
        let distinct: HashSet<IpNet> = self
            .addresses
            .iter()
            .filter(|&&(a, from, _)| self.network(&a) == net && from > t - self.esc.within_ms)
            .map(|&(a, _, _)| a)
            .collect();
        if distinct.len() as u32 >= self.esc.bans && !active(&self.networks, net) {
            let ban = (net, t, t + self.esc.duration_ms);
            self.networks.push(ban);
            return (true, Some(ban));
        }
        (true, None)
    }
}
