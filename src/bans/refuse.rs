//! What no operator's ban may cover, checked in one place for every entry
//! point (`fleetban ban`, the control socket): the trusted proxies (every
//! client behind them would be cut off) and the fleet's allow list with
//! loopback. The enforcer still filters allowed addresses before nft; this
//! keeps such a ban out of the fleet's list in the first place.

use ipnet::IpNet;

use crate::addr::AddrText;
use crate::config::Config;
use crate::detect::AllowList;

#[derive(Clone)]
pub struct Unbannable {
    allow: AllowList,
    proxies: Vec<IpNet>,
}

impl Unbannable {
    pub fn of(config: &Config) -> Unbannable {
        Unbannable {
            allow: AllowList::fleet(&config.allow),
            proxies: config.proxies.clone(),
        }
    }

    /// Why `net` may not be banned, if it may not.
    pub fn refusal(&self, net: &IpNet) -> Option<String> {
        if let Some(proxy) = self.proxies.iter().find(|p| p.contains(net) || net.contains(*p)) {
            return Some(format!(
                "{} overlaps the trusted proxy network {proxy} (`proxies:`): never banned, since every client \
                 behind it would be cut off",
                AddrText(net)
            ));
        }
        self.allow.overlaps(net).then(|| {
            format!(
                "{} overlaps the allow list (loopback or `allow:`): not banned",
                AddrText(net)
            )
        })
    }
}
