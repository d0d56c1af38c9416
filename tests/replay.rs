//! `fleetban test` on the shared corpus (10,000 real lines, out-of-order
//! times): its `--json` decisions must be exactly the brute-force model's,
//! and the output must have the contract's shape.

mod common;

use common::model::{model, Algo, ModelHit, ModelRule};
use common::{cli, combined_line, corpus_path, CliOutput, ConfigDir, MainConfig, Rule};
use fleetban::addr::{client_key, AddrText};
use fleetban::parse::{Format, Parser};

/// `fleetban test EXTRA... CORPUS` with `rules`.
fn run_test(rules: &[Rule], extra: &[&str]) -> CliOutput {
    let r = ConfigDir::new();
    r.write(&MainConfig::new(), rules);
    let corpus = corpus_path();
    let mut args = vec!["test"];
    args.extend(extra);
    args.push(corpus.to_str().expect("a UTF-8 corpus path"));
    cli(&r.cfg, &args)
}

/// The two rules replayed on the corpus: `any` counts every request, ban
/// 10 minutes; `notfound` the 404s, ban an hour; each with its `limit:`.
fn corpus_rules(any: &str, notfound: &str) -> [Rule; 2] {
    [
        Rule::new("any", "/unused", any).ban("10m"),
        Rule::new("notfound", "/unused", notfound)
            .matching("{ status: [404] }")
            .ban("1h"),
    ]
}

/// The sliding windows of the first two tests.
fn default_rules() -> [Rule; 2] {
    corpus_rules("{ hits: 20, window: 60s }", "{ hits: 3, window: 5m }")
}

#[test]
fn json_decisions_equal_the_brute_force_model_on_the_corpus() {
    let CliOutput {
        code,
        stdout: out,
        stderr: err,
    } = run_test(&default_rules(), &["--json"]);
    assert_eq!(code, 0, "{err}");

    // The model's input: every line of the corpus, in file order.
    let hits = corpus_hits();
    let rules = [
        ModelRule {
            limit: 20,
            window: 60_000,
            ban_ms: 600_000,
            algo: Algo::Sliding { prefilter: 0 },
        },
        ModelRule {
            limit: 3,
            window: 300_000,
            ban_ms: 3_600_000,
            algo: Algo::Sliding { prefilter: 0 },
        },
    ];
    let expected: Vec<(String, String, String)> = model(&hits, &rules)
        .into_iter()
        .map(|b| (b.key, ["any", "notfound"][b.rule].to_owned(), fleetban::rfc3339(b.at)))
        .collect();
    assert!(
        expected.len() >= 5,
        "the corpus should produce several bans, got {}",
        expected.len()
    );

    let lines: Vec<serde_json::Value> = out.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    let (summary, bans) = lines.split_last().unwrap();
    let got: Vec<(String, String, String)> = bans
        .iter()
        .map(|b| {
            assert_eq!(b["event"], "ban");
            (
                b["addr"].as_str().unwrap().into(),
                b["rule"].as_str().unwrap().into(),
                b["at"].as_str().unwrap().into(),
            )
        })
        .collect();
    assert_eq!(got, expected);
    for b in bans {
        // The count judged on, this hit included: at least the limit's
        // next; more when hits dated before it arrived after it (their
        // members count from its time on; docs/design.md §2).
        let least = if b["rule"] == "any" { 21 } else { 4 };
        assert!(b["hits"].as_u64().unwrap() >= least, "{b}");
        assert!(b["until"].as_str().unwrap() > b["at"].as_str().unwrap());
    }
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["lines"], 10_000);
    assert_eq!(summary["unparsed"], 0);
    let n404 = hits.iter().filter(|h| h.rule == 1).count() as u64;
    assert_eq!(summary["rules"]["notfound"]["matched"], n404);
    assert_eq!(summary["rules"]["any"]["matched"], 10_000);
    let any_bans = expected.iter().filter(|e| e.1 == "any").count() as u64;
    assert_eq!(summary["rules"]["any"]["bans"], any_bans);
}

