//! The ban list and the decisions around it: a ban's duration and its
//! escalation for repeat offenders, the safety valve, and the local view of
//! who is banned (so that a banned client's hits are not counted).
//!
//! `list` is the ban list itself, in Redis (`lua/ban.lua`, `lua/unban.lua`)
//! or embedded; `valve` the per-host cap on new bans; `cache` this host's
//! view of the list.

mod cache;
pub mod list;
mod valve;

pub use cache::BanCache;
pub use list::{BanList, BanListError};
pub use valve::SafetyValve;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::enforce::Until;

/// One ban as stored in the record hash and shown by `fleetban bans`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BanRecord {
    #[serde(with = "net_text")]
    pub addr: IpNet,
    pub rule: String,
    #[serde(default)]
    pub reason: String,
    #[serde(default)]
    pub host: String,
    /// When the ban started, unix ms.
    pub since: i64,
    /// Expiry, unix ms; `None` for a permanent ban.
    pub until: Option<i64>,
    /// This address's ban number within `forget_after` (escalation).
    #[serde(default)]
    pub count: u32,
    /// Hits in the window when the limit was crossed (0 for manual bans).
    #[serde(default)]
    pub hits: u32,
}

impl BanRecord {
    pub fn until(&self) -> Until {
        self.until.map_or(Until::Permanent, Until::At)
    }
}

/// How a ban is asked for.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Mode {
    /// A rule decided: escalates; no-op when a ban is already active.
    Auto(crate::config::BanPolicy),
    /// An operator: exactly this long, replacing any active ban.
    For(i64),
    /// An operator: until unbanned.
    Permanent,
}

#[derive(Clone, Debug, PartialEq)]
pub struct BanRequest {
    pub addr: IpNet,
    pub rule: String,
    pub reason: String,
    pub host: String,
    pub hits: u32,
    pub mode: Mode,
}

/// What came of a ban request.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A new ban was written.
    Banned(BanRecord),
    /// The address was already banned until then; nothing changed.
    AlreadyBanned(Until),
}

/// Addresses without `/32` or `/128`, networks in CIDR form, in JSON too.
mod net_text {
    use ipnet::IpNet;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &IpNet, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&crate::addr::AddrText(n))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IpNet, D::Error> {
        let s = String::deserialize(d)?;
        crate::addr::parse_member(&s).ok_or_else(|| serde::de::Error::custom(format!("not an address: {s}")))
    }
}
