//! Learning mode: `fleetban test` reports, per rule, the clients never banned
//! whose window came closest to the limit (peak window count), in the human
//! output and as a `closest` field of the `--json` summary, without changing
//! the contract's lines.

mod common;

use common::{cli, combined_line, ConfigDir, MainConfig, Rule};

#[test]
fn test_reports_the_clients_closest_to_each_limit() {
    let r = ConfigDir::new();
    r.write(
        &MainConfig::new(),
        &[
            Rule::new("pages", "/unused", "{ hits: 10, window: 60s }").ban("1h"),
            Rule::new("notfound", "/unused", "{ hits: 3, window: 60s }")
                .matching("{ status: [404] }")
                .ban("1h"),
        ],
    );
    let t0 = 1_700_000_000_000i64;
    let mut log = String::new();
    // 198.51.100.1: 7 hits within a minute; later 2 more, after the window.
    for i in 0..7 {
        log += &combined_line("198.51.100.1", t0 + i * 1000, "/a", 200);
    }
    // 198.51.100.2: 12 hits in a minute: banned at the 11th.
    for i in 0..12 {
        log += &combined_line("198.51.100.2", t0 + i * 1000, "/b", 200);
    }
    // 198.51.100.3: 3 hits, two of them 404.
    for (i, st) in [200, 404, 404].iter().enumerate() {
        log += &combined_line("198.51.100.3", t0 + i as i64 * 1000, "/c", *st);
    }
    for i in 0..2 {
        log += &combined_line("198.51.100.1", t0 + 120_000 + i * 1000, "/a", 200);
    }
    std::fs::write(&r.log, log).unwrap();

    let run = |json: bool| {
        let mut args = vec!["test"];
        if json {
            args.push("--json");
        }
        args.push(r.log.to_str().expect("a UTF-8 temp path"));
        let out = cli(&r.cfg, &args);
        assert!(out.success(), "{}", out.stderr);
        out.stdout
    };

    let human = run(false);
    let rows: Vec<Vec<&str>> = human.lines().map(|l| l.split_whitespace().collect()).collect();
    let after = |header: &[&str]| -> Vec<Vec<&str>> {
        let at = rows
            .iter()
            .position(|r| r[..] == *header)
            .unwrap_or_else(|| panic!("no {header:?} in\n{human}"));
        rows[at + 1..].iter().take_while(|r| !r.is_empty()).cloned().collect()
    };
    // RULE LINES UNPARSED MATCHED BANS
    assert_eq!(
        after(&["RULE", "LINES", "UNPARSED", "MATCHED", "BANS"]),
        [
            vec!["pages", "24", "0", "24", "1"],
            vec!["notfound", "24", "0", "2", "0"]
        ],
        "{human}"
    );
    // One client per line, fullest first, against its rule's limit.
    assert_eq!(
        after(&["RULE", "ADDRESS", "PEAK", "LIMIT"]),
        [
            vec!["pages", "198.51.100.1", "7", "10"],
            vec!["pages", "198.51.100.3", "3", "10"],
            vec!["notfound", "198.51.100.3", "2", "3"]
        ],
        "{human}"
    );

    let json = run(true);
    let lines: Vec<serde_json::Value> = json.lines().map(|l| serde_json::from_str(l).unwrap()).collect();
    assert_eq!(lines.len(), 2, "one ban, one summary: {json}");
    assert_eq!(lines[0]["event"], "ban");
    let summary = &lines[1];
    assert_eq!(summary["event"], "summary");
    assert_eq!(summary["rules"]["pages"]["matched"], 24);
    assert_eq!(summary["rules"]["pages"]["bans"], 1);
    // The banned client is a ban decision, not a candidate for the limit.
    assert_eq!(
        summary["rules"]["pages"]["closest"],
        serde_json::json!([{"addr": "198.51.100.1", "peak": 7}, {"addr": "198.51.100.3", "peak": 3}])
    );
    assert_eq!(
        summary["rules"]["notfound"]["closest"],
        serde_json::json!([{"addr": "198.51.100.3", "peak": 2}])
    );
}
