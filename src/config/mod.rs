//! Configuration: the main file (`/etc/fleetban/fleetban.yaml`) and the rule
//! files its `rules:` globs name, loaded into one validated [`Config`].
//!
//! `schema` holds the serde structs as written; `values` the scalar types that
//! parse where they stand; this file resolves paths, applies defaults and runs
//! the checks that need more than one value. Every error carries file, line and
//! column ([`ConfigError`]); loading goes on after an error where it can so
//! that all of them are reported together.

mod error;
mod schema;
mod values;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::time::Duration;

use ipnet::IpNet;
use serde_saphyr::{Location, Spanned};

pub use error::{ConfigError, ConfigErrors};
pub use schema::{ActionSpec, Algorithm, Backend, Clock, MatchSpec, OnDown, Scope};
pub use values::{Dur, Method, Net, Rate, Re, StatusPat};

use crate::enforce::{Action, EnforceError, Enforcer, NftOptions};
use crate::parse::Format;

/// Where `fleetban` looks when `-c` is not given.
pub const DEFAULT_PATH: &str = "/etc/fleetban/fleetban.yaml";

/// The whole validated configuration of one host.
#[derive(Debug)]
pub struct Config {
    /// The main file, for messages and for resolving relative paths.
    pub file: PathBuf,
    /// Names this host in ban records and in `scope: host` keys.
    pub host_id: String,
    /// Offsets and the embedded ban list live here.
    pub state_dir: PathBuf,
    /// `None`: a single host with the embedded store.
    pub redis: Option<RedisConfig>,
    pub firewall: FirewallConfig,
    /// Networks never banned, besides loopback and the host's own addresses.
    pub allow: Vec<IpNet>,
    /// IPv6 clients are counted and banned per prefix of this length.
    pub ipv6_prefix: u8,
    /// Safety valve: new bans this host may apply per minute.
    pub max_bans_per_minute: u32,
    /// Unix socket of the running daemon (`fleetban status`).
    pub control: PathBuf,
    /// Prometheus endpoint, off when `None`.
    pub metrics: Option<SocketAddr>,
    pub rules: Vec<Rule>,
}

#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// The server of `Servers::Url`; otherwise what logs name (the first
    /// cluster node, or `sentinel:SERVICE`).
    pub url: String,
    pub servers: Servers,
    /// CA and client certificate for TLS (`rediss://`), read at load.
    pub tls: Option<TlsFiles>,
    /// Key prefix; hash tags are added around it where DESIGN §3 says.
    pub prefix: String,
    /// Per-command timeout; a slower Redis counts as down.
    pub timeout: Duration,
    pub on_down: OnDown,
    pub fleet_size: u32,
    pub reconcile_every: Duration,
    /// How long the hits of an address below half of a rule's limit may
    /// wait in the daemon to share one script call (`detect::Pending`).
    pub hold: Duration,
}

impl RedisConfig {
    /// One server at `url` with the defaults of the `redis:` section and a
    /// per-command `timeout` (tests, benchmarks, tools).
    pub fn single(url: impl Into<String>, timeout: Duration) -> RedisConfig {
        RedisConfig {
            url: url.into(),
            servers: Servers::Url,
            tls: None,
            prefix: "fleetban".to_owned(),
            timeout,
            on_down: OnDown::Local,
            fleet_size: 1,
            reconcile_every: Duration::from_secs(60),
            hold: Duration::from_secs(1),
        }
    }
}

/// Where the Redis servers are.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum Servers {
    /// One server: `RedisConfig::url`.
    #[default]
    Url,
    /// Seed nodes of a Redis Cluster.
    Cluster(Vec<String>),
    /// The master of `service` as the sentinels name it, followed across failovers.
    Sentinel {
        service: String,
        nodes: Vec<String>,
        user: Option<String>,
        password: Option<String>,
        db: i64,
    },
}

