//! One request head of the decision endpoint, read from bytes: the request
//! line, the few headers the answer depends on (`X-Client-Addr`,
//! `Connection`, `Content-Length`, `Transfer-Encoding`), nothing kept but
//! what the answer needs. Pure: the connection (`server.rs`) feeds it what
//! it has read, and learns how many bytes the head took.

use std::net::IpAddr;

use crate::addr::NetSet;

/// The largest head accepted (request line and headers); a longer one is
/// answered 431 and the connection closed.
pub const MAX_HEAD: usize = 8 * 1024;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Method {
    Get,
    Head,
    /// Any other: answered 405.
    Other,
}

/// What `X-Client-Addr` said.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Client {
    Missing,
    /// Not an address as `parse::parse_addr` reads one, or the header given
    /// twice.
    Invalid,
    Addr(IpAddr),
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Head {
    pub method: Method,
    /// The target is `/check` (a query string is ignored).
    pub check: bool,
    /// HTTP/1.0: the answer names `Connection: keep-alive` when it keeps it.
    pub http10: bool,
    /// The client wants the connection kept after the answer (HTTP/1.1
    /// unless `Connection: close`; HTTP/1.0 only with `keep-alive`).
    pub keep_alive: bool,
    pub client: Client,
    /// Body bytes after the head (`Content-Length`): skipped, never read.
    pub body: u64,
    /// `Transfer-Encoding` was given: the body's end is unknown here, so
    /// the connection closes after the answer.
    pub chunked: bool,
}

#[derive(Debug, PartialEq, Eq)]
pub enum Parse {
    /// The head has not ended yet.
    Partial,
    /// A head, and the bytes it took (its blank line included).
    Done(Head, usize),
    /// Not HTTP/1.x as this endpoint reads it: answered 400, then closed.
    Bad,
}

/// [`parse_trusting`] with no proxy: `X-Forwarded-For` is never read.
#[cfg(test)]
pub fn parse(buf: &[u8]) -> Parse {
    parse_trusting(buf, &NetSet::default())
}

/// Reads the head at the start of `buf`. Lines end in LF, with or without
/// CR before it; empty lines before the request line are skipped (RFC 9112
/// §2.2). When `X-Client-Addr` is a hop in `proxies` (nginx asked about the
/// balancer: no realip in front of it) and the check carries the request's
/// `X-Forwarded-For`, the client is read from that list as the log parser
/// reads it (`parse::resolve_forwarded`: the rightmost hop not in
/// `proxies`); a list that names no client is an invalid address.
pub fn parse_trusting(buf: &[u8], proxies: &NetSet) -> Parse {
    let mut pos = 0;
    let mut request_line = None;
    let mut head = Head {
        method: Method::Other,
        check: false,
        http10: false,
        keep_alive: false,
        client: Client::Missing,
        body: 0,
        chunked: false,
    };
    let mut connection: Option<bool> = None;
    let mut length: Option<u64> = None;
    // `X-Forwarded-For`, when given once.
    let mut forwarded: Option<Result<&[u8], ()>> = None;
    loop {
        let Some(nl) = memchr::memchr(b'\n', &buf[pos..]) else {
            return Parse::Partial;
        };
        let raw = &buf[pos..pos + nl];
        let line = raw.strip_suffix(b"\r").unwrap_or(raw);
        pos += nl + 1;
        match request_line {
            None if line.is_empty() => continue,
            None => match parse_request_line(line) {
                Some((method, check, http10)) => {
                    request_line = Some(());
                    (head.method, head.check, head.http10) = (method, check, http10);
                }
                None => return Parse::Bad,
            },
            Some(()) if line.is_empty() => break,
            Some(()) => {
                let Some(colon) = memchr::memchr(b':', line) else {
                    return Parse::Bad;
                };
                let (name, value) = (&line[..colon], trim(&line[colon + 1..]));
                // No whitespace in or before the name: no obsolete line
                // folding, no `Name :` (RFC 9112 §5.1).
                if name.is_empty() || name.iter().any(|b| b.is_ascii_whitespace()) {
                    return Parse::Bad;
                }
                if name.eq_ignore_ascii_case(b"x-client-addr") {
                    head.client = match (head.client, crate::parse::parse_addr(value)) {
                        (Client::Missing, Some(a)) => Client::Addr(a),
                        _ => Client::Invalid,
                    };
                } else if name.eq_ignore_ascii_case(b"x-forwarded-for") {
                    forwarded = Some(match forwarded {
                        None => Ok(value),
                        Some(_) => Err(()),
                    });
                } else if name.eq_ignore_ascii_case(b"connection") {
                    for token in value.split(|&b| b == b',').map(trim) {
                        if token.eq_ignore_ascii_case(b"close") {
                            connection = Some(false);
                        } else if token.eq_ignore_ascii_case(b"keep-alive") && connection.is_none() {
                            connection = Some(true);
                        }
                    }
                } else if name.eq_ignore_ascii_case(b"content-length") {
                    let Some(n) = digits(value) else {
                        return Parse::Bad;
                    };
                    if length.is_some_and(|l| l != n) {
                        return Parse::Bad;
                    }
                    length = Some(n);
                } else if name.eq_ignore_ascii_case(b"transfer-encoding") {
                    head.chunked = true;
                }
            }
        }
    }
    head.keep_alive = connection.unwrap_or(!head.http10);
    if let (Client::Addr(peer), Some(list)) = (head.client, forwarded) {
        if proxies.contains(peer) {
            head.client = match list
                .ok()
                .and_then(|l| crate::parse::resolve_forwarded(peer, l, proxies))
            {
                Some(a) => Client::Addr(a),
                None => Client::Invalid,
            };
        }
    }
    head.body = length.unwrap_or(0);
    Parse::Done(head, pos)
}

