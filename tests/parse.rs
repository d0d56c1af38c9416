//! Parsing real nginx access logs: the shared corpus (10,000 `combined` lines
//! from a public site) through every format, exact field values, hostile and
//! broken input, log injection, and the compile errors a user sees.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};
use std::path::PathBuf;
use std::sync::OnceLock;

use fleetban::parse::{
    days_from_civil, parse_addr, parse_epoch, parse_iso8601, parse_time_any, parse_time_local, Format, FormatError,
    Parser, Request,
};
use proptest::prelude::*;

const COMBINED: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent""#;
const COMMON: &str = r#"$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent"#;
const REGEX: &str = r#"(?P<addr>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>[A-Z]+) (?P<path>\S+)[^"]*" (?P<status>\d{3}) (?:\d+|-) "(?P<referer>[^"]*)" "(?P<ua>[^"]*)""#;

// ---------------------------------------------------------------- helpers

/// The corpus kept in the repository (`tests/data/corpus`, its licence beside it).
fn corpus_path() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus/elastic-examples-access.log")
}

/// The corpus, one entry per line, without the `\n`.
fn corpus() -> &'static [Vec<u8>] {
    static LINES: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
    LINES.get_or_init(|| {
        let text = std::fs::read(corpus_path()).expect("read corpus");
        let lines: Vec<Vec<u8>> = text
            .split(|&b| b == b'\n')
            .filter(|l| !l.is_empty())
            .map(<[u8]>::to_vec)
            .collect();
        assert_eq!(lines.len(), 10_000, "corpus changed");
        lines
    })
}

/// Corpus line `n`, counting from 1 as editors do.
fn line(n: usize) -> &'static [u8] {
    &corpus()[n - 1]
}

fn parser(format: Format) -> Parser {
    Parser::new(&format).unwrap_or_else(|e| panic!("{format:?}: {e}"))
}

fn log_format(s: &str) -> Parser {
    parser(Format::LogFormat(s.to_string()))
}

fn regex(s: &str) -> Parser {
    parser(Format::Regex(s.to_string()))
}

/// Every kind of parser, for properties that hold for all of them.
fn all_parsers() -> Vec<(&'static str, Parser)> {
    vec![
        ("combined", parser(Format::Combined)),
        ("common", parser(Format::Common)),
        ("log_format combined", log_format(COMBINED)),
        ("log_format common", log_format(COMMON)),
        ("regex", regex(REGEX)),
    ]
}

fn v4(s: &str) -> IpAddr {
    IpAddr::V4(s.parse::<Ipv4Addr>().expect("test address"))
}

fn error(format: Format) -> FormatError {
    match Parser::new(&format) {
        Ok(_) => panic!("{format:?} compiled"),
        Err(e) => e,
    }
}

/// The address in the first space-delimited field, the only place it may come from.
fn first_field_addr(line: &[u8]) -> Option<IpAddr> {
    parse_addr(line.split(|&b| b == b' ').next().unwrap_or_default())
}

// ---------------------------------------------------------------- the corpus

#[test]
fn corpus_parses_completely_with_combined() {
    let combined = parser(Format::Combined);
    for (i, text) in corpus().iter().enumerate() {
        let request = combined
            .parse(text)
            .unwrap_or_else(|| panic!("line {} unparsed: {}", i + 1, String::from_utf8_lossy(text)));
        assert_eq!(Some(request.addr), first_field_addr(text), "line {}", i + 1);
        let time = request.time_ms.expect("combined has a time");
        // The sample covers 17 to 21 May 2015.
        assert!((1_431_820_800_000..1_432_252_800_000).contains(&time), "line {}", i + 1);
        assert!((100..600).contains(&request.status), "line {}", i + 1);
        assert!(
            !request.method.is_empty() && request.path.starts_with(b"/"),
            "line {}",
            i + 1
        );
        assert!(!request.user_agent.is_empty() && !request.referer.is_empty());
        assert!(request.host.is_empty() && request.limit_req_status.is_empty());
    }
}

#[test]
fn log_format_spellings_match_the_fast_paths_on_the_corpus() {
    let pairs = [
        (parser(Format::Combined), log_format(COMBINED)),
        (parser(Format::Common), log_format(COMMON)),
    ];
    for (fast, spelled) in &pairs {
        for (i, text) in corpus().iter().enumerate() {
            let expected = fast.parse(text);
            assert!(expected.is_some(), "line {}", i + 1);
            assert_eq!(spelled.parse(text), expected, "line {}", i + 1);
        }
    }
}