/// PEM contents of `redis.tls`.
#[derive(Clone, Default)]
pub struct TlsFiles {
    pub ca: Option<Vec<u8>>,
    /// Client certificate chain and key (mutual TLS), both or neither.
    pub client: Option<(Vec<u8>, Vec<u8>)>,
}

impl std::fmt::Debug for TlsFiles {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TlsFiles")
            .field("ca", &self.ca.is_some())
            .field("client", &self.client.is_some())
            .finish()
    }
}

#[derive(Debug, Clone)]
pub struct FirewallConfig {
    pub backend: Backend,
    pub table: String,
    pub action: ActionSpec,
    pub ports: Vec<u16>,
}

impl FirewallConfig {
    /// The firewall this section asks for (`log` on a dry run). The nft
    /// binary is `nft`, or `$FLEETBAN_NFT` (tests, unusual installs: a
    /// path, run as argv, never as a shell string).
    pub fn enforcer(&self, dry_run: bool) -> Result<Enforcer, EnforceError> {
        if dry_run || self.backend == Backend::Log {
            return Ok(Enforcer::log());
        }
        let command = match std::env::var("FLEETBAN_NFT") {
            Ok(p) if !p.is_empty() => vec![p],
            _ => vec!["nft".to_owned()],
        };
        Enforcer::nft(NftOptions {
            table: self.table.clone(),
            action: match self.action {
                ActionSpec::Drop => Action::Drop,
                ActionSpec::Reject => Action::Reject,
            },
            ports: self.ports.clone(),
            command,
        })
    }
}

/// One rule: which requests of which logs count, the limit, and the ban.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    /// The rule file it came from.
    pub file: PathBuf,
    /// Absolute paths or globs.
    pub logs: Vec<String>,
    pub format: Format,
    pub matches: MatchSpec,
    pub ignore: MatchSpec,
    pub limit: Limit,
    pub ban: BanPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub algorithm: Algorithm,
    /// Hits allowed within one window; the next one bans. For
    /// `token_bucket`: the burst (bucket capacity).
    pub hits: u32,
    /// For `token_bucket`: the time an empty bucket takes to fill again
    /// (`burst` x interval), which bounds how long a hit matters.
    pub window_ms: i64,
    /// `token_bucket`: microseconds between two tokens (1 / rate).
    pub interval_us: i64,
    /// `sliding_window` with `prefilter`: the fraction of `hits` counted by
    /// the cheap fixed window before the exact window is consulted.
    pub prefilter: Option<f64>,
    pub scope: Scope,
    pub clock: Clock,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BanPolicy {
    pub duration_ms: i64,
    /// Repeat offenders get `duration * factor^(n-1)`, capped at `max_ms`.
    pub factor: f64,
    pub max_ms: i64,
    /// Bans older than this no longer count towards `n`.
    pub forget_after_ms: i64,
}

impl Config {
    /// Loads and validates the main file and every rule file it names.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let mut errors = Vec::new();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors(vec![ConfigError::whole_file(path, format!("cannot read: {e}"))]))?;
        let main: schema::MainFile =
            serde_saphyr::from_str(&text).map_err(|e| ConfigErrors(vec![ConfigError::from_yaml(path, &e)]))?;
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();

        let redis = main
            .redis
            .as_ref()
            .and_then(|r| redis_config(path, &base, r, &mut errors));
        let firewall = firewall_config(path, &main.firewall, &mut errors);
        let ipv6_prefix = match &main.ipv6_prefix {
            None => 64,
            Some(p) if (1..=128).contains(&p.value) => p.value,
            Some(p) => {
                errors.push(ConfigError::at(
                    path,
                    p.referenced,
                    "ipv6_prefix must be between 1 and 128",
                ));
                64
            }
        };
        let metrics = main.metrics.as_ref().and_then(|m| match m.value.parse::<SocketAddr>() {
            Ok(a) => Some(a),
            Err(_) => {
                errors.push(ConfigError::at(
                    path,
                    m.referenced,
                    format!(
                        "invalid metrics address `{}`: expected ADDRESS:PORT such as 127.0.0.1:9464",
                        m.value
                    ),
                ));
                None
            }
        });

