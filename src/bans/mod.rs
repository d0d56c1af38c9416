//! The ban list and everything that applies a ban to it: a ban's duration
//! and its escalation for repeat offenders, the safety valve, the queue of
//! bans decided while Redis is down, and this host's view of who is banned
//! (so that a banned client's hits are not counted).
//!
//! `apply` holds [`Bans`], the one owner of ban application; `list` is the
//! ban list itself, in Redis (`lua/ban.lua`, `lua/unban.lua`) or embedded;
//! `valve` the per-host cap on new bans; `queue` the bans waiting for
//! Redis; `cache` this host's view of the list.

mod apply;
mod cache;
pub mod list;
mod queue;
mod refuse;
mod valve;

pub use apply::{Applied, BanCounters, Bans};
pub use cache::BanCache;
pub use list::{BanList, BanListError};
pub use queue::{with_held, Held, QUEUE_CAP};
pub use refuse::Unbannable;
pub use valve::SafetyValve;

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::enforce::Until;

/// One ban as stored in the record hash and shown by `fleetban bans`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BanRecord {
    #[serde(with = "crate::addr::text")]
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

/// An operator's ban lasts this long unless told otherwise (`ban --for`).
pub const MANUAL_DEFAULT_MS: i64 = 3_600_000;
/// An operator's ban lasts at least this long.
pub const MANUAL_MIN_MS: i64 = 1000;

impl Mode {
    /// An operator's ban: until unbanned, or `for_ms` (default
    /// [`MANUAL_DEFAULT_MS`], at least [`MANUAL_MIN_MS`]).
    pub fn manual(for_ms: Option<i64>, permanent: bool) -> Mode {
        if permanent {
            Mode::Permanent
        } else {
            Mode::For(for_ms.unwrap_or(MANUAL_DEFAULT_MS).max(MANUAL_MIN_MS))
        }
    }
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

impl BanRequest {
    /// An operator's ban of `addr` (rule `manual`).
    pub fn manual(addr: IpNet, mode: Mode, reason: &str, host: &str) -> BanRequest {
        BanRequest {
            addr,
            rule: "manual".into(),
            reason: reason.to_owned(),
            host: host.to_owned(),
            hits: 0,
            mode,
        }
    }

    /// The record of this ban, made at `since` to end at `until` (None:
    /// permanent), the client's `count`-th offence.
    pub fn record(&self, since: i64, until: Option<i64>, count: u32) -> BanRecord {
        BanRecord {
            addr: self.addr,
            rule: self.rule.clone(),
            reason: self.reason.clone(),
            host: self.host.clone(),
            since,
            until,
            count,
            hits: self.hits,
        }
    }
}

/// What came of a ban request.
#[derive(Clone, Debug, PartialEq)]
pub enum Outcome {
    /// A new ban was written.
    Banned(BanRecord),
    /// The address was already banned until then; nothing changed.
    AlreadyBanned(Until),
}
