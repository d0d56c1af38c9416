//! JSON access logs (`format: json`) read by the real binary and the
//! library, matched on their unescaped values, and `hits: 0` (a ban on the
//! first match) in `fleetban test` and in the daemon, with Redis and without;
//! the path every format gives the rules (nginx's, from the target it logs).

mod common;

use common::{cli, fleetban_test_json, ConfigDir, MainConfig, Rule};
use fleetban::parse::Parser;

const JSON_RULE_FORMAT: &str =
    "{ json: { remote_addr: client, time_iso8601: ts, request: req, status: status, http_user_agent: ua } }";

/// A JSON access log as nginx writes it with `escape=json`: `"` and `\`
/// escaped, a user agent spelled with `\u0041` escapes.
fn json_line(client: &str, ts: &str, req: &str, ua: &str) -> String {
    format!(
        r#"{{"ts":"{ts}","client":"{client}","req":"{req}","status":"404","ua":"{ua}","bytes":512,"extra":{{"a":[1,"}}"]}}}}"#
    )
}

#[test]
fn a_json_log_is_matched_on_its_unescaped_values() {
    let log_lines = [
        // "Evil \"Bot\"": the quotes are matched as quotes.
        json_line(
            "203.0.113.7",
            "2026-11-30T10:00:01+00:00",
            "GET /a HTTP/1.1",
            r#"Evil \"Bot\""#,
        ),
        // \u0045vil = Evil.
        json_line(
            "203.0.113.7",
            "2026-11-30T10:00:02+00:00",
            "GET /b HTTP/1.1",
            r#"\u0045vil \"Bot\""#,
        ),
        // The same bytes without the quotes: no match.
        json_line(
            "203.0.113.8",
            "2026-11-30T10:00:02+00:00",
            "GET /c HTTP/1.1",
            "Evil Bot",
        ),
        // The escaped spelling itself, written literally (\\" is a backslash then a quote).
        json_line(
            "203.0.113.9",
            "2026-11-30T10:00:02+00:00",
            "GET /d HTTP/1.1",
            r#"Evil \\\"Bot\\\""#,
        ),
        // Not JSON, no client, no time: unparsed.
        "203.0.113.10 - - [30/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" 404 0 \"-\" \"Evil \\\"Bot\\\"\"".to_owned(),
        r#"{"ts":"2026-11-30T10:00:03+00:00","req":"GET / HTTP/1.1","ua":"Evil \"Bot\""}"#.to_owned(),
        r#"{"client":"203.0.113.11","req":"GET / HTTP/1.1","ua":"Evil \"Bot\""}"#.to_owned(),
        r#"{"client":"203.0.113.12","ts":"2026-11-30T10:00:03+00:00","ua":"Evil \"Bot\""} trailing"#.to_owned(),
    ];
    let r = ConfigDir::new();
    std::fs::write(&r.log, log_lines.join("\n") + "\n").unwrap();
    r.write(
        &MainConfig::new(),
        &[Rule::new("bots", &r.log, "{ hits: 1, window: 60s }")
            .format(JSON_RULE_FORMAT)
            .matching(r#"{ user_agent: '^Evil "Bot"$', path: '^/[ab]$', status: [404] }"#)],
    );
    let check = cli(&r.cfg, &["check"]);
    assert_eq!(check.code, 0, "{}", check.text());
    assert!(check.stdout.contains("format json"), "{}", check.stdout);
    let decisions = fleetban_test_json(&r.cfg, &[&r.log], "UTC");
    let bans: Vec<_> = decisions.iter().filter(|d| d["event"] == "ban").collect();
    assert_eq!(bans.len(), 1, "{decisions:?}");
    assert_eq!(bans[0]["addr"], "203.0.113.7");
    assert_eq!(bans[0]["at"], "2026-11-30T10:00:02Z");
    let summary = decisions.last().unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["lines"], 8, "{summary}");
    assert_eq!(summary["unparsed"], 4, "{summary}");
    assert_eq!(summary["rules"]["bots"]["matched"], 2, "{summary}");
}

#[test]
fn format_json_alone_reads_keys_named_as_the_variables() {
    let r = ConfigDir::new();
    let line = r#"{"time_iso8601":"2026-11-30T10:00:01+00:00","remote_addr":"2001:db8::5","request":"POST /login HTTP/2.0","status":401,"http_user_agent":"curl/8"}"#;
    std::fs::write(&r.log, format!("{line}\n{line}\n")).unwrap();
    r.write(
        &MainConfig::new(),
        &[Rule::new("login", &r.log, "{ hits: 1, window: 60s }")
            .format("json")
            .matching("{ method: [POST], status: [401] }")],
    );
    let decisions = fleetban_test_json(&r.cfg, &[&r.log], "UTC");
    let bans: Vec<_> = decisions.iter().filter(|d| d["event"] == "ban").collect();
    assert_eq!(bans.len(), 1, "{decisions:?}");
    assert_eq!(bans[0]["addr"], "2001:db8::/64");
    assert_eq!(bans[0]["hits"], 2);
}

#[test]
fn hits_zero_bans_on_the_first_matching_line() {
    let r = ConfigDir::new();
    // 2026-11-30T10:00:00Z in ms.
    let t0 = fleetban::parse::parse_iso8601(b"2026-11-30T10:00:00Z").unwrap();
    let lines = [
        common::combined_line("203.0.113.5", t0, "/ok", 200),
        common::combined_line("203.0.113.5", t0 + 1000, "/wp-login.php", 404),
        common::combined_line("203.0.113.5", t0 + 2000, "/wp-login.php", 404),
    ];
    std::fs::write(&r.log, lines.concat()).unwrap();
    for algorithm in [
        "{ hits: 0, window: 60s }",
        "{ hits: 0, window: 60s, algorithm: fixed_window }",
        "{ hits: 0, window: 60s, algorithm: sliding_counter }",
    ] {
        r.write(
            &MainConfig::new(),
            &[Rule::new("probe", &r.log, algorithm).matching("{ status: [404] }")],
        );
        let check = cli(&r.cfg, &["check"]);
        assert_eq!(check.code, 0, "{algorithm}: {}", check.text());
        let decisions = fleetban_test_json(&r.cfg, &[&r.log], "UTC");
        let bans: Vec<_> = decisions.iter().filter(|d| d["event"] == "ban").collect();
        assert_eq!(bans.len(), 1, "{algorithm}: {decisions:?}");
        assert_eq!(bans[0]["at"], "2026-11-30T10:00:01Z", "{algorithm}");
        assert_eq!(bans[0]["hits"], 1, "{algorithm}");
    }
}

/// `hits: 0` in the daemon, with a real redis-server and with the embedded
/// store: the first matching request bans, its record says 1 hit, and
/// (Redis) no window key was ever written for it: decided with no round trip.
#[test]
fn the_daemon_bans_on_the_first_matching_request_with_hits_zero() {
    for with_redis in [true, false] {
        let redis = with_redis.then(common::Redis::start);
        let r = ConfigDir::new();
        let mut main = r.main_config().host_id("h0").log_firewall();
        if let Some(redis) = &redis {
            main = main.redis(&redis.url(), "");
        }
        r.write(
            &main,
            &[Rule::new("first", &r.log, "{ hits: 0, window: 60s }")
                .matching("{ status: [404] }")
                .ban("1h")],
        );
        std::fs::write(&r.log, "").unwrap();
        let d = common::Daemon::start(None, &r.cfg, &r.control);
        common::wait_until(std::time::Duration::from_secs(10), "the daemon answers", || {
            common::control_status(&r.control).is_some()
        });
        let now = common::now_ms();
        common::append(
            &r.log,
            &[
                common::combined_line("203.0.113.60", now, "/fine", 200),
                common::combined_line("203.0.113.61", now, "/missing", 404),
            ]
            .concat(),
        );
        d.wait_lines(2);
        let mut listed = String::new();
        common::wait_until(std::time::Duration::from_secs(10), "the ban listed", || {
            listed = cli(&r.cfg, &["bans", "--json"]).stdout;
            listed.contains("203.0.113.61")
        });
        assert!(!listed.contains("203.0.113.60"), "{listed}");
        let ban: serde_json::Value = listed
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .find(|v| v["addr"] == "203.0.113.61")
            .unwrap();
        assert_eq!(ban["hits"], 1, "redis {with_redis}: {ban}");
        assert_eq!(ban["rule"], "first", "{ban}");
        if let Some(redis) = &redis {
            let keys = redis.cli(&["--scan", "--pattern", "fleetban:win:*"]);
            assert!(keys.trim().is_empty(), "a window was written: {keys}");
            let rec = redis.record_text("203.0.113.61").unwrap_or_default();
            assert!(rec.contains("\"hits\":1"), "{rec}");
            let status = d.status();
            assert_eq!(status["redis"]["round_trips"], 0, "the limiter asked Redis: {status}");
        }
    }
}

/// A value as nginx's `escape=json` writes it: `"` and `\` escaped, control
/// characters as `\u00XX`, every other byte as it is.
fn nginx_json_escape(value: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    for &b in value {
        match b {
            b'"' => out.extend_from_slice(b"\\\""),
            b'\\' => out.extend_from_slice(b"\\\\"),
            0..=0x1f => out.extend_from_slice(format!("\\u{b:04x}").as_bytes()),
            _ => out.push(b),
        }
    }
    out
}

proptest::proptest! {
    #![proptest_config(proptest::prelude::ProptestConfig::with_cases(500))]

    /// Whatever a client sends as its user agent and path, the JSON format
    /// reads back exactly those bytes, and the client is the one logged.
    #[test]
    fn json_values_read_back_as_the_client_sent_them(
        ua in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..80),
        path in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..40),
    ) {
        let parser = Parser::new(&fleetban::parse::Format::Json(vec![
            ("remote_addr".into(), "c".into()),
            ("time_iso8601".into(), "t".into()),
            ("request_uri".into(), "u".into()),
            ("http_user_agent".into(), "ua".into()),
        ])).unwrap();
        let mut line = br#"{"t":"2026-11-30T10:00:01+00:00","ua":""#.to_vec();
        line.extend(nginx_json_escape(&ua));
        line.extend_from_slice(br#"","u":""#);
        line.extend(nginx_json_escape(&path));
        line.extend_from_slice(br#"","c":"203.0.113.7"}"#);
        let mut scratch = Vec::new();
        let r = parser.parse_in(&line, &mut scratch).expect("a valid line parses");
        proptest::prop_assert_eq!(r.user_agent, &ua[..]);
        proptest::prop_assert_eq!(r.target, &path[..]);
        proptest::prop_assert_eq!(r.addr.to_string(), "203.0.113.7");
    }

    /// No bytes make either new parser panic.
    #[test]
    fn the_new_parsers_never_panic(line in proptest::collection::vec(proptest::prelude::any::<u8>(), 0..200)) {
        for format in [fleetban::parse::Format::Json(fleetban::parse::default_json_mapping()), fleetban::parse::Format::NginxError] {
            let parser = Parser::new(&format).unwrap();
            let mut scratch = Vec::new();
            let _ = parser.parse_in(&line, &mut scratch);
            let _ = parser.parse(&line);
        }
    }
}

/// Behind `proxies`, a JSON log's forwarded list is read as `log_format`
/// reads it (the rightmost untrusted hop); without `proxies` the rule is refused.
#[test]
fn a_json_forwarded_list_is_believed_only_from_a_proxy() {
    let format = fleetban::parse::Format::Json(vec![
        ("remote_addr".into(), "peer".into()),
        ("http_x_forwarded_for".into(), "xff".into()),
        ("msec".into(), "t".into()),
    ]);
    let proxies = fleetban::addr::NetSet::new(&["10.0.0.0/8".parse().unwrap()]);
    let parser = Parser::trusting(&format, &proxies).unwrap();
    let line = br#"{"t":1764496801.123,"peer":"10.0.0.2","xff":"198.51.100.1, 203.0.113.9, 10.0.0.7"}"#;
    let r = parser.parse(line).unwrap();
    assert_eq!(r.addr.to_string(), "203.0.113.9");
    assert_eq!(r.time_ms, Some(1_764_496_801_123));

    let r = ConfigDir::new();
    r.write(
        &MainConfig::new(),
        &[Rule::new("a", &r.log, "{ hits: 1, window: 60s }")
            .format("{ json: { remote_addr: peer, http_x_forwarded_for: xff, msec: t } }")],
    );
    let out = cli(&r.cfg, &["check"]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(out.stderr.contains("proxies"), "{}", out.stderr);
}

/// The JSON scanner's edges: what parses, to what, and what is unparsed.
#[test]
fn json_lines_parse_or_not_as_the_contract_says() {
    let parser = Parser::new(&fleetban::parse::Format::Json(vec![
        ("remote_addr".into(), "c".into()),
        ("msec".into(), "t".into()),
        ("status".into(), "s".into()),
        ("http_host".into(), "h".into()),
    ]))
    .unwrap();
    // (line, Some((client, status, host)) or None for unparsed)
    type Read<'a> = Option<(&'a str, u16, &'a str)>;
    let cases: &[(&str, Read)] = &[
        (
            r#"{"c":"192.0.2.1","t":1.5,"s":200,"h":"a"}"#,
            Some(("192.0.2.1", 200, "a")),
        ),
        (
            r#" { "c" : "192.0.2.1" , "t" : "1.5" , "s" : "404" } "#,
            Some(("192.0.2.1", 404, "")),
        ),
        // The first occurrence of a key wins.
        (
            r#"{"c":"192.0.2.1","c":"198.51.100.9","t":1}"#,
            Some(("192.0.2.1", 0, "")),
        ),
        // null is absent; other keys, nested values skipped.
        (
            r#"{"c":"192.0.2.1","t":1,"h":null,"x":{"c":"198.51.100.9"},"y":[1,2]}"#,
            Some(("192.0.2.1", 0, "")),
        ),
        // A key spelled with an escape is still the key.
        (r#"{"\u0063":"192.0.2.1","t":1}"#, Some(("192.0.2.1", 0, ""))),
        // A mapped key holding an object; no client; no time; not an object;
        // trailing text; a truncated line; a bad escape; a bad number.
        (r#"{"c":{"ip":"192.0.2.1"},"t":1}"#, None),
        (r#"{"t":1,"s":200}"#, None),
        (r#"{"c":"192.0.2.1","s":200}"#, None),
        (r#"["192.0.2.1",1]"#, None),
        (r#"{"c":"192.0.2.1","t":1} x"#, None),
        (r#"{"c":"192.0.2.1","t":1"#, None),
        (r#"{"c":"192.0.2.1","t":1,"h":"\q"}"#, None),
        (r#"{"c":"192.0.2.1","t":1,"h":nope}"#, None),
        ("", None),
    ];
    for (line, want) in cases {
        let mut scratch = Vec::new();
        let got = parser.parse_in(line.as_bytes(), &mut scratch).map(|r| {
            (
                r.addr.to_string(),
                r.status,
                String::from_utf8_lossy(r.host).into_owned(),
            )
        });
        let want = want.map(|(a, s, h)| (a.to_owned(), s, h.to_owned()));
        assert_eq!(got, want, "{line}");
    }
}

/// Every format gives the rules the path nginx served, read from the target
/// it logs (`$request`, `$request_uri`, a JSON value with its escapes, a
/// regex's `path` group) and never decoded twice: `$uri` is nginx's path
/// already, taken as logged, and only when no target is logged (it is the
/// URI after rewrites: `/index.php` behind `try_files`).
#[test]
fn every_format_gives_the_path_nginx_served() {
    use fleetban::parse::Format;
    let json = |pairs: &[(&str, &str)]| Format::Json(pairs.iter().map(|(v, k)| ((*v).into(), (*k).into())).collect());
    let log_format = |s: &str| Format::LogFormat(s.into());
    // (format, line, target, path)
    let cases: Vec<(Format, &str, &str, &str)> = vec![
        (
            Format::Combined,
            r#"203.0.113.7 - - [30/Nov/2026:10:00:01 +0000] "GET //x/../%2eenv?a=%2e HTTP/1.1" 200 5 "-" "ua""#,
            "//x/../%2eenv?a=%2e",
            "/.env",
        ),
        (
            Format::Common,
            r#"203.0.113.7 - - [30/Nov/2026:10:00:01 +0000] "GET http://example.com/.git/%63onfig HTTP/1.1" 200 5"#,
            "http://example.com/.git/%63onfig",
            "/.git/config",
        ),
        (
            log_format(r#"$remote_addr [$time_local] "$request" $status"#),
            r#"203.0.113.7 [30/Nov/2026:10:00:01 +0000] "POST /wp-login%2ephp HTTP/2.0" 403"#,
            "/wp-login%2ephp",
            "/wp-login.php",
        ),
        (
            log_format(r#"$remote_addr [$time_local] "$request_uri" $status"#),
            r#"203.0.113.7 [30/Nov/2026:10:00:01 +0000] "/logi%6e?next=/" 401"#,
            "/logi%6e?next=/",
            "/login",
        ),
        // `$uri` as logged: `%41` is what the client escaped as `%2541`.
        (
            log_format(r#"$remote_addr [$time_local] "$uri" $status"#),
            r#"203.0.113.7 [30/Nov/2026:10:00:01 +0000] "/a%41?b" 404"#,
            "",
            "/a%41?b",
        ),
        // With a target logged too, the client's path, not the rewritten one.
        (
            log_format(r#"$remote_addr [$time_local] "$request" "$uri" $status"#),
            r#"203.0.113.7 [30/Nov/2026:10:00:01 +0000] "GET /./.env HTTP/1.1" "/index.php" 404"#,
            "/./.env",
            "/.env",
        ),
        (
            json(&[("remote_addr", "c"), ("msec", "t"), ("request", "r")]),
            r#"{"c":"203.0.113.7","t":1764496801.5,"r":"GET /x/..//.e%6ev HTTP/1.1"}"#,
            "/x/..//.e%6ev",
            "/.env",
        ),
        // An escaped value: decoded, then its path resolved.
        (
            json(&[("remote_addr", "c"), ("msec", "t"), ("request_uri", "u")]),
            r#"{"c":"203.0.113.7","t":1,"u":"/a\"b/%2e%2e/c\\d?q"}"#,
            r#"/a"b/%2e%2e/c\d?q"#,
            r"/c\d",
        ),
        (
            json(&[("remote_addr", "c"), ("msec", "t"), ("uri", "u")]),
            r#"{"c":"203.0.113.7","t":1,"u":"/%2e"}"#,
            "",
            "/%2e",
        ),
        (
            Format::Regex(r#"^(?P<addr>\S+) "(?P<method>\S+) (?P<path>\S+)""#.into()),
            r#"203.0.113.7 "GET /%2egit/config?x""#,
            "/%2egit/config?x",
            "/.git/config",
        ),
        // A target nginx refuses: the raw path.
        (
            Format::Combined,
            r#"203.0.113.7 - - [30/Nov/2026:10:00:01 +0000] "GET /../.env%00?x HTTP/1.1" 400 5 "-" "ua""#,
            "/../.env%00?x",
            "/../.env%00",
        ),
    ];
    for (format, line, target, path) in cases {
        let parser = Parser::new(&format).unwrap();
        let mut scratch = Vec::new();
        let r = parser
            .parse_in(line.as_bytes(), &mut scratch)
            .unwrap_or_else(|| panic!("{line}"));
        assert_eq!(
            (String::from_utf8_lossy(r.target), String::from_utf8_lossy(r.path)),
            (target.into(), path.into()),
            "{format:?}: {line}"
        );
    }
}
