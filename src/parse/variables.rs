//! nginx variables as the `log_format` compiler sees them: which [`Request`]
//! field each one fills, which have a fixed width, and which are tokens that
//! nginx writes itself (no space or quote inside, so safe unquoted anywhere).
//! Everything not named here is an opaque field, skipped.
//!
//! [`Request`]: super::Request

/// What a variable means to a `Request`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Field {
    Addr,
    /// `$http_x_forwarded_for`: hops the client and proxies wrote.
    Forwarded,
    /// `$proxy_protocol_addr`: the client an L4 balancer names.
    ProxyProtocol,
    TimeLocal,
    TimeIso,
    Msec,
    Request,
    Method,
    /// `$request_uri`: the target as the client sent it (path and query).
    RequestUri,
    /// `$uri`, `$document_uri`: nginx's normalised path, after rewrites
    /// and internal redirects.
    Uri,
    Status,
    Bytes,
    Referer,
    UserAgent,
    Host,
    LimitReqStatus,
    Other,
}

impl Field {
    pub(crate) fn of(name: &str) -> Field {
        match name.to_ascii_lowercase().as_str() {
            "remote_addr" => Field::Addr,
            "http_x_forwarded_for" => Field::Forwarded,
            "proxy_protocol_addr" => Field::ProxyProtocol,
            "time_local" => Field::TimeLocal,
            "time_iso8601" => Field::TimeIso,
            "msec" => Field::Msec,
            "request" => Field::Request,
            "request_method" => Field::Method,
            "request_uri" => Field::RequestUri,
            "uri" | "document_uri" => Field::Uri,
            "status" => Field::Status,
            "body_bytes_sent" | "bytes_sent" => Field::Bytes,
            "http_referer" => Field::Referer,
            "http_user_agent" => Field::UserAgent,
            "host" | "http_host" | "server_name" => Field::Host,
            "limit_req_status" => Field::LimitReqStatus,
            _ => Field::Other,
        }
    }

    pub(crate) fn fixed_width(self) -> Option<usize> {
        match self {
            Field::TimeLocal => Some(26),
            Field::TimeIso => Some(25),
            _ => None,
        }
    }

    /// Whether the field may name the client in place of the peer.
    pub(crate) fn is_forwarded(self) -> bool {
        matches!(self, Field::Forwarded | Field::ProxyProtocol)
    }

    /// The variable's name, for the fields a message names.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Field::Forwarded => "http_x_forwarded_for",
            Field::ProxyProtocol => "proxy_protocol_addr",
            Field::Addr => "remote_addr",
            _ => "?",
        }
    }

    pub(crate) fn is_time(self) -> bool {
        matches!(self, Field::TimeLocal | Field::TimeIso | Field::Msec)
    }
}

/// Variables nginx fills itself with no space or quote in them (numbers,
/// addresses, tokens, config values): safe to read unquoted before the address.
const TOKEN_VARS: &[&str] = &[
    "remote_addr",
    "remote_port",
    "realip_remote_addr",
    "realip_remote_port",
    "proxy_protocol_addr",
    "proxy_protocol_port",
    "server_addr",
    "server_port",
    "server_name",
    "hostname",
    "status",
    "body_bytes_sent",
    "bytes_sent",
    "request_length",
    "request_time",
    "request_method",
    "request_id",
    "msec",
    "connection",
    "connection_requests",
    "pid",
    "pipe",
    "scheme",
    "https",
    "server_protocol",
];

/// Whether `name` is one of [`TOKEN_VARS`] (nginx names are case-insensitive).
pub(crate) fn is_token_var(name: &str) -> bool {
    TOKEN_VARS.contains(&name.to_ascii_lowercase().as_str())
}
