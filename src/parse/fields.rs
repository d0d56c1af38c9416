//! Field helpers shared by the combined scanner and the `log_format` program,
//! so the two read a request line, a status or a quoted field the same way.
//!
//! Quoted fields: nginx writes a `"` inside a value as `\x22` (and a `\` as
//! `\x5C`), so with its default escaping a quoted field ends at the first `"`.
//! With `escape=json` a quote is written `\"` and a backslash `\\`; a `"`
//! preceded by an odd number of backslashes is therefore part of the value.
//! Honouring that costs nothing on ordinary lines and reads both escapings.

use memchr::memchr;

/// Position of the first `"` at or after `from` that is not backslash-escaped
/// (backslashes are counted back to `from`, the start of the field).
pub(crate) fn find_quote(line: &[u8], from: usize) -> Option<usize> {
    let mut at = from;
    loop {
        let q = at + memchr(b'"', line.get(at..)?)?;
        if !is_escaped(line, from, q) {
            return Some(q);
        }
        at = q + 1;
    }
}

/// Whether the byte at `at` is preceded (within `line[from..at]`) by an odd
/// number of backslashes.
pub(crate) fn is_escaped(line: &[u8], from: usize, at: usize) -> bool {
    let field = line.get(from..at).unwrap_or_default();
    let backslashes = field.iter().rev().take_while(|&&b| b == b'\\').count();
    backslashes % 2 == 1
}

/// Splits a logged request line `GET /path?q HTTP/1.1` into method and
/// target. nginx logs whatever the client sent, so anything that does not
/// start with a method token (`-`, a TLS hello as `\x16\x03...`, garbage)
/// gives an empty method and target; the line itself still counts.
pub(crate) fn split_request(request: &[u8]) -> (&[u8], &[u8]) {
    // Methods are short: a plain loop beats memchr's call here.
    let Some(space) = request.iter().take(33).position(|&b| b == b' ') else {
        return (b"", b"");
    };
    let (method, rest) = (&request[..space], &request[space + 1..]);
    if !is_method(method) {
        return (b"", b"");
    }
    // The protocol is the last word; a target may itself contain spaces.
    let target = match rest.iter().rposition(|&b| b == b' ') {
        Some(space) if rest[space + 1..].starts_with(b"HTTP/") => &rest[..space],
        _ => rest,
    };
    (method, target)
}

/// An HTTP method as nginx accepts one: 1 to 32 of `A-Z`, `_`, `-`.
fn is_method(token: &[u8]) -> bool {
    (1..=32).contains(&token.len()) && token.iter().all(|&b| b.is_ascii_uppercase() || b == b'_' || b == b'-')
}

/// An HTTP status: exactly three digits.
#[inline]
pub(crate) fn parse_status(field: &[u8]) -> Option<u16> {
    match field {
        [a, b, c] if a.is_ascii_digit() && b.is_ascii_digit() && c.is_ascii_digit() => {
            Some(u16::from(a - b'0') * 100 + u16::from(b - b'0') * 10 + u16::from(c - b'0'))
        }
        _ => None,
    }
}

/// A byte count (`$body_bytes_sent`): digits, or `-` as Apache writes zero.
#[inline]
pub(crate) fn is_byte_count(field: &[u8]) -> bool {
    field == b"-" || (!field.is_empty() && field.iter().all(u8::is_ascii_digit))
}

/// What may follow the last field of a format: nothing, or more fields that
/// the site appended (separated by a space or tab), which are ignored.
#[inline]
pub(crate) fn is_trailer(rest: &[u8]) -> bool {
    matches!(rest.first(), None | Some(b' ' | b'\t'))
}
