//! Nothing silent about lines a rule cannot parse: a rule whose format
//! fits none of its log's lines shows with its own `unparsed` count (and
//! `lines` read) in `fleetban test` (human and `--json`, with a warning),
//! in `status --json` and in Prometheus, whatever the other rules reading
//! the same log parse.

mod common;

use common::metrics::{http_get, sample};

use std::path::Path;
use std::time::Duration;

use common::{append, cli, combined_line, combined_lines, corpus_path, wait_until, ConfigDir, Daemon, Rule};

/// nginx-limit-req's format: `combined` plus `$limit_req_status`, which a
/// plain combined line lacks.
const LIMIT_REQ_FORMAT: &str = r#"{ log_format: '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" $limit_req_status' }"#;

/// A config reading every shipped rule (`rules/*.yaml`).
fn shipped_rules_config(dir: &Path) -> std::path::PathBuf {
    let cfg = dir.join("fleetban.yaml");
    let rules = Path::new(env!("CARGO_MANIFEST_DIR")).join("rules/*.yaml");
    std::fs::write(
        &cfg,
        format!(
            "state_dir: {}\ncontrol: {}\nrules: ['{}']\n",
            dir.join("state").display(),
            dir.join("control.sock").display(),
            rules.display()
        ),
    )
    .unwrap();
    cfg
}

/// The corpus (10,000 combined lines) with every shipped rule: the summary's
/// `unparsed` (lines no rule could parse) is 0, and nginx-limit-req's own
/// count is every line it read, with a warning saying so (and so for
/// the error-log rules, which read it too: no rule's `logs:` names it).
#[test]
fn a_rule_that_parses_none_of_the_corpus_is_named_with_its_count() {
    let dir = tempfile::tempdir().unwrap();
    let cfg = shipped_rules_config(dir.path());
    let corpus = corpus_path();
    let corpus = corpus.to_str().unwrap();

    let out = cli(&cfg, &["test", "--json", corpus]);
    assert_eq!(out.code, 0, "{}", out.text());
    let summary: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["lines"], 10_000);
    assert_eq!(summary["unparsed"], 0, "another rule parses every line");
    let limit_req = &summary["rules"]["nginx-limit-req"];
    assert_eq!(limit_req["lines"], 10_000, "{summary}");
    assert_eq!(limit_req["unparsed"], 10_000, "{summary}");
    let scraper = &summary["rules"]["nginx-scraper"];
    assert_eq!(scraper["lines"], 10_000, "{summary}");
    assert_eq!(scraper["unparsed"], 0, "{summary}");
    let warnings: Vec<&str> = summary["warnings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|w| w.as_str().unwrap())
        .collect();
    // The corpus is an access log no rule's `logs:` names, so every rule
    // reads it: the three whose format is another (the `$limit_req_status`
    // log_format, nginx's error log twice) are each named, and no other.
    let mut none: Vec<&str> = warnings
        .iter()
        .filter(|w| w.contains("parsed none"))
        .map(|w| w.split(' ').nth(1).unwrap_or_default())
        .collect();
    none.sort_unstable();
    assert_eq!(
        none,
        ["nginx-http-auth", "nginx-limit-req", "nginx-limit-req-error"],
        "{warnings:?}"
    );
    assert!(
        warnings
            .iter()
            .any(|w| w.starts_with("rule nginx-limit-req read 10000 line(s) and parsed none of them")),
        "{warnings:?}"
    );

    let human = cli(&cfg, &["test", corpus]);
    assert_eq!(human.code, 0, "{}", human.text());
    let row = human
        .stdout
        .lines()
        .find(|l| l.starts_with("nginx-limit-req "))
        .unwrap_or_else(|| panic!("no row for nginx-limit-req:\n{}", human.stdout));
    let cells: Vec<&str> = row.split_whitespace().collect();
    // RULE LINES UNPARSED MATCHED BANS
    assert_eq!(cells, ["nginx-limit-req", "10000", "10000", "0", "0"], "{row}");
    assert!(
        human
            .stdout
            .contains("warning: rule nginx-limit-req read 10000 line(s) and parsed none of them"),
        "{}",
        human.stdout
    );
    assert!(
        human
            .stdout
            .lines()
            .last()
            .unwrap()
            .starts_with("lines: 10000  unparsed: 0"),
        "{}",
        human.stdout
    );
}
/// The daemon: two rules on one log, one of them with a format that fits
/// none of its lines; `status --json` and the metrics carry each rule's
/// lines and unparsed counts.
#[test]
fn status_and_metrics_count_unparsed_lines_per_rule() {
    let r = ConfigDir::new();
    let addr = format!("127.0.0.1:{}", common::free_port());
    r.write(
        &r.main_config().log_firewall().metrics(&addr),
        &[
            Rule::new("plain", &r.log, "{ hits: 1000, window: 60s }"),
            Rule::new("limit-req", &r.log, "{ hits: 1000, window: 60s }").format(LIMIT_REQ_FORMAT),
        ],
    );
    let d = Daemon::start(None, &r.cfg, &r.control);
    // The daemon starts a new log at its end: lines appended after it runs.
    append(
        &r.log,
        &(combined_lines("203.0.113.5", 7, "/", 200) + "not a request\n"),
    );
    d.wait_lines(8);
    let st = d.status();
    let rule = |name: &str| {
        st["rules"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["name"] == name)
            .cloned()
            .unwrap_or_else(|| panic!("no rule {name} in {st}"))
    };
    assert_eq!(st["unparsed"], 1, "{st}");
    assert_eq!(rule("plain")["lines"], 8, "{st}");
    assert_eq!(rule("plain")["unparsed"], 1, "{st}");
    assert_eq!(rule("limit-req")["lines"], 8, "{st}");
    assert_eq!(rule("limit-req")["unparsed"], 8, "{st}");

    let mut resp = String::new();
    wait_until(Duration::from_secs(10), "the metrics endpoint", || {
        resp = http_get(&addr, "/metrics");
        resp.starts_with("HTTP/1.0 200")
    });
    assert_eq!(sample(&resp, "fleetban_unparsed_total"), Some(1.0), "{resp}");
    assert_eq!(
        sample(&resp, "fleetban_rule_unparsed_total{rule=\"limit-req\"}"),
        Some(8.0),
        "{resp}"
    );
    assert_eq!(
        sample(&resp, "fleetban_rule_unparsed_total{rule=\"plain\"}"),
        Some(1.0),
        "{resp}"
    );
    assert_eq!(
        sample(&resp, "fleetban_rule_lines_total{rule=\"limit-req\"}"),
        Some(8.0),
        "{resp}"
    );
}