        let mut rules = Vec::new();
        let mut seen: HashMap<String, (PathBuf, Location)> = HashMap::new();
        for pattern in &main.rules.value.0 {
            let files = expand(&base, pattern);
            if files.is_empty() {
                errors.push(ConfigError::at(
                    path,
                    main.rules.referenced,
                    format!("rule pattern `{pattern}` matches no file"),
                ));
            }
            for file in files {
                load_rule_file(&file, &mut rules, &mut seen, &mut errors);
            }
        }
        if rules.is_empty() && errors.is_empty() {
            errors.push(ConfigError::at(
                path,
                main.rules.referenced,
                "no rules defined: expected at least one rule",
            ));
        }
        if !errors.is_empty() {
            return Err(ConfigErrors(errors));
        }

        Ok(Config {
            file: path.to_path_buf(),
            host_id: main.host_id.clone().unwrap_or_else(hostname),
            state_dir: main
                .state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("/var/lib/fleetban")),
            redis,
            firewall,
            allow: main.allow.0.iter().map(|n| n.0).collect(),
            ipv6_prefix,
            max_bans_per_minute: main.safety.max_bans_per_minute,
            control: main
                .control
                .clone()
                .unwrap_or_else(|| PathBuf::from("/run/fleetban/control.sock")),
            metrics,
            rules,
        })
    }

    /// The distinct log paths/globs of all rules, in first-seen order.
    pub fn log_patterns(&self) -> Vec<String> {
        let mut out: Vec<String> = Vec::new();
        for r in &self.rules {
            for l in &r.logs {
                if !out.contains(l) {
                    out.push(l.clone());
                }
            }
        }
        out
    }
}

