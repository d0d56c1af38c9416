//! [`Status`]: the daemon's counters as `fleetban status` shows them (and
//! `status --json` prints them).

use serde::{Deserialize, Serialize};

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Status {
    pub sources: Vec<SourceStatus>,
    pub rules: Vec<RuleStatus>,
    pub lines: u64,
    pub unparsed: u64,
    pub skipped_long: u64,
    /// Hits older than their window at arrival: not counted.
    pub stale: u64,
    /// Hits dated more than a few seconds after the wall clock: counted at
    /// the wall clock. Absent from an older daemon's status.
    #[serde(default)]
    pub future: u64,
    /// New bans this daemon decided (its rules; operators through its
    /// control socket), not those it applied from the fleet.
    pub bans: u64,
    pub safety_refused: u64,
    pub safety: SafetyStatus,
    pub redis: RedisStatus,
    pub bans_active: u64,
    /// Wall clock minus the log time of the last hit read.
    pub lag_ms: i64,
    /// Reloads applied, and those refused (`status` shows their sum).
    pub reloads: u64,
    pub reload_errors: u64,
    /// The decision endpoint, when `http:` is configured.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub http: Option<HttpStatus>,
    /// What the kernel holds of the bans (absent from an older daemon's).
    #[serde(default)]
    pub firewall: FirewallStatus,
    /// One per `blocklists:` file (absent from an older daemon's).
    #[serde(default)]
    pub blocklists: Vec<BlocklistStatus>,
    /// The per-client windows in the daemon's memory (absent from an older
    /// daemon's).
    #[serde(default)]
    pub client_state: ClientStateStatus,
}

/// The embedded windows (the store's, or the fallback's while Redis is
/// down) against `safety.max_client_state` (docs/design.md §2, "Memory").
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ClientStateStatus {
    /// Bytes they hold now (their tables' slots and their heap), as last
    /// measured (each batch decided in memory).
    pub bytes: u64,
    /// (rule, client) windows and counters held.
    pub keys: u64,
    /// `safety.max_client_state` in bytes.
    pub max: u64,
    /// Keys shed to stay within `max` (those clients count again from
    /// zero), and in how many sheds.
    pub shed_keys: u64,
    pub sheds: u64,
}

/// One blocklist file: what its last good read loaded, and its last error.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct BlocklistStatus {
    pub file: String,
    /// Networks of this file in the kernel's sets (merged, allowed ones taken out).
    pub entries: u64,
    /// Networks the file lists (valid lines).
    pub listed: u64,
    /// Lines neither comment nor network, skipped.
    pub skipped_lines: u64,
    /// Networks refused over `max_entries`.
    pub over_cap: u64,
    /// Networks refused as wider than IPv4 /8 or IPv6 /16.
    #[serde(default)]
    pub too_wide: u64,
    /// Listed networks split around an allowed address.
    pub split_entries: u64,
    /// The last successful read and load (RFC 3339).
    pub last_refresh: Option<String>,
    /// The last read or load error, while not followed by a success; the
    /// last good networks stay in the kernel meanwhile.
    pub error: Option<String>,
}

/// Whether the bans are in the kernel: after a failed nft call, the bans it
/// left out are *not enforced* (retried until they are).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct FirewallStatus {
    /// The last nft call failed (its error below); retried with backoff.
    pub failing: bool,
    pub error: Option<String>,
    /// Bans wanted but not in the kernel (nor covered by a wider ban there).
    pub not_enforced: u64,
    /// The first few of them.
    pub not_enforced_sample: Vec<String>,
    /// Times the table was found gone and re-created.
    pub recreated: u64,
    /// Bans applied around the never-banned addresses they hold
    /// (`verdict::cover`), and bans not applied at all: wholly never banned
    /// on this host.
    #[serde(default)]
    pub split: u64,
    #[serde(default)]
    pub spared: u64,
}

/// One followed file.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceStatus {
    pub path: String,
    pub offset: u64,
    pub lines: u64,
    pub lines_per_s: f64,
    /// Wall clock minus the log time of its last hit.
    pub lag_ms: Option<i64>,
    /// The file's size past `offset`, when it could be read.
    pub bytes_behind: Option<u64>,
    /// `following` (the file is read), `missing` (no file at the path, or
    /// a glob matching none: followed once it appears) or `unreadable`
    /// (see `error`). An older daemon listed only followed files.
    #[serde(default = "following")]
    pub state: String,
    /// Why a `missing` or `unreadable` log is not read; null when followed.
    #[serde(default)]
    pub error: Option<String>,
}

