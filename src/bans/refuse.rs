//! What no operator's ban may cover, checked in one place for every entry
//! point (`fleetban ban`, the control socket): the fleet's never-banned set
//! (`verdict::NeverBanned`: loopback, `allow:`, the trusted proxies, whose
//! every client would be cut off). The enforcer still cuts a ban around
//! never-banned addresses before nft (this host's own among them); this
//! keeps such a ban out of the fleet's list in the first place.

use ipnet::IpNet;

use crate::addr::AddrText;
use crate::config::Config;
use crate::verdict::{Kind, NeverBanned};

#[derive(Clone)]
pub struct Unbannable(NeverBanned);

impl Unbannable {
    pub fn of(config: &Config) -> Unbannable {
        Unbannable(config.never_banned())
    }

    /// Why `net` may not be banned, if it may not.
    pub fn refusal(&self, net: &IpNet) -> Option<String> {
        let mut hit: Vec<_> = self.0.overlapping(net).collect();
        if hit.is_empty() && crate::addr::too_wide(net) {
            let net = AddrText(&crate::addr::canonical(*net)).to_string();
            return Some(format!("{net} is {}: not banned", crate::addr::WIDEST_TEXT));
        }
        // A proxy is named first: the reason weighs most.
        hit.sort_by_key(|w| w.kind != Kind::Proxy);
        let why = hit.first()?;
        let net = AddrText(&crate::addr::canonical(*net)).to_string();
        Some(match why.kind {
            Kind::Proxy => format!(
                "{net} overlaps the trusted proxy network {} (`proxies:`): never banned, since every client \
                 behind it would be cut off",
                why.net
            ),
            _ => format!("{net} overlaps the allow list (loopback or `allow:`): not banned ({why})"),
        })
    }
}
