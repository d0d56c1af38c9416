//! The control protocol: what `fleetban status`, `bans`, `ban` and `unban`
//! ask the running daemon over its Unix socket (mode 0600), and what it
//! answers. One request per connection, one JSON line each way, typed on
//! both ends: the daemon serves [`Request`]s with a [`Handler`]
//! (`server.rs`), the CLI asks through [`Client`] (`client.rs`). `status`
//! is answered from the daemon's counters ([`Status`], `status.rs`);
//! without Redis, `ban`, `unban` and `bans` go through here too, since the
//! embedded list lives in the daemon.

mod client;
mod server;
mod status;

pub use client::{Client, ControlError};
pub use server::{bind, serve, Handler};
pub use status::{FirewallStatus, HttpStatus, RedisStatus, RuleStatus, SafetyStatus, SourceStatus, Status};

use ipnet::IpNet;
use serde::{Deserialize, Serialize};

use crate::bans::BanRecord;

/// What the CLI asks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "cmd", rename_all = "lowercase")]
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
    },
    /// Lifts a ban.
    Unban {
        #[serde(with = "crate::addr::text")]
        addr: IpNet,
    },
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
    },
    Ban {
        banned: bool,
        until: Option<i64>,
        /// For a new ban: whether the kernel holds it (false: nft failed or
        /// did not answer within 2 s; the ban stands and is retried).
        #[serde(default, skip_serializing_if = "Option::is_none")]
        enforced: Option<bool>,
    },
    Unban {
        removed: bool,
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
        let err = serde_json::to_string(&Response::error("no")).unwrap();
        assert_eq!(err, r#"{"error":"no"}"#);
        assert_eq!(
            serde_json::to_string(&Response::Unban { removed: true }).unwrap(),
            r#"{"removed":true}"#
        );
    }
}