#[test]
fn common_reads_the_prefix_of_combined_lines() {
    let (combined, common) = (parser(Format::Combined), parser(Format::Common));
    for text in corpus() {
        let full = combined.parse(text).expect("combined");
        let prefix = common.parse(text).expect("common");
        assert_eq!(
            prefix,
            Request {
                user_agent: b"",
                referer: b"",
                ..full
            }
        );
    }
}

#[test]
fn regex_format_agrees_with_combined_on_the_corpus() {
    let (combined, regex) = (parser(Format::Combined), regex(REGEX));
    let mut parsed = 0;
    for text in corpus() {
        if let Some(request) = regex.parse(text) {
            parsed += 1;
            assert_eq!(Some(request), combined.parse(text));
        }
    }
    // All but the line whose user agent lost its closing quote.
    assert_eq!(parsed, 9_999);
}

#[test]
fn spot_checks_of_corpus_lines() {
    let combined = parser(Format::Combined);
    let first = combined.parse(line(1)).expect("line 1");
    assert_eq!(
        first,
        Request {
            addr: v4("83.149.9.216"),
            time_ms: Some(1_431_857_103_000),
            method: b"GET",
            path: b"/presentations/logstash-monitorama-2013/images/kibana-search.png",
            target: b"/presentations/logstash-monitorama-2013/images/kibana-search.png",
            status: 200,
            user_agent: b"Mozilla/5.0 (Macintosh; Intel Mac OS X 10_9_1) AppleWebKit/537.36 \
                          (KHTML, like Gecko) Chrome/32.0.1700.77 Safari/537.36",
            referer: b"http://semicomplete.com/presentations/logstash-monitorama-2013/",
            host: b"",
            limit_req_status: b"",
            level: b"",
            message: b"",
        }
    );

    let not_found = combined.parse(line(63)).expect("line 63");
    assert_eq!(not_found.addr, v4("66.249.73.185"));
    assert_eq!(not_found.time_ms, Some(1_431_857_122_000));
    assert_eq!(not_found.status, 404);
    assert_eq!(
        not_found.target,
        b"/doc/index.html?org/elasticsearch/action/search/SearchResponse.html"
    );
    assert_eq!(not_found.path, b"/doc/index.html");

    // HEAD with `-` as the byte count, and `-` for referer and user agent.
    let head = combined.parse(line(1141)).expect("line 1141");
    assert_eq!(head.addr, v4("81.198.20.11"));
    assert_eq!((head.method, head.path), (&b"HEAD"[..], &b"/favicon.ico"[..]));
    assert_eq!((head.referer, head.user_agent), (&b"-"[..], &b"-"[..]));

    let post = combined.parse(line(5009)).expect("line 5009");
    assert_eq!((post.method, post.status), (&b"POST"[..], 200));
    assert_eq!(post.path, b"/blog/geekery/xvfb-firefox");

    let options = combined.parse(line(9158)).expect("line 9158");
    assert_eq!((options.method, options.status), (&b"OPTIONS"[..], 500));
    assert_eq!(options.user_agent, b"Microsoft Office Protocol Discovery");

    // The sample's one truncated line: its user agent has no closing quote.
    let truncated = combined.parse(line(8899)).expect("line 8899");
    assert_eq!(truncated.addr, v4("46.118.127.106"));
    assert_eq!(truncated.time_ms, Some(1_432_123_517_000));
    assert_eq!(
        truncated.user_agent,
        b"Mozilla/5.0 (compatible; Googlebot/2.1; +http://www.google.com/bot.html"
    );
}

// ---------------------------------------------------------------- broken input

