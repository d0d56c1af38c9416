//! nginx's error log (`format: nginx_error`): the lines its HTTP modules
//! write about one request,
//!
//! ```text
//! 2026/11/30 10:00:01 [error] 1234#0: *5 limiting requests, excess: 0.500 by zone "one",
//!   client: 203.0.113.40, server: example.com, request: "GET / HTTP/1.1", host: "example.com"
//! ```
//!
//! (one line): time (local, no zone: `time::parse_error_log_time`), level,
//! pid#tid, the connection `*N`, the message, then the fields nginx appends
//! in a fixed order: `client`, `server`, and optionally `request`,
//! `subrequest`, `upstream`, `host`, `referrer` (quoted). A line without
//! `, client: ` (start-up notices, a worker's exit) is unparsed.
//!
//! Where the client is: the message can hold text a client wrote (a basic
//! auth user name) and so can the quoted fields after it (the referrer,
//! unescaped), so either could imitate `, client: ADDR, server: ...`. Each
//! `, client: ` is tried, and it is the client only when what follows it is
//! exactly nginx's suffix to the end of the line: an address, an unquoted
//! server name, and the quoted fields in their order, each closed by a `"`
//! that is followed by the next field or the end. When more than one reading
//! fits, the line is unparsed: never a chosen victim's address. (A user name
//! holding a whole fake suffix thus hides its own line; README "nginx error
//! log" says so.)
//!
//! Records split across lines ([`split_records`]): nginx writes each record
//! with one `write()` of at most [`MAX_RECORD`] bytes ending in one `\n`,
//! but a message can hold decoded client text (the path in `open() "..."
//! failed`), so a `%0A` in the request target starts a physical line the
//! client wrote whole, fake header and suffix included. Such lines are
//! found by the record around them, not by their own text: see
//! [`split_records`].

use memchr::memmem;

use super::addr::parse_addr;
use super::fields::split_request;
use super::time::parse_error_log_time;
use super::Request;

/// nginx's log levels, as written between the brackets.
pub const LEVELS: &[&str] = &["debug", "info", "notice", "warn", "error", "crit", "alert", "emerg"];

/// The quoted fields nginx may write after `server`, in its order.
const TRAILING: &[&[u8]] = &[b"request", b"subrequest", b"upstream", b"host", b"referrer"];

/// Parses one error-log line.
pub(crate) fn parse(line: &[u8]) -> Option<Request<'_>> {
    let time = parse_error_log_time(line.get(..19)?)?;
    let rest = line.get(19..)?.strip_prefix(b" [")?;
    let close = memchr::memchr(b']', rest).filter(|&c| c <= 6)?;
    let level = &rest[..close];
    if !LEVELS.iter().any(|l| l.as_bytes() == level) {
        return None;
    }
    let rest = rest[close..].strip_prefix(b"] ")?;
    let rest = skip_digits(rest)?.strip_prefix(b"#")?;
    let mut body = skip_digits(rest)?.strip_prefix(b": ")?;
    if let Some(conn) = body.strip_prefix(b"*") {
        body = skip_digits(conn)?.strip_prefix(b" ")?;
    }
    let mut chosen = None;
    for at in memmem::find_iter(body, b", client: ") {
        if let Some(suffix) = suffix(&body[at + 10..]) {
            if chosen.is_some() {
                return None; // two readings: ambiguous
            }
            chosen = Some((at, suffix));
        }
    }
    let (at, s) = chosen?;
    let mut request = Request::with_addr(s.addr);
    request.time_ms = Some(time);
    request.level = level;
    request.message = &body[..at];
    let (method, path) = split_request(s.fields[0]);
    request.method = method;
    request.target = path;
    request.host = s.fields[3];
    request.referer = s.fields[4];
    Some(request)
}

fn skip_digits(s: &[u8]) -> Option<&[u8]> {
    let n = s.iter().take_while(|b| b.is_ascii_digit()).count();
    (n > 0).then(|| &s[n..])
}

/// What follows `, client: ` when it is nginx's suffix.
struct Suffix<'a> {
    addr: std::net::IpAddr,
    /// The values of [`TRAILING`], empty when absent.
    fields: [&'a [u8]; 5],
}

