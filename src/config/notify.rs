//! The `notify:` section: webhook targets told of bans, unbans, the
//! safety valve and Redis outages (`crate::notify` sends). Validated here:
//! the URL (https, or http to loopback only), the format, the secret file
//! (readable, not empty), the event names and the rule names, which are
//! checked once the rules are loaded ([`check_rules`]).

use std::path::{Path, PathBuf};

use serde::Deserialize;
use serde_saphyr::{Location, Spanned};

use super::values::{Dur, List};
use super::ConfigError;

/// One target as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct NotifySection {
    pub url: Spanned<String>,
    #[serde(default)]
    pub format: NotifyFormat,
    /// HMAC-SHA256 key of the `X-Fleetban-Signature` header.
    pub secret_file: Option<Spanned<PathBuf>>,
    /// Which events (default `[ban, valve, redis]`).
    pub events: Option<Spanned<List<String>>>,
    /// Only bans (and unbans) of these rules.
    pub rules: Option<Spanned<List<String>>>,
    /// Only bans at least this long (a permanent ban always passes).
    pub min_duration: Option<Dur>,
}

/// What a target's body looks like (README: Notifications).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum NotifyFormat {
    /// One JSON object per event.
    #[default]
    Json,
    /// A Slack incoming-webhook message (`{"text": ...}`).
    Slack,
    /// ntfy: a plain-text body with a `Title` header.
    Ntfy,
}

impl NotifyFormat {
    pub fn name(self) -> &'static str {
        match self {
            NotifyFormat::Json => "json",
            NotifyFormat::Slack => "slack",
            NotifyFormat::Ntfy => "ntfy",
        }
    }
}

/// The kinds of events a target may ask for.
pub const EVENTS: [&str; 4] = ["ban", "unban", "valve", "redis"];

/// Where a target's POSTs go, parsed from its URL.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Endpoint {
    /// `https` (rustls) or `http` (loopback only).
    pub tls: bool,
    /// The host as written (a name, an IPv4 address or an IPv6 one without brackets).
    pub host: String,
    pub port: u16,
    /// Path and query, at least `/`. May hold a token (Slack's hooks do):
    /// never shown; [`Endpoint::origin`] is.
    pub path: String,
}

impl Endpoint {
    /// `scheme://host[:port]`: how a target is named in `status`,
    /// metrics, logs and `check` (the path may be a secret).
    pub fn origin(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        let host = match self.host.contains(':') {
            true => format!("[{}]", self.host),
            false => self.host.clone(),
        };
        match (self.tls, self.port) {
            (true, 443) | (false, 80) => format!("{scheme}://{host}"),
            _ => format!("{scheme}://{host}:{}", self.port),
        }
    }

    /// Parses `http(s)://host[:port][/path]`; `http` only to a loopback host.
    pub fn parse(url: &str) -> Result<Endpoint, String> {
        let url = url.trim();
        let (tls, rest) = if let Some(r) = url.strip_prefix("https://") {
            (true, r)
        } else if let Some(r) = url.strip_prefix("http://") {
            (false, r)
        } else {
            return Err("expected an https:// URL (http:// only to loopback)".to_owned());
        };
        let (authority, path) = match rest.find(['/', '?']) {
            Some(i) if rest.as_bytes()[i] == b'/' => (&rest[..i], rest[i..].to_owned()),
            Some(i) => (&rest[..i], format!("/{}", &rest[i..])),
            None => (rest, "/".to_owned()),
        };
        if authority.contains('@') {
            return Err("credentials in the URL are not supported: use secret_file".to_owned());
        }
        let (host, port) = if let Some(v6) = authority.strip_prefix('[') {
            let Some((h, after)) = v6.split_once(']') else {
                return Err("unclosed `[` in the host".to_owned());
            };
            (h, after.strip_prefix(':'))
        } else {
            match authority.rsplit_once(':') {
                Some((h, p)) => (h, Some(p)),
                None => (authority, None),
            }
        };
        if host.is_empty() || host.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("no host".to_owned());
        }
        let port = match port {
            None => {
                if tls {
                    443
                } else {
                    80
                }
            }
            Some(p) => match p.parse::<u16>() {
                Ok(p) if p > 0 => p,
                _ => return Err(format!("invalid port `{p}`")),
            },
        };
        if path.chars().any(|c| c.is_whitespace() || c.is_control()) {
            return Err("spaces or control characters in the path".to_owned());
        }
        let loopback = host == "localhost" || host.parse::<std::net::IpAddr>().is_ok_and(|a| a.is_loopback());
        if !tls && !loopback {
            return Err("http:// is allowed only to loopback (127.0.0.1, [::1], localhost): use https://".to_owned());
        }
        Ok(Endpoint {
            tls,
            host: host.to_owned(),
            port,
            path,
        })
    }
}

