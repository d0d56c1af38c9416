//! nginx's error log (`format: nginx_error`) proven on fail2ban's own
//! sample lines (`tests/data/fail2ban/`, test data only) replayed through
//! the shipped error-log rules, by the library the daemon uses and by the
//! real binary (`fleetban test` in two time zones, `fleetban run`).

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;

use common::{cli, fleetban_test_json, ConfigDir, MainConfig, Rule};
use fleetban::config::Config;
use fleetban::detect::RuleFilter;
use fleetban::parse::Parser;
use fleetban::verdict::NeverBanned;

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// One line of a fail2ban sample with what its `# failJSON:` says.
struct Case {
    line_no: usize,
    text: String,
    /// `Some(host)` when fail2ban matches the line, `None` when it does not.
    host: Option<String>,
    time: Option<String>,
    /// The `# filterOptions:` in force (`normal`, `fallback`, `journal`, ...).
    options: String,
}

/// The annotated lines of a fail2ban sample log (`tests/data/fail2ban/`).
fn fail2ban_cases(name: &str) -> Vec<Case> {
    let path = repo().join("tests/data/fail2ban").join(name);
    let text = std::fs::read_to_string(&path).unwrap();
    let mut out = Vec::new();
    let mut options = String::from("normal");
    let mut pending: Option<serde_json::Value> = None;
    for (i, line) in text.lines().enumerate() {
        if let Some(o) = line.strip_prefix("# filterOptions:") {
            options = o.trim().to_owned();
        } else if let Some(json) = line.strip_prefix("# failJSON:") {
            pending = Some(serde_json::from_str(json).unwrap_or_else(|e| panic!("{name}:{}: {e}", i + 1)));
        } else if line.starts_with('#') || line.trim().is_empty() {
            continue;
        } else {
            let ann = pending
                .take()
                .unwrap_or_else(|| panic!("{name}:{}: a line without failJSON", i + 1));
            let matched = ann["match"].as_bool().unwrap();
            out.push(Case {
                line_no: i + 1,
                text: line.to_owned(),
                host: matched.then(|| ann["host"].as_str().unwrap().to_owned()),
                time: ann["time"].as_str().map(str::to_owned),
                options: options.clone(),
            });
        }
    }
    assert!(out.len() >= 8, "{name}: only {} cases", out.len());
    out
}

/// Why fleetban deliberately does not match a line fail2ban matches, if it does not.
fn deliberately_unmatched(case: &Case) -> Option<&'static str> {
    if case.options.contains("journal") {
        // `host nginx[pid]: 2023/...`: journald's rendering, fail2ban reads
        // it from the journal. fleetban reads nginx's error.log, whose lines
        // start with the date: this prefix leaves the line unparsed.
        return Some("a systemd journal line (fleetban reads error.log itself)");
    }
    if case.text.contains("SSL_do_handshake() failed") || case.text.contains("SSL_read() failed") {
        // fail2ban's `mode = fallback`/`aggressive` only (not its default):
        // TLS handshake noise, not a login; no shipped rule counts it.
        return Some("fail2ban's fallback/aggressive mode (TLS errors), not shipped");
    }
    if case.text.contains("delaying request") {
        // A delayed request was served: nginx's `burst` let it through.
        return Some("`delaying request`: the request was served, within `burst`");
    }
    None
}

/// The shipped rule `name` from rules/.
fn shipped(name: &str) -> PathBuf {
    repo().join("rules").join(format!("{name}.yaml"))
}

