//! What `fleetban test` reads (docs/design.md §6, "What `test` reads"):
//! each rule its own logs, rotated siblings and directories in the order
//! they were written, gzip by its bytes, `-` for standard input, errors
//! naming the file, `--rule` repeated. What it prints: tests/replay_output.rs.

mod common;

use std::io::Write;
use std::path::Path;
use std::process::{Command, Stdio};

use common::replay::{at, json_lines, s, summary, write_gz, LIMIT_REQ_FORMAT, T0};
use common::{cli, fleetban_bin, ConfigDir, Rule};

/// A directory of rotated logs, two of them gzip: read oldest first
/// (access.log.3.gz, .2.gz, .1, then access.log), as the ban's place and
/// time show: client .1's sixth request within a minute spans two files;
/// read newest first, its requests would go back in time and not ban there.
#[test]
fn a_directory_of_rotated_gzip_logs_is_read_in_the_order_it_was_written() {
    let r = ConfigDir::with_log("logs/access.log");
    let dir = r.log.parent().unwrap().to_path_buf();
    let a = "203.0.113.1";
    write_gz(
        &dir.join("access.log.3.gz"),
        &[at("198.51.100.9", 0), at(a, 1), at(a, 2), at(a, 3)].concat(),
    );
    write_gz(
        &dir.join("access.log.2.gz"),
        &[at(a, 10), at(a, 11), at(a, 12), at("198.51.100.9", 13)].concat(),
    );
    std::fs::write(
        dir.join("access.log.1"),
        [at("198.51.100.8", 20), "not a request\n".into()].concat(),
    )
    .unwrap();
    std::fs::write(&r.log, [at(a, 700), at("198.51.100.8", 701)].concat()).unwrap();
    r.write(
        &r.main_config(),
        &[
            Rule::new("any", &r.log, "{ hits: 5, window: 60s }").ban("10m"),
            Rule::new("limit-req", &r.log, "{ hits: 5, window: 60s }").format(LIMIT_REQ_FORMAT),
        ],
    );
    let out = cli(&r.cfg, &["test", "--json", s(&dir)]);
    assert_eq!(out.code, 0, "{}", out.text());
    let lines = json_lines(&out);
    let bans: Vec<&serde_json::Value> = lines.iter().filter(|l| l["event"] == "ban").collect();
    assert_eq!(bans.len(), 1, "{}", out.stdout);
    assert_eq!(bans[0]["addr"], a);
    assert_eq!(bans[0]["rule"], "any");
    assert_eq!(bans[0]["file"], s(&dir.join("access.log.2.gz")));
    assert_eq!(bans[0]["line"], 3, "line 3 of the decompressed file");
    assert_eq!(bans[0]["at"], fleetban::rfc3339(T0 + 12_000));
    assert_eq!(bans[0]["hits"], 6);

    let sum = summary(&out);
    let files: Vec<(String, bool, u64)> = sum["files"]
        .as_array()
        .unwrap()
        .iter()
        .map(|f| {
            assert_eq!(f["rules"], serde_json::json!(["any", "limit-req"]), "{f}");
            assert_eq!(f["named"], true, "a rotated sibling of the rules' log: {f}");
            let name = Path::new(f["file"].as_str().unwrap()).file_name().unwrap();
            (
                name.to_string_lossy().into_owned(),
                f["gzip"] == true,
                f["lines"].as_u64().unwrap(),
            )
        })
        .collect();
    let want = [
        ("access.log.3.gz", true, 4),
        ("access.log.2.gz", true, 4),
        ("access.log.1", false, 2),
        ("access.log", false, 2),
    ];
    let want: Vec<(String, bool, u64)> = want.iter().map(|(n, g, l)| (n.to_string(), *g, *l)).collect();
    assert_eq!(files, want);
    assert_eq!(sum["lines"], 12);
    assert_eq!(sum["unparsed"], 1);
    assert_eq!(sum["rules"]["any"]["lines"], 12);
    assert_eq!(sum["rules"]["any"]["unparsed"], 1);
    assert_eq!(sum["rules"]["any"]["matched"], 11);
    assert_eq!(sum["rules"]["limit-req"]["unparsed"], 12);

    // The same files given newest first, as a shell's `access.log*` lists
    // them: read in that order, a's requests go back in time and ban no one.
    let mut names: Vec<String> = ["access.log", "access.log.1", "access.log.2.gz", "access.log.3.gz"]
        .iter()
        .map(|n| s(&dir.join(n)).to_owned())
        .collect();
    names.insert(0, "--json".into());
    names.insert(0, "test".into());
    let args: Vec<&str> = names.iter().map(String::as_str).collect();
    let newest_first = cli(&r.cfg, &args);
    assert_eq!(newest_first.code, 0, "{}", newest_first.text());
    assert!(
        json_lines(&newest_first).iter().all(|l| l["event"] != "ban"),
        "{}",
        newest_first.stdout
    );

    let human = cli(&r.cfg, &["test", s(&dir)]).stdout;
    assert!(human.contains("access.log.3.gz (gzip)"), "{human}");
    assert!(
        human.contains(&format!("{}:3", dir.join("access.log.2.gz").display())),
        "{human}"
    );
    assert!(
        human.contains("warning: rule limit-req read 12 line(s) and parsed none"),
        "{human}"
    );
}