#[test]
fn rule_selection_and_human_output() {
    let CliOutput {
        code,
        stdout: out,
        stderr: err,
    } = run_test(&default_rules(), &["--rule", "notfound"]);
    assert_eq!(code, 0, "{err}");
    // The summary last; the rules table names the selected rule only.
    let last = out.lines().last().unwrap();
    assert!(last.starts_with("lines: 10000  unparsed: 0  bans: "), "{out}");
    let rows: Vec<Vec<&str>> = out.lines().map(|l| l.split_whitespace().collect()).collect();
    let header = rows
        .iter()
        .position(|r| r[..] == ["RULE", "LINES", "UNPARSED", "MATCHED", "BANS"])
        .unwrap_or_else(|| panic!("no rules table in\n{out}"));
    assert_eq!(rows[header + 1][..3], ["notfound", "10000", "0"], "{out}");
    assert!(rows[header + 2].is_empty(), "one rule only:\n{out}");
    assert!(!out.lines().any(|l| l.starts_with("any ")), "{out}");
    let CliOutput { code, stderr: err, .. } = run_test(&default_rules(), &["--rule", "nosuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("nosuch") && err.contains("any, notfound"), "{err}");
}

#[test]
fn an_injected_address_is_never_banned() {
    // A client whose user agent and path carry another address: only the
    // real client may be banned.
    let r = ConfigDir::new();
    let mut text = String::new();
    for s in 0..30 {
        text += &format!(
            "198.51.100.9 - - [17/May/2015:10:05:{s:02} +0000] \"GET /?x=6.6.6.6 HTTP/1.1\" 200 1 \"http://7.7.7.7/\" \"6.6.6.6 - - [17/May/2015:10:05:00 +0000] \\x22GET / HTTP/1.1\\x22\"\n"
        );
    }
    std::fs::write(&r.log, text).unwrap();
    r.write(
        &MainConfig::new(),
        &[Rule::new("any", "/unused", "{ hits: 5, window: 60s }")],
    );
    let out = cli(&r.cfg, &["test", "--json", r.log.to_str().expect("a UTF-8 temp path")]).stdout;
    assert!(out.contains("\"addr\":\"198.51.100.9\""), "{out}");
    assert!(!out.contains("6.6.6.6") && !out.contains("7.7.7.7"), "{out}");
}

/// Every line of the corpus as model hits: rule 0 counts every request, rule
/// 1 the 404s.
fn corpus_hits() -> Vec<ModelHit> {
    let text = std::fs::read(corpus_path()).unwrap();
    let parser = Parser::new(&Format::Combined).unwrap();
    let mut hits = Vec::new();
    for (n, line) in text.split(|&b| b == b'\n').filter(|l| !l.is_empty()).enumerate() {
        let r = parser.parse(line).expect("the corpus parses");
        let key = AddrText(&client_key(r.addr, 64)).to_string();
        let time = r.time_ms.unwrap();
        hits.push(ModelHit {
            rule: 0,
            key: key.clone(),
            time,
            member: n as u64,
            origin: 0,
            offset: n as u64,
        });
        if r.status == 404 {
            hits.push(ModelHit {
                rule: 1,
                key,
                time,
                member: n as u64,
                origin: 0,
                offset: n as u64,
            });
        }
    }
    hits
}

/// `fleetban test` with each algorithm on the corpus (out-of-order times,
/// bursts, idle clients): its decisions are the brute-force model's.
#[test]
fn every_algorithm_replays_as_its_model_on_the_corpus() {
    let hits = corpus_hits();
    let cases: [(&str, &str, ModelRule, ModelRule); 4] = [
        (
            "{ hits: 20, window: 60s, algorithm: fixed_window }",
            "{ hits: 3, window: 5m, algorithm: fixed_window }",
            ModelRule {
                limit: 20,
                window: 60_000,
                ban_ms: 600_000,
                algo: Algo::Fixed,
            },
            ModelRule {
                limit: 3,
                window: 300_000,
                ban_ms: 3_600_000,
                algo: Algo::Fixed,
            },
        ),
        (
            "{ algorithm: token_bucket, burst: 20, rate: 1/s }",
            "{ algorithm: token_bucket, burst: 3, rate: 1/m }",
            ModelRule {
                limit: 20,
                window: 0,
                ban_ms: 600_000,
                algo: Algo::Bucket { interval_us: 1_000_000 },
            },
            ModelRule {
                limit: 3,
                window: 0,
                ban_ms: 3_600_000,
                algo: Algo::Bucket {
                    interval_us: 60_000_000,
                },
            },
        ),
        (
            "{ hits: 20, window: 60s, algorithm: sliding_counter }",
            "{ hits: 3, window: 5m, algorithm: sliding_counter }",
            ModelRule {
                limit: 20,
                window: 60_000,
                ban_ms: 600_000,
                algo: Algo::Counter,
            },
            ModelRule {
                limit: 3,
                window: 300_000,
                ban_ms: 3_600_000,
                algo: Algo::Counter,
            },
        ),
        (
            "{ hits: 20, window: 60s, prefilter: 0.5 }",
            "{ hits: 3, window: 5m, prefilter: 0.7 }",
            ModelRule {
                limit: 20,
                window: 60_000,
                ban_ms: 600_000,
                algo: Algo::Sliding { prefilter: 10 },
            },
            ModelRule {
                limit: 3,
                window: 300_000,
                ban_ms: 3_600_000,
                algo: Algo::Sliding { prefilter: 2 },
            },
        ),
    ];
    for (any, notfound, r0, r1) in cases {
        let CliOutput {
            code,
            stdout: out,
            stderr: err,
        } = run_test(&corpus_rules(any, notfound), &["--json"]);
        assert_eq!(code, 0, "{any}: {err}");
        // The model's windows: the bucket's `window` is unused, but must not be 0.
        let fix = |r: ModelRule| ModelRule {
            window: r.window.max(1),
            ..r
        };
        let expected: Vec<(String, String, String)> = model(&hits, &[fix(r0), fix(r1)])
            .into_iter()
            .map(|b| (b.key, ["any", "notfound"][b.rule].to_owned(), fleetban::rfc3339(b.at)))
            .collect();
        assert!(expected.len() >= 5, "{any}: only {} bans", expected.len());
        let got: Vec<(String, String, String)> = out
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|b| b["event"] == "ban")
            .map(|b| {
                (
                    b["addr"].as_str().unwrap().into(),
                    b["rule"].as_str().unwrap().into(),
                    b["at"].as_str().unwrap().into(),
                )
            })
            .collect();
        assert_eq!(got, expected, "{any}");
    }
}

/// Time out of order in `fleetban test` (docs/design.md §2): a log whose
/// clock goes back an hour (its second hour repeats the first one's times)
/// does not ban a client making 2 requests a minute under the sliding
/// window, token bucket or sliding counter allowing 3 a minute (nor a rule
/// on `clock: redis`, which `test` counts at log time), nor do three lines dated an hour ahead ban a client
/// whose next requests are each more than a window apart; a scraper in the
/// same log is banned by every rule (each replayed alone).
#[test]
fn a_log_whose_clock_goes_back_or_ahead_bans_only_the_scraper() {
    let r = ConfigDir::new();
    let t0 = 1_700_000_000_000i64;
    let mut lines: Vec<String> = Vec::new();
    for hour in 0..2 {
        for k in 0..120 {
            let t = t0 + k * 30_000 + hour;
            lines.push(combined_line("203.0.113.9", t, "/page", 200));
            if hour == 1 && k == 60 {
                // Three lines an hour ahead, then requests 6 s apart.
                for j in 0..3 {
                    lines.push(combined_line("203.0.113.10", t + 3_600_000 + j, "/next", 200));
                }
                for j in 0..10 {
                    lines.push(combined_line("203.0.113.10", t + 1_000 + j * 6_000, "/next", 200));
                }
                // A scraper: 40 requests in 4 s.
                for j in 0..40 {
                    lines.push(combined_line("198.51.100.7", t + j * 100, "/", 200));
                }
            }
        }
    }
    std::fs::write(&r.log, lines.concat()).unwrap();
    // Not fixed windows, nor the prefilter's first tier: they count per
    // window number, and `test` keeps the windows of the first hour
    // (docs/design.md §2).
    let minute = [
        ("sliding", "{ hits: 30, window: 10m }"),
        ("bucket", "{ algorithm: token_bucket, burst: 30, rate: 3/m }"),
        ("counter", "{ hits: 30, window: 10m, algorithm: sliding_counter }"),
        ("redis_clock", "{ hits: 30, window: 10m, clock: redis }"),
    ];
    let mut rules: Vec<Rule> = minute
        .iter()
        .map(|(name, limit)| Rule::new(name, "/unused", limit).matching("{ path: '^/(page)?$' }"))
        .collect();
    rules.push(Rule::new("ahead", "/unused", "{ hits: 3, window: 5s }").matching("{ path: '^/next$' }"));
    r.write(&MainConfig::new(), &rules);
    // One rule at a time: a client banned by one rule is not counted by the
    // others.
    for (name, _) in minute.iter().chain([&("ahead", "")]) {
        let out = cli(
            &r.cfg,
            &[
                "test",
                "--json",
                "--rule",
                name,
                r.log.to_str().expect("a UTF-8 temp path"),
            ],
        );
        assert_eq!(out.code, 0, "{name}: {}", out.text());
        let banned: Vec<String> = out
            .stdout
            .lines()
            .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
            .filter(|v| v["event"] == "ban")
            .map(|v| v["addr"].as_str().unwrap_or_default().to_owned())
            .collect();
        let scraper = if *name == "ahead" {
            vec![]
        } else {
            vec!["198.51.100.7".to_owned()]
        };
        assert_eq!(banned, scraper, "{name}: {}", out.stdout);
    }
}

/// Issue 14, item 11: `test` skips lines longer than 64 KiB as `run` does
/// (and says how many): five ordinary requests and five with a 70 KiB user
/// agent stay under a limit of 5, where counting the long ones banned.
#[test]
fn lines_longer_than_64_kib_are_skipped_as_run_skips_them() {
    let r = ConfigDir::new();
    let t0 = 1_700_000_000_000i64;
    let long_ua = "x".repeat(70 << 10);
    let mut text = String::new();
    for i in 0..10 {
        let line = combined_line("203.0.113.77", t0 + i * 1000, "/", 200);
        text += &if i % 2 == 0 {
            line
        } else {
            line.replace("curl/7.88", &long_ua)
        };
    }
    std::fs::write(&r.log, text).unwrap();
    r.write(
        &MainConfig::new(),
        &[Rule::new("any", "/unused", "{ hits: 5, window: 60s }")],
    );
    let log = r.log.to_str().expect("a UTF-8 temp path");
    let out = cli(&r.cfg, &["test", "--json", log]);
    assert_eq!(out.code, 0, "{}", out.text());
    let last: serde_json::Value = serde_json::from_str(out.stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["event"], "summary", "{}", out.stdout);
    assert_eq!(last["lines"], 5, "{}", out.stdout);
    assert_eq!(last["skipped_long"], 5, "{}", out.stdout);
    assert_eq!(last["rules"]["any"]["bans"], 0, "{}", out.stdout);
    let human = cli(&r.cfg, &["test", log]).stdout;
    assert!(
        human.contains("longer than 64 KiB (skipped, as run does): 5"),
        "{human}"
    );
}
