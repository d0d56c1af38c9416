//! The configuration as written: serde structs mirroring the YAML of docs/design.md §5,
//! every one with `deny_unknown_fields`, every value parsed where it stands so
//! that errors carry the line and column. `mod.rs` turns these into the
//! validated [`super::Config`].

use std::num::NonZeroU32;
use std::path::PathBuf;

use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::Deserialize;
use serde_saphyr::Spanned;

use super::values::{Count, Dur, Fraction, Hits, Level, List, Method, Net, Rate, Re, StatusPat};
use crate::parse::{Format, Parser};

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MainFile {
    pub host_id: Option<String>,
    pub state_dir: Option<PathBuf>,
    pub redis: Option<Spanned<RedisSection>>,
    #[serde(default)]
    pub firewall: FirewallSection,
    #[serde(default)]
    pub allow: List<Net>,
    /// Trusted hops in front of nginx (balancers, CDN ranges).
    pub proxies: Option<Spanned<List<Net>>>,
    /// The decision endpoint for nginx `auth_request`.
    pub http: Option<Spanned<HttpSection>>,
    pub ipv6_prefix: Option<Spanned<u8>>,
    #[serde(default)]
    pub safety: SafetySection,
    pub control: Option<PathBuf>,
    pub metrics: Option<Spanned<String>>,
    /// Local files of networks to drop (`blocklists.rs`).
    #[serde(default)]
    pub blocklists: Vec<super::blocklists::BlocklistSection>,
    /// Webhooks told of bans and outages (`notify.rs`).
    #[serde(default)]
    pub notify: Vec<super::notify::NotifySection>,
    pub rules: Spanned<List<String>>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RedisSection {
    /// One server (exactly one of `url`, `cluster`, `sentinel`).
    pub url: Option<Spanned<String>>,
    /// Seed nodes of a Redis Cluster.
    pub cluster: Option<Spanned<Vec<Spanned<String>>>>,
    pub sentinel: Option<Spanned<SentinelSection>>,
    /// CA and client certificate for `rediss://`.
    pub tls: Option<TlsSection>,
    #[serde(default = "default_prefix")]
    pub prefix: Spanned<String>,
    pub timeout: Option<Dur>,
    #[serde(default)]
    pub on_down: OnDown,
    pub fleet_size: Option<NonZeroU32>,
    /// How often the full ban list is compared with the local set (drift repair).
    pub reconcile_every: Option<Dur>,
    /// Longest wait of the hits of an address far below its limits, to be
    /// sent to Redis together (0: none waits).
    pub hold: Option<Dur>,
}

/// `redis.sentinel`: the sentinels to ask for the master of `service`, and
/// how to log in to that master (sentinels' own credentials go in their URLs).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SentinelSection {
    pub service: Spanned<String>,
    pub nodes: Spanned<Vec<Spanned<String>>>,
    pub user: Option<String>,
    pub password: Option<String>,
    #[serde(default)]
    pub db: i64,
}

/// `redis.tls`: PEM files. Without `ca` the system's roots are trusted.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TlsSection {
    pub ca: Option<Spanned<PathBuf>>,
    pub cert: Option<Spanned<PathBuf>>,
    pub key: Option<Spanned<PathBuf>>,
}

fn default_prefix() -> Spanned<String> {
    Spanned::new(
        "fleetban".to_owned(),
        serde_saphyr::Location::UNKNOWN,
        serde_saphyr::Location::UNKNOWN,
    )
}

/// `http:`: where the decision endpoint listens and how it refuses.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct HttpSection {
    pub listen: Spanned<String>,
    pub deny_status: Option<Spanned<u16>>,
    /// Group owning a unix socket (nginx's workers must reach it).
    pub group: Option<Spanned<String>>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OnDown {
    #[default]
    Local,
    Pause,
}

#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct FirewallSection {
    #[serde(default)]
    pub backend: Backend,
    pub table: Option<Spanned<String>>,
    #[serde(default)]
    pub action: ActionSpec,
    #[serde(default)]
    pub ports: List<u16Port>,
}

/// A TCP port number (1-65535).
#[allow(non_camel_case_types)]
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct u16Port(pub u16);

