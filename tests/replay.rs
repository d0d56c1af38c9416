//! `fleetban test` on the shared corpus (10,000 real lines, out-of-order
//! times): its `--json` decisions must be exactly the brute-force model's,
//! and the output must have the contract's shape.

mod common;

use common::model::{model, Algo, ModelHit, ModelRule};
use common::{cli, corpus_path, CliOutput, ConfigDir, MainConfig, Rule};
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
        assert_eq!(b["hits"], 21u64.min(if b["rule"] == "any" { 21 } else { 4 }));
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
    assert!(out.contains("lines: 10000  unparsed: 0"), "{out}");
    assert!(out.contains("rule notfound:"), "{out}");
    assert!(!out.contains("rule any:"), "{out}");
    let CliOutput { code, stderr: err, .. } = run_test(&default_rules(), &["--rule", "nosuch"]);
    assert_eq!(code, 2);
    assert!(err.contains("nosuch"));
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