fn suffix(s: &[u8]) -> Option<Suffix<'_>> {
    let end = memchr::memchr(b',', s)?;
    let addr = parse_addr(&s[..end])?;
    let s = s[end..].strip_prefix(b", server: ")?;
    // The server name (or listen address) is configuration: no space, quote or comma.
    let n = s
        .iter()
        .position(|&b| matches!(b, b',' | b' ' | b'"'))
        .unwrap_or(s.len());
    let mut s = &s[n..];
    let mut fields: [&[u8]; 5] = [b""; 5];
    let mut next = 0;
    while !s.is_empty() {
        let rest = s.strip_prefix(b", ")?;
        let k = (next..TRAILING.len())
            .find(|&k| rest.starts_with(TRAILING[k]) && rest[TRAILING[k].len()..].starts_with(b": \""))?;
        let value = &rest[TRAILING[k].len() + 3..];
        let close = if TRAILING[k] == b"referrer" {
            // Always last: it runs to the line's final quote.
            value.len().checked_sub(1).filter(|&c| value[c] == b'"')?
        } else {
            closing_quote(value)?
        };
        fields[k] = &value[..close];
        s = &value[close + 1..];
        next = k + 1;
    }
    Some(Suffix { addr, fields })
}

/// The first `"` followed by `, ` or the end of the line.
fn closing_quote(value: &[u8]) -> Option<usize> {
    memchr::memchr_iter(b'"', value).find(|&q| {
        let after = &value[q + 1..];
        after.is_empty() || after.starts_with(b", ")
    })
}

/// The longest record nginx writes (`NGX_MAX_ERROR_STR`), its `\n` included:
/// a longer one is cut to exactly this many bytes.
pub const MAX_RECORD: usize = 2048;

/// Marks the lines of `data` (whole lines; line `i` ends just past its
/// `\n` at `ends[i]`) that may belong to a record nginx split across lines:
/// `marks[i]` is set, never cleared (the caller counts them unparsed).
///
/// A record spans lines only where its text holds a decoded `\n`, and
/// then one of its lines shows it:
/// - its request line (raw, still encoded) holds `%0A`: every line that
///   starts within [`MAX_RECORD`] bytes around that line (before its end,
///   after its start) is marked, since the record holding it lies there
///   (the decoded text may come before the `request:` field, in the
///   message, or after it, in an `upstream:` built from `$uri`);
/// - or nginx cut it at [`MAX_RECORD`] bytes, the request line with it: a
///   line ending exactly [`MAX_RECORD`] bytes after an earlier line start,
///   that is not a whole record with a request, marks the lines from that
///   start to its end.
///
/// A line is final once the `MAX_RECORD` bytes after its end are in `data`
/// (or the file ended or stayed quiet): nothing later can mark it.
pub fn split_records(data: &[u8], ends: &[u32], marks: &mut Vec<bool>) {
    marks.resize(ends.len(), false);
    let start = |i: usize| if i == 0 { 0 } else { ends[i - 1] as usize };
    // The first line starting at or after `at`.
    let first_from = |at: usize| match at {
        0 => 0,
        _ => (ends.partition_point(|&e| (e as usize) < at) + 1).min(ends.len()),
    };
    for i in 0..ends.len() {
        let (s, e) = (start(i), ends[i] as usize);
        let line = &data[s..e];
        if has_encoded_newline(line) {
            let from = first_from(e.saturating_sub(MAX_RECORD));
            let to = first_from(s + MAX_RECORD);
            marks[from..to].iter_mut().for_each(|m| *m = true);
        } else if e >= MAX_RECORD && e - MAX_RECORD < s {
            let head = first_from(e - MAX_RECORD);
            let whole = |l: &[u8]| parse(l.strip_suffix(b"\n").unwrap_or(l)).is_some_and(|r| !r.target.is_empty());
            if head < i && start(head) == e - MAX_RECORD && !whole(line) {
                marks[head..=i].iter_mut().for_each(|m| *m = true);
            }
        }
    }
}

