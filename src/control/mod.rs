//! The control protocol: what `fleetban status`, `bans`, `ban`, `unban`
//! and `explain` ask the running daemon over its Unix socket (mode 0600),
//! and what it answers. One request per connection, one JSON line each way, typed on
//! both ends: the daemon serves [`Request`]s with a [`Handler`]
//! (`server.rs`), the CLI asks through [`Client`] (`client.rs`). `status`
//! is answered from the daemon's counters ([`Status`], `status.rs`);
//! without Redis, `ban`, `unban`, `bans` and `explain` go through here too,
//! since the embedded list and windows live in the daemon; with Redis down,
//! `ban` and `unban` do (the daemon enforces them and queues them for
//! Redis).

mod client;
mod server;
mod status;

pub use client::{Client, ControlError};
pub use server::{bind, serve, Handler};
pub use status::{
    BlocklistStatus, ClientStateStatus, FirewallStatus, HttpStatus, NearStatus, NotifyStatus, RedisStatus, RuleStatus,
    SafetyStatus, SourceStatus, Status,
};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::bans::BanRecord;

/// What the CLI asks. A field it does not know is refused, not ignored: a
/// ban's length is `for_ms`, in milliseconds, and a `"for": "90"` must not
/// become the default hour.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase", deny_unknown_fields)]
pub enum Request {
    /// The daemon's counters.
    Status,
    /// The active bans of the embedded list.
    Bans,
    /// An operator's ban: `for_ms` long (the default when absent), or
    /// until unbanned.
    Ban {
        #[serde(with = "crate::addr::text")]
        addr: IpNet,
        #[serde(default)]
        for_ms: Option<i64>,
        #[serde(default)]
        permanent: bool,
        #[serde(default)]
        reason: String,
        /// Shorten an active ban if asked (`ban --replace`); else the
        /// later end wins.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        replace: bool,
    },
    /// Lifts a ban.
    Unban {
        #[serde(with = "crate::addr::text")]
        addr: IpNet,
    },
    /// What the embedded store counts of a client key under each rule
    /// (`fleetban explain`).
    Explain {
        #[serde(with = "crate::addr::text")]
        addr: IpNet,
    },
}

/// A wider ban that still covers an unbanned address.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Cover {
    #[serde(with = "crate::addr::text")]
    pub addr: IpNet,
    /// Unix ms; None: permanent.
    pub until: Option<i64>,
}

/// One rule's count of a client key, against its limit.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WindowCount {
    pub rule: String,
    /// The key this rule counts the client under: its address (or IPv6
    /// prefix), or its network for `limit.key: network`.
    #[serde(default)]
    pub key: String,
    /// `sliding_window`, `fixed_window`, `sliding_counter`, `token_bucket`.
    pub algorithm: String,
    /// Hits counted in the window now (token bucket: tokens in use).
    pub count: u64,
    /// The limit (token bucket: the burst).
    pub limit: u64,
    pub window_ms: i64,
}

impl WindowCount {
    /// `rule`'s window holding `count` now.
    pub fn of(rule: crate::limit::RuleLimit, count: u64) -> WindowCount {
        WindowCount {
            algorithm: crate::config::algorithm_name(rule.algorithm, rule.distinct),
            limit: u64::from(rule.hits),
            window_ms: rule.window_ms,
            rule: rule.name,
            key: String::new(),
            count,
        }
    }
}

/// The daemon's answer to an operator's ban (`Request::Ban`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct BanAnswer {
    /// The address is banned now (false: nothing was done).
    pub banned: bool,
    /// Its end now; None: permanent (or not banned).
    pub until: Option<i64>,
    /// For a new or changed ban: whether the kernel holds it (false: nft
    /// failed or did not answer within 2 s; the ban stands and is retried).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub enforced: Option<bool>,
    /// `new`, `kept`, `extended`, `replaced` (absent from an older daemon).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub effect: Option<crate::bans::Effect>,
    /// An active ban's end before this one (None: permanent, or none).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub was: Option<i64>,
    /// Redis was down: enforced here, written to Redis when it answers.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub queued: bool,
}

/// What the daemon answers, one shape per request (or an error).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum Response {
    Error {
        error: String,
    },
    Status(Box<Status>),
    Bans {
        bans: Vec<BanRecord>,
        /// The bans among them the kernel does not hold (yet): a failed nft
        /// call, retried. Absent when every ban is enforced.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        not_enforced: Vec<String>,
        /// Redis is down: the bans this host enforces, from its own view
        /// (address and end only: the records are in Redis).
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        local: bool,
        /// Redis is down: the bans among them decided meanwhile, queued
        /// for Redis (their records are the queue's, not Redis's).
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        queued: Vec<String>,
    },
    Ban(BanAnswer),
    Unban {
        removed: bool,
        /// Redis was down: lifted here, written to Redis when it answers.
        #[serde(default, skip_serializing_if = "std::ops::Not::not")]
        queued: bool,
        /// Wider bans that still cover the address.
        #[serde(default, skip_serializing_if = "Vec::is_empty")]
        wider: Vec<Cover>,
    },
    Explain {
        windows: Vec<WindowCount>,
    },
}

impl Response {
    pub fn error(e: impl std::fmt::Display) -> Response {
        Response::Error { error: e.to_string() }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn requests_keep_their_wire_form() {
        let ban = Request::Ban {
            addr: "198.51.100.0/24".parse().unwrap(),
            for_ms: Some(60_000),
            permanent: false,
            reason: "abuse".into(),
            replace: false,
        };
        let text = serde_json::to_string(&ban).unwrap();
        assert_eq!(
            text,
            r#"{"cmd":"ban","addr":"198.51.100.0/24","for_ms":60000,"permanent":false,"reason":"abuse"}"#
        );
        assert_eq!(serde_json::from_str::<Request>(&text).unwrap(), ban);
        assert_eq!(
            serde_json::from_str::<Request>(r#"{"cmd":"unban","addr":"192.0.2.1"}"#).unwrap(),
            Request::Unban {
                addr: "192.0.2.1/32".parse().unwrap()
            }
        );
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"ban","addr":"192.0.2.1/24"}"#).is_err());
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"reboot"}"#).is_err());
        let e = serde_json::from_str::<Request>(r#"{"cmd":"ban","addr":"192.0.2.1","for":"90"}"#).unwrap_err();
        assert!(e.to_string().contains("unknown field `for`"), "{e}");
        assert!(serde_json::from_str::<Request>(r#"{"cmd":"status"}"#).is_ok());
        let err = serde_json::to_string(&Response::error("no")).unwrap();
        assert_eq!(err, r#"{"error":"no"}"#);
        assert_eq!(
            serde_json::to_string(&Response::Unban {
                removed: true,
                queued: false,
                wider: Vec::new()
            })
            .unwrap(),
            r#"{"removed":true}"#
        );
    }
}
