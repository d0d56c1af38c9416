//! Configuration: the main file (`/etc/fleetban/fleetban.yaml`) and the rule
//! files its `rules:` globs name, loaded into one validated [`Config`].
//!
//! `schema` holds the serde structs as written; `values` the scalar types that
//! parse where they stand; `redis`, `firewall` and `rules` validate their
//! sections into the types the rest of fleetban uses; this file loads the
//! main file, resolves paths and applies defaults. Every error carries file, line and
//! column ([`ConfigError`]); loading goes on after an error where it can so
//! that all of them are reported together.

mod blocklists;
mod bytes;
mod error;
mod firewall;
mod http;
mod notify;
mod prune;
mod redis;
mod rules;
mod schema;
mod values;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use ipnet::IpNet;
use serde_saphyr::Location;

pub use crate::limit::algorithm::distinct::MAX_DISTINCT_HITS;
pub use bytes::ByteSize;
pub use error::{ConfigError, ConfigErrors};
pub use firewall::FirewallConfig;
pub use http::{HttpConfig, Listen, DEFAULT_GROUP as DEFAULT_HTTP_GROUP};
pub use notify::{read_secret, Endpoint, NotifyConfig, NotifyFormat};
pub use redis::{RedisConfig, Sentinel, Servers, TlsFiles};
pub use rules::{algorithm_name, BanPolicy, Limit, NetworkEscalation, Rule};
pub use schema::{ActionSpec, Algorithm, Backend, Clock, Distinct, LimitSpec, MatchSpec, OnDown, Scope};
pub use values::{Dur, Level, Method, Net, Rate, Re, StatusPat};

/// Where `fleetban` looks when `-c` is not given.
pub const DEFAULT_PATH: &str = "/etc/fleetban/fleetban.yaml";

/// `safety.max_client_state` when unset, and its least.
pub const DEFAULT_MAX_CLIENT_STATE: u64 = 128 << 20;
const MIN_CLIENT_STATE: u64 = 1 << 20;

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
    /// Trusted hops in front of nginx: never counted, never banned, and
    /// the only ones whose forwarded list names the client.
    pub proxies: Vec<IpNet>,
    /// The decision endpoint for nginx `auth_request`, off when `None`.
    pub http: Option<HttpConfig>,
    /// IPv6 clients are counted and banned per prefix of this length.
    pub ipv6_prefix: u8,
    /// Safety valve: new bans this host may apply per minute.
    pub max_bans_per_minute: u32,
    /// Bytes the embedded windows may hold (the store's, or the fallback's
    /// while Redis is down): past it the least full are shed.
    pub max_client_state: u64,
    /// Unix socket of the running daemon (`fleetban status`).
    pub control: PathBuf,
    /// Prometheus endpoint, off when `None`.
    pub metrics: Option<SocketAddr>,
    pub rules: Vec<Rule>,
    /// `blocklists:`, validated (files are read by the daemon).
    pub blocklists: Vec<crate::blocklist::Spec>,
    /// `notify:`, the webhook targets (read at start).
    pub notify: Vec<NotifyConfig>,
}

impl Config {
    /// Loads and validates the main file and every rule file it names.
    pub fn load(path: &Path) -> Result<Config, ConfigErrors> {
        let (config, rule_errors) = Config::read(path)?;
        match rule_errors.is_empty() {
            true => Ok(config),
            false => Err(ConfigErrors(rule_errors)),
        }
    }

    /// The main file, validated, with the rules that loaded, and the
    /// errors of the rule files (in file order); any error of the main file
    /// is a failure, with every error found.
    fn read(path: &Path) -> Result<(Config, Vec<ConfigError>), ConfigErrors> {
        let mut errors = Vec::new();
        let text = std::fs::read_to_string(path)
            .map_err(|e| ConfigErrors(vec![ConfigError::whole_file(path, format!("cannot read: {e}"))]))?;
        // Every error of the main file too: its bad entries are blanked out
        // and the rest validated (`prune.rs`).
        let mut found = Vec::new();
        let parsed = prune::every_error::<schema::MainFile>(path, &text, &mut found);
        let Some((main, pruned)) = parsed else {
            return Err(ConfigErrors(found));
        };
        let base = path.parent().map(Path::to_path_buf).unwrap_or_default();

        let redis = main
            .redis
            .as_ref()
            .and_then(|r| redis::redis_config(path, &base, r, &mut errors));
        let firewall = firewall::firewall_config(path, &main.firewall, &mut errors);
        let blocklists = blocklists::blocklists(path, &base, &main.blocklists, &mut errors);
        let notify = notify::notify(path, &base, &main.notify, &mut errors);
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
        let max_client_state = match &main.safety.max_client_state {
            None => DEFAULT_MAX_CLIENT_STATE,
            Some(m) if m.value.0 >= MIN_CLIENT_STATE => m.value.0,
            Some(m) => {
                errors.push(ConfigError::at(
                    path,
                    m.referenced,
                    format!(
                        "safety.max_client_state must be at least {} (the default is {})",
                        ByteSize(MIN_CLIENT_STATE),
                        ByteSize(DEFAULT_MAX_CLIENT_STATE)
                    ),
                ));
                DEFAULT_MAX_CLIENT_STATE
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

        let proxies: Vec<IpNet> = main
            .proxies
            .as_ref()
            .map(|p| p.value.0.iter().map(|n| n.0).collect())
            .unwrap_or_default();
        let http = main
            .http
            .as_ref()
            .and_then(|h| http::http_config(path, &h.value, &mut errors));

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
                rules::load_rule_file(&file, &proxies, ipv6_prefix, &mut rules, &mut seen, &mut errors);
            }
        }
        let names: Vec<String> = rules.iter().map(|r: &Rule| r.name.clone()).collect();
        // Against the rules that loaded, once every rule file did.
        if !errors.iter().any(|e| e.file != path) {
            notify::check_rules(path, &notify, &names, &mut errors);
        }
        if rules.is_empty() && errors.is_empty() {
            errors.push(ConfigError::at(
                path,
                main.rules.referenced,
                "no rules defined: expected at least one rule",
            ));
        }
        errors.retain(|e| e.file != path || !pruned.hides(e));
        if !found.is_empty() || errors.iter().any(|e| e.file == path) {
            // The main file's errors in its order, then the rule files'.
            found.extend(errors.iter().filter(|e| e.file == path).cloned());
            found.sort_by_key(|e| (e.line, e.column));
            found.extend(errors.into_iter().filter(|e| e.file != path));
            return Err(ConfigErrors(found));
        }

        let config = Config {
            file: path.to_path_buf(),
            host_id: main.host_id.clone().unwrap_or_else(hostname),
            state_dir: main
                .state_dir
                .clone()
                .unwrap_or_else(|| PathBuf::from("/var/lib/fleetban")),
            redis,
            firewall,
            allow: main.allow.0.iter().map(|n| n.0).collect(),
            proxies,
            http,
            ipv6_prefix,
            max_bans_per_minute: main.safety.max_bans_per_minute.0,
            max_client_state,
            control: main
                .control
                .clone()
                .unwrap_or_else(|| PathBuf::from("/run/fleetban/control.sock")),
            metrics,
            rules,
            blocklists,
            notify,
        };
        Ok((config, errors))
    }