/// `METHOD SP TARGET SP HTTP/1.x`: the method, whether the target is
/// `/check`, and whether the version is 1.0.
fn parse_request_line(line: &[u8]) -> Option<(Method, bool, bool)> {
    let mut parts = line.split(|&b| b == b' ');
    let (method, target, version) = (parts.next()?, parts.next()?, parts.next()?);
    if parts.next().is_some() || method.is_empty() || target.is_empty() {
        return None;
    }
    let http10 = match version {
        b"HTTP/1.1" => false,
        b"HTTP/1.0" => true,
        _ => return None,
    };
    let method = match method {
        b"GET" => Method::Get,
        b"HEAD" => Method::Head,
        m if m.iter().all(|b| b.is_ascii_alphabetic()) => Method::Other,
        _ => return None,
    };
    let path = target.split(|&b| b == b'?').next().unwrap_or(target);
    Some((method, path == b"/check", http10))
}

fn trim(v: &[u8]) -> &[u8] {
    let start = v.iter().position(|b| !matches!(b, b' ' | b'\t')).unwrap_or(v.len());
    let end = v
        .iter()
        .rposition(|b| !matches!(b, b' ' | b'\t'))
        .map_or(start, |e| e + 1);
    &v[start..end]
}

/// A decimal `Content-Length` (at most 18 digits: no overflow).
fn digits(v: &[u8]) -> Option<u64> {
    if v.is_empty() || v.len() > 18 || !v.iter().all(u8::is_ascii_digit) {
        return None;
    }
    Some(v.iter().fold(0, |n, d| n * 10 + u64::from(d - b'0')))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn done(text: &str) -> (Head, usize) {
        match parse(text.as_bytes()) {
            Parse::Done(h, n) => (h, n),
            other => panic!("{text:?}: {other:?}"),
        }
    }

    #[test]
    fn a_proxy_asked_about_is_resolved_through_its_forwarded_list() {
        let proxies = NetSet::new(&["10.0.0.0/8".parse().unwrap()]);
        let ask = |xff: &str, peer: &str| {
            let text = format!("GET /check HTTP/1.1\r\nX-Client-Addr: {peer}\r\n{xff}\r\n");
            match parse_trusting(text.as_bytes(), &proxies) {
                Parse::Done(h, _) => h.client,
                other => panic!("{other:?}"),
            }
        };
        let addr = |s: &str| Client::Addr(s.parse().unwrap());
        // nginx without realip asks about the balancer, with the list.
        assert_eq!(
            ask("X-Forwarded-For: 203.0.113.66, 192.0.2.7\r\n", "10.0.0.4"),
            addr("192.0.2.7")
        );
        // With realip the peer is already the client: the list is not read.
        assert_eq!(ask("X-Forwarded-For: 203.0.113.66\r\n", "192.0.2.7"), addr("192.0.2.7"));
        // Only proxies, or no list: the balancer (never banned: 204).
        assert_eq!(ask("X-Forwarded-For: 10.1.1.1\r\n", "10.0.0.4"), addr("10.1.1.1"));
        assert_eq!(ask("", "10.0.0.4"), addr("10.0.0.4"));
        // A malformed walked entry, or the header twice: no address.
        assert_eq!(ask("X-Forwarded-For: 192.0.2.7:80\r\n", "10.0.0.4"), Client::Invalid);
        assert_eq!(
            ask(
                "X-Forwarded-For: 192.0.2.7\r\nX-Forwarded-For: 192.0.2.8\r\n",
                "10.0.0.4"
            ),
            Client::Invalid
        );
        // No proxies: never read.
        let text = "GET /check HTTP/1.1\r\nX-Client-Addr: 10.0.0.4\r\nX-Forwarded-For: 192.0.2.7\r\n\r\n";
        assert!(matches!(parse(text.as_bytes()), Parse::Done(Head { client, .. }, _) if client == addr("10.0.0.4")));
    }

    #[test]
    fn a_check_from_nginx() {
        let text = "GET /check HTTP/1.1\r\nHost: fleetban\r\nX-Client-Addr: 203.0.113.7\r\n\r\n";
        let (h, n) = done(text);
        assert_eq!(n, text.len());
        assert_eq!(h.method, Method::Get);
        assert!(h.check && h.keep_alive && !h.http10 && !h.chunked);
        assert_eq!(h.client, Client::Addr("203.0.113.7".parse().unwrap()));
        assert_eq!(h.body, 0);
    }

    #[test]
    fn header_names_in_any_case_values_trimmed() {
        let (h, _) = done("GET /check?x=1 HTTP/1.1\r\nx-CLIENT-addr: \t2001:db8::1 \r\nCONNECTION: Close\r\n\r\n");
        assert!(h.check && !h.keep_alive);
        assert_eq!(h.client, Client::Addr("2001:db8::1".parse().unwrap()));
    }

    #[test]
    fn ipv6_bracketed_and_mapped() {
        let (h, _) = done("GET /check HTTP/1.1\nX-Client-Addr: [2001:db8::2]\n\n");
        assert_eq!(h.client, Client::Addr("2001:db8::2".parse().unwrap()));
        let (h, _) = done("GET /check HTTP/1.1\r\nX-Client-Addr: ::ffff:192.0.2.9\r\n\r\n");
        assert_eq!(h.client, Client::Addr("192.0.2.9".parse().unwrap()));
    }

    #[test]
    fn missing_garbage_or_twice_is_not_an_address() {
        assert_eq!(done("GET /check HTTP/1.1\r\n\r\n").0.client, Client::Missing);
        for bad in [
            "",
            "nope",
            "192.0.2.1:80",
            "192.0.2.01",
            "1.2.3.4, 5.6.7.8",
            "2001:db8::1%eth0",
        ] {
            let text = format!("GET /check HTTP/1.1\r\nX-Client-Addr: {bad}\r\n\r\n");
            assert_eq!(done(&text).0.client, Client::Invalid, "{bad:?}");
        }
        let twice = "GET /check HTTP/1.1\r\nX-Client-Addr: 192.0.2.1\r\nX-Client-Addr: 192.0.2.1\r\n\r\n";
        assert_eq!(done(twice).0.client, Client::Invalid);
    }

    #[test]
    fn http10_closes_unless_asked_to_keep() {
        let (h, _) = done("GET /check HTTP/1.0\r\n\r\n");
        assert!(h.http10 && !h.keep_alive);
        let (h, _) = done("GET /check HTTP/1.0\r\nConnection: Keep-Alive\r\n\r\n");
        assert!(h.http10 && h.keep_alive);
    }

    #[test]
    fn pipelined_heads_are_read_one_at_a_time() {
        let one = "GET /check HTTP/1.1\r\nX-Client-Addr: 192.0.2.1\r\n\r\n";
        let two = "HEAD /other HTTP/1.1\r\n\r\n";
        let both = format!("{one}{two}GET /ch");
        let (h, n) = done(&both);
        assert_eq!((n, h.client), (one.len(), Client::Addr("192.0.2.1".parse().unwrap())));
        let (h, m) = done(&both[n..]);
        assert_eq!((m, h.method, h.check), (two.len(), Method::Head, false));
        assert_eq!(parse(&both.as_bytes()[n + m..]), Parse::Partial);
    }

    #[test]
    fn partial_until_the_blank_line() {
        let text = "GET /check HTTP/1.1\r\nX-Client-Addr: 192.0.2.1\r\n\r\n";
        for cut in 0..text.len() {
            assert_eq!(parse(&text.as_bytes()[..cut]), Parse::Partial, "cut at {cut}");
        }
        assert_eq!(parse(b"\r\n\r\n"), Parse::Partial);
    }

    #[test]
    fn garbage_is_bad() {
        for bad in [
            "GET /check\r\n\r\n",
            "GET /check HTTP/2.0\r\n\r\n",
            "GET  /check HTTP/1.1\r\n\r\n",
            "G\x00T /check HTTP/1.1\r\n\r\n",
            "\x16\x03\x01\x02\x00\x01\x00\x01\x7f\x03\x03\n\n",
            "GET /check HTTP/1.1\r\nNo colon here\r\n\r\n",
            "GET /check HTTP/1.1\r\nX-A: 1\r\n folded\r\n\r\n",
            "GET /check HTTP/1.1\r\nX-Client-Addr : 192.0.2.1\r\n\r\n",
            "GET /check HTTP/1.1\r\nContent-Length: -1\r\n\r\n",
            "GET /check HTTP/1.1\r\nContent-Length: 1\r\nContent-Length: 2\r\n\r\n",
        ] {
            assert_eq!(parse(bad.as_bytes()), Parse::Bad, "{bad:?}");
        }
    }

    #[test]
    fn bodies_are_measured_to_be_skipped() {
        let (h, _) = done("GET /check HTTP/1.1\r\nContent-Length: 12\r\n\r\n");
        assert_eq!((h.body, h.chunked), (12, false));
        let (h, _) = done("GET /check HTTP/1.1\r\nTransfer-Encoding: chunked\r\n\r\n");
        assert!(h.chunked);
    }

    mod any_input {
        use proptest::prelude::*;

        use super::super::{parse, Client, Parse};

        /// A head nginx could send: a check for an address (or none, or
        /// garbage), with headers in any case and order.
        fn head() -> impl Strategy<Value = (String, Client)> {
            let addr = prop_oneof![
                any::<[u8; 4]>().prop_map(|o| {
                    let a = std::net::Ipv4Addr::from(o);
                    (Some(a.to_string()), Client::Addr(a.into()))
                }),
                any::<u128>().prop_map(|v| {
                    let a = std::net::Ipv6Addr::from(v);
                    (Some(a.to_string()), Client::Addr(crate::addr::normalize(a.into())))
                }),
                Just((None, Client::Missing)),
                "[a-z]{1,8}".prop_map(|g| (Some(g), Client::Invalid)),
            ];
            (addr, any::<bool>(), any::<bool>()).prop_map(|((text, client), upper, host_first)| {
                let name = if upper { "X-CLIENT-ADDR" } else { "x-client-addr" };
                let mut headers = vec!["Host: fleetban".to_owned()];
                if let Some(t) = text {
                    headers.insert(usize::from(!host_first), format!("{name}: {t}"));
                }
                (
                    format!("GET /check HTTP/1.1\r\n{}\r\n\r\n", headers.join("\r\n")),
                    client,
                )
            })
        }

        proptest! {
            /// Any bytes: an answer, never a panic, never past the input.
            #[test]
            fn any_bytes(bytes in prop::collection::vec(any::<u8>(), 0..300)) {
                if let Parse::Done(_, n) = parse(&bytes) {
                    prop_assert!(n <= bytes.len());
                }
            }

            /// Heads sent back to back are read one by one, each as alone.
            #[test]
            fn pipelined_heads_read_as_each_alone(heads in prop::collection::vec(head(), 1..6)) {
                let all: String = heads.iter().map(|(h, _)| h.as_str()).collect();
                let mut at = 0;
                for (text, client) in &heads {
                    match parse(&all.as_bytes()[at..]) {
                        Parse::Done(h, n) => {
                            prop_assert_eq!(n, text.len());
                            prop_assert_eq!(h.client, *client);
                            prop_assert!(h.check && h.keep_alive);
                            at += n;
                        }
                        other => prop_assert!(false, "{:?} at {}", other, at),
                    }
                }
                prop_assert_eq!(parse(&all.as_bytes()[at..]), Parse::Partial);
            }
        }
    }

    #[test]
    fn other_methods_parse_and_are_told_apart() {
        assert_eq!(done("POST /check HTTP/1.1\r\n\r\n").0.method, Method::Other);
        assert_eq!(done("HEAD /check HTTP/1.1\r\n\r\n").0.method, Method::Head);
    }
}
