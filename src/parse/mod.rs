//! Parse: one access-log line in, one [`Request`] out, borrowing the line.
//!
//! This is the step between `source` (which hands over whole lines) and
//! `detect` (which decides whether a request counts). Five ways to read a
//! line, chosen once per log by a [`Format`]: a hand-written scanner for
//! nginx `combined`/`common` (the hot path: no regex, no allocation), a
//! compiler from an nginx `log_format` string to a scanning program, JSON
//! objects (`escape=json`) through a key mapping, nginx's error log, and a
//! `regex` escape hatch with named groups.
//!
//! The one invariant that matters for a ban daemon: the client address is
//! read from its own field and nowhere else. A URI, referer or user agent that
//! contains an address (log injection) can at worst make the line unparsed;
//! it can never make that address the [`Request::addr`]. Behind trusted
//! proxies the address field is `$remote_addr` with the forwarded list
//! (`forwarded.rs`), read from the right only as far as the first hop that
//! is not a proxy: what a client wrote to its left is never read. `parse` knows nothing
//! of rules, Redis or nftables, and never panics, whatever the bytes.
//!
//! Layout: `combined` (fast path), `log_format` (compiler), `json`
//! (`escape=json` objects), `error_log` (nginx's error.log), `regex` (named
//! groups), `variables` (what each nginx variable means), `fields` (request
//! line, status, quoted fields), `addr`, `forwarded` (the client behind
//! proxies), `time`, `target` (the path nginx serves for a request target:
//! percent-decoded, dot segments resolved, slashes merged).

mod addr;
mod combined;
mod error_log;
mod fields;
mod forwarded;
mod json;
mod log_format;
mod regex;
mod target;
mod time;
mod variables;

use std::net::IpAddr;
use std::sync::Arc;

use crate::addr::NetSet;

pub use addr::parse_addr;
pub use error_log::{split_records, LEVELS, MAX_RECORD};
pub use forwarded::{resolve as resolve_forwarded, MAX_HOPS};
pub use json::{default_json_mapping, JSON_VARIABLES};
pub use time::{days_from_civil, parse_epoch, parse_error_log_time, parse_iso8601, parse_time_any, parse_time_local};

/// One parsed access-log line; fields borrow the line (zero-copy), or the
/// caller's scratch buffer ([`Parser::parse_in`]) for a decoded value.
///
/// A field the format does not have is empty / `None` / `0`. Quoted fields are
/// returned as logged: nginx's `-` for an empty referer or user agent stays
/// `-`, and escapes such as `\x22` are not decoded; `format: json` decodes
/// its values' JSON escapes when parsed with [`Parser::parse_in`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Request<'a> {
    /// Client address from its own field; IPv4-mapped IPv6 becomes IPv4.
    pub addr: IpAddr,
    /// Unix epoch milliseconds, UTC; `None` when the format has no time field.
    pub time_ms: Option<i64>,
    /// Request method (`GET`); empty when the request line is malformed.
    pub method: &'a [u8],
    /// The path as nginx serves it: the target's path (no query),
    /// percent-decoded, dot segments resolved, slashes merged (`target.rs`);
    /// a target nginx refuses (400) gives its raw text before `?`. A format
    /// that logs `$uri` but no target gives `$uri` as logged (nginx's own,
    /// already normalised). What `match.path` and `distinct: path` read.
    pub path: &'a [u8],
    /// The request target as logged (`$request_uri`, or the target of
    /// `$request`: path and query, raw bytes); empty when the format logs
    /// neither. What `match.target` reads.
    pub target: &'a [u8],
    /// HTTP status; 0 when the format has none.
    pub status: u16,
    /// User agent as logged.
    pub user_agent: &'a [u8],
    /// Referer as logged.
    pub referer: &'a [u8],
    /// Host (`$host`, `$http_host` or `$server_name`).
    pub host: &'a [u8],
    /// `$limit_req_status` (`PASSED`, `REJECTED`, ...).
    pub limit_req_status: &'a [u8],
    /// The error log's level (`error`, `warn`, ...); empty for access logs.
    pub level: &'a [u8],
    /// The error log's message, the text before `, client: `; empty for access logs.
    pub message: &'a [u8],
}

impl<'a> Request<'a> {
    /// A request with only an address: the starting point every format fills in.
    pub(crate) fn with_addr(addr: IpAddr) -> Request<'a> {
        Request {
            addr,
            time_ms: None,
            method: b"",
            path: b"",
            target: b"",
            status: 0,
            user_agent: b"",
            referer: b"",
            host: b"",
            limit_req_status: b"",
            level: b"",
            message: b"",
        }
    }
}