/// Each rule reads the files its `logs:` name; a file no rule names is
/// read by every rule (said once); no file: the rules' own logs, a missing
/// one named in a warning.
#[test]
fn each_rule_reads_only_the_files_its_logs_name() {
    let r = ConfigDir::new();
    let (a_log, b_log, other) = (
        r.path().join("a.log"),
        r.path().join("b.log"),
        r.path().join("other.log"),
    );
    std::fs::write(&a_log, [at("203.0.113.1", 0), at("203.0.113.1", 1)].concat()).unwrap();
    std::fs::write(&b_log, at("203.0.113.2", 0)).unwrap();
    std::fs::write(r.path().join("a.log.1"), at("203.0.113.3", 0)).unwrap();
    std::fs::write(&other, at("203.0.113.4", 0)).unwrap();
    let missing = r.path().join("missing.log");
    let rules = [
        Rule::new("a", &a_log, "{ hits: 5, window: 60s }"),
        Rule::new("b", &b_log, "{ hits: 5, window: 60s }"),
        Rule::new("c", &missing, "{ hits: 5, window: 60s }"),
    ];
    r.write(&r.main_config(), &rules);
    let read_by = |sum: &serde_json::Value| -> Vec<(String, Vec<String>, bool)> {
        sum["files"]
            .as_array()
            .unwrap()
            .iter()
            .map(|f| {
                let name = Path::new(f["file"].as_str().unwrap()).file_name().unwrap();
                let rules = f["rules"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|r| r.as_str().unwrap().to_owned());
                (name.to_string_lossy().into_owned(), rules.collect(), f["named"] == true)
            })
            .collect()
    };
    let own = |n: &str, rules: &[&str], named: bool| {
        (
            n.to_owned(),
            rules.iter().map(|r| r.to_string()).collect::<Vec<_>>(),
            named,
        )
    };

    let given = cli(
        &r.cfg,
        &[
            "test",
            "--json",
            s(&a_log),
            s(&b_log),
            s(&r.path().join("a.log.1")),
            s(&other),
        ],
    );
    assert_eq!(given.code, 0, "{}", given.text());
    let sum = summary(&given);
    assert_eq!(
        read_by(&sum),
        [
            own("a.log", &["a"], true),
            own("b.log", &["b"], true),
            own("a.log.1", &["a"], true),
            own("other.log", &["a", "b", "c"], false),
        ]
    );
    assert_eq!(sum["rules"]["a"]["lines"], 4);
    assert_eq!(sum["rules"]["b"]["lines"], 2);
    assert_eq!(sum["rules"]["c"]["lines"], 1);
    let human = cli(&r.cfg, &["test", s(&a_log), s(&other)]).stdout;
    let notes: Vec<&str> = human.lines().filter(|l| l.starts_with("note:")).collect();
    assert_eq!(
        notes,
        [format!(
            "note: no rule's logs: name {}: read by every selected rule",
            other.display()
        )],
        "{human}"
    );

    // No file: each rule its own log; c's is missing, and said so.
    let own_logs = cli(&r.cfg, &["test", "--json"]);
    assert_eq!(own_logs.code, 0, "{}", own_logs.text());
    let sum = summary(&own_logs);
    assert_eq!(read_by(&sum), [own("a.log", &["a"], true), own("b.log", &["b"], true)]);
    let warnings = sum["warnings"].to_string();
    assert!(
        warnings.contains(&format!(
            "rule c: logs: {}: No such file or directory",
            missing.display()
        )),
        "{warnings}"
    );

    // Only c selected: nothing to read, which is a failure naming the log.
    let nothing = cli(&r.cfg, &["test", "--rule", "c"]);
    assert_eq!(nothing.code, 1, "{}", nothing.text());
    assert!(
        nothing.stderr.contains(&missing.display().to_string()),
        "{}",
        nothing.stderr
    );
}