/// Replays every fail2ban line through the shipped rule: a line fail2ban
/// matches yields exactly its host as the hit's client, a line it does not
/// match yields none, but for the cases [`deliberately_unmatched`] names.
fn replay_through_the_library(rule_name: &str, sample: &str) {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("fleetban.yaml");
    MainConfig::new().rule_files(&[shipped(rule_name)]).write(&main);
    let config = Config::load(&main).unwrap_or_else(|e| panic!("{e}"));
    let rule = &config.rules[0];
    let parser = Parser::new(&rule.format).unwrap();
    let filter = RuleFilter::new(&rule.matches, &rule.ignore);
    let allow = NeverBanned::only(&["127.0.0.0/8".parse().unwrap(), "::1/128".parse().unwrap()]);
    let (mut matched, mut skipped) = (0, 0);
    let mut problems = Vec::new();
    for case in fail2ban_cases(sample) {
        let mut scratch = Vec::new();
        let got = parser
            .parse_in(case.text.as_bytes(), &mut scratch)
            .filter(|r| !allow.contains(r.addr) && filter.accepts(r))
            .map(|r| r.addr.to_string());
        let want = match (&case.host, deliberately_unmatched(&case)) {
            (Some(_), Some(_)) => {
                skipped += 1;
                None
            }
            (Some(host), None) => {
                matched += 1;
                Some(host.clone())
            }
            (None, _) => None,
        };
        if got != want {
            problems.push(format!(
                "{sample}:{}: fail2ban says {:?}, {rule_name} gave {got:?}: {}",
                case.line_no, want, case.text
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
    assert!(
        matched >= 4,
        "{sample}: only {matched} matching lines were checked ({skipped} skipped)"
    );
}

#[test]
fn fail2ban_nginx_http_auth_samples_yield_their_hosts() {
    replay_through_the_library("nginx-http-auth", "nginx-http-auth");
}

#[test]
fn fail2ban_nginx_limit_req_samples_yield_their_hosts() {
    replay_through_the_library("nginx-limit-req-error", "nginx-limit-req");
}

/// The real binary on fail2ban's lines, each shipped rule at `hits: 0`
/// (a ban on the first match): the addresses banned are exactly the hosts
/// fail2ban finds, each banned at the local time of its first line (TZ=UTC
/// and TZ=UTC-2 read the same text two hours apart).
#[test]
fn fleetban_test_bans_the_fail2ban_hosts_at_their_local_times() {
    let hits = regex::Regex::new(r"hits: \d+").unwrap();
    for (rule_name, sample) in [
        ("nginx-http-auth", "nginx-http-auth"),
        ("nginx-limit-req-error", "nginx-limit-req"),
    ] {
        let text = std::fs::read_to_string(shipped(rule_name)).unwrap();
        let at_zero = hits.replace(&text, "hits: 0");
        assert_ne!(at_zero, text, "{rule_name}: no `hits:` to set to 0");
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(dir.path().join("rules.yaml"), at_zero.as_bytes()).unwrap();
        let main = dir.path().join("fleetban.yaml");
        MainConfig::new().write(&main);
        let log = repo().join("tests/data/fail2ban").join(sample);

        let mut first: BTreeMap<String, String> = BTreeMap::new();
        for case in fail2ban_cases(sample) {
            if let (Some(host), None, Some(time)) = (&case.host, deliberately_unmatched(&case), &case.time) {
                first.entry(host.clone()).or_insert_with(|| time.clone());
            }
        }
        for (tz, shift_h) in [("UTC", 0), ("UTC-2", 2)] {
            let decisions = fleetban_test_json(&main, &[&log], tz);
            // Each address's first ban (a later line, after the ban ended, bans again).
            let mut bans: BTreeMap<String, String> = BTreeMap::new();
            for d in decisions.iter().filter(|d| d["event"] == "ban") {
                assert_eq!(d["hits"], 1, "hits: 0 reports the one hit that banned: {d}");
                bans.entry(d["addr"].as_str().unwrap().to_owned())
                    .or_insert_with(|| d["at"].as_str().unwrap().to_owned());
            }
            // IPv6 clients are banned by their /64.
            let want: BTreeMap<String, String> = first
                .iter()
                .map(|(host, time)| {
                    let key = fleetban::addr::client_key(host.parse().unwrap(), 64);
                    let text = fleetban::addr::AddrText(&key).to_string();
                    (text, shifted(time, shift_h))
                })
                .collect();
            assert_eq!(bans, want, "{rule_name} on {sample} with TZ={tz}");
        }
    }
}

/// `2012-04-09T11:53:29` (local, in a zone `hours` east of UTC) as RFC 3339 UTC.
fn shifted(local: &str, hours: i64) -> String {
    let ms = fleetban::parse::parse_iso8601(format!("{local}Z").as_bytes()).unwrap() - hours * 3_600_000;
    let secs = ms.div_euclid(1000);
    let days = secs.div_euclid(86_400);
    let (y, m, d) = civil(days);
    let s = secs.rem_euclid(86_400);
    format!("{y:04}-{m:02}-{d:02}T{:02}:{:02}:{:02}Z", s / 3600, s / 60 % 60, s % 60)
}

fn civil(days: i64) -> (i64, i64, i64) {
    // Brute force from 1970: these dates are few and tests can afford it.
    let mut y = 1970;
    let mut left = days;
    loop {
        let len = fleetban::parse::days_from_civil(y + 1, 1, 1) - fleetban::parse::days_from_civil(y, 1, 1);
        if left < len {
            break;
        }
        left -= len;
        y += 1;
    }
    let mut m = 1;
    loop {
        let start = fleetban::parse::days_from_civil(y, m, 1);
        let next = if m == 12 {
            fleetban::parse::days_from_civil(y + 1, 1, 1)
        } else {
            fleetban::parse::days_from_civil(y, m + 1, 1)
        };
        let day = days - start;
        if day < next - start {
            return (y, i64::from(m), day + 1);
        }
        m += 1;
    }
}

/// `YYYY/MM/DD HH:MM:SS` of epoch ms in UTC, as nginx writes its error log
/// on a host whose zone is UTC.
fn error_log_time(ms: i64) -> String {
    let secs = ms.div_euclid(1000);
    let (y, m, d) = civil(secs.div_euclid(86_400));
    let s = secs.rem_euclid(86_400);
    format!("{y:04}/{m:02}/{d:02} {:02}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
}

/// `fleetban run` reads the new formats as `test` does: the shipped
/// nginx-http-auth rule (its limit lowered to 1) on an error log written in
/// the daemon's zone, and a JSON access log, ban their clients.
#[test]
fn the_daemon_reads_an_error_log_and_a_json_log() {
    let r = ConfigDir::new();
    let errors = r.empty_log("error.log");
    let text = std::fs::read_to_string(shipped("nginx-http-auth")).unwrap();
    let auth = regex::Regex::new(r"hits: \d+")
        .unwrap()
        .replace(&text, "hits: 1")
        .replace("/var/log/nginx/error.log", &errors.display().to_string());
    let rules_file = r.path().join("auth.yaml");
    std::fs::write(&rules_file, auth).unwrap();
    r.write_rules(&[Rule::new("json", &r.log, "{ hits: 1, window: 60s }")
        .format("{ json: { remote_addr: client, time_iso8601: ts, request: req, http_user_agent: ua } }")
        .matching(r#"{ user_agent: '^Evil "Bot"$' }"#)]);
    let main = r
        .main_config()
        .host_id("h1")
        .log_firewall()
        .rule_files(&[r.rules.clone(), rules_file]);
    main.write(&r.cfg);
    std::fs::write(&r.log, "").unwrap();
    let d = common::Daemon::start_with_env(None, &r.cfg, &r.control, &[("TZ", "UTC")]);
    let now = common::now_ms();
    let t = error_log_time(now);
    let failure = |n: u32| {
        format!(
            "{t} [error] 1234#1234: *{n} user \"admin\": password mismatch, client: 203.0.113.70, server: example.com, request: \"GET /admin/ HTTP/1.1\", host: \"example.com\"\n"
        )
    };
    common::append(&errors, &(failure(1) + &failure(2)));
    let ts = format!("{}+00:00", error_log_time(now).replace('/', "-").replace(' ', "T"));
    let evil = format!(r#"{{"ts":"{ts}","client":"203.0.113.71","req":"GET / HTTP/1.1","ua":"Evil \"Bot\""}}"#);
    common::append(&r.log, &format!("{evil}\n{evil}\n"));
    d.wait_lines(4);
    let mut listed = String::new();
    common::wait_until(std::time::Duration::from_secs(10), "both bans listed", || {
        listed = cli(&r.cfg, &["bans", "--json"]).stdout;
        listed.contains("203.0.113.70") && listed.contains("203.0.113.71")
    });
    let status = d.status();
    assert_eq!(status["unparsed"], 0, "{status}");
    assert_eq!(status["stale"], 0, "the error log's local time read right: {status}");
    assert_eq!(status["future"], 0, "the error log's local time read right: {status}");
}

/// Addresses of the framing test (issue 25): the attacker, the address his
/// injected lines name, a client failing logins for real, nginx.
const ATTACKER: &str = "10.213.81.5";
const VICTIM: &str = "198.51.100.99";
const GUESSER: &str = "10.213.81.6";
const FRAME_WEB: &str = "10.213.81.1";

/// `text` percent-encoded as a request target carries it: nginx decodes
/// it back into the `open()` message.
fn encoded(text: &str) -> String {
    let mut out = String::new();
    for b in text.bytes() {
        match b {
            b'a'..=b'z' | b'A'..=b'Z' | b'0'..=b'9' | b'/' | b'.' | b'-' | b'_' | b':' | b',' | b'[' | b']' | b'*' => {
                out.push(b as char)
            }
            _ => out += &format!("%{b:02X}"),
        }
    }
    out
}

/// One HTTP/1.1 request sent as `raw` bytes from `from` to nginx; the
/// answer is read to its end and not looked at.
fn send_raw(client: &common::NetNs, from: &str, raw: Vec<u8>) {
    use std::io::{Read, Write};
    let (from, to): (std::net::IpAddr, std::net::SocketAddr) =
        (from.parse().unwrap(), format!("{FRAME_WEB}:8080").parse().unwrap());
    client
        .spawn(move || {
            let mut s = common::connect_from(from, to, std::time::Duration::from_secs(2)).expect("connect to nginx");
            s.set_read_timeout(Some(std::time::Duration::from_secs(2))).unwrap();
            s.write_all(&raw).unwrap();
            let mut answer = Vec::new();
            let _ = s.read_to_end(&mut answer);
        })
        .join()
        .unwrap();
}

fn get(target: &str, headers: &str) -> Vec<u8> {
    format!("GET {target} HTTP/1.1\r\nHost: example.com\r\n{headers}Connection: close\r\n\r\n").into_bytes()
}

/// Issue 25: a `%0A` in a path makes nginx start, in its error log, lines
/// the client writes whole. Against Debian's nginx (log_not_found on,
/// basic auth, limit_req), the attacker's crafted requests name the
/// victim in fake records: a fake header on each segment, several fake
/// lines, a record cut at 2048 bytes, a user name holding newlines, and
/// the attack as the last record of the file. `fleetban test` with the
/// shipped nginx-http-auth and nginx-limit-req-error rules (their limits at
/// first hit: `hits: 0`) bans nobody for them: the victim is never counted, the split
/// lines are unparsed; a real guesser's failed logins still ban him.
#[test]
fn lines_a_client_wrote_through_a_decoded_newline_are_never_attributed() {
    let (web, client) = (common::NetNs::new("fweb"), common::NetNs::new("fcli"));
    let (_, client_if) = common::veth_pair(&web, FRAME_WEB, &client, ATTACKER);
    client.run(&["ip", "addr", "add", &format!("{GUESSER}/24"), "dev", &client_if]);
    let site = common::Site {
        log_format: None,
        http: "limit_req_zone $binary_remote_addr zone=one:1m rate=1r/m;\n".into(),
        server: "root {www};\n\
                 location /auth/ { auth_basic \"x\"; auth_basic_user_file {www}/htpasswd; }\n\
                 location /lim/ { limit_req zone=one nodelay; }\n"
            .into(),
    };
    let nginx = common::Nginx::start_site(&web, &format!("{FRAME_WEB}:8080"), &site);
    // A user whose password nobody sends ("{PLAIN}" scheme).
    std::fs::write(nginx.dir().join("www/htpasswd"), "admin:{PLAIN}not-this-one\n").unwrap();

    let now = error_log_time(common::now_ms());
    let auth = format!(
        "{now} [error] 1#1: *5 user \"admin\": password mismatch, client: {VICTIM}, server: example.com, request: \"GET /auth/ HTTP/1.1\", host: \"example.com\""
    );
    let limit = format!(
        "{now} [error] 1#1: *6 limiting requests, excess: 0.500 by zone \"one\", client: {VICTIM}, server: example.com, request: \"GET /lim/ HTTP/1.1\", host: \"example.com\""
    );
    let fake_suffix = format!("\" failed (2: No such file or directory), client: {VICTIM}, server: example.com, request: \"GET / HTTP/1.1\", host: \"example.com\"");
    let variants: Vec<String> = vec![
        // The issue's request: one fake line between two halves of the record.
        format!("/x\n{auth}\n"),
        format!("/x\n{limit}\n"),
        // Several fake lines, and a fake header and suffix on every segment
        // (the head line's own end and the last segment's start).
        format!("/x{fake_suffix}\n{auth}\n{limit}\n{now} [error] 1#1: *7 open() \"/y"),
        // A record cut at 2048 bytes: the real suffix, request and all, is lost.
        format!("/x\n{auth}\n{now} [error] 1#1: *8 {}", "a".repeat(2100)),
    ];
    let guesser_fails = 2;
    for _ in 0..2 {
        for v in &variants {
            send_raw(&client, ATTACKER, get(&encoded(v), ""));
        }
    }
    // A user name holding newlines: base64-decoded, written raw, but cut at
    // its first `:`, so no segment can hold a header or a suffix.
    let user = format!("a\n{auth}\nb");
    let basic = base64(format!("{user}:pw").as_bytes());
    send_raw(
        &client,
        ATTACKER,
        get("/auth/", &format!("Authorization: Basic {basic}\r\n")),
    );
    // Far from the attacks (more than 2048 bytes of other records between):
    // the guesser's failed logins, each a record of its own.
    for i in 0..12 {
        send_raw(&client, GUESSER, get(&format!("/missing-{i}"), ""));
    }
    for _ in 0..guesser_fails {
        let basic = base64(b"admin:guess");
        send_raw(
            &client,
            GUESSER,
            get("/auth/", &format!("Authorization: Basic {basic}\r\n")),
        );
    }
    // The attacker's own failed login, far from his attacks: it counts.
    send_raw(
        &client,
        ATTACKER,
        get("/auth/", &format!("Authorization: Basic {}\r\n", base64(b"admin:mine"))),
    );
    for i in 0..12 {
        send_raw(&client, GUESSER, get(&format!("/missing-{i}"), ""));
    }
    // The attack again as the file's last record.
    send_raw(&client, ATTACKER, get(&encoded(&variants[0]), ""));

    let log = nginx.error_log();
    let text = std::fs::read_to_string(&log).unwrap();
    let injected = text
        .lines()
        .filter(|l| l.contains(VICTIM) && !l.contains("request: \"GET /x"))
        .count();
    assert!(
        injected >= 8,
        "nginx wrote the fake lines as lines of their own:\n{text}"
    );

    let hits = regex::Regex::new(r"hits: \d+").unwrap();
    let dir = tempfile::tempdir().unwrap();
    let mut files = Vec::new();
    for name in ["nginx-http-auth", "nginx-limit-req-error"] {
        let rule = std::fs::read_to_string(shipped(name)).unwrap();
        let file = dir.path().join(format!("{name}.yaml"));
        std::fs::write(
            &file,
            hits.replace(&rule, "hits: 0")
                .replace("/var/log/nginx/error.log", log.to_str().unwrap()),
        )
        .unwrap();
        files.push(file);
    }
    let main = dir.path().join("fleetban.yaml");
    MainConfig::new().rule_files(&files).write(&main);
    let out = cli(&main, &["test", "--json", log.to_str().unwrap()]);
    assert!(out.success(), "{out:?}");
    let mut banned: Vec<String> = out
        .test_bans()
        .iter()
        .map(|b| b["addr"].as_str().unwrap().to_owned())
        .collect();
    banned.sort();
    banned.dedup();
    assert_eq!(banned, [ATTACKER, GUESSER], "{}\n{text}", out.stdout);
    assert!(
        !out.stdout.contains(VICTIM),
        "the victim is never counted:\n{}",
        out.stdout
    );
    let summary: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    let auth_rule = &summary["rules"]["nginx-http-auth"];
    assert_eq!(auth_rule["matched"], guesser_fails + 1, "{summary}");
    // Every line of the attacker's records is unparsed: the head lines,
    // the fake ones, the ends; and so are nginx's notices. (So are the
    // guesser's lines within 2048 bytes of an attack: never a victim's hit.)
    let own = format!("password mismatch, client: {ATTACKER},");
    let attack_lines = text
        .lines()
        .filter(|l| !l.contains(GUESSER) && !l.contains(&own))
        .count();
    assert!(
        summary["unparsed"].as_u64().unwrap() >= attack_lines as u64,
        "{summary}\n{text}"
    );
}

/// Standard base64 of `bytes`, as an `Authorization: Basic` value.
fn base64(bytes: &[u8]) -> String {
    const A: &[u8; 64] = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";
    let mut out = String::new();
    for c in bytes.chunks(3) {
        let n =
            (u32::from(c[0]) << 16) | (u32::from(*c.get(1).unwrap_or(&0)) << 8) | u32::from(*c.get(2).unwrap_or(&0));
        for k in 0..4 {
            if k <= c.len() {
                out.push(A[(n >> (18 - 6 * k) & 63) as usize] as char);
            } else {
                out.push('=');
            }
        }
    }
    out
}
