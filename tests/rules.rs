//! The shipped rules (`rules/*.yaml`) against their annotated samples
//! (`rules/samples/RULE.log`, format in `rules/README.md`): every rule has
//! samples with at least one hit and one miss, and every sample line is
//! decided exactly as annotated — parsed or not, a hit or not, and for which
//! client key. Uses the library the daemon uses: config loading, `Parser`,
//! `RuleFilter`, `NeverBanned`, `client_key`.

mod common;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use fleetban::addr::client_key;
use fleetban::config::Config;
use fleetban::detect::RuleFilter;
use fleetban::parse::Parser;
use fleetban::verdict::NeverBanned;

use common::{rules_yaml, MainConfig, Rule};

/// What an annotation says about the line after it.
#[derive(Debug, PartialEq)]
enum Expect {
    Hit(String),
    Miss,
    Unparsed,
}

/// One annotated sample line with its line number in the sample file.
struct Sample {
    line_no: usize,
    expect: Expect,
    text: String,
}

fn repo() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
}

/// Reads a sample file; annotation errors are returned as messages.
fn read_samples(path: &Path) -> Result<Vec<Sample>, String> {
    let text = std::fs::read_to_string(path).map_err(|e| format!("{}: {e}", path.display()))?;
    let mut out = Vec::new();
    let mut pending: Option<(usize, Expect)> = None;
    for (i, line) in text.lines().enumerate() {
        let n = i + 1;
        if let Some(ann) = line.strip_prefix("#>") {
            if let Some((at, _)) = &pending {
                return Err(format!("{}:{at}: annotation without a sample line", path.display()));
            }
            let mut words = ann.split_whitespace();
            let expect = match words.next() {
                Some("hit") => match words.next() {
                    Some(key) => Expect::Hit(key.to_string()),
                    None => return Err(format!("{}:{n}: `hit` needs the client key", path.display())),
                },
                Some("miss") => Expect::Miss,
                Some("unparsed") => Expect::Unparsed,
                other => return Err(format!("{}:{n}: unknown annotation {other:?}", path.display())),
            };
            pending = Some((n, expect));
        } else if line.starts_with('#') || line.trim().is_empty() {
            continue;
        } else {
            match pending.take() {
                Some((_, expect)) => out.push(Sample {
                    line_no: n,
                    expect,
                    text: line.to_string(),
                }),
                None => return Err(format!("{}:{n}: sample line without an annotation", path.display())),
            }
        }
    }
    if let Some((at, _)) = pending {
        return Err(format!("{}:{at}: annotation without a sample line", path.display()));
    }
    Ok(out)
}

/// The shipped rule files, sorted.
fn rule_files() -> Vec<PathBuf> {
    let mut files: Vec<PathBuf> = std::fs::read_dir(repo().join("rules"))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.extension().is_some_and(|x| x == "yaml"))
        .collect();
    files.sort();
    files
}

fn load(files: &[PathBuf]) -> Config {
    let dir = tempfile::tempdir().unwrap();
    let main = dir.path().join("fleetban.yaml");
    MainConfig::new().rule_files(files).write(&main);
    Config::load(&main).unwrap_or_else(|e| panic!("shipped rules do not load:\n{e}"))
}

/// What the daemon decides for one line under one rule.
fn decide(parser: &Parser, filter: &RuleFilter, never: &NeverBanned, v6: u8, line: &str) -> Expect {
    let mut scratch = Vec::new();
    let Some(req) = parser.parse_in(line.as_bytes(), &mut scratch) else {
        return Expect::Unparsed;
    };
    if never.contains(req.addr) || !filter.accepts(&req) {
        return Expect::Miss;
    }
    Expect::Hit(client_key(req.addr, v6).to_string())
}

/// Sample keys are written as an address (`/32`, `/128` implied) or a prefix.
fn canonical(key: &str) -> String {
    if key.contains('/') {
        key.to_string()
    } else if key.contains(':') {
        format!("{key}/128")
    } else {
        format!("{key}/32")
    }
}

fn check_rules(files: &[PathBuf], samples_dir: &Path) -> Vec<String> {
    let config = load(files);
    // Loopback and the private networks of the shipped config/fleetban.yaml.
    let allow = NeverBanned::only(
        &[
            "127.0.0.0/8",
            "::1/128",
            "10.0.0.0/8",
            "172.16.0.0/12",
            "192.168.0.0/16",
        ]
        .map(|n| n.parse().unwrap()),
    );
    let mut problems = Vec::new();
    for rule in &config.rules {
        let path = samples_dir.join(format!("{}.log", rule.name));
        if !path.exists() {
            problems.push(format!(
                "rule {} has no samples: {} is missing",
                rule.name,
                path.display()
            ));
            continue;
        }
        let samples = match read_samples(&path) {
            Ok(s) => s,
            Err(e) => {
                problems.push(e);
                continue;
            }
        };
        if !samples.iter().any(|s| matches!(s.expect, Expect::Hit(_)))
            || !samples.iter().any(|s| s.expect == Expect::Miss)
        {
            problems.push(format!(
                "rule {}: samples need at least one hit and one miss",
                rule.name
            ));
        }
        let parser = Parser::new(&rule.format).unwrap();
        let filter = RuleFilter::new(&rule.matches, &rule.ignore);
        for s in &samples {
            let got = decide(&parser, &filter, &allow, config.ipv6_prefix, &s.text);
            let want = match &s.expect {
                Expect::Hit(k) => Expect::Hit(canonical(k)),
                Expect::Miss => Expect::Miss,
                Expect::Unparsed => Expect::Unparsed,
            };
            if got != want {
                problems.push(format!(
                    "{}:{}: rule {}: annotated {:?}, decided {:?}",
                    path.display(),
                    s.line_no,
                    rule.name,
                    want,
                    got
                ));
            }
        }
    }
    problems
}