/// `-` reads standard input (gzip too), read by every selected rule.
#[test]
fn a_dash_reads_standard_input() {
    let r = ConfigDir::new();
    r.write(
        &r.main_config(),
        &[Rule::new("any", &r.log, "{ hits: 2, window: 60s }")],
    );
    let gz = r.path().join("in.gz");
    write_gz(&gz, &(0..3).map(|i| at("203.0.113.9", i)).collect::<String>());
    let out = Command::new(fleetban_bin())
        .args(["test", "--json", "-c", s(&r.cfg), "-"])
        .stdin(Stdio::from(std::fs::File::open(&gz).unwrap()))
        .output()
        .unwrap();
    let stdout = String::from_utf8(out.stdout).unwrap();
    assert!(out.status.success(), "{stdout}{}", String::from_utf8_lossy(&out.stderr));
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["lines"], 3, "{stdout}");
    assert_eq!(last["files"][0]["file"], "-", "{stdout}");
    assert_eq!(last["files"][0]["gzip"], true, "{stdout}");
    assert!(
        stdout.contains(r#""event":"ban""#) && stdout.contains(r#""file":"-""#),
        "{stdout}"
    );
}

/// gzip is told by its bytes whatever the name; other compressions are
/// refused by name; a missing file, a cut gzip stream: errors naming the file.
#[test]
fn compressed_and_unreadable_files_are_read_or_refused_by_name() {
    let r = ConfigDir::new();
    r.write(
        &r.main_config(),
        &[Rule::new("any", &r.log, "{ hits: 100, window: 60s }")],
    );
    let text: String = (0..50).map(|i| at("203.0.113.9", i)).collect();

    let disguised = r.path().join("plain-name.log");
    write_gz(&disguised, &text);
    let out = cli(&r.cfg, &["test", "--json", s(&disguised)]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(summary(&out)["lines"], 50);
    assert_eq!(summary(&out)["unparsed"], 0);

    let zst = r.path().join("access.log.2.zst");
    std::fs::write(&zst, [0x28, 0xb5, 0x2f, 0xfd, 0x20, 0x00, 0x01, 0x00, 0x00, 0x00]).unwrap();
    let out = cli(&r.cfg, &["test", s(&zst)]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stderr.starts_with(&format!("{}: zstd-compressed", zst.display())),
        "{}",
        out.stderr
    );
    let xz = r.path().join("renamed.gz");
    std::fs::write(&xz, b"\xfd7zXZ\x00\x00\x04").unwrap();
    let out = cli(&r.cfg, &["test", s(&xz)]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stderr.starts_with(&format!("{}: xz-compressed", xz.display())),
        "{}",
        out.stderr
    );

    let missing = r.path().join("nope.log");
    let out = cli(&r.cfg, &["test", s(&r.log), s(&missing)]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stderr
            .starts_with(&format!("{}: No such file or directory", missing.display())),
        "{}",
        out.stderr
    );

    let cut = r.path().join("cut.gz");
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.repeat(2000).as_bytes()).unwrap();
    let bytes = gz.finish().unwrap();
    std::fs::write(&cut, &bytes[..bytes.len() / 2]).unwrap();
    let out = cli(&r.cfg, &["test", s(&cut)]);
    assert_eq!(out.code, 1, "{}", out.text());
    let prefix = format!("{}: corrupt gzip stream after line ", cut.display());
    assert!(out.stderr.starts_with(&prefix), "{}", out.stderr);
    let line: u64 = out.stderr[prefix.len()..]
        .split_whitespace()
        .next()
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("a line number in {}", out.stderr));
    assert!(line > 1000 && line < 100_000, "{}", out.stderr);
}

/// `--rule` repeated selects those rules; an unknown name is a usage error
/// listing the names.
#[test]
fn rule_may_be_given_more_than_once() {
    let r = ConfigDir::new();
    std::fs::write(&r.log, at("203.0.113.9", 0)).unwrap();
    r.write(
        &r.main_config(),
        &[
            Rule::new("one", &r.log, "{ hits: 5, window: 60s }"),
            Rule::new("two", &r.log, "{ hits: 5, window: 60s }"),
            Rule::new("three", &r.log, "{ hits: 5, window: 60s }"),
        ],
    );
    let out = cli(
        &r.cfg,
        &["test", "--json", "--rule", "one", "--rule", "three", s(&r.log)],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let rules = summary(&out)["rules"].clone();
    let names: Vec<&String> = rules.as_object().unwrap().keys().collect();
    assert_eq!(names, ["one", "three"]);
    let out = cli(&r.cfg, &["test", "--rule", "one", "--rule", "nosuch", s(&r.log)]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(
        out.stderr
            .contains("no rule named `nosuch`; the rules are: one, two, three"),
        "{}",
        out.stderr
    );
}