/// How the lines of one log are written.
#[derive(Clone, Debug, PartialEq)]
pub enum Format {
    /// nginx `combined` (also Apache's): common plus `"$http_referer" "$http_user_agent"`.
    Combined,
    /// `$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent`.
    Common,
    /// An nginx `log_format` string, e.g. `'$remote_addr [$time_iso8601] "$request" $status'`.
    LogFormat(String),
    /// One JSON object per line (nginx `escape=json`): (nginx variable, JSON
    /// key) pairs saying which key holds which variable.
    Json(Vec<(String, String)>),
    /// nginx's error log: local time, level, message, client, request, host.
    NginxError,
    /// A regex with named groups: `addr` (required), `time`, `method`, `path`,
    /// `status`, `ua`, `referer`, `host`. It must match from the line's first byte.
    Regex(String),
}

/// Why a [`Format`] cannot be turned into a [`Parser`].
#[derive(Debug, thiserror::Error)]
pub enum FormatError {
    #[error("log_format is empty")]
    Empty,
    #[error("log_format has no `$remote_addr`: the client address needs its own field")]
    MissingAddr,
    #[error(
        "log_format reads `${name}` but not `$remote_addr`: a forwarded address is believed only \
         when the peer that sent it is a trusted proxy, so log `$remote_addr` too"
    )]
    ForwardedWithoutPeer { name: &'static str },
    #[error(
        "log_format: `${name}` at position {position} is neither quoted nor last; its client-written \
         entries could imitate the fields after it. Quote it (\"${name}\") or move it to the end"
    )]
    UnquotedForwarded { name: String, position: usize },
    #[error("log_format: `$` at position {position} is not followed by a variable name")]
    BadVariable { position: usize },
    #[error("log_format: `${{` at position {position} is never closed by `}}`")]
    UnclosedBrace { position: usize },
    #[error("log_format: unknown character {found:?} in variable name at position {position}")]
    BadVariableChar { found: char, position: usize },
    #[error(
        "log_format: `${second}` at position {position} follows `${first}` with no text \
         between them, so the parser cannot tell where one ends"
    )]
    AdjacentVariables {
        first: String,
        second: String,
        position: usize,
    },
    #[error(
        "log_format: `${name}` at position {position} comes before `$remote_addr` and may \
         contain {delimiter:?}; an address inside it could be taken for the client's. \
         Quote it (\"${name}\") or move it after `$remote_addr`"
    )]
    AmbiguousBeforeAddr {
        name: String,
        position: usize,
        delimiter: String,
    },
    #[error("format json: `{name}` is not a variable fleetban reads; expected one of {known}")]
    JsonUnknownVariable { name: String, known: String },
    #[error("format json: the key of `{name}` is empty")]
    JsonEmptyKey { name: String },
    #[error("format json: the key `{key}` is mapped to both `{first}` and `{second}`")]
    JsonDuplicateKey { key: String, first: String, second: String },
    #[error("format json: no key is mapped to `remote_addr`: the client address needs its own field")]
    JsonNoAddr,
    #[error("format json: at most {max} keys")]
    JsonTooManyKeys { max: usize },
    #[error("invalid regex: {}", regex_error_text(.0))]
    Regex(#[from] ::regex::Error),
    #[error("regex has no named group `addr`")]
    RegexNoAddr,
}

/// A compiled [`Format`]: `Send + Sync`, and cloning it is cheap (an `Arc` at most).
#[derive(Clone, Debug)]
pub struct Parser {
    kind: Kind,
    /// Hops whose forwarded list is believed; empty: only the peer counts.
    proxies: Arc<NetSet>,
}

#[derive(Clone, Debug)]
enum Kind {
    Combined,
    Common,
    LogFormat(Arc<log_format::Program>),
    Json(Arc<json::JsonFormat>),
    NginxError,
    Regex(Arc<regex::RegexFormat>),
}

impl Parser {
    /// Compiles `format`; every error names what is wrong and where. The
    /// client is the peer (`$remote_addr`); a forwarded list is not believed.
    pub fn new(format: &Format) -> Result<Parser, FormatError> {
        Parser::trusting(format, &NetSet::default())
    }

    /// Compiles `format`, believing the forwarded list (`X-Forwarded-For`,
    /// PROXY protocol) of a peer in `proxies`: the client is the rightmost
    /// hop not in `proxies`, as nginx's realip module with
    /// `real_ip_recursive on` decides (`forwarded.rs`).
    pub fn trusting(format: &Format, proxies: &NetSet) -> Result<Parser, FormatError> {
        let kind = match format {
            Format::Combined => Kind::Combined,
            Format::Common => Kind::Common,
            Format::LogFormat(s) => Kind::LogFormat(Arc::new(log_format::Program::compile(s)?)),
            Format::Json(mapping) => Kind::Json(Arc::new(json::JsonFormat::compile(mapping)?)),
            Format::NginxError => Kind::NginxError,
            Format::Regex(s) => Kind::Regex(Arc::new(regex::RegexFormat::compile(s)?)),
        };
        Ok(Parser {
            kind,
            proxies: Arc::new(proxies.clone()),
        })
    }