/// A validated target.
#[derive(Clone, Debug)]
pub struct NotifyConfig {
    pub endpoint: Endpoint,
    pub format: NotifyFormat,
    /// The file holding the HMAC key: read again when the daemon starts.
    pub secret_file: Option<PathBuf>,
    /// Subset of [`EVENTS`].
    pub events: Vec<String>,
    /// Empty: every rule.
    pub rules: Vec<String>,
    /// Shorter bans are not told (0: all).
    pub min_duration_ms: i64,
    /// Where `rules:` stands, for [`check_rules`].
    rules_at: Location,
}

/// The same target, wherever it is written in the file (a reload compares).
impl PartialEq for NotifyConfig {
    fn eq(&self, o: &NotifyConfig) -> bool {
        (
            &self.endpoint,
            self.format,
            &self.secret_file,
            &self.events,
            &self.rules,
            self.min_duration_ms,
        ) == (
            &o.endpoint,
            o.format,
            &o.secret_file,
            &o.events,
            &o.rules,
            o.min_duration_ms,
        )
    }
}

/// Reads a secret file: its content without surrounding whitespace, not
/// empty. The error names the file, never the content.
pub fn read_secret(path: &Path) -> Result<Vec<u8>, String> {
    let bytes = std::fs::read(path).map_err(|e| format!("secret_file {}: cannot read: {e}", path.display()))?;
    let text = bytes.trim_ascii();
    if text.is_empty() {
        return Err(format!("secret_file {}: empty", path.display()));
    }
    Ok(text.to_vec())
}

pub(super) fn notify(
    file: &Path,
    base: &Path,
    list: &[NotifySection],
    errors: &mut Vec<ConfigError>,
) -> Vec<NotifyConfig> {
    let mut out = Vec::new();
    for n in list {
        let endpoint = match Endpoint::parse(&n.url.value) {
            Ok(e) => e,
            Err(why) => {
                // The URL itself is not repeated: it may hold a token.
                errors.push(ConfigError::at(file, n.url.referenced, format!("notify.url: {why}")));
                continue;
            }
        };
        let secret_file = n.secret_file.as_ref().and_then(|s| {
            let path = base.join(&s.value);
            match read_secret(&path) {
                Ok(_) => Some(path),
                Err(why) => {
                    errors.push(ConfigError::at(file, s.referenced, why));
                    None
                }
            }
        });
        let events = match &n.events {
            None => vec!["ban".to_owned(), "valve".to_owned(), "redis".to_owned()],
            Some(e) => {
                for name in &e.value.0 {
                    if !EVENTS.contains(&name.as_str()) {
                        errors.push(ConfigError::at(
                            file,
                            e.referenced,
                            format!("notify.events: unknown event `{name}`: expected {}", EVENTS.join(", ")),
                        ));
                    }
                }
                e.value.0.clone()
            }
        };
        out.push(NotifyConfig {
            endpoint,
            format: n.format,
            secret_file,
            events,
            rules: n.rules.as_ref().map(|r| r.value.0.clone()).unwrap_or_default(),
            min_duration_ms: n.min_duration.map_or(0, Dur::as_ms),
            rules_at: n.rules.as_ref().map_or(Location::UNKNOWN, |r| r.referenced),
        });
    }
    out
}

/// Every rule a target names must be loaded (a typo would silence it).
pub(super) fn check_rules(file: &Path, targets: &[NotifyConfig], rules: &[String], errors: &mut Vec<ConfigError>) {
    for t in targets {
        for r in &t.rules {
            if !rules.contains(r) {
                errors.push(ConfigError::at(
                    file,
                    t.rules_at,
                    format!("notify.rules: no rule is named `{r}`"),
                ));
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::Endpoint;

    #[test]
    fn urls_parse_into_origin_and_path_and_http_is_for_loopback_only() {
        let e = Endpoint::parse("https://hooks.example.com/fleetban?x=1").unwrap();
        assert_eq!(
            (e.tls, e.host.as_str(), e.port, e.path.as_str()),
            (true, "hooks.example.com", 443, "/fleetban?x=1")
        );
        assert_eq!(e.origin(), "https://hooks.example.com");
        let e = Endpoint::parse("http://[::1]:8080").unwrap();
        assert_eq!((e.host.as_str(), e.port, e.path.as_str()), ("::1", 8080, "/"));
        assert_eq!(e.origin(), "http://[::1]:8080");
        assert!(Endpoint::parse("http://127.0.0.1:9/x").is_ok());
        assert!(Endpoint::parse("http://hooks.example.com/x").is_err());
        assert!(Endpoint::parse("ftp://x").is_err());
        assert!(Endpoint::parse("https://u:p@x/").is_err());
        assert!(Endpoint::parse("https://x:0/").is_err());
        assert!(Endpoint::parse("https:///x").is_err());
    }
}
