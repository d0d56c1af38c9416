//! What `fleetban test` prints (docs/design.md §6, "`test` output"):
//! `--print` with FILE:LINE (line numbers after decompression), for
//! people and as JSON lines; `--since`/`--until` bounding the replay by log
//! time; and the output's order (bans, tables, summary last).

mod common;

use common::replay::{at, json_lines, s, summary, write_gz, LIMIT_REQ_FORMAT, T0};
use common::{cli, combined_line, ConfigDir, Rule};

/// `--print unparsed,matched --print banned`: those lines with FILE:LINE
/// (line numbers in the decompressed file), for people and as JSON lines.
#[test]
fn print_shows_the_lines_with_their_file_and_line_number() {
    let r = ConfigDir::new();
    let gz = r.path().join("access.log.1.gz");
    let text = [
        at("203.0.113.9", 0),
        "garbage one\n".into(),
        at("203.0.113.9", 1),
        "\n".into(),
        combined_line("203.0.113.9", T0 + 2000, "/login", 200),
        combined_line("203.0.113.9", T0 + 3000, "/login", 200),
    ]
    .concat();
    write_gz(&gz, &text);
    r.write(
        &r.main_config(),
        &[Rule::new("login", &r.log, "{ hits: 1, window: 60s }").matching("{ path: '^/login' }")],
    );
    let out = cli(
        &r.cfg,
        &["test", "--print", "unparsed,matched", "--print", "banned", s(&gz)],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let f = gz.display().to_string();
    let printed: Vec<&str> = out.stdout.lines().filter(|l| l.starts_with(&format!("{f}:"))).collect();
    let login = |n: i64| {
        combined_line("203.0.113.9", T0 + n * 1000, "/login", 200)
            .trim_end()
            .to_owned()
    };
    assert_eq!(
        printed,
        [
            format!("{f}:2: unparsed: garbage one"),
            format!("{f}:5: matched login: {}", login(2)),
            format!("{f}:6: matched login: {}", login(3)),
            format!("{f}:6: banned login: {}", login(3)),
        ]
    );

    let out = cli(&r.cfg, &["test", "--json", "--print", "unparsed,banned", s(&gz)]);
    assert_eq!(out.code, 0, "{}", out.text());
    let lines = json_lines(&out);
    let printed: Vec<String> = lines
        .iter()
        .filter(|l| l["event"] != "summary")
        .map(|l| l.to_string())
        .collect();
    let ev = |kind: &str, line: u64, rule: Option<&str>, text: &str| {
        serde_json::json!({"event":"line","file":f,"kind":kind,"line":line,"rule":rule,"text":text}).to_string()
    };
    assert_eq!(printed[0], ev("unparsed", 2, None, "garbage one"));
    assert_eq!(printed[1], ev("banned", 6, Some("login"), &login(3)));
    // The JSON is written in the documented field order.
    assert!(
        out.stdout
            .lines()
            .next()
            .unwrap()
            .starts_with(r#"{"event":"line","file":"#),
        "{}",
        out.stdout
    );
    let ban = &lines[2];
    assert_eq!(ban["event"], "ban");
    assert_eq!(
        (ban["file"].as_str(), ban["line"].as_u64()),
        (Some(f.as_str()), Some(6))
    );
    let out = cli(&r.cfg, &["test", "--print", "nothing", s(&gz)]);
    assert_eq!(out.code, 2, "{}", out.text());
}

/// `--since`/`--until` bound the replay by log time: `[since, until)`, an
/// RFC 3339 time or a duration before now.
#[test]
fn since_and_until_bound_the_replay_by_log_time() {
    let r = ConfigDir::new();
    // One request a minute for ten minutes.
    let text: String = (0..10).map(|m| at("203.0.113.9", m * 60)).collect();
    std::fs::write(&r.log, text).unwrap();
    r.write(
        &r.main_config(),
        &[Rule::new("any", &r.log, "{ hits: 100, window: 60s }")],
    );
    let since = fleetban::rfc3339(T0 + 2 * 60_000);
    let until = fleetban::rfc3339(T0 + 5 * 60_000);
    let out = cli(
        &r.cfg,
        &["test", "--json", "--since", &since, "--until", &until, s(&r.log)],
    );
    assert_eq!(out.code, 0, "{}", out.text());
    let sum = summary(&out);
    assert_eq!(
        (sum["lines"].as_u64(), sum["outside"].as_u64()),
        (Some(3), Some(7)),
        "{sum}"
    );
    assert_eq!(sum["rules"]["any"]["matched"], 3);
    assert_eq!(sum["since"], since.as_str());

    // A duration counts back from now: lines of 2015-2023 are all before it.
    let out = cli(&r.cfg, &["test", "--json", "--since", "1h", s(&r.log)]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert_eq!(summary(&out)["outside"], 10);
    let recent = r.path().join("recent.log");
    std::fs::write(&recent, common::combined_lines("203.0.113.9", 4, "/", 200)).unwrap();
    let out = cli(&r.cfg, &["test", "--json", "--since", "1h", s(&recent)]);
    assert_eq!(
        (summary(&out)["lines"].as_u64(), summary(&out)["outside"].as_u64()),
        (Some(4), Some(0))
    );

    // A line outside the bounds is read by no rule: not even as unparsed
    // by a rule whose format (tried first) does not fit it.
    r.write(
        &r.main_config(),
        &[
            Rule::new("limit-req", &r.log, "{ hits: 100, window: 60s }").format(LIMIT_REQ_FORMAT),
            Rule::new("any", &r.log, "{ hits: 100, window: 60s }"),
        ],
    );
    let out = cli(
        &r.cfg,
        &["test", "--json", "--since", &since, "--until", &until, s(&r.log)],
    );
    let sum = summary(&out);
    assert_eq!(sum["rules"]["limit-req"]["lines"], 3, "{sum}");
    assert_eq!(sum["rules"]["limit-req"]["unparsed"], 3, "{sum}");
    assert_eq!(sum["rules"]["any"]["unparsed"], 0, "{sum}");

    let out = cli(&r.cfg, &["test", "--since", "yesterday-ish", s(&r.log)]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(out.stderr.contains("--since yesterday-ish"), "{}", out.stderr);
}

/// For people: the bans, then the rules, then the summary last; the
/// clients nearest their limit one per line, at most `--top` per rule.
#[test]
fn human_output_puts_bans_then_tables_then_the_summary_last() {
    let r = ConfigDir::new();
    let mut text = String::new();
    for c in 0..20 {
        for k in 0..=c % 6 {
            text += &at(&format!("203.0.113.{c}"), c * 100 + k);
        }
    }
    std::fs::write(&r.log, text).unwrap();
    r.write(
        &r.main_config(),
        &[Rule::new("any", &r.log, "{ hits: 4, window: 60s }").ban("10m")],
    );
    let out = cli(&r.cfg, &["test", "--top", "3", s(&r.log)]);
    assert_eq!(out.code, 0, "{}", out.text());
    let lines: Vec<&str> = out.stdout.lines().collect();
    let pos = |prefix: &str| {
        lines
            .iter()
            .position(|l| l.starts_with(prefix))
            .unwrap_or_else(|| panic!("no line {prefix:?} in\n{}", out.stdout))
    };
    let (bans, rules, near) = (pos("BANNED AT"), pos("RULE "), pos("closest to the limit"));
    assert!(bans < rules && rules < near, "{}", out.stdout);
    // Clients 4, 5, 10, 11, 16, 17 make 5 or 6 requests: six bans, one row each.
    let ban_rows: Vec<&str> = lines[bans + 1..]
        .iter()
        .take_while(|l| !l.is_empty())
        .copied()
        .collect();
    assert_eq!(ban_rows.len(), 6, "{}", out.stdout);
    assert!(
        ban_rows.iter().all(|l| l.contains(" any ") && l.contains("10m")),
        "{}",
        out.stdout
    );
    // Nearest: clients making 4 requests (3, 9, 15), at most 3, one per line.
    let near_rows: Vec<&str> = lines[near + 2..]
        .iter()
        .take_while(|l| !l.is_empty())
        .copied()
        .collect();
    assert_eq!(near_rows.len(), 3, "{}", out.stdout);
    for row in &near_rows {
        let cells: Vec<&str> = row.split_whitespace().collect();
        assert_eq!((cells[0], cells[2], cells[3]), ("any", "4", "4"), "{row}");
    }
    assert!(lines.last().unwrap().starts_with("lines: "), "{}", out.stdout);
    assert_eq!(
        lines.last().unwrap(),
        &format!(
            "lines: {}  unparsed: 0  bans: 6",
            (0..20).map(|c| c % 6 + 1).sum::<i64>()
        )
    );
}
