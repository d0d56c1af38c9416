//! `fleetban check` on good and bad configurations: every error names the
//! file, line and column and says what was expected; exit code 2. Drives the
//! real binary.

mod common;

use std::path::Path;

use common::cli;

const GOOD_RULE: &str = "rules:
  - name: scraper
    logs: [/var/log/nginx/access.log]
    limit: { hits: 100, window: 60s }
";

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

fn check(main: &str, rule: &str) -> (i32, String, String, tempfile::TempDir) {
    let dir = tempfile::tempdir().unwrap();
    write(dir.path(), "r.yaml", rule);
    let cfg = write(dir.path(), "fleetban.yaml", main);
    let out = cli(&cfg, &["check"]);
    (out.code, out.stdout, out.stderr, dir)
}

#[test]
fn a_good_configuration_passes_with_a_summary() {
    let (code, out, err, _d) = check(
        "rules: [r.yaml]\nallow: [10.0.0.0/8, 192.0.2.1]\nredis: { url: 'unix:///run/redis.sock' }\n",
        GOOD_RULE,
    );
    assert_eq!(code, 0, "stderr: {err}");
    assert!(out.contains("1 rule(s)"), "{out}");
    assert!(out.contains("scraper: 100 hits per 1m"), "{out}");
    assert!(out.contains("/var/log/nginx/access.log"), "{out}");
}

/// `match.target` and `ignore.target` (regexes on the raw target) are rule keys.
#[test]
fn target_is_a_match_and_ignore_key() {
    let rule = "rules:\n  - name: a\n    logs: [/x]\n    match: { target: '(?i)(\\$|%24)(\\{|%7b)jndi', path: '^/' }\n    ignore: { target: '^/health\\?' }\n    limit: { hits: 0, window: 1s }\n";
    let (code, out, err, _d) = check("rules: [r.yaml]\n", rule);
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("1 rule(s)"), "{out}");
}