#[test]
fn malformed_lines_are_unparsed() {
    let lines: &[&[u8]] = &[
        b"",
        b" ",
        b"-",
        b"\r",
        b"1.2.3.4",
        b"1.2.3.4 - - [",
        b"- - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"1.2.3.4x - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"example.com - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"1.2.3.4 - - [17/Foo/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"1.2.3.4 - - [32/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"1.2.3.4 - - [17/May/2015:24:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"1.2.3.4 - - [17/May/2015:10:05:03 0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 2000 1 \"-\" \"-\"",
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" OK 1 \"-\" \"-\"",
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 x \"-\" \"-\"",
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] GET / HTTP/1.1 200 1 \"-\" \"-\"",
        b"1.2.3.4\0 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"",
        b"\x00\x01\x02\xff\xfe\xfd\"\"[[]] \\\\\"",
    ];
    for (name, parser) in all_parsers() {
        for text in lines {
            assert_eq!(parser.parse(text), None, "{name}: {}", String::from_utf8_lossy(text));
        }
    }
    // Broken only after the common prefix.
    let tails: &[&[u8]] = &[
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\"\"-\"",
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-",
        b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 -",
    ];
    for (name, parser) in all_parsers() {
        for text in tails {
            let common = name.ends_with("common");
            assert_eq!(
                parser.parse(text).is_some(),
                common,
                "{name}: {}",
                String::from_utf8_lossy(text)
            );
        }
    }
    // Appended fields must be separated from the last one.
    let glued = b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"-\"x";
    assert_eq!(parser(Format::Combined).parse(glued), None);
    assert_eq!(log_format(COMBINED).parse(glued), None);
}

#[test]
fn odd_but_valid_lines_parse() {
    let combined = parser(Format::Combined);
    // nginx logs a 400 for a garbage request line; it still counts.
    for request in [&b"-"[..], b"\\x16\\x03\\x01\\x00\\xA5", b"", b"GET", b"get / HTTP/1.1"] {
        let mut text = b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"".to_vec();
        text.extend_from_slice(request);
        text.extend_from_slice(b"\" 400 0 \"-\" \"-\"");
        let parsed = combined.parse(&text).expect("garbage request line");
        assert_eq!((parsed.method, parsed.path, parsed.status), (&b""[..], &b""[..], 400));
    }
    // A target with a space, HTTP/0.9 without a protocol, a trailing \r,
    // appended fields, a NUL and invalid UTF-8 inside quoted fields.
    let cases: &[(&[u8], &[u8], &[u8])] = &[
        (
            b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET /a b HTTP/1.1\" 200 1 \"-\" \"-\"",
            b"/a b",
            b"-",
        ),
        (
            b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET /old\" 200 1 \"-\" \"-\"",
            b"/old",
            b"-",
        ),
        (
            b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\"\r",
            b"/",
            b"ua",
        ),
        (
            b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\" 0.012 \"x\" -",
            b"/",
            b"ua",
        ),
        (
            b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"a\0b\xff\"",
            b"/",
            b"a\0b\xff",
        ),
        (
            b"1.2.3.4 ident alice [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\"",
            b"/",
            b"ua",
        ),
    ];
    for (text, path, ua) in cases {
        let parsed = combined
            .parse(text)
            .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(text)));
        assert_eq!((parsed.path, parsed.user_agent), (*path, *ua));
    }
}

#[test]
fn every_prefix_of_a_real_line_is_unparsed_or_consistent() {
    let (combined, common, spelled) = (parser(Format::Combined), parser(Format::Common), log_format(COMBINED));
    for n in [1, 63, 1141, 5009, 9158, 10_000] {
        let full = line(n);
        let whole = combined.parse(full).expect("full line");
        let whole_common = common.parse(full).expect("full line");
        let ua_start = full.len() - whole.user_agent.len() - 1;
        let bytes_start = full[..ua_start - 4].iter().rposition(|&b| b == b'"').expect("referer");
        let bytes_start = full[..bytes_start - 1].iter().rposition(|&b| b == b' ').expect("bytes") + 1;
        for cut in 0..full.len() {
            let prefix = &full[..cut];
            let parsed = combined.parse(prefix);
            // Only a cut inside the user agent (the last field) is tolerated.
            if cut < ua_start {
                assert_eq!(parsed, None, "line {n} cut at {cut}");
            } else {
                let parsed = parsed.expect("cut inside the user agent");
                assert_eq!(
                    parsed,
                    Request {
                        user_agent: &full[ua_start..cut],
                        ..whole
                    }
                );
            }
            assert_eq!(spelled.parse(prefix), parsed, "line {n} cut at {cut}");
            match common.parse(prefix) {
                None => assert!(cut <= bytes_start, "line {n} cut at {cut}"),
                Some(r) => assert!(cut > bytes_start && r == whole_common, "line {n} cut at {cut}"),
            }
        }
    }
}

