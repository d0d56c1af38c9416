//! The ban list and everything that applies a ban to it: a ban's duration
//! and its escalation for repeat offenders, the safety valve, the queue of
//! bans decided while Redis is down, and this host's view of who is banned
//! (so that a banned client's hits are not counted).
//!
//! `apply` holds [`Bans`], the one owner of ban application; `list` is the
//! ban list itself, in Redis (`lua/ban.lua`, `lua/unban.lua`) or embedded;
//! `escalate` the ban of a network many of whose addresses were banned;
//! `valve` the per-host cap on new bans; `queue` the bans waiting for
//! Redis; `cache` this host's view of the list.

mod apply;
mod cache;
pub mod escalate;
pub mod list;
mod netmap;
mod networks;
mod queue;
mod refuse;
mod valve;

pub use crate::enforce::End;
pub use apply::{Applied, BanCounters, Bans, Unbanned};
pub use cache::{BanCache, SharedView};
pub use list::{BanList, BanListError, Cursor, Span};
pub use netmap::NetMap;
pub use networks::TopNetworks;
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
    /// An operator: `ms` from now. An active ban that ends later is kept
    /// (never shortened) unless `replace`.
    For { ms: i64, replace: bool },
    /// An operator: until unbanned (`replace`: a new record, not the
    /// active ban's with a later end).
    Permanent { replace: bool },
}

/// An operator's ban lasts this long unless told otherwise (`ban --for`).
pub const MANUAL_DEFAULT_MS: i64 = 3_600_000;
/// An operator's ban lasts at least this long.
pub const MANUAL_MIN_MS: i64 = 1000;
/// No ban with an end lasts longer (ten years: nft's longest timeout,
/// `enforce`'s): every entry point (`ban --for`, the control socket's
/// `for_ms`, a rule's `ban:` and escalation) refuses more; a ban without
/// end is `--permanent`.
pub const MAX_BAN_MS: i64 = crate::enforce::MAX_TIMEOUT_MS;

impl Mode {
    /// An operator's ban: until unbanned, or `for_ms` (default
    /// [`MANUAL_DEFAULT_MS`], from [`MANUAL_MIN_MS`] to [`MAX_BAN_MS`]);
    /// `replace`: the end asked for even if an active ban ends later
    /// (`ban --replace`). The one check of every entry point.
    pub fn manual(for_ms: Option<i64>, permanent: bool, replace: bool) -> Result<Mode, String> {
        if permanent {
            return Ok(Mode::Permanent { replace });
        }
        match for_ms.unwrap_or(MANUAL_DEFAULT_MS) {
            ms if ms < MANUAL_MIN_MS => Err(format!("a ban lasts at least 1s (asked for {ms} ms)")),
            ms if ms > MAX_BAN_MS => Err(format!(
                "a ban with an end lasts at most 3650d (10 years; asked for {ms} ms): use --permanent for a ban without end"
            )),
            ms => Ok(Mode::For { ms, replace }),
        }
    }

    /// An operator's ban that may shorten an active one.
    pub fn replaces(&self) -> bool {
        matches!(
            self,
            Mode::For { replace: true, .. } | Mode::Permanent { replace: true }
        )
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
    /// A rule's ban: the address was already banned until then; nothing changed.
    AlreadyBanned(Until),
    /// An operator's ban of an address already banned (until `was`): what
    /// became of the active ban, and its record now.
    Changed { rec: BanRecord, effect: Effect, was: Until },
}

/// What an operator's ban did to an active ban of the same address.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Effect {
    /// No active ban: a new one.
    New,
    /// The active ban ends as late or later: its end is kept (its reason
    /// replaced when a new one was given).
    Kept,
    /// The active ban now ends later (its rule, host and start kept).
    Extended,
    /// `--replace`: the active ban replaced by this one, whatever the ends.
    Replaced,
}