impl std::str::FromStr for u16Port {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().parse::<u16>() {
            Ok(p) if p > 0 => Ok(u16Port(p)),
            _ => Err(format!("invalid port `{s}`: expected 1-65535")),
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Backend {
    #[default]
    Nftables,
    Log,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ActionSpec {
    #[default]
    Drop,
    Reject,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SafetySection {
    #[serde(default = "default_max_bans")]
    pub max_bans_per_minute: Count,
    /// Bytes of per-client windows in the daemon's memory (`128MiB`).
    pub max_client_state: Option<Spanned<super::ByteSize>>,
}

impl Default for SafetySection {
    fn default() -> Self {
        SafetySection {
            max_bans_per_minute: default_max_bans(),
            max_client_state: None,
        }
    }
}

fn default_max_bans() -> Count {
    Count(600)
}

/// A rule file: `rules:` and nothing else.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleFile {
    pub rules: Vec<RuleSpec>,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RuleSpec {
    pub name: Spanned<String>,
    pub logs: Spanned<List<String>>,
    pub format: Option<Spanned<FormatSpec>>,
    #[serde(default, rename = "match")]
    pub match_: MatchSpec,
    #[serde(default)]
    pub ignore: MatchSpec,
    pub limit: Spanned<LimitSpec>,
    pub ban: Option<Spanned<BanSpec>>,
    pub escalate_network: Option<Spanned<EscalateNetworkSpec>>,
}

/// `match:` / `ignore:` — every key given must match (AND); values in a list are alternatives (OR).
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MatchSpec {
    pub method: Option<List<Method>>,
    pub status: Option<List<StatusPat>>,
    /// The path as nginx serves it (decoded, dot segments resolved, no query).
    pub path: Option<Re>,
    /// The request target as logged: path and query, raw.
    pub target: Option<Re>,
    #[serde(alias = "ua")]
    pub user_agent: Option<Re>,
    pub host: Option<Re>,
    pub limit_req_status: Option<List<String>>,
    /// `format: nginx_error`: the message (the text before `, client: `).
    pub message: Option<Re>,
    /// `format: nginx_error`: the level, one of nginx's (`error`, `warn`, ...).
    pub level: Option<List<Level>>,
}

impl MatchSpec {
    /// The error-log keys given (`message`, `level`), for the check that
    /// the rule's format has them.
    pub fn error_log_keys(&self) -> Option<&'static str> {
        match (&self.message, &self.level) {
            (Some(_), _) => Some("message"),
            (_, Some(_)) => Some("level"),
            _ => None,
        }
    }
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LimitSpec {
    /// Required by every algorithm but `token_bucket`.
    pub hits: Option<Hits>,
    pub window: Option<Dur>,
    #[serde(default)]
    pub algorithm: Algorithm,
    /// `token_bucket`: capacity.
    pub burst: Option<Hits>,
    /// `token_bucket`: refill rate.
    pub rate: Option<Rate>,
    /// `sliding_window` only: the two-tier scheme's fraction of the limit.
    pub prefilter: Option<Fraction>,
    /// Counts distinct values of this field instead of requests
    /// (`sliding_window` only, no `prefilter`).
    pub distinct: Option<Distinct>,
    #[serde(default)]
    pub scope: Scope,
    #[serde(default)]
    pub clock: Clock,
    /// What a client is counted and banned as: its address, or its network.
    #[serde(default)]
    pub key: KeyKind,
    /// `key: network`: the IPv4 network's length (default 24).
    pub ipv4_prefix: Option<u8>,
    /// `key: network`: the IPv6 network's length (default 56).
    pub ipv6_prefix: Option<u8>,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyKind {
    #[default]
    Address,
    Network,
}

/// `algorithm:`: listed where the algorithms are (`limit::algorithm`).
pub use crate::limit::algorithm::Algorithm;

/// The request field a `distinct:` limit counts the values of.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Distinct {
    /// The path as nginx serves it, without the query string (`/a?x=1`,
    /// `/a?x=2` and `/%61` are one value).
    Path,
    UserAgent,
    Host,
    Status,
}

impl Distinct {
    pub fn name(self) -> &'static str {
        match self {
            Distinct::Path => "path",
            Distinct::UserAgent => "user_agent",
            Distinct::Host => "host",
            Distinct::Status => "status",
        }
    }
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Scope {
    #[default]
    Fleet,
    Host,
}

#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Clock {
    #[default]
    Log,
    Redis,
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BanSpec {
    #[serde(default = "default_ban_duration")]
    pub duration: Dur,
    pub escalate: Option<EscalateSpec>,
}

impl Default for BanSpec {
    fn default() -> Self {
        BanSpec {
            duration: default_ban_duration(),
            escalate: None,
        }
    }
}

fn default_ban_duration() -> Dur {
    Dur(std::time::Duration::from_secs(3600))
}

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalateSpec {
    #[serde(default = "default_factor")]
    pub factor: f64,
    pub max: Option<Dur>,
    pub forget_after: Option<Dur>,
}

fn default_factor() -> f64 {
    2.0
}

/// `escalate_network:` — when `bans` distinct addresses of one network of
/// these prefix lengths are banned by the rule within `within`, fleet-wide,
/// the network is banned for `duration` (`bans::escalate`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EscalateNetworkSpec {
    #[serde(default = "default_escalate_v4")]
    pub ipv4_prefix: u8,
    #[serde(default = "default_escalate_v6")]
    pub ipv6_prefix: u8,
    pub bans: u32,
    /// Required; optional here so that its absence is said beside the
    /// section's other errors (`rules::network_of`).
    pub within: Option<Dur>,
    /// Required, as `within`.
    pub duration: Option<Dur>,
}

fn default_escalate_v4() -> u8 {
    24
}

fn default_escalate_v6() -> u8 {
    56
}

/// `format:` is `combined`, `common`, `json`, `nginx_error`, `{ log_format: '...' }`,
/// `{ json: { VARIABLE: KEY, ... } }` or `{ regex: '...' }`. The parser is
/// compiled here so that a bad format is reported where it stands.
#[derive(Debug, Clone, PartialEq)]
pub struct FormatSpec(pub Format);

impl Default for FormatSpec {
    fn default() -> Self {
        FormatSpec(Format::Combined)
    }
}

const FORMATS: &str = "`combined`, `common`, `json`, `nginx_error`, `{ log_format: '...' }`, `{ json: { remote_addr: KEY, ... } }` or `{ regex: '...' }`";

impl<'de> Deserialize<'de> for FormatSpec {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl<'de> Visitor<'de> for V {
            type Value = FormatSpec;
            fn expecting(&self, f: &mut std::fmt::Formatter) -> std::fmt::Result {
                f.write_str(FORMATS)
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<FormatSpec, E> {
                match v {
                    "combined" => Ok(FormatSpec(Format::Combined)),
                    "common" => Ok(FormatSpec(Format::Common)),
                    "json" => Ok(FormatSpec(Format::Json(crate::parse::default_json_mapping()))),
                    "nginx_error" => Ok(FormatSpec(Format::NginxError)),
                    _ => Err(E::custom(format!("unknown format `{v}`: expected {FORMATS}"))),
                }
            }
            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<FormatSpec, A::Error> {
                let key: String = map
                    .next_key()?
                    .ok_or_else(|| de::Error::custom("empty format: expected `log_format:`, `json:` or `regex:`"))?;
                let format = match key.as_str() {
                    "log_format" => {
                        let value: String = map.next_value()?;
                        if let Some(why) = pasted_directive(&value) {
                            return Err(de::Error::custom(format!(
                                "log_format: this is {why} of nginx's `log_format` directive: paste only the \
                                 format string, the text between its quotes (several quoted parts joined, \
                                 without the name, `escape=`, the quotes and the `;`), e.g. `log_format: \
                                 '$remote_addr - $remote_user [$time_local] \"$request\" $status'`; for a \
                                 `escape=json` log use `format: json` (README: JSON access logs)"
                            )));
                        }
                        Format::LogFormat(value)
                    }
                    "regex" => Format::Regex(map.next_value()?),
                    "json" => {
                        let mapping: std::collections::BTreeMap<String, String> = map.next_value()?;
                        Format::Json(mapping.into_iter().collect())
                    }
                    other => {
                        return Err(de::Error::custom(format!(
                            "unknown format key `{other}`: expected `log_format`, `json` or `regex`"
                        )))
                    }
                };
                if map.next_key::<String>()?.is_some() {
                    return Err(de::Error::custom(
                        "a format has exactly one key: `log_format`, `json` or `regex`",
                    ));
                }
                Parser::new(&format).map_err(|e| de::Error::custom(format!("bad {key}: {e}")))?;
                Ok(FormatSpec(format))
            }
        }
        d.deserialize_any(V)
    }
}

/// What of a whole nginx directive a `log_format:` value holds, if it is
/// one pasted from nginx.conf rather than its format string: `log_format
/// main escape=json '{...}';` parses as a format that matches no line.
fn pasted_directive(value: &str) -> Option<&'static str> {
    let t = value.trim();
    let first = t.split_whitespace().next().unwrap_or_default();
    if first == "log_format" {
        return Some("the whole text");
    }
    if first.starts_with("escape=") {
        return Some("the `escape=` parameter");
    }
    // `main '...'` or `main escape=json '...'`: a name before the quotes.
    let second = t.split_whitespace().nth(1).unwrap_or_default();
    if !first.contains('$')
        && first.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_')
        && (second.starts_with("escape=") || second.starts_with('\'') || second.starts_with('"'))
    {
        return Some("the name and quotes");
    }
    if t.ends_with("';") || t.ends_with("\";") {
        return Some("the quotes and the trailing `;`");
    }
    // Single quotes only: a format may well start and end with a quoted field.
    if t.len() >= 2 && t.starts_with('\'') && t.ends_with('\'') {
        return Some("the surrounding quotes");
    }
    None
}
