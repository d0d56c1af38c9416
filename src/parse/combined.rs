//! The fast path: nginx `combined` and `common`, scanned by hand.
//!
//! ```text
//! $remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent"
//! '------------------------- common -----------------------------------------'
//! ```
//!
//! One pass, left to right, with `memchr` between fields: no regex, no
//! allocation. The address is the text before the first space, so nothing later
//! in the line can move it. What is tolerated, because real logs have it:
//! - any ident and user between the address and `[` (Apache writes an ident);
//! - fields that a site appends after the last one (`common` therefore reads a
//!   `combined` line as its prefix);
//! - a user agent whose closing quote is missing at the end of the line (a
//!   truncated line: the public sample log has one); every other field must be
//!   complete, so a truncated line parses only when all but the user agent is
//!   there.

use std::net::IpAddr;

use memchr::memchr;

use super::addr::{ipv4_field, parse_addr};
use super::fields::{find_quote, is_trailer, parse_status, split_request};
use super::time::parse_time_local;
use super::Request;

/// Length of `17/May/2015:10:05:03 +0000`.
const TIME_LOCAL_LEN: usize = 26;

/// Parses a `combined` line, or only its `common` prefix when `combined` is false.
pub(crate) fn parse(line: &[u8], combined: bool) -> Option<Request<'_>> {
    let (addr, space) = match ipv4_field(line) {
        Some((v4, space)) => (IpAddr::V4(v4), space),
        None => {
            // An address is at most 47 bytes: no need to look further for its end.
            let space = memchr(b' ', &line[..line.len().min(48)])?;
            (parse_addr(&line[..space])?, space)
        }
    };
    let mut request = Request::with_addr(addr);

    let open = time_open(line, space)?;
    let time = open + 1;
    request.time_ms = Some(parse_time_local(line.get(time..time + TIME_LOCAL_LEN)?)?);

    let mut at = time + TIME_LOCAL_LEN;
    if line.get(at..at + 3)? != b"] \"" {
        return None;
    }
    at += 3;
    let close = find_quote(line, at)?;
    (request.method, request.target) = split_request(&line[at..close]);

    // ` 200 ` then the byte count, ending at a space or the end of the line.
    at = close + 1;
    match line.get(at..at + 5)? {
        [b' ', status @ .., b' '] => request.status = parse_status(status)?,
        _ => return None,
    }
    at += 5;
    let bytes_end = byte_count_end(line, at)?;
    if !combined {
        return Some(request);
    }

    at = quote_open(line, bytes_end)?;
    let close = find_quote(line, at)?;
    request.referer = &line[at..close];

    at = quote_open(line, close + 1)?;
    match find_quote(line, at) {
        Some(close) if is_trailer(&line[close + 1..]) => request.user_agent = &line[at..close],
        Some(_) => return None,
        None => request.user_agent = &line[at..],
    }
    Some(request)
}

/// Where the byte count starting at `at` ends: the field runs to the next
/// space (or the end of the line) and must be a byte count (`is_byte_count`),
/// checked in the same pass.
#[inline]
fn byte_count_end(line: &[u8], at: usize) -> Option<usize> {
    let rest = line.get(at..)?;
    let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
    let n = match digits {
        0 if rest.first() == Some(&b'-') => 1,
        0 => return None,
        n => n,
    };
    matches!(rest.get(n), None | Some(b' ')).then_some(at + n)
}

/// Position of the `[` opening the time: the first `[` after a space,
/// searching from the space that ends the address.
fn time_open(line: &[u8], from: usize) -> Option<usize> {
    // nginx always writes `- - [` or `- user [`; check the common one first.
    if line.get(from..from + 6) == Some(b" - - [") {
        return Some(from + 5);
    }
    let mut at = from;
    loop {
        let open = at + memchr(b'[', line.get(at..)?)?;
        // `open > from` because `line[from]` is a space, so `open - 1` exists.
        if line[open - 1] == b' ' {
            return Some(open);
        }
        at = open + 1;
    }
}

/// Expects ` "` at `at`; returns where the quoted value starts.
#[inline]
fn quote_open(line: &[u8], at: usize) -> Option<usize> {
    (line.get(at..at + 2)? == b" \"").then_some(at + 2)
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::super::fields::is_byte_count;
    use super::*;

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        /// The one-pass byte count decides as "up to the next space, then
        /// `is_byte_count`".
        #[test]
        fn byte_count_end_is_the_field_then_the_check(
            line in prop::collection::vec(prop::sample::select(b"0123456789- x\"\t".to_vec()), 0..12),
            at in 0usize..4,
        ) {
            let plain = line.get(at..).and_then(|rest| {
                let end = rest.iter().position(|&b| b == b' ').map_or(line.len(), |n| at + n);
                is_byte_count(&line[at..end]).then_some(end)
            });
            prop_assert_eq!(byte_count_end(&line, at), plain);
        }
    }
}