#[test]
fn every_shipped_rule_agrees_with_its_annotated_samples() {
    let files = rule_files();
    assert!(files.len() >= 8, "expected the eight shipped rules, found {files:?}");
    let problems = check_rules(&files, &repo().join("rules/samples"));
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn every_sample_file_belongs_to_a_shipped_rule() {
    let config = load(&rule_files());
    let names: BTreeSet<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    for e in std::fs::read_dir(repo().join("rules/samples")).unwrap() {
        let p = e.unwrap().path();
        let stem = p.file_stem().unwrap().to_string_lossy().into_owned();
        assert!(names.contains(&stem), "{} names no shipped rule", p.display());
    }
}

/// The check itself must be able to fail: a missing sample file, a wrong
/// annotation and a dangling annotation are each reported.
#[test]
fn the_check_reports_missing_and_wrong_samples() {
    let dir = tempfile::tempdir().unwrap();
    let rule = dir.path().join("r.yaml");
    let r = Rule::new("r", "/x", "{ hits: 1, window: 1s }")
        .matching("{ status: [404] }")
        .ban("1m");
    std::fs::write(&rule, rules_yaml(&[r])).unwrap();
    let samples = dir.path().join("samples");
    std::fs::create_dir(&samples).unwrap();
    let problems = check_rules(std::slice::from_ref(&rule), &samples);
    assert!(problems.iter().any(|p| p.contains("has no samples")), "{problems:?}");

    let line =
        |status: u16| format!("203.0.113.9 - - [30/Nov/2026:10:00:01 +0000] \"GET / HTTP/1.1\" {status} 1 \"-\" \"x\"");
    std::fs::write(
        samples.join("r.log"),
        format!(
            "#> hit 203.0.113.9\n{}\n#> miss\n{}\n#> hit 203.0.113.8\n{}\n",
            line(404),
            line(200),
            line(404)
        ),
    )
    .unwrap();
    let problems = check_rules(std::slice::from_ref(&rule), &samples);
    assert_eq!(problems.len(), 1, "{problems:?}");
    assert!(problems[0].contains("r.log:6"), "{problems:?}");

    std::fs::write(samples.join("r.log"), format!("#> miss\n#> miss\n{}\n", line(200))).unwrap();
    let problems = check_rules(std::slice::from_ref(&rule), &samples);
    assert!(
        problems.iter().any(|p| p.contains("annotation without a sample")),
        "{problems:?}"
    );
}

/// `nginx-first-hit` and `nginx-first-hit-target` (`hits: 0`, one file)
/// through `fleetban test`, each on its own samples: each prober is banned
/// at its first request, and no other client.
#[test]
fn the_first_hit_rule_bans_every_prober_at_its_first_request() {
    for (rule, probers) in [("nginx-first-hit", 13), ("nginx-first-hit-target", 4)] {
        let files = common::ConfigDir::new();
        let samples = repo().join(format!("rules/samples/{rule}.log"));
        let text = std::fs::read_to_string(&samples).unwrap();
        std::fs::copy(&samples, &files.log).unwrap();
        let yaml = std::fs::read_to_string(repo().join("rules/nginx-first-hit.yaml"))
            .unwrap()
            .replace("/var/log/nginx/access.log", files.log.to_str().unwrap());
        std::fs::write(files.path().join("first-hit.yaml"), yaml).unwrap();
        files
            .main_config()
            .log_firewall()
            .rule_files(&[files.path().join("first-hit.yaml")])
            .write(&files.cfg);
        let out = common::cli(
            &files.cfg,
            &["test", "--json", "--rule", rule, files.log.to_str().unwrap()],
        );
        assert!(out.success(), "{out:?}");
        let bans: Vec<(String, u64)> = out
            .test_bans()
            .iter()
            .map(|b| (b["addr"].as_str().unwrap().to_owned(), b["line"].as_u64().unwrap()))
            .collect();
        // Each prober's first hit in the file (1-based, comments included).
        let mut first: Vec<(String, u64)> = Vec::new();
        let mut hit = false;
        for (n, line) in text.lines().enumerate() {
            if line.starts_with('#') {
                hit = line.starts_with("#> hit") || (hit && !line.starts_with("#>"));
                continue;
            }
            let addr = line.split(' ').next().unwrap_or("");
            if hit && !first.iter().any(|(a, _)| a == addr) {
                first.push((addr.to_owned(), n as u64 + 1));
            }
            hit = false;
        }
        assert_eq!(first.len(), probers, "{rule}: {first:?}");
        assert_eq!(bans, first, "{rule}: {}", out.stdout);
    }
}