    /// What is never counted nor banned for the whole fleet: loopback,
    /// `allow:` and `proxies:` (a host adds its own addresses:
    /// [`Config::own_addresses`]).
    pub fn never_banned(&self) -> crate::verdict::NeverBanned {
        crate::verdict::NeverBanned::new(&self.allow, &self.proxies, &[])
    }

    /// This host's never-banned set, following its interfaces.
    pub fn own_addresses(&self) -> crate::verdict::Own {
        crate::verdict::Own::new(&self.allow, &self.proxies)
    }

    /// Warnings about a configuration that loads but may not do what is
    /// meant, one line each (`check` prints them, the daemon logs them).
    pub fn warnings(&self) -> Vec<String> {
        let mut out = Vec::new();
        if !self.proxies.is_empty() && self.http.is_none() {
            out.push(
                "`proxies` is set but no `http:` endpoint is: clients behind a proxy are banned in nft, \
                 where their packets never come from; add `http: { listen: ... }` and the nginx snippet \
                 (README: Behind a load balancer or CDN)"
                    .to_owned(),
            );
        }
        for r in &self.rules {
            if matches!(&r.format, crate::parse::Format::LogFormat(f) if f.trim_start().starts_with('{')) {
                out.push(format!(
                    "rule {} ({}): its log_format is a JSON template: it parses, but `match`/`ignore` see \
                     the escaped text (`\\\"` for a quote); `format: {{ json: {{ VARIABLE: KEY, ... }} }}` \
                     matches the unescaped values (README: JSON access logs)",
                    r.name,
                    r.file.display()
                ));
            }
            // The safety valve weighs a ban by the clients it covers.
            let mut lengths = Vec::new();
            if let crate::addr::Keying::Network { v4, v6 } = r.limit.keying {
                lengths.push(("key: network", v4, v6));
            }
            if let Some(e) = r.ban.network {
                lengths.push(("escalate_network", e.ipv4_prefix, e.ipv6_prefix));
            }
            let max = u64::from(self.max_bans_per_minute);
            for (what, v4, v6) in lengths {
                let nets: [IpNet; 2] = [
                    format!("0.0.0.0/{v4}").parse().expect("a valid length"),
                    format!("::/{}", v6.min(self.ipv6_prefix))
                        .parse()
                        .expect("a valid length"),
                ];
                for net in nets {
                    let clients = crate::addr::clients_covered(&net, self.ipv6_prefix);
                    if clients > max {
                        out.push(format!(
                            "rule {} ({}): a /{} ban ({what}) covers {clients} clients, more than \
                             `safety.max_bans_per_minute` ({max}) lets through in a minute: the safety valve \
                             refuses every such ban; raise it or use a longer prefix",
                            r.name,
                            r.file.display(),
                            net.prefix_len()
                        ));
                    }
                }
            }
        }
        out
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

impl Config {
    /// The configuration as the commands that talk to the daemon or to
    /// Redis need it (`status`, `bans`, `ban`, `unban`, `flush`,
    /// `explain`): the main file must be valid (socket, Redis, firewall,
    /// `state_dir`, `allow`, `proxies`), while errors in rule files are
    /// returned beside the configuration with the rules that did load, so
    /// that an operator can still reach a daemon that runs on its last good
    /// rules. An error in the main file fails as [`Config::load`] does.
    pub fn load_for_cli(path: &Path) -> Result<(Config, Option<ConfigErrors>), ConfigErrors> {
        let (config, rule_errors) = Config::read(path)?;
        Ok((config, (!rule_errors.is_empty()).then_some(ConfigErrors(rule_errors))))
    }
}
