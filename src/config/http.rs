//! The `proxies:` list and the `http:` section: the hops trusted to name
//! the client, and the decision endpoint nginx's `auth_request` asks.

use std::net::SocketAddr;
use std::path::{Path, PathBuf};

use super::{schema, ConfigError};

/// Where the decision endpoint listens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Listen {
    /// A unix socket path (the recommended form: no port to expose).
    Unix(PathBuf),
    /// A loopback TCP address, `127.0.0.1:PORT` or `[::1]:PORT`.
    Tcp(SocketAddr),
}

impl std::fmt::Display for Listen {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Listen::Unix(p) => write!(f, "unix:{}", p.display()),
            Listen::Tcp(a) => write!(f, "{a}"),
        }
    }
}

/// The validated `http:` section.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HttpConfig {
    pub listen: Listen,
    /// What a banned client gets: 403, or 429 with `Retry-After`.
    pub deny_status: u16,
    /// Group given a unix socket (mode 0660); `None`: the default
    /// `www-data` when that group exists, else the socket is root's only.
    pub group: Option<String>,
}

/// The group a unix socket gets when `http.group` is not set.
pub const DEFAULT_GROUP: &str = "www-data";

pub(super) fn http_config(
    file: &Path,
    section: &schema::HttpSection,
    errors: &mut Vec<ConfigError>,
) -> Option<HttpConfig> {
    let text = section.listen.value.trim();
    let listen = if text.starts_with('/') {
        Listen::Unix(PathBuf::from(text))
    } else {
        match text.parse::<SocketAddr>() {
            Ok(a) if a.ip().is_loopback() && a.port() != 0 => Listen::Tcp(a),
            Ok(a) => {
                errors.push(ConfigError::at(
                    file,
                    section.listen.referenced,
                    format!(
                        "http.listen `{a}` is not a loopback address: the endpoint answers nginx on this host \
                         only (use a unix socket path, 127.0.0.1:PORT or [::1]:PORT)"
                    ),
                ));
                return None;
            }
            Err(_) => {
                errors.push(ConfigError::at(
                    file,
                    section.listen.referenced,
                    format!(
                        "invalid http.listen `{text}`: expected an absolute unix socket path, \
                         127.0.0.1:PORT or [::1]:PORT"
                    ),
                ));
                return None;
            }
        }
    };
    let deny_status = match &section.deny_status {
        None => 403,
        Some(s) if s.value == 403 || s.value == 429 => s.value,
        Some(s) => {
            errors.push(ConfigError::at(
                file,
                s.referenced,
                format!("http.deny_status must be 403 or 429, not {}", s.value),
            ));
            return None;
        }
    };
    let group = match &section.group {
        None => None,
        Some(g) if matches!(listen, Listen::Tcp(_)) => {
            errors.push(ConfigError::at(
                file,
                g.referenced,
                "http.group applies to a unix socket only",
            ));
            return None;
        }
        Some(g) => Some(g.value.clone()),
    };
    Some(HttpConfig {
        listen,
        deny_status,
        group,
    })
}
