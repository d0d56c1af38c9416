//! Learning mode: `fleetban test` reports, per rule, the clients never banned
//! whose window came closest to the limit (peak window count), in the human
//! output and as a `closest` field of the `--json` summary, without changing
//! the contract's lines.

mod common;

use std::process::Command;

use common::{combined_line, fleetban_bin};

#[test]
fn test_reports_the_clients_closest_to_each_limit() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        "rules:
  - name: pages
    logs: [/unused]
    limit: { hits: 10, window: 60s }
    ban: { duration: 1h }
  - name: notfound
    logs: [/unused]
    match: { status: [404] }
    limit: { hits: 3, window: 60s }
    ban: { duration: 1h }
",
    )
    .unwrap();
    let cfg = dir.path().join("fleetban.yaml");
    std::fs::write(&cfg, "rules: [rules.yaml]\n").unwrap();
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
    let path = dir.path().join("access.log");
    std::fs::write(&path, log).unwrap();

    let run = |json: bool| {
        let mut c = Command::new(fleetban_bin());
        c.args(["test", "-c"]).arg(&cfg);
        if json {
            c.arg("--json");
        }
        let out = c.arg(&path).output().unwrap();
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };

    let human = run(false);
    assert!(
        human.contains(
            "rule pages: 24 matched, 1 ban(s)\n  closest to the limit, not banned: 198.51.100.1 7/10, 198.51.100.3 3/10\n"
        ),
        "{human}"
    );
    assert!(
        human.contains("rule notfound: 2 matched, 0 ban(s)\n  closest to the limit, not banned: 198.51.100.3 2/3\n"),
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
