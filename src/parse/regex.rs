//! The escape hatch: a regex with named groups, for logs that are not nginx's.
//!
//! Groups: `addr` (required), and optionally `time` (`$time_local`, ISO 8601
//! with a zone, or epoch seconds with a fraction), `method`, `path` (the
//! request target as logged, path and query: the request's path is read
//! from it as from `$request_uri`), `status`
//! (three digits), `ua`, `referer`, `host`. A group that did not take part in
//! the match leaves its field empty; one that did must hold a valid value or
//! the line is unparsed.
//!
//! The match must start at the line's first byte, as if the pattern began
//! with `^`. An unanchored pattern could otherwise match further right, inside
//! a URI or user agent that a client wrote, and take its address from there.
//! This costs one check: the leftmost match is reported, so if none starts at
//! 0 there is none anchored either.

use ::regex::bytes::Regex;

use super::addr::parse_addr;
use super::fields::parse_status;
use super::time::parse_time_any;
use super::{FormatError, Request};

/// A compiled regex format with the indexes of the groups it has.
#[derive(Debug)]
pub(crate) struct RegexFormat {
    regex: Regex,
    addr: usize,
    time: Option<usize>,
    method: Option<usize>,
    path: Option<usize>,
    status: Option<usize>,
    user_agent: Option<usize>,
    referer: Option<usize>,
    host: Option<usize>,
}

impl RegexFormat {
    pub(crate) fn compile(pattern: &str) -> Result<RegexFormat, FormatError> {
        let regex = Regex::new(pattern)?;
        let group = |name: &str| regex.capture_names().position(|n| n == Some(name));
        Ok(RegexFormat {
            addr: group("addr").ok_or(FormatError::RegexNoAddr)?,
            time: group("time"),
            method: group("method"),
            path: group("path"),
            status: group("status"),
            user_agent: group("ua"),
            referer: group("referer"),
            host: group("host"),
            regex,
        })
    }

    pub(crate) fn has_time(&self) -> bool {
        self.time.is_some()
    }

    pub(crate) fn has_target(&self) -> bool {
        self.path.is_some()
    }

    pub(crate) fn parse<'a>(&self, line: &'a [u8]) -> Option<Request<'a>> {
        let captures = self.regex.captures(line)?;
        if captures.get(0)?.start() != 0 {
            return None;
        }
        let text = |index: Option<usize>| -> Option<&'a [u8]> { captures.get(index?).map(|m| m.as_bytes()) };
        let mut request = Request::with_addr(parse_addr(text(Some(self.addr))?)?);
        if let Some(time) = text(self.time) {
            request.time_ms = Some(parse_time_any(time)?);
        }
        if let Some(status) = text(self.status) {
            request.status = parse_status(status)?;
        }
        request.method = text(self.method).unwrap_or_default();
        request.target = text(self.path).unwrap_or_default();
        request.user_agent = text(self.user_agent).unwrap_or_default();
        request.referer = text(self.referer).unwrap_or_default();
        request.host = text(self.host).unwrap_or_default();
        Some(request)
    }
}