fn redis_config(
    file: &Path,
    base: &Path,
    section: &Spanned<schema::RedisSection>,
    errors: &mut Vec<ConfigError>,
) -> Option<RedisConfig> {
    let r = &section.value;
    let given = [r.url.is_some(), r.cluster.is_some(), r.sentinel.is_some()];
    if given.iter().filter(|g| **g).count() != 1 {
        errors.push(ConfigError::at(
            file,
            section.referenced,
            "redis: expected exactly one of `url`, `cluster` or `sentinel`",
        ));
        return None;
    }
    let before = errors.len();
    let mut check_url = |u: &Spanned<String>, unix: bool| -> String {
        let url = u.value.trim();
        let schemes: &[&str] = if unix {
            &["redis://", "rediss://", "unix://", "redis+unix://"]
        } else {
            &["redis://", "rediss://"]
        };
        let parsed =
            schemes.iter().any(|s| url.starts_with(s)) && redis::IntoConnectionInfo::into_connection_info(url).is_ok();
        if !parsed {
            let expected = if unix {
                "redis://HOST:PORT/DB, rediss://... or unix:///path/to/redis.sock"
            } else {
                "redis://HOST:PORT or rediss://HOST:PORT"
            };
            errors.push(ConfigError::at(
                file,
                u.referenced,
                format!("invalid Redis url `{url}`: expected {expected}"),
            ));
        }
        url.to_owned()
    };
    let (url, servers) = if let Some(u) = &r.url {
        (check_url(u, true), Servers::Url)
    } else if let Some(c) = &r.cluster {
        let nodes: Vec<String> = c.value.iter().map(|u| check_url(u, false)).collect();
        if nodes.is_empty() {
            errors.push(ConfigError::at(
                file,
                c.referenced,
                "redis.cluster: expected at least one node URL",
            ));
            return None;
        }
        (nodes[0].clone(), Servers::Cluster(nodes))
    } else {
        let s = &r.sentinel.as_ref()?.value;
        let nodes: Vec<String> = s.nodes.value.iter().map(|u| check_url(u, false)).collect();
        if nodes.is_empty() {
            errors.push(ConfigError::at(
                file,
                s.nodes.referenced,
                "redis.sentinel.nodes: expected at least one sentinel URL",
            ));
            return None;
        }
        let service = s.service.value.trim();
        if service.is_empty() {
            errors.push(ConfigError::at(
                file,
                s.service.referenced,
                "redis.sentinel.service: expected the master's name as the sentinels know it",
            ));
        }
        (
            format!("sentinel:{service}"),
            Servers::Sentinel {
                service: service.to_owned(),
                nodes,
                user: s.user.clone(),
                password: s.password.clone(),
                db: s.db,
            },
        )
    };
    let prefix = r.prefix.value.trim();
    if prefix.is_empty() || !prefix.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        errors.push(ConfigError::at(
            file,
            r.prefix.referenced,
            format!("invalid prefix `{prefix}`: expected letters, digits, `_`, `-` or `.`"),
        ));
    }
    let tls = r
        .tls
        .as_ref()
        .and_then(|t| tls_files(file, base, section.referenced, t, errors));
    let urls: Vec<&str> = match &servers {
        Servers::Url => vec![url.as_str()],
        Servers::Cluster(n) | Servers::Sentinel { nodes: n, .. } => n.iter().map(String::as_str).collect(),
    };
    if r.tls.is_some() && !urls.iter().any(|u| u.starts_with("rediss://")) {
        errors.push(ConfigError::at(
            file,
            section.referenced,
            "redis.tls is set but no URL uses it: TLS needs `rediss://`",
        ));
    }
    if errors.len() > before {
        return None;
    }
    Some(RedisConfig {
        url,
        servers,
        tls,
        prefix: prefix.to_owned(),
        timeout: r.timeout.map_or(Duration::from_millis(250), |d| d.0),
        on_down: r.on_down,
        fleet_size: r.fleet_size.map_or(1, |n| n.get()),
        reconcile_every: r.reconcile_every.map_or(Duration::from_secs(60), |d| d.0),
        hold: r.hold.map_or(Duration::from_secs(1), |d| d.0),
    })
}

/// Reads the PEM files of `redis.tls` (relative paths from the main file's
/// folder); a file that cannot be read or holds no PEM block is an error at
/// its own line.
fn tls_files(
    file: &Path,
    base: &Path,
    at: serde_saphyr::Location,
    t: &schema::TlsSection,
    errors: &mut Vec<ConfigError>,
) -> Option<TlsFiles> {
    let mut read = |p: &Spanned<PathBuf>, what: &str| -> Option<Vec<u8>> {
        let path = base.join(&p.value);
        match std::fs::read(&path) {
            Ok(b) if b.windows(11).any(|w| w == b"-----BEGIN ") => Some(b),
            Ok(_) => {
                errors.push(ConfigError::at(
                    file,
                    p.referenced,
                    format!("redis.tls.{what}: {} holds no PEM block", path.display()),
                ));
                None
            }
            Err(e) => {
                errors.push(ConfigError::at(
                    file,
                    p.referenced,
                    format!("redis.tls.{what}: cannot read {}: {e}", path.display()),
                ));
                None
            }
        }
    };
    let ca = t.ca.as_ref().and_then(|p| read(p, "ca"));
    let cert = t.cert.as_ref().and_then(|p| read(p, "cert"));
    let key = t.key.as_ref().and_then(|p| read(p, "key"));
    let client = match (&t.cert, &t.key) {
        (None, None) => None,
        (Some(_), Some(_)) => Some((cert?, key?)),
        _ => {
            errors.push(ConfigError::at(
                file,
                at,
                "redis.tls: `cert` and `key` go together (client certificate and its key)",
            ));
            return None;
        }
    };
    Some(TlsFiles { ca, client })
}