/// Whether `line` holds `%0A` or `%0a`.
fn has_encoded_newline(line: &[u8]) -> bool {
    memchr::memchr_iter(b'%', line).any(|p| matches!(line.get(p + 1..p + 3), Some([b'0', b'a' | b'A'])))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fields_and_message() {
        let line = br#"2026/11/30 10:00:01 [error] 1234#0: *5 limiting requests, excess: 0.500 by zone "one", client: 203.0.113.40, server: example.com, request: "GET /a?b HTTP/1.1", host: "example.com", referrer: "https://x/""#;
        let r = parse(line).unwrap();
        assert_eq!(r.addr.to_string(), "203.0.113.40");
        assert_eq!(r.level, b"error");
        assert_eq!(r.message, br#"limiting requests, excess: 0.500 by zone "one""#);
        assert_eq!((r.method, r.target), (&b"GET"[..], &b"/a?b"[..]));
        assert_eq!(r.host, b"example.com");
        assert_eq!(r.referer, b"https://x/");
    }

    #[test]
    fn a_fake_suffix_in_the_referrer_makes_the_line_ambiguous() {
        let line = br#"2026/11/30 10:00:01 [error] 1#0: *5 x, client: 203.0.113.40, server: s, request: "GET / HTTP/1.1", referrer: "r", client: 198.51.100.7, server: s, host: "h""#;
        assert!(parse(line).is_none());
        let no_client = b"2026/11/30 10:00:01 [notice] 1#1: signal process started";
        assert!(parse(no_client).is_none());
    }

    fn marks(lines: &[Vec<u8>]) -> Vec<bool> {
        let (mut data, mut ends) = (Vec::new(), Vec::new());
        for l in lines {
            data.extend_from_slice(l);
            data.push(b'\n');
            ends.push(data.len() as u32);
        }
        let mut marks = Vec::new();
        split_records(&data, &ends, &mut marks);
        marks
    }

    fn record(n: usize, rest: &str) -> Vec<u8> {
        format!("2026/11/30 10:00:01 [error] 1#0: *{n} {rest}").into_bytes()
    }

    #[test]
    fn an_encoded_newline_marks_the_lines_around_it_and_only_those() {
        let fake = record(
            9,
            r#"user "a": password mismatch, client: 198.51.100.7, server: s, host: "h""#,
        );
        let genuine = record(1, r#"x, client: 203.0.113.1, server: s, request: "GET / HTTP/1.1""#);
        let far = vec![b'p'; MAX_RECORD];
        let end = br#"" failed, client: 203.0.113.5, server: s, request: "GET /x%0a... HTTP/1.1""#.to_vec();
        // Marked: the lines starting in the 2048 bytes before its end, and
        // in the 2048 after its start (a `$uri` upstream comes after it).
        let lines = [
            far.clone(),
            genuine.clone(),
            record(2, r#"open() "/w/x"#),
            fake,
            end,
            far,
            genuine,
        ];
        assert_eq!(marks(&lines), [false, true, true, true, true, true, false]);
    }

    #[test]
    fn a_record_cut_at_2048_bytes_is_marked_whole_and_a_line_that_long_alone_is_not() {
        let head = record(2, r#"open() "/w/x"#);
        let fake = record(
            9,
            r#"user "a": password mismatch, client: 198.51.100.7, server: s, request: "GET / HTTP/1.1""#,
        );
        let used = head.len() + 1 + fake.len() + 1 + 1;
        let tail = vec![b'a'; MAX_RECORD - used];
        let before = record(1, r#"x, client: 203.0.113.1, server: s, request: "GET / HTTP/1.1""#);
        assert_eq!(marks(&[before.clone(), head, fake, tail]), [false, true, true, true]);
        // One byte less: not nginx's cut.
        let head = record(2, r#"open() "/w/"#);
        let fake = record(
            9,
            r#"user "a": password mismatch, client: 198.51.100.7, server: s, request: "GET / HTTP/1.1""#,
        );
        let tail = vec![b'a'; MAX_RECORD - used];
        assert_eq!(marks(&[before.clone(), head, fake, tail]), [false; 4]);
        let long = vec![b'a'; MAX_RECORD - 1];
        assert_eq!(marks(&[before, long]), [false, false]);
    }
}