#[test]
fn binary_and_huge_lines_never_panic() {
    let mut noise = Vec::with_capacity(1 << 20);
    let mut x: u32 = 0x9e37_79b9;
    while noise.len() < 1 << 20 {
        x ^= x << 13;
        x ^= x >> 17;
        x ^= x << 5;
        noise.push(x as u8);
    }
    let huge: Vec<Vec<u8>> = vec![
        noise,
        vec![b'A'; 1 << 20],
        vec![b'"'; 1 << 20],
        vec![b'\\'; 1 << 20],
        vec![0; 1 << 20],
        b"1.1.1.1 ".repeat(1 << 17),
        b"1.1.1.1 - - [".repeat(1 << 16),
        b"\\\"".repeat(1 << 19),
    ];
    for (name, parser) in all_parsers() {
        for text in &huge {
            assert_eq!(parser.parse(text), None, "{name}");
        }
    }
    // A real line with a 1 MB target is still a request.
    let mut long = b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET /".to_vec();
    long.extend(std::iter::repeat_n(b'a', 1 << 20));
    long.extend_from_slice(b" HTTP/1.1\" 200 1 \"-\" \"-\"");
    let parsed = parser(Format::Combined).parse(&long).expect("long target");
    assert_eq!(parsed.path.len(), (1 << 20) + 1);
    assert_eq!(log_format(COMBINED).parse(&long), Some(parsed));
}

// ---------------------------------------------------------------- log injection

/// Lines whose client-controlled fields carry another address. The real
/// client is always 1.2.3.4; 6.6.6.6 must never come out.
const INJECTED: &[&[u8]] = &[
    b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET /?ip=6.6.6.6 HTTP/1.1\" 200 1 \"http://6.6.6.6/\" \"6.6.6.6\"",
    // nginx's escaping: a quote in the user agent is written \x22.
    b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"\\x22 6.6.6.6 - - [17/May/2015:10:05:03 +0000] \\x22GET / HTTP/1.1\\x22 200 1 \\x22-\\x22 \\x22x\"",
    // escape=json: the quote is written \".
    b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"\\\" 6.6.6.6 - - [17/May/2015:10:05:03 +0000] \\\"GET / HTTP/1.1\\\" 200 1 \\\"-\\\" \\\"x\"",
    // The request line and referer carry a whole fake line.
    b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET /\\x22 6.6.6.6 - - [17/May/2015:10:05:03 +0000] HTTP/1.1\" 200 1 \"6.6.6.6 - - [\" \"-\"",
    // An unescaped quote (escape=none) ends the field early; the rest reads
    // as appended fields.
    b"1.2.3.4 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"\" 6.6.6.6 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"x\"",
];

/// Lines whose own address field is not an address: the address injected
/// later in the line must not be picked up instead.
const NO_CLIENT: &[&[u8]] = &[
    b"- - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"6.6.6.6 - - [17/May/2015:10:05:03 +0000] \\x22GET / HTTP/1.1\\x22 200 1 \\x22-\\x22 \\x22x\"",
    b" 1.2.3.4 - - [] \"GET / HTTP/1.1\" 200 1 \"-\" \"x 6.6.6.6 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"x\"",
    b"unix: - - [17/May/2015:10:05:03 +0000] \"GET /6.6.6.6 HTTP/1.1\" 200 1 \"-\" \"6.6.6.6\"",
];