fn firewall_config(file: &Path, f: &schema::FirewallSection, errors: &mut Vec<ConfigError>) -> FirewallConfig {
    let table = match &f.table {
        None => "fleetban".to_owned(),
        Some(t) => {
            let ok = !t.value.is_empty()
                && t.value.len() <= 32
                && t.value.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_');
            if !ok {
                errors.push(ConfigError::at(
                    file,
                    t.referenced,
                    format!("invalid table name `{}`: expected 1-32 letters, digits or `_`", t.value),
                ));
            }
            t.value.clone()
        }
    };
    FirewallConfig {
        backend: f.backend,
        table,
        action: f.action,
        ports: f.ports.0.iter().map(|p| p.0).collect(),
    }
}

fn load_rule_file(
    file: &Path,
    rules: &mut Vec<Rule>,
    seen: &mut HashMap<String, (PathBuf, Location)>,
    errors: &mut Vec<ConfigError>,
) {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => return errors.push(ConfigError::whole_file(file, format!("cannot read: {e}"))),
    };
    let parsed: schema::RuleFile = match serde_saphyr::from_str(&text) {
        Ok(p) => p,
        Err(e) => return errors.push(ConfigError::from_yaml(file, &e)),
    };
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    for spec in parsed.rules {
        let name = spec.name.value.trim().to_owned();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
            errors.push(ConfigError::at(
                file,
                spec.name.referenced,
                format!("invalid rule name `{name}`: expected letters, digits, `_`, `-` or `.`"),
            ));
            continue;
        }
        if let Some((other, loc)) = seen.get(&name) {
            let first = ConfigError::at(other, *loc, "");
            errors.push(ConfigError::at(
                file,
                spec.name.referenced,
                format!(
                    "duplicate rule name `{name}` (first defined at {}:{}:{})",
                    other.display(),
                    first.line,
                    first.column
                ),
            ));
            continue;
        }
        seen.insert(name.clone(), (file.to_path_buf(), spec.name.referenced));
        if spec.logs.value.0.is_empty() {
            errors.push(ConfigError::at(
                file,
                spec.logs.referenced,
                "`logs` is empty: expected at least one path",
            ));
            continue;
        }
        if let Some(bad) = spec
            .logs
            .value
            .0
            .iter()
            .find_map(|l| glob::Pattern::new(l).err().map(|e| (l, e)))
        {
            errors.push(ConfigError::at(
                file,
                spec.logs.referenced,
                format!("invalid log path or glob `{}`: {}", bad.0, bad.1),
            ));
            continue;
        }
        let l = &spec.limit.value;
        let limit = match limit_of(l) {
            Ok(limit) => limit,
            Err(msg) => {
                errors.push(ConfigError::at(file, spec.limit.referenced, msg));
                continue;
            }
        };
        let esc = spec.ban.escalate.as_ref();
        let duration_ms = spec.ban.duration.as_ms().max(1000);
        let factor = esc.map_or(1.0, |e| e.factor);
        if !(factor.is_finite() && (1.0..=1000.0).contains(&factor)) {
            errors.push(ConfigError::at(
                file,
                spec.limit.referenced,
                "`escalate.factor` must be between 1 and 1000",
            ));
            continue;
        }
        let week = 7 * 86_400_000;
        rules.push(Rule {
            name,
            file: file.to_path_buf(),
            logs: spec.logs.value.0.iter().map(|l| absolute(&base, l)).collect(),
            format: spec.format.0.clone(),
            matches: spec.match_,
            ignore: spec.ignore,
            limit,
            ban: BanPolicy {
                duration_ms,
                factor,
                max_ms: esc
                    .and_then(|e| e.max)
                    .map_or(if esc.is_some() { week } else { duration_ms }, Dur::as_ms)
                    .max(duration_ms),
                forget_after_ms: esc.and_then(|e| e.forget_after).map_or(week, Dur::as_ms),
            },
        });
    }
}