impl Effect {
    pub fn name(self) -> &'static str {
        match self {
            Effect::New => "new",
            Effect::Kept => "kept",
            Effect::Extended => "extended",
            Effect::Replaced => "replaced",
        }
    }

    /// As `ban.lua` names it.
    pub fn parse(s: &str) -> Option<Effect> {
        Some(match s {
            "new" => Effect::New,
            "kept" => Effect::Kept,
            "extended" => Effect::Extended,
            "replaced" => Effect::Replaced,
            _ => return None,
        })
    }
}

/// A ban's end for logs: RFC 3339, or `forever`.
pub fn until_text(u: Until) -> String {
    match u {
        Until::At(t) => crate::rfc3339(t),
        Until::Permanent => "forever".to_owned(),
    }
}

/// An address or network an operator typed for `ban`, `unban` or
/// `explain` (one parser for all three): an address (IPv4-mapped IPv6 is
/// the IPv4 address) or a network in CIDR form. A network with host bits
/// set (`192.0.2.5/24`) is refused with the network it would be, never
/// taken for either of the two things it could mean.
pub fn parse_target(s: &str) -> Result<IpNet, String> {
    let s = s.trim();
    if let Some(n) = crate::addr::parse_member(s) {
        return Ok(n);
    }
    match s.parse::<IpNet>() {
        Ok(n) => Err(format!(
            "`{s}` has host bits set: write the network `{}`, or the address `{}` alone",
            n.trunc(),
            n.addr()
        )),
        Err(_) => Err(format!(
            "`{s}` is not an address or a network (e.g. 192.0.2.7, 198.51.100.0/24, 2001:db8:1:2::/64)"
        )),
    }
}

/// The active bans other than `net` itself that cover it (a wider network)
/// or that it covers (narrower ones), from `records`.
pub fn overlapping<'a>(records: &'a [BanRecord], net: &IpNet) -> (Vec<&'a BanRecord>, Vec<&'a BanRecord>) {
    let wider = records
        .iter()
        .filter(|r| r.addr != *net && r.addr.contains(net))
        .collect();
    let narrower = records
        .iter()
        .filter(|r| r.addr != *net && net.contains(&r.addr))
        .collect();
    (wider, narrower)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ban_unban_and_explain_take_one_form_of_target() {
        let net = |s: &str| s.parse::<IpNet>().unwrap();
        assert_eq!(parse_target(" 192.0.2.7 "), Ok(net("192.0.2.7/32")));
        assert_eq!(parse_target("::ffff:192.0.2.7"), Ok(net("192.0.2.7/32")));
        assert_eq!(parse_target("2001:db8::/64"), Ok(net("2001:db8::/64")));
        assert_eq!(parse_target("2001:db8::1"), Ok(net("2001:db8::1/128")));
        let e = parse_target("2001:db8::1/64").unwrap_err();
        assert!(
            e.contains("host bits set") && e.contains("`2001:db8::/64`") && e.contains("`2001:db8::1`"),
            "{e}"
        );
        assert!(parse_target("192.0.2.300").unwrap_err().contains("not an address"));
    }

    #[test]
    fn overlapping_bans_are_the_wider_and_the_narrower_ones() {
        let rec = |a: &str| {
            BanRequest::manual(a.parse().unwrap(), Mode::Permanent { replace: false }, "", "h").record(0, None, 1)
        };
        let recs = vec![
            rec("198.51.100.0/24"),
            rec("198.51.100.5/32"),
            rec("198.51.0.0/16"),
            rec("203.0.113.1/32"),
        ];
        let (wider, narrower) = overlapping(&recs, &"198.51.100.0/24".parse().unwrap());
        assert_eq!(
            wider.iter().map(|r| r.addr.to_string()).collect::<Vec<_>>(),
            ["198.51.0.0/16"]
        );
        assert_eq!(
            narrower.iter().map(|r| r.addr.to_string()).collect::<Vec<_>>(),
            ["198.51.100.5/32"]
        );
    }
}