#[test]
fn injected_addresses_never_become_the_client() {
    let mut formats = all_parsers();
    // An unanchored regex: anchoring is the parser's job, not the user's.
    formats.push((
        "unanchored regex",
        regex(r#"(?P<addr>\S+) \S+ \S+ \[(?P<time>[^\]]+)\] "(?P<method>\S+) (?P<path>\S+)"#),
    ));
    formats.push((
        "quoted user agent first",
        log_format(r#""$http_user_agent" $remote_addr [$time_local] "$request" $status"#),
    ));
    let real = v4("1.2.3.4");
    for (name, parser) in &formats {
        for text in INJECTED {
            if let Some(request) = parser.parse(text) {
                assert_eq!(request.addr, real, "{name}: {}", String::from_utf8_lossy(text));
            }
        }
        for text in NO_CLIENT {
            assert_eq!(parser.parse(text), None, "{name}: {}", String::from_utf8_lossy(text));
        }
    }
    // The nginx-escaped lines parse, and the fake line stays inside the field.
    let combined = parser(Format::Combined);
    for text in &INJECTED[..4] {
        assert_eq!(combined.parse(text).map(|r| r.addr), Some(real));
    }
    let json = combined.parse(INJECTED[2]).expect("escape=json line");
    assert!(json.user_agent.starts_with(b"\\\" 6.6.6.6") && json.user_agent.ends_with(b"x"));

    // A user agent in front of the address, quoted and escaped by nginx.
    let ua_first = log_format(r#""$http_user_agent" $remote_addr [$time_local] "$request" $status"#);
    let text = b"\"\\x22 6.6.6.6 [17/May/2015:10:05:03 +0000] \\x22GET / HTTP/1.1\\x22 200 \\x22\" 1.2.3.4 [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200";
    assert_eq!(ua_first.parse(text).map(|r| r.addr), Some(real));
}

#[test]
fn free_text_before_the_address_must_be_quoted() {
    for format in [
        "$http_user_agent $remote_addr [$time_local]",
        "$host $remote_addr [$time_local]",
        "[$request] $remote_addr",
    ] {
        let e = error(Format::LogFormat(format.into()));
        assert!(matches!(e, FormatError::AmbiguousBeforeAddr { .. }), "{format}: {e}");
        assert!(e.to_string().contains("before `$remote_addr`"), "{e}");
    }
    // A forwarded list anywhere but quoted or last.
    for format in [
        "$http_x_forwarded_for - $remote_addr [$time_local]",
        "$remote_addr $http_x_forwarded_for [$time_local]",
    ] {
        let e = error(Format::LogFormat(format.into()));
        assert!(matches!(e, FormatError::UnquotedForwarded { .. }), "{format}: {e}");
    }
    // Tokens nginx writes itself, fixed-width times and quoted text are fine.
    for format in [
        "$server_name $remote_addr [$time_local]",
        "$msec $remote_addr",
        "$time_local $remote_addr",
        "$time_iso8601 $remote_addr",
        "\"$http_x_forwarded_for\" $remote_addr",
    ] {
        assert!(Parser::new(&Format::LogFormat(format.into())).is_ok(), "{format}");
    }
}

// ---------------------------------------------------------------- addresses

#[test]
fn addresses_are_exact_and_normalised() {
    let good: &[(&[u8], IpAddr)] = &[
        (b"1.2.3.4", v4("1.2.3.4")),
        (b"0.0.0.0", v4("0.0.0.0")),
        (b"255.255.255.255", v4("255.255.255.255")),
        (
            b"2001:db8::1",
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ),
        (
            b"[2001:db8::1]",
            IpAddr::V6(Ipv6Addr::new(0x2001, 0xdb8, 0, 0, 0, 0, 0, 1)),
        ),
        (b"::1", IpAddr::V6(Ipv6Addr::LOCALHOST)),
        (b"::ffff:192.0.2.1", v4("192.0.2.1")),
        (b"::FFFF:c000:201", v4("192.0.2.1")),
        (b"[::ffff:192.0.2.1]", v4("192.0.2.1")),
    ];
    for (text, addr) in good {
        assert_eq!(parse_addr(text), Some(*addr), "{}", String::from_utf8_lossy(text));
    }
    let bad: &[&[u8]] = &[
        b"",
        b"-",
        b" 1.2.3.4",
        b"1.2.3.4 ",
        b"1.2.3.4x",
        b"1.2.3",
        b"1.2.3.4.5",
        b"256.1.1.1",
        b"01.2.3.4",
        b"1.2.3.4:80",
        b"[1.2.3.4]",
        b"example.com",
        b"fe80::1%eth0",
        b"2001:db8::1/64",
        b"[2001:db8::1]:443",
        b"2001:db8:::1",
        b"1.2.3.\xff",
        b"::ffff:1.2.3.4x",
        b"unix:",
    ];
    for text in bad {
        assert_eq!(parse_addr(text), None, "{}", String::from_utf8_lossy(text));
    }
}

#[test]
fn ipv6_clients_parse_in_every_format() {
    let text = b"::ffff:198.51.100.7 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\"";
    let six = b"2001:db8::7 - - [17/May/2015:10:05:03 +0000] \"GET / HTTP/1.1\" 200 1 \"-\" \"ua\"";
    for (name, parser) in all_parsers() {
        assert_eq!(parser.parse(text).map(|r| r.addr), Some(v4("198.51.100.7")), "{name}");
        assert_eq!(
            parser.parse(six).map(|r| r.addr),
            Some("2001:db8::7".parse().expect("v6")),
            "{name}"
        );
    }
}

// ---------------------------------------------------------------- log_format

#[test]
fn log_format_reads_the_variables_it_knows() {
    let parser = log_format(
        r#"$remote_addr - $remote_user [$time_iso8601] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" ${host} rt=$request_time urt="$upstream_response_time" lrs=$limit_req_status"#,
    );
    assert!(parser.has_time());
    let text = b"203.0.113.9 - bob [2015-05-17T12:05:03+02:00] \"POST /login?next=/ HTTP/2.0\" 429 0 \"-\" \"curl/8.0\" shop.example rt=0.001 urt=\"0.001, 0.002 : 0.003\" lrs=REJECTED";
    assert_eq!(
        parser.parse(text),
        Some(Request {
            addr: v4("203.0.113.9"),
            time_ms: Some(1_431_857_103_000),
            method: b"POST",
            path: b"/login",
            target: b"/login?next=/",
            status: 429,
            user_agent: b"curl/8.0",
            referer: b"-",
            host: b"shop.example",
            limit_req_status: b"REJECTED",
            level: b"",
            message: b"",
        })
    );

    // $msec, $request_method and $request_uri, $http_host, opaque variables.
    let parser =
        log_format("${remote_addr}|$msec|$request_method|$request_uri|$status|$http_host|$upstream_addr|$ssl_protocol");
    let text = b"2001:db8::2|1431857103.123|GET|/a?b=c|200|example.org|10.0.0.1:80, 10.0.0.2:80|TLSv1.3";
    let parsed = parser.parse(text).expect("pipe format");
    assert_eq!(parsed.addr, "2001:db8::2".parse::<IpAddr>().expect("v6"));
    assert_eq!(parsed.time_ms, Some(1_431_857_103_123));
    assert_eq!(
        (parsed.method, parsed.target, parsed.path, parsed.status),
        (&b"GET"[..], &b"/a?b=c"[..], &b"/a"[..], 200)
    );
    assert_eq!(parsed.host, b"example.org");

    // Without a time variable there is no time.
    let parser = log_format("$remote_addr $status");
    assert!(!parser.has_time());
    let parsed = parser.parse(b"1.2.3.4 503").expect("no time");
    assert_eq!((parsed.time_ms, parsed.status), (None, 503));
    // Appended fields after a last token variable are ignored.
    assert_eq!(parser.parse(b"1.2.3.4 503 extra"), Some(parsed));
    assert_eq!(parser.parse(b"1.2.3.4 5030"), None);
}

#[test]
fn log_format_errors_say_what_and_where() {
    let cases: &[(&str, &str)] = &[
        ("", "log_format is empty"),
        ("$remote_user [$time_local]", "no `$remote_addr`"),
        (
            "$remote_addr$remote_user",
            "`$remote_user` at position 12 follows `$remote_addr`",
        ),
        ("$remote_addr ${time_local}${status}", "position 26"),
        (
            "$remote_addr $",
            "`$` at position 13 is not followed by a variable name",
        ),
        ("$remote_addr $ x", "position 13"),
        ("$remote_addr ${}", "position 13"),
        ("$remote_addr ${status", "`${` at position 13 is never closed"),
        (
            "$remote_addr ${sta-tus}",
            "unknown character '-' in variable name at position 18",
        ),
        ("$remote_addr ${stätus}", "unknown character 'ä'"),
    ];
    for (format, message) in cases {
        let e = error(Format::LogFormat(format.to_string()));
        assert!(e.to_string().contains(message), "{format:?}: got {e:?} / {e}");
    }
}

// ---------------------------------------------------------------- regex

#[test]
fn regex_formats() {
    let e = error(Format::Regex(r"^(?P<ip>\S+) ".into()));
    assert_eq!(e.to_string(), "regex has no named group `addr`");
    let e = error(Format::Regex(r"^(?P<addr>\S+".into()));
    assert!(e.to_string().starts_with("invalid regex:"), "{e}");

    let no_time = regex(r"^(?P<addr>\S+) (?P<host>\S+)");
    assert!(!no_time.has_time());
    let parsed = no_time.parse(b"1.2.3.4 example.org").expect("addr and host");
    assert_eq!(
        (parsed.host, parsed.time_ms, parsed.status),
        (&b"example.org"[..], None, 0)
    );
    assert_eq!(no_time.parse(b"1.2.3.4x example.org"), None);

    // `time` reads all three spellings.
    let timed = regex(r"^(?P<addr>\S+) (?P<time>.+)$");
    for time in [
        &b"[17/May/2015:10:05:03 +0000]"[..],
        b"17/May/2015:12:05:03 +0200",
        b"2015-05-17T10:05:03Z",
        b"2015-05-17T06:05:03-04:00",
        b"1431857103",
        b"1431857103.000",
    ] {
        let mut text = b"1.2.3.4 ".to_vec();
        text.extend_from_slice(time);
        let parsed = timed
            .parse(&text)
            .unwrap_or_else(|| panic!("{}", String::from_utf8_lossy(time)));
        assert_eq!(parsed.time_ms, Some(1_431_857_103_000));
    }
    assert_eq!(timed.parse(b"1.2.3.4 yesterday"), None);
    // A group that matched an invalid status makes the line unparsed.
    assert_eq!(regex(r"^(?P<addr>\S+) (?P<status>\S+)").parse(b"1.2.3.4 20x"), None);
}

// ---------------------------------------------------------------- time

#[test]
fn times_convert_to_known_epoch_values() {
    let local: &[(&[u8], i64)] = &[
        (b"17/May/2015:10:05:03 +0000", 1_431_857_103_000),
        (b"17/May/2015:10:05:03 +0200", 1_431_857_103_000 - 2 * 3_600_000),
        (b"17/May/2015:10:05:03 -0530", 1_431_876_903_000),
        (b"29/Feb/2016:23:59:59 +0000", 1_456_790_399_000),
        (b"01/Jan/1970:00:00:00 +0100", -3_600_000),
        (b"19/Jan/2038:03:14:07 +0000", 2_147_483_647_000),
        (b"31/Dec/9999:23:59:59 +0000", 253_402_300_799_000),
        (b"30/Jun/2015:23:59:60 +0000", 1_435_708_800_000),
    ];
    for (text, ms) in local {
        assert_eq!(parse_time_local(text), Some(*ms), "{}", String::from_utf8_lossy(text));
        assert_eq!(parse_time_any(text), Some(*ms));
    }
    for bad in [
        &b"29/Feb/2015:10:05:03 +0000"[..],
        b"31/Apr/2015:10:05:03 +0000",
        b"00/May/2015:10:05:03 +0000",
        b"17/may/2015:10:05:03 +0000",
        b"17/May/2015:10:60:03 +0000",
        b"17/May/2015:10:05:03 +2400",
        b"17/May/2015:10:05:03 *0000",
        b"17/May/2015:10:05:03 +000",
        b"17/May/2015 10:05:03 +0000",
        b"7/May/2015:10:05:03 +00000",
    ] {
        assert_eq!(parse_time_local(bad), None, "{}", String::from_utf8_lossy(bad));
    }
    // `parse_time_local` keeps the last text and value: repeating, going
    // back, and a bad time right after a good one all give the same answers.
    for _ in 0..2 {
        for (text, ms) in local.iter().chain(local.iter().rev()) {
            assert_eq!(parse_time_local(text), Some(*ms));
            assert_eq!(parse_time_local(text), Some(*ms));
            assert_eq!(parse_time_local(b"29/Feb/2015:10:05:03 +0000"), None);
            let mut other_zone = text.to_vec();
            other_zone[25] = b'1';
            assert_ne!(parse_time_local(&other_zone), Some(*ms));
        }
    }

    let iso: &[(&[u8], i64)] = &[
        (b"2015-05-17T10:05:03+00:00", 1_431_857_103_000),
        (b"2015-05-17T10:05:03Z", 1_431_857_103_000),
        (b"2015-05-17 12:05:03+0200", 1_431_857_103_000),
        (b"2015-05-17T10:05:03.5Z", 1_431_857_103_500),
        (b"2015-05-17T10:05:03.123456-00:00", 1_431_857_103_123),
        (b"2000-01-01T00:00:00Z", 946_684_800_000),
        (b"1969-12-31T23:59:59Z", -1_000),
    ];
    for (text, ms) in iso {
        assert_eq!(parse_iso8601(text), Some(*ms), "{}", String::from_utf8_lossy(text));
    }
    for bad in [
        &b"2015-05-17T10:05:03"[..],
        b"2015-05-17T10:05:03.Z",
        b"2015-13-17T10:05:03Z",
        b"2015-05-17T10:05:03+0",
    ] {
        assert_eq!(parse_iso8601(bad), None, "{}", String::from_utf8_lossy(bad));
    }

    assert_eq!(parse_epoch(b"1431857103.123"), Some(1_431_857_103_123));
    assert_eq!(parse_epoch(b"1431857103.1"), Some(1_431_857_103_100));
    assert_eq!(parse_epoch(b"0"), Some(0));
    for bad in [
        &b""[..],
        b".",
        b"1.",
        b".5",
        b"-1",
        b"1e9",
        b"1431857103.12x",
        b"9999999999999",
    ] {
        assert_eq!(parse_epoch(bad), None, "{}", String::from_utf8_lossy(bad));
    }

    assert_eq!(days_from_civil(1970, 1, 1), 0);
    assert_eq!(days_from_civil(2000, 3, 1), 11_017);
    assert_eq!(days_from_civil(1969, 12, 31), -1);
    assert_eq!(days_from_civil(1600, 1, 1), -135_140);
}

#[test]
fn parser_is_shareable() {
    fn assert_shareable<T: Send + Sync + Clone + 'static>() {}
    assert_shareable::<Parser>();
    let parser = log_format(COMBINED);
    let copies: Vec<Parser> = (0..4).map(|_| parser.clone()).collect();
    std::thread::scope(|s| {
        for copy in &copies {
            s.spawn(move || assert!(copy.parse(line(1)).is_some()));
        }
    });
}

// ---------------------------------------------------------------- properties

#[derive(Clone, Debug)]
enum Mutation {
    Flip(usize, u8),
    Insert(usize, u8),
    Delete(usize),
    Truncate(usize),
}

fn mutate(text: &[u8], mutations: &[Mutation]) -> Vec<u8> {
    let mut out = text.to_vec();
    for m in mutations {
        let len = out.len().max(1);
        match *m {
            Mutation::Flip(at, bits) => {
                if let Some(b) = out.get_mut(at % len) {
                    *b ^= bits;
                }
            }
            Mutation::Insert(at, b) => out.insert(at % (out.len() + 1), b),
            Mutation::Delete(at) => {
                if !out.is_empty() {
                    out.remove(at % len);
                }
            }
            Mutation::Truncate(at) => out.truncate(at % len),
        }
    }
    out
}

fn mutation() -> impl Strategy<Value = Mutation> {
    // Bytes that matter to the scanners are chosen more often than others.
    let byte = prop_oneof![any::<u8>(), prop::sample::select(&b" \"[]\\-:/.0123456789\r\0"[..]),];
    prop_oneof![
        (any::<usize>(), 1..=255u8).prop_map(|(at, bits)| Mutation::Flip(at, bits)),
        (any::<usize>(), byte).prop_map(|(at, b)| Mutation::Insert(at, b)),
        any::<usize>().prop_map(Mutation::Delete),
        any::<usize>().prop_map(Mutation::Truncate),
    ]
}

proptest! {
    #[test]
    fn random_bytes_never_panic(text in prop::collection::vec(any::<u8>(), 0..600)) {
        for (_, parser) in all_parsers() {
            if let Some(request) = parser.parse(&text) {
                prop_assert_eq!(Some(request.addr), first_field_addr(&text));
            }
        }
    }

    #[test]
    fn addresses_agree_with_the_standard_library(
        text in prop_oneof!["[0-9]{1,4}(\\.[0-9]{1,4}){0,4}", "[0-9a-fA-F.:]{0,24}"],
    ) {
        let std = text.parse::<IpAddr>().ok().map(|a| a.to_canonical());
        prop_assert_eq!(parse_addr(text.as_bytes()), std);
    }

    #[test]
    fn mutated_lines_never_panic_nor_move_the_address(
        n in 1..=10_000usize,
        mutations in prop::collection::vec(mutation(), 1..6),
    ) {
        let text = mutate(line(n), &mutations);
        for (name, parser) in all_parsers() {
            if let Some(request) = parser.parse(&text) {
                prop_assert_eq!(Some(request.addr), first_field_addr(&text), "{}", name);
            }
        }
    }

    #[test]
    fn a_good_line_after_garbage_parses_as_alone(
        garbage in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..300), 1..5),
        n in 1..=10_000usize,
        mutations in prop::collection::vec(mutation(), 0..4),
    ) {
        let good = line(n);
        let broken = mutate(line((n % 10_000) + 1), &mutations);
        for (name, parser) in all_parsers() {
            let alone = parser.parse(good);
            for junk in &garbage {
                let _ = parser.parse(junk);
            }
            let _ = parser.parse(&broken);
            prop_assert_eq!(parser.parse(good), alone, "{}", name);
        }
    }
}