/// The validated limit of one rule: each algorithm takes its own parameters
/// and refuses the others'.
fn limit_of(l: &schema::LimitSpec) -> Result<Limit, String> {
    let algo = l.algorithm.name();
    let mut limit = Limit {
        algorithm: l.algorithm,
        hits: 0,
        window_ms: 0,
        interval_us: 0,
        prefilter: None,
        scope: l.scope,
        clock: l.clock,
    };
    if l.prefilter.is_some() && l.algorithm != Algorithm::SlidingWindow {
        return Err(format!("`prefilter` applies to `sliding_window` only, not to `{algo}`"));
    }
    if l.algorithm == Algorithm::TokenBucket {
        if l.hits.is_some() || l.window.is_some() {
            return Err("`token_bucket` takes `burst` and `rate`, not `hits` and `window`: e.g. `{ algorithm: token_bucket, burst: 20, rate: 5/s }`".into());
        }
        let (Some(burst), Some(rate)) = (l.burst, l.rate) else {
            return Err(
                "`token_bucket` needs `burst` and `rate`: e.g. `{ algorithm: token_bucket, burst: 20, rate: 5/s }`"
                    .into(),
            );
        };
        let interval_us = (1e6 / rate.0).round();
        if !(1.0..=86_400e6).contains(&interval_us) {
            return Err("`rate` must be between 1/d and 1000000/s".into());
        }
        // Times are µs in Lua doubles (exact up to 2^53); a full bucket spans
        // burst x interval.
        if f64::from(burst.0) * interval_us >= (1u64 << 50) as f64 {
            return Err("`token_bucket` needs burst / rate below ~35 years: lower `burst` or raise `rate`".into());
        }
        limit.hits = burst.0;
        limit.interval_us = interval_us as i64;
        limit.window_ms = ((i64::from(burst.0) * limit.interval_us + 999) / 1000).max(1);
        return Ok(limit);
    }
    if l.burst.is_some() || l.rate.is_some() {
        return Err(format!(
            "`burst` and `rate` apply to `token_bucket` only; `{algo}` takes `hits` and `window`"
        ));
    }
    let (Some(hits), Some(window)) = (l.hits, l.window) else {
        return Err(format!(
            "`{algo}` needs `hits` and `window`: e.g. `{{ hits: 100, window: 60s }}`"
        ));
    };
    if window.as_ms() < 1 {
        return Err("`window` must be at least 1ms".into());
    }
    limit.hits = hits.0;
    limit.window_ms = window.as_ms();
    // The sliding counter weighs counts by time in exact integers; Lua's
    // numbers are doubles, exact up to 2^53, and the estimate reaches 2 x hits x window.
    if l.algorithm == Algorithm::SlidingCounter && (i128::from(hits.0) * i128::from(limit.window_ms)) >= 1 << 52 {
        return Err("`sliding_counter` needs hits x window (in ms) below 2^52: lower `hits` or `window`".into());
    }
    limit.prefilter = l.prefilter.map(|f| f.0);
    Ok(limit)
}

fn absolute(base: &Path, p: &str) -> String {
    let path = Path::new(p);
    if path.is_absolute() {
        p.to_owned()
    } else {
        base.join(path).to_string_lossy().into_owned()
    }
}

/// Files matching a glob relative to `base`, sorted (deterministic rule order).
fn expand(base: &Path, pattern: &str) -> Vec<PathBuf> {
    let full = absolute(base, pattern);
    let mut out: Vec<PathBuf> = match glob::glob(&full) {
        Ok(paths) => paths.filter_map(Result::ok).filter(|p| p.is_file()).collect(),
        Err(_) => Vec::new(),
    };
    out.sort();
    out
}

/// The machine's host name, the default `host_id`.
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .ok()
        .filter(|s| !s.is_empty())
        .unwrap_or_else(|| "localhost".to_owned())
}
