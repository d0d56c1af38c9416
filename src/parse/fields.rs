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
        // Escaped only after a backslash: look no further on ordinary lines.
        if q == from || line[q - 1] != b'\\' || !is_escaped(line, from, q) {
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
    // The method's characters, then a space: 1 to 32 of them.
    let len = request
        .iter()
        .take(33)
        .position(|&b| !is_method_byte(b))
        .unwrap_or(request.len().min(33));
    if !(1..=32).contains(&len) || request.get(len) != Some(&b' ') {
        return (b"", b"");
    }
    let (method, rest) = (&request[..len], &request[len + 1..]);
    (method, strip_protocol(rest))
}

/// The target without the protocol, the last word when it is `HTTP/...`
/// (a target may itself contain spaces).
#[inline]
fn strip_protocol(rest: &[u8]) -> &[u8] {
    // Nearly always ` HTTP/1.1` or ` HTTP/2.0`: nine bytes whose first is
    // the last space.
    if let Some(start) = rest.len().checked_sub(9) {
        let tail = &rest[start..];
        if tail[0] == b' ' && tail[1..6] == *b"HTTP/" && tail[6] != b' ' && tail[7] != b' ' && tail[8] != b' ' {
            return &rest[..start];
        }
    }
    match rest.iter().rposition(|&b| b == b' ') {
        Some(space) if rest[space + 1..].starts_with(b"HTTP/") => &rest[..space],
        _ => rest,
    }
}

#[inline]
fn is_method_byte(b: u8) -> bool {
    b.is_ascii_uppercase() || b == b'_' || b == b'-'
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

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// `split_request` as it was written first (one loop per question).
    fn split_request_plain(request: &[u8]) -> (&[u8], &[u8]) {
        let Some(space) = request.iter().take(33).position(|&b| b == b' ') else {
            return (b"", b"");
        };
        let (method, rest) = (&request[..space], &request[space + 1..]);
        if !((1..=32).contains(&method.len()) && method.iter().all(|&b| is_method_byte(b))) {
            return (b"", b"");
        }
        let target = match rest.iter().rposition(|&b| b == b' ') {
            Some(space) if rest[space + 1..].starts_with(b"HTTP/") => &rest[..space],
            _ => rest,
        };
        (method, target)
    }

    /// `find_quote` without the shortcut for a quote not after a backslash.
    fn find_quote_plain(line: &[u8], from: usize) -> Option<usize> {
        let mut at = from;
        loop {
            let q = at + memchr(b'"', line.get(at..)?)?;
            if !is_escaped(line, from, q) {
                return Some(q);
            }
            at = q + 1;
        }
    }

    fn text() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop::sample::select(vec![
            "GET",
            "HEAD",
            "M-SEARCH",
            "get",
            " ",
            "/",
            "/a b",
            "HTTP/1.1",
            "HTTP/2.0",
            "HTTP/",
            "HTTPS",
            "\"",
            "\\",
            "\\\"",
            "x",
            "ABCDEFGHIJKLMNOPQRSTUVWXYZ_-ABCDEF",
            "\t",
        ]);
        prop::collection::vec(piece, 0..8).prop_map(|v| v.concat().into_bytes())
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        #[test]
        fn split_request_agrees_with_the_plain_version(request in text()) {
            prop_assert_eq!(split_request(&request), split_request_plain(&request));
        }

        #[test]
        fn find_quote_agrees_with_the_plain_version(line in text(), from in 0usize..40) {
            prop_assert_eq!(find_quote(&line, from), find_quote_plain(&line, from));
        }
    }
}