/// `test` on one file with the same two rules: the counts are per rule,
/// and only the rule that parses nothing is warned about.
#[test]
fn test_counts_unparsed_lines_per_rule() {
    let r = ConfigDir::new();
    let t0 = 1_700_000_000_000;
    let text: String = (0..5).map(|i| combined_line("203.0.113.5", t0 + i, "/", 200)).collect();
    std::fs::write(&r.log, text + "garbage\n").unwrap();
    r.write(
        &r.main_config(),
        &[
            Rule::new("plain", &r.log, "{ hits: 1000, window: 60s }"),
            Rule::new("limit-req", &r.log, "{ hits: 1000, window: 60s }").format(LIMIT_REQ_FORMAT),
        ],
    );
    let out = cli(&r.cfg, &["test", "--json", r.log.to_str().unwrap()]);
    assert_eq!(out.code, 0, "{}", out.text());
    let s: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(s["unparsed"], 1, "{s}");
    assert_eq!(s["rules"]["plain"]["lines"], 6, "{s}");
    assert_eq!(s["rules"]["plain"]["unparsed"], 1, "{s}");
    assert_eq!(s["rules"]["limit-req"]["unparsed"], 6, "{s}");
    let warnings = s["warnings"].as_array().unwrap();
    assert_eq!(warnings.len(), 1, "{s}");
    assert!(
        warnings[0]
            .as_str()
            .unwrap()
            .starts_with("rule limit-req read 6 line(s)"),
        "{s}"
    );
}
