//! The `redis:` section: which servers (one URL, a Sentinel service or a
//! Cluster), TLS files, timeouts and what to do while Redis is down.

use std::path::{Path, PathBuf};
use std::time::Duration;

use serde_saphyr::Spanned;

use super::{schema, ConfigError, OnDown};

#[derive(Debug, Clone)]
pub struct RedisConfig {
    /// The server of `Servers::Url`; otherwise what logs name (the first
    /// cluster node, or `sentinel:SERVICE`).
    pub url: String,
    pub servers: Servers,
    /// CA and client certificate for TLS (`rediss://`), read at load.
    pub tls: Option<TlsFiles>,
    /// Key prefix; hash tags are added around it where docs/design.md §3 says.
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
    Sentinel(Sentinel),
}

/// `redis.sentinel`: whom to ask for the master, and how to log in to it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Sentinel {
    pub service: String,
    pub nodes: Vec<String>,
    pub user: Option<String>,
    pub password: Option<String>,
    pub db: i64,
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

pub(super) fn redis_config(
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
            Servers::Sentinel(Sentinel {
                service: service.to_owned(),
                nodes,
                user: s.user.clone(),
                password: s.password.clone(),
                db: s.db,
            }),
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
        Servers::Cluster(n) | Servers::Sentinel(Sentinel { nodes: n, .. }) => n.iter().map(String::as_str).collect(),
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
        let problem = match std::fs::read(&path) {
            Ok(b) if b.windows(11).any(|w| w == b"-----BEGIN ") => return Some(b),
            Ok(_) => "holds no PEM block".to_owned(),
            Err(e) => format!("cannot be read: {e}"),
        };
        errors.push(ConfigError::at(
            file,
            p.referenced,
            format!("redis.tls.{what}: {} {problem}", path.display()),
        ));
        None
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