fn following() -> String {
    "following".to_owned()
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RuleStatus {
    pub name: String,
    pub hits: u64,
    pub bans: u64,
    /// Lines this rule read (absent from an older daemon's status).
    #[serde(default)]
    pub lines: u64,
    /// Of those, the lines its format could not parse.
    #[serde(default)]
    pub unparsed: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SafetyStatus {
    /// `open`, or `tripped` when it refused a ban within the last minute.
    pub state: String,
    pub max_bans_per_minute: u64,
    pub refused: u64,
}

/// The decision endpoint (`GET /check`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct HttpStatus {
    /// Where it listens: `unix:PATH` or `ADDRESS:PORT`.
    pub listen: String,
    /// Checks answered.
    pub checks: u64,
    /// Checks answered `deny_status`.
    pub denials: u64,
    /// Checks without a readable `X-Client-Addr` (answered 204).
    pub malformed: u64,
    /// Half and 99% of the checks so far were answered within this many
    /// microseconds (the upper bound of their latency bucket, from the read
    /// that completed the request to the answer written; null before the
    /// first check or past the last bucket, 20.48 ms).
    #[serde(default)]
    pub p50_us: Option<u64>,
    #[serde(default)]
    pub p99_us: Option<u64>,
    /// Connections open now (absent from an older daemon's).
    #[serde(default)]
    pub connections: u64,
    /// Connections closed to admit a new one when as many were open as may
    /// be (the one quiet the longest goes).
    #[serde(default)]
    pub evicted: u64,
    /// Connections closed because a request was not whole a second after
    /// its first byte.
    #[serde(default)]
    pub head_timeouts: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RedisStatus {
    /// `embedded` (no `redis:`), `connecting` (not answered yet),
    /// `connected`, or `down` (since `down_since`; deciding as `on_down`
    /// says). Accurate within about a second (a PING each quiet half
    /// second). Empty from an older daemon: read `connected` and `used`.
    #[serde(default)]
    pub state: String,
    /// RFC 3339 UTC: when the outage began (null unless `down`).
    #[serde(default)]
    pub down_since: Option<String>,
    /// `redis.on_down`: `local` (deciding locally) or `pause` (null embedded).
    #[serde(default)]
    pub on_down: Option<String>,
    /// Redis answered the last time it was asked.
    pub connected: bool,
    /// `redis:` is configured (else the embedded store is used).
    pub used: bool,
    pub errors: u64,
    pub round_trips: u64,
    /// Hits of cold clients kept in the daemon to share a script call.
    pub held_hits: u64,
    /// Hits of the limiter round trips in flight (or being decided).
    pub inflight_hits: u64,
    /// Batches decided by the local fallback while Redis was down.
    pub local_decisions: u64,
    /// Hosts this one counts as sharing the fleet's windows (registered,
    /// at least `redis.fleet_size`): each keeps at most its share of a
    /// cold client's hits unsent. (Absent from an older daemon's status,
    /// as a CLI upgraded before its daemon restarts sees it.)
    #[serde(default)]
    pub fleet_hosts: u64,
    /// Clients marked hot here (at half a rule's limit or more, by this
    /// host's round trips or the fleet's marks): their hits are sent at once.
    #[serde(default)]
    pub hot_clients: u64,
    /// Bans decided while Redis was down, waiting to be written.
    pub queued_bans: u64,
    /// Bans the full queue could not keep.
    pub dropped_bans: u64,
}

#[cfg(test)]
mod tests {
    use super::SourceStatus;

    #[test]
    fn a_source_from_an_older_daemon_reads_as_followed() {
        let old = r#"{"path":"/var/log/nginx/access.log","offset":10,"lines":2,"lines_per_s":0.0,"lag_ms":null,"bytes_behind":0}"#;
        let s: SourceStatus = serde_json::from_str(old).unwrap();
        assert_eq!((s.state.as_str(), s.error), ("following", None));
    }
}