/// (what, main file, rule file, file that must be named, "line:col", words the message must have)
type Case = (
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static str,
    &'static [&'static str],
);
const BAD: &[Case] = &[
    ("unknown key in main", "rules: [r.yaml]\nredis_url: x\n", GOOD_RULE, "fleetban.yaml", "2:1", &["redis_url"]),
    ("unknown key in rule", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    bans: {}\n", "r.yaml", "5:5", &["bans"]),
    ("network prefix too short", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { key: network, ipv4_prefix: 4, hits: 1, window: 1s }\n", "r.yaml", "4:", &["ipv4_prefix", "between 8 and 32", "not 4"]),
    ("prefix without key: network", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { ipv6_prefix: 48, hits: 1, window: 1s }\n", "r.yaml", "4:", &["ipv6_prefix", "key: network"]),
    ("unknown key kind", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { key: subnet, hits: 1, window: 1s }\n", "r.yaml", "4:", &["subnet", "network"]),
    ("bad duration", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: soon }\n", "r.yaml", "4:", &["duration", "soon", "60s"]),
    ("bad status", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    match: { status: [200, 6xx] }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["6xx", "4xx"]),
    ("bad regex", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    ignore: { path: '(unclosed' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["regular expression"]),
    ("target without a logged target", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '$remote_addr [$time_local] \"$uri\" $status' }\n    ignore: { target: '\\?' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["ignore: { target: ... }", "$request_uri"]),
    ("bad target regex", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    match: { target: '[z-a]' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:22", &["regular expression", "[z-a]"]),
    ("bad cidr", "rules: [r.yaml]\nallow: [10.0.0.0/33]\n", GOOD_RULE, "fleetban.yaml", "2:", &["10.0.0.0/33", "CIDR"]),
    ("memory bound without its unit", "rules: [r.yaml]\nsafety: { max_client_state: 128 }\n", GOOD_RULE, "fleetban.yaml", "2:", &["128", "add a unit, e.g. 128MiB"]),
    ("memory bound too small", "rules: [r.yaml]\nsafety: { max_client_state: 512KiB }\n", GOOD_RULE, "fleetban.yaml", "2:", &["max_client_state", "at least 1MiB"]),
    ("hits out of range", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 100000000000, window: 1s }\n", "r.yaml", "4:", &["100000000000", "from 0 to 4294967295"]),
    ("zero burst", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: token_bucket, burst: 0, rate: 5/s }\n", "r.yaml", "4:", &["burst", "at least 1", "hits: 0"]),
    ("prefilter with hits 0", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 0, window: 1s, prefilter: 0.5 }\n", "r.yaml", "4:", &["hits: 0", "prefilter"]),
    ("ban below a second", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    ban: { duration: 100ms }\n", "r.yaml", "5:10", &["100ms", "below a second"]),
    // Issue 25, item 5: one bound for a ban's length, in the rules as on the command line.
    ("ban longer than nft holds", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    ban: { duration: 3651d }\n", "r.yaml", "5:10", &["ban.duration", "above 3650d", "longest ban"]),
    ("ban that overflows", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    ban: { duration: 300000000y }\n", "r.yaml", "5:", &["ban.duration", "above 3650d"]),
    ("escalate max longer than nft holds", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    ban: { duration: 1d, escalate: { max: 4000d } }\n", "r.yaml", "5:10", &["escalate.max", "above 3650d"]),
    ("escalate max below a second", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    ban: { duration: 1s, escalate: { max: 500ms } }\n", "r.yaml", "5:10", &["escalate.max", "500ms"]),
    ("escalate max below the duration", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n    ban: { duration: 1h, escalate: { max: 10m } }\n", "r.yaml", "5:10", &["escalate.max", "shorter"]),
    ("pasted log_format directive", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: \"log_format main '$remote_addr [$time_local]';\" }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["whole text", "format string", "format: json"]),
    ("pasted directive with escape=json", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: \"main escape=json '{\\\"a\\\":\\\"$remote_addr\\\",\\\"t\\\":\\\"$msec\\\"}';\" }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["name and quotes", "format: json"]),
    ("pasted escape= parameter", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: \"escape=json '$remote_addr $msec'\" }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["escape="]),
    ("pasted quotes and semicolon", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: \"'$remote_addr [$time_local]';\" }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["trailing `;`"]),
    ("no time under clock log", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '$remote_addr \"$request\" $status' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:13", &["no time", "clock: log", "clock: redis"]),
    ("regex without a time group", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { regex: '^(?P<addr>\\S+)' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["no time", "`time`"]),
    ("json without a client", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { json: { time_iso8601: ts } }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["remote_addr"]),
    ("json unknown variable", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { json: { remote_addr: c, time_iso8601: t, colour: x } }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["colour", "http_user_agent"]),
    ("json key used twice", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { json: { remote_addr: c, time_iso8601: c } }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["`c`", "both"]),
    ("message without nginx_error", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    match: { message: 'x' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "2:", &["message", "nginx_error"]),
    ("bad level", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: nginx_error\n    match: { level: [error, loud] }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "5:", &["loud", "crit"]),
    ("missing limit", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n", "r.yaml", "2:5", &["missing field `limit`"]),
    ("duplicate rule", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s }\n  - name: a\n    logs: [/y]\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "5:", &["duplicate", "`a`"]),
    ("bad log_format", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '$remote_user [$time_local]' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["log_format"]),
    ("regex without addr", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { regex: '^(?P<host>\\S+)' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["addr"]),
    ("unknown format", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: apache\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["apache", "combined"]),
    ("bad redis url", "rules: [r.yaml]\nredis:\n  url: http://x\n", GOOD_RULE, "fleetban.yaml", "3:", &["http://x", "redis://"]),
    ("bad ipv6 prefix", "rules: [r.yaml]\nipv6_prefix: 200\n", GOOD_RULE, "fleetban.yaml", "2:", &["ipv6_prefix"]),
    ("unknown algorithm", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 1s, algorithm: leaky }\n", "r.yaml", "4:", &["leaky"]),
    ("glob matches nothing", "rules: [nothing/*.yaml]\n", GOOD_RULE, "fleetban.yaml", "1:", &["matches no file"]),
    ("bad yaml", "rules: [r.yaml\n", GOOD_RULE, "fleetban.yaml", "1:8", &["unclosed"]),
    ("token bucket without rate", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: token_bucket, burst: 20 }\n", "r.yaml", "4:", &["token_bucket", "rate"]),
    ("token bucket with hits", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: token_bucket, burst: 20, rate: 5/s, hits: 5 }\n", "r.yaml", "4:", &["token_bucket", "burst", "not `hits`"]),
    ("bad rate", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: token_bucket, burst: 20, rate: 5/fortnight }\n", "r.yaml", "4:", &["5/fortnight"]),
    ("fixed window without window", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: fixed_window, hits: 10 }\n", "r.yaml", "4:", &["fixed_window", "window"]),
    ("burst on a sliding counter", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: sliding_counter, hits: 10, window: 1m, burst: 3 }\n", "r.yaml", "4:", &["burst", "token_bucket"]),
    ("prefilter on a fixed window", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: fixed_window, hits: 10, window: 1m, prefilter: 0.8 }\n", "r.yaml", "4:", &["prefilter", "fixed_window"]),
    ("prefilter out of range", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 10, window: 1m, prefilter: 1.5 }\n", "r.yaml", "4:", &["1.5", "between 0 and 1"]),
    ("distinct on a token bucket", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: token_bucket, burst: 5, rate: 1/s, distinct: path }\n", "r.yaml", "4:", &["distinct: path", "sliding window", "token_bucket"]),
    ("distinct with a prefilter", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 30, window: 5m, distinct: path, prefilter: 0.5 }\n", "r.yaml", "4:", &["distinct: path", "prefilter", "distinct values"]),
    ("distinct over its cap", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 5000, window: 5m, distinct: user_agent }\n", "r.yaml", "4:", &["at most 1000", "32-bit"]),
    ("distinct of an unknown field", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 5, window: 5m, distinct: referer }\n", "r.yaml", "4:", &["referer", "user_agent"]),
    ("token bucket too slow", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: token_bucket, burst: 4000000000, rate: 1/d }\n", "r.yaml", "4:", &["token_bucket", "burst"]),
    ("sliding counter too large", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    limit: { algorithm: sliding_counter, hits: 4000000000, window: 30d }\n", "r.yaml", "4:", &["sliding_counter", "2^52"]),
    ("forwarded list without proxies", "rules: [r.yaml]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '$remote_addr [$time_local] \"$request\" $status \"$http_x_forwarded_for\"' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["$http_x_forwarded_for", "proxies", "realip"]),
    ("unquoted forwarded list", "rules: [r.yaml]\nproxies: [10.0.0.0/8]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '$http_x_forwarded_for - $remote_addr [$time_local]' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["neither quoted nor last"]),
    ("forwarded list without the peer", "rules: [r.yaml]\nproxies: [10.0.0.0/8]\n", "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '\"$http_x_forwarded_for\" [$time_local]' }\n    limit: { hits: 1, window: 1s }\n", "r.yaml", "4:", &["$remote_addr", "trusted proxy"]),
    ("bad proxy network", "rules: [r.yaml]\nproxies: [10.0.0.0/40]\n", GOOD_RULE, "fleetban.yaml", "2:", &["10.0.0.0/40"]),
    ("bad http listen", "rules: [r.yaml]\nhttp: { listen: 'somewhere' }\n", GOOD_RULE, "fleetban.yaml", "2:", &["http.listen", "somewhere"]),
    ("http listen not loopback", "rules: [r.yaml]\nhttp: { listen: '0.0.0.0:8081' }\n", GOOD_RULE, "fleetban.yaml", "2:", &["loopback"]),
    ("bad deny status", "rules: [r.yaml]\nhttp: { listen: /run/x.sock, deny_status: 500 }\n", GOOD_RULE, "fleetban.yaml", "2:", &["403 or 429", "500"]),
    ("bad table name", "rules: [r.yaml]\nfirewall: { table: 'x; drop' }\n", GOOD_RULE, "fleetban.yaml", "2:", &["table"]),
];

#[test]
fn every_bad_configuration_names_file_line_column_and_reason() {
    let mut failures = Vec::new();
    for (what, main, rule, file, pos, words) in BAD {
        let (code, _out, err, dir) = check(main, rule);
        let path = dir.path().join(file);
        let prefix = format!("{}:{}", path.display(), pos);
        let ok = code == 2 && err.contains(&prefix) && words.iter().all(|w| err.contains(w));
        if !ok {
            failures.push(format!(
                "{what}: exit {code}, wanted `{prefix}...` and {words:?}, got:\n{err}"
            ));
        }
    }
    assert!(failures.is_empty(), "{}", failures.join("\n---\n"));
}

/// A sliding window whose ZSET can outgrow the listpack encoding is valid but
/// warned about, with the two remedies; with a prefilter that keeps the ZSET
/// under the threshold, or another algorithm, no warning.
#[test]
fn large_sliding_windows_are_warned_about_and_every_algorithm_is_summarised() {
    let big = "rules:\n  - name: big\n    logs: [/x]\n    limit: { hits: 500, window: 1m }\n";
    // Only Redis keeps windows in listpacks: no warning for the embedded store.
    let (code, out, err, _d) = check("rules: [r.yaml]\n", big);
    assert_eq!(code, 0, "{err}");
    assert!(!out.contains("listpack"), "{out}");
    let (code, out, err, _d) = check("rules: [r.yaml]\nredis: { url: 'unix:///run/redis.sock' }\n", big);
    assert_eq!(code, 0, "{err}");
    let warning = not_about_logs(&out)
        .into_iter()
        .next()
        .unwrap_or_else(|| panic!("no warning in {out}"));
    for w in [
        "r.yaml",
        "big",
        "500",
        "zset-max-listpack-entries",
        "prefilter",
        "sliding_counter",
    ] {
        assert!(warning.contains(w), "{w} missing from {warning}");
    }
    let fine = "rules:
  - name: pre
    logs: [/x]
    limit: { hits: 500, window: 1m, prefilter: 0.8 }
  - name: counter
    logs: [/x]
    limit: { hits: 5000, window: 1h, algorithm: sliding_counter }
  - name: bucket
    logs: [/x]
    limit: { algorithm: token_bucket, burst: 20, rate: 5/s }
  - name: fixed
    logs: [/x]
    limit: { hits: 300, window: 1m, algorithm: fixed_window }
";
    let (code, out, err, _d) = check("rules: [r.yaml]\nredis: { url: 'unix:///run/redis.sock' }\n", fine);
    assert_eq!(code, 0, "{err}");
    assert!(not_about_logs(&out).is_empty(), "{out}");
    assert!(
        out.contains("pre: 500 hits per 1m, prefilter 0.8 (sliding_window)"),
        "{out}"
    );
    assert!(out.contains("counter: 5000 hits per 1h (sliding_counter)"), "{out}");
    assert!(
        out.contains("bucket: burst 20, one token every 200ms (token_bucket)"),
        "{out}"
    );
    assert!(out.contains("fixed: 300 hits per 1m (fixed_window)"), "{out}");
}

#[test]
fn errors_in_several_files_are_all_reported() {
    let dir = tempfile::tempdir().unwrap();
    write(
        dir.path(),
        "a.yaml",
        "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: soon }\n",
    );
    write(
        dir.path(),
        "b.yaml",
        "rules:\n  - name: b\n    logs: [/x]\n    limit: { hits: 1, window: 1s, colour: red }\n",
    );
    let cfg = write(dir.path(), "fleetban.yaml", "rules: ['*.yaml']\n");
    // The main file itself matches *.yaml too: it has no `rules:` list of rule
    // objects, which is a third error.
    let out = cli(&cfg, &["check"]);
    let err = out.stderr;
    assert_eq!(out.code, 2);
    assert!(err.contains("a.yaml:4:"), "{err}");
    assert!(err.contains("b.yaml:4:"), "{err}");
}

/// Proxies and the decision endpoint are summarised; `proxies` without an
/// endpoint is valid but warned about (proxied clients could not be stopped).
#[test]
fn proxies_and_the_endpoint_are_summarised_and_a_missing_endpoint_warned() {
    let xff_rule = "rules:\n  - name: a\n    logs: [/x]\n    format: { log_format: '$remote_addr [$time_local] \"$request\" $status \"$http_x_forwarded_for\"' }\n    limit: { hits: 1, window: 1s }\n";
    let (code, out, err, _d) = check("rules: [r.yaml]\nproxies: [10.0.0.0/8, '2001:db8:ff::/48']\n", xff_rule);
    assert_eq!(code, 0, "stderr: {err}");
    assert!(out.contains("proxies: 10.0.0.0/8, 2001:db8:ff::/48"), "{out}");
    assert!(out.contains("warning:") && out.contains("no `http:` endpoint"), "{out}");
    let (code, out, err, _d) = check(
        "rules: [r.yaml]\nproxies: [10.0.0.0/8]\nhttp: { listen: /run/fleetban/http.sock, deny_status: 429 }\n",
        xff_rule,
    );
    assert_eq!(code, 0, "stderr: {err}");
    assert!(
        out.contains("http: unix:/run/fleetban/http.sock (banned clients get 429)"),
        "{out}"
    );
    assert!(not_about_logs(&out).is_empty(), "{out}");
}

/// `check`'s warnings but those about the logs (these tests name `/x`,
/// which does not exist: `tests/check.rs` tests those warnings).
fn not_about_logs(out: &str) -> Vec<&str> {
    out.lines()
        .filter(|l| l.starts_with("warning:") && !l.starts_with("warning: log "))
        .collect()
}

/// A bad rule does not hide the next: every error of every rule of a file
/// is reported, several per rule, in the order of the file; the good rule
/// between them is not reported.
#[test]
fn every_error_of_every_rule_is_reported() {
    let rules = "rules:
  - name: first
    logs: [/x]
    limit: { hits: 1, window: soon }
  - name: good
    logs: [/x]
    limit: { hits: 1, window: 1s }
  - name: third
    logs: [/x]
    ignore: { path: '(unclosed' }
    limit: { hits: 1, window: 1s, colour: red }
  - name: 'bad name!'
    logs: [/x]
    format: { log_format: '$remote_addr $status' }
    limit: { hits: 1, window: 1s }
    ban: { duration: 100ms }
";
    let (code, _out, err, dir) = check("rules: [r.yaml]\n", rules);
    assert_eq!(code, 2, "{err}");
    let file = dir.path().join("r.yaml").display().to_string();
    let lines: Vec<&str> = err.lines().filter(|l| l.starts_with(&file)).collect();
    let at: Vec<String> = lines
        .iter()
        .map(|l| l[file.len() + 1..].split(": ").next().unwrap().to_owned())
        .collect();
    assert_eq!(at.len(), 6, "{err}");
    let wanted = ["4:", "10:", "11:", "12:", "14:", "16:"];
    for (got, want) in at.iter().zip(wanted) {
        assert!(got.starts_with(want), "{at:?}, wanted {wanted:?}:\n{err}");
    }
    assert!(
        err.contains("soon") && err.contains("colour") && err.contains("bad name!"),
        "{err}"
    );
    assert!(err.contains("no time") && err.contains("below a second"), "{err}");
    assert!(!err.contains("good"), "{err}");
}

/// The regex crate's several-line message is one readable line: no `\\n`.
#[test]
fn a_regex_error_is_one_readable_line() {
    let rule =
        "rules:\n  - name: a\n    logs: [/x]\n    ignore: { path: '(unclosed' }\n    limit: { hits: 1, window: 1s }\n";
    let (code, _out, err, _d) = check("rules: [r.yaml]\n", rule);
    assert_eq!(code, 2);
    assert!(!err.contains("\\n"), "{err}");
    assert!(
        err.contains("invalid regular expression: unclosed group at character 1 of `(unclosed`"),
        "{err}"
    );
}

/// What is valid now: `hits: 0` (every window algorithm), a ban
/// of 1.5 s shown exactly, a format without time under `clock: redis`, the
/// two new formats.
#[test]
fn hits_zero_exact_durations_and_the_new_formats_pass() {
    let rule = "rules:
  - name: first
    logs: [/x]
    limit: { hits: 0, window: 1m }
    ban: { duration: 1500ms }
  - name: fixed
    logs: [/x]
    limit: { algorithm: fixed_window, hits: 0, window: 1m }
  - name: untimed
    logs: [/x]
    format: { log_format: '$remote_addr \"$request\" $status' }
    limit: { hits: 5, window: 1m, clock: redis }
  - name: json
    logs: [/x]
    format: json
    limit: { hits: 5, window: 1m }
  - name: errors
    logs: [/x]
    format: nginx_error
    match: { level: [error, crit], message: '^limiting requests' }
    limit: { hits: 5, window: 1m }
";
    let (code, out, err, _d) = check("rules: [r.yaml]\n", rule);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("first: hits 0: the first matching request bans, scope fleet, ban 1500ms"),
        "{out}"
    );
    assert!(
        out.contains("fixed: hits 0: the first matching request bans, scope fleet, ban 1h"),
        "{out}"
    );
    assert!(
        out.contains("format json") && out.contains("format nginx_error"),
        "{out}"
    );
}

/// A JSON template pasted into `log_format:` works but matches escaped
/// text: `check` passes and says so, pointing to `format: json`.
#[test]
fn a_json_template_in_log_format_is_warned_about() {
    let rule = "rules:\n  - name: j\n    logs: [/x]\n    format: { log_format: '{\"a\":\"$remote_addr\",\"t\":\"$time_iso8601\"}' }\n    limit: { hits: 1, window: 1s }\n";
    let (code, out, err, _d) = check("rules: [r.yaml]\n", rule);
    assert_eq!(code, 0, "{err}");
    assert!(
        out.contains("warning:") && out.contains("rule j") && out.contains("format: { json:"),
        "{out}"
    );
}

/// One run finds every error of every file (issue 26): in one rule file a
/// bad regex, a misspelled key, `hits: -1`, an unknown algorithm, a
/// duplicate name (of a rule that has an error of its own), a ban below a
/// second and both errors of one `escalate_network`; in the main file an
/// unknown backend does not hide a bad network, a bare duration nor a
/// count that is no number. Each at its line and column.
#[test]
fn one_run_reports_every_error_of_every_file_with_its_position() {
    let rules = "rules:
  - name: one
    logs: [/x]
    match: { path: '(unclosed' }
    limit: { hits: 10, window: 60s }
  - name: two
    logs: [/x]
    match: { stauts: 404 }
    limit: { hits: 10, window: 60s }
  - name: three
    logs: [/x]
    limit: { hits: -1, window: 60s }
  - name: four
    logs: [/x]
    limit: { hits: 10, window: 60s, algorithm: sliding }
  - name: one
    logs: [/x]
    limit: { hits: 10, window: 60s }
  - name: six
    logs: [/x]
    limit:
      hits: 10
      window: 60s
    ban:
      duration: 500ms
  - name: seven
    logs: [/x]
    limit: { hits: 10, window: 60s }
    escalate_network: { ipv4_prefix: 32, bans: 1 }
";
    let main = "rules: [r.yaml]
firewall:
  backend: nftable
allow: [192.0.2.1, 10.0.0.0/33]
redis: { url: 'redis://127.0.0.1', timeout: 250 }
safety: { max_bans_per_minute: lots }
";
    let (code, _out, err, dir) = check(main, rules);
    assert_eq!(code, 2, "{err}");
    let at = |file: &str, pos: &str, words: &[&str]| {
        let prefix = format!("{}:{pos}: ", dir.path().join(file).display());
        let found = err
            .lines()
            .any(|l| l.starts_with(&prefix) && words.iter().all(|w| l.contains(w)));
        assert!(found, "no error at {file}:{pos} saying {words:?}:\n{err}");
    };
    at("fleetban.yaml", "3:12", &["nftable"]);
    at("fleetban.yaml", "4:20", &["10.0.0.0/33"]);
    at("fleetban.yaml", "5:45", &["250: add a unit, e.g. 250ms or 250s"]);
    at("fleetban.yaml", "6:32", &["invalid number `lots`"]);
    at("r.yaml", "4:20", &["regular expression"]);
    at("r.yaml", "8:14", &["unknown field `stauts`"]);
    at("r.yaml", "12:20", &["-1"]);
    at("r.yaml", "15:48", &["sliding"]);
    at("r.yaml", "16:11", &["duplicate rule name `one`"]);
    at("r.yaml", "25:7", &["below a second"]);
    at("r.yaml", "29:23", &["ipv4_prefix` is 32"]);
    at("r.yaml", "29:23", &["bans` is 1"]);
    at("r.yaml", "29:23", &["missing field `within`"]);
    at("r.yaml", "29:23", &["missing field `duration`"]);
    assert!(err.contains("14 error(s)"), "nothing else is reported:\n{err}");
}

/// A bare number where a duration is expected is an error with the hint,
/// in the configuration and on the command line; `0` is zero in any unit.
#[test]
fn a_duration_without_a_unit_is_an_error_with_a_hint() {
    let rule = "rules:\n  - name: a\n    logs: [/x]\n    limit: { hits: 1, window: 90 }\n";
    let (code, _out, err, dir) = check("rules: [r.yaml]\nredis: { url: 'redis://127.0.0.1', hold: 0 }\n", rule);
    assert_eq!(code, 2, "{err}");
    let want = format!(
        "{}:4:31: 90: add a unit, e.g. 90ms or 90s",
        dir.path().join("r.yaml").display()
    );
    assert!(err.lines().any(|l| l == want), "{want}\n{err}");
    assert_eq!(err.lines().filter(|l| l.contains("add a unit")).count(), 1, "{err}");

    let cfg = write(dir.path(), "r.yaml", GOOD_RULE);
    let cfg = cfg.with_file_name("fleetban.yaml");
    let out = cli(&cfg, &["ban", "192.0.2.7", "--for", "90"]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(
        out.stderr.contains("--for: 90: add a unit, e.g. 90ms or 90s"),
        "{}",
        out.text()
    );
}

/// `check` says every duration it derived: the Redis timeouts (defaults
/// too), a rule's scope, its repeat offenders' bounds and its
/// `escalate_network`.
#[test]
fn check_prints_every_duration_it_derived() {
    let rule = "rules:
  - name: a
    logs: [/x]
    limit: { hits: 5, window: 1m, scope: host }
    ban: { duration: 1h, escalate: { factor: 2, max: 1d, forget_after: 30d } }
    escalate_network: { bans: 3, within: 2h, duration: 12h }
";
    let (code, out, err, _d) = check(
        "rules: [r.yaml]\nredis: { url: 'redis://127.0.0.1', timeout: 300ms }\n",
        rule,
    );
    assert_eq!(code, 0, "{err}");
    assert!(out.contains("timeout 300ms, hold 1s, reconcile every 1m"), "{out}");
    assert!(out.contains("scope host"), "{out}");
    assert!(out.contains("at most 1d, offences forgotten after 30d"), "{out}");
    assert!(
        out.contains("escalate_network: 3 addresses of one /24 (IPv6 /56) banned within 2h ban the network for 12h"),
        "{out}"
    );
}