    /// Parses one line (without its `\n`; a trailing `\r` is ignored).
    /// `None` means unparsed: the caller counts it and moves on. JSON
    /// values are given as logged, escapes and all, and a path that needs
    /// decoding or resolving is given raw (its text before `?`):
    /// [`Parser::parse_in`] decodes both (what the per-line loop uses).
    #[inline]
    pub fn parse<'a>(&self, line: &'a [u8]) -> Option<Request<'a>> {
        self.parse_with(line, None)
    }

    /// [`Parser::parse`], with JSON escapes decoded and the path resolved
    /// into `scratch` (cleared first, reused from line to line: no
    /// allocation once it has grown). A plain path (no `%`, `//`, `/.`) is
    /// a slice of the line: nothing is copied.
    // Inlined, the request is built where the caller keeps it (not copied
    // out of this frame: a 150-byte memcpy per line).
    #[inline]
    pub fn parse_in<'a>(&self, line: &'a [u8], scratch: &'a mut Vec<u8>) -> Option<Request<'a>> {
        self.parse_with(line, Some(scratch))
    }

    #[inline]
    fn parse_with<'a>(&self, line: &'a [u8], mut scratch: Option<&'a mut Vec<u8>>) -> Option<Request<'a>> {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if let Some(s) = scratch.as_deref_mut() {
            s.clear();
        }
        let mut request = match &self.kind {
            Kind::Combined => combined::parse(line, true),
            Kind::Common => combined::parse(line, false),
            Kind::LogFormat(program) => program.parse(line, &self.proxies),
            // Its values may be decoded in `scratch`: it resolves the path there too.
            Kind::Json(format) => return format.parse(line, scratch, &self.proxies),
            Kind::NginxError => error_log::parse(line),
            Kind::Regex(format) => format.parse(line),
        }?;
        if !request.target.is_empty() {
            request.path = target::path(request.target, scratch);
        }
        Some(request)
    }

    /// The variable a forwarded client may come from (`http_x_forwarded_for`,
    /// `proxy_protocol_addr`), if the format logs one.
    pub fn forwarded(&self) -> Option<&'static str> {
        match &self.kind {
            Kind::LogFormat(program) => program.forwarded(),
            Kind::Json(format) => format.forwarded(),
            _ => None,
        }
    }

    /// Whether parsed requests carry the request target (`match.target`
    /// needs one): `$request` or `$request_uri`, a regex's `path` group.
    pub fn has_target(&self) -> bool {
        match &self.kind {
            Kind::Combined | Kind::Common | Kind::NginxError => true,
            Kind::LogFormat(program) => program.has_target(),
            Kind::Json(format) => format.has_target(),
            Kind::Regex(format) => format.has_target(),
        }
    }

    /// Whether this reads nginx's error log, whose records may span lines
    /// (`error_log::split_records`).
    pub fn is_error_log(&self) -> bool {
        matches!(self.kind, Kind::NginxError)
    }

    /// Whether parsed requests carry a time (`clock: log` needs one).
    pub fn has_time(&self) -> bool {
        match &self.kind {
            Kind::Combined | Kind::Common | Kind::NginxError => true,
            Kind::LogFormat(program) => program.has_time(),
            Kind::Json(format) => format.has_time(),
            Kind::Regex(format) => format.has_time(),
        }
    }
}

/// The variable `format` may read a forwarded client from, if any (a format
/// that does not compile reads none).
pub fn forwarded_field(format: &Format) -> Option<&'static str> {
    Parser::new(format).ok()?.forwarded()
}

/// The regex crate's message on one line: it spans lines (the pattern, a
/// caret under the error, the reason), which configuration errors (one per
/// line, `FILE:LINE:COL: message`) would print with a literal `\n`.
/// `unclosed group at character 1 of `(unclosed``.
pub fn regex_error_text(e: &::regex::Error) -> String {
    let text = e.to_string();
    let lines: Vec<&str> = text.lines().filter(|l| !l.trim().is_empty()).collect();
    if let ([head, pattern, caret, .., last], true) = (lines.as_slice(), text.starts_with("regex parse error:")) {
        let _ = head;
        if let Some(reason) = last.strip_prefix("error: ") {
            let indent = pattern.len() - pattern.trim_start().len();
            if let Some(at) = caret.find('^').and_then(|c| c.checked_sub(indent)) {
                return format!("{reason} at character {} of `{}`", at + 1, pattern.trim_start());
            }
            return format!("{reason} in `{}`", pattern.trim_start());
        }
    }
    lines.iter().map(|l| l.trim()).collect::<Vec<_>>().join("; ")
}
