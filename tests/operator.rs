//! The operator's commands against a daemon with the embedded store (the
//! `log` firewall, or nft inside a namespace the test creates), run as the
//! real binary: they work while a rule file is broken; `flush` says what it
//! removed and refuses while a daemon runs; re-banning never shortens a
//! ban; `unban` names the wider bans that still cover an address and takes
//! what `ban` takes; `status` and `bans` print aligned tables; `explain`
//! says why an address is or is not banned. The same stories over Redis:
//! tests/operator_redis.rs.

mod common;

use std::time::Duration;

use common::operator::{
    ban_of, explain_cases, rebanning_never_shortens, rig, unban_names_the_narrower_bans, unban_names_the_wider_ban,
};
use common::{append, cli, combined_lines, fleetban_bin, wait_until, ConfigDir, Daemon, NetNs, Rule};

#[test]
fn commands_that_talk_to_the_daemon_work_while_a_rule_file_is_broken() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    // The rules break after the start (no `logs:`, a bad `hits`: two
    // errors): the daemon runs on its last good ones.
    std::fs::write(&r.rules, "rules:\n  - name: scraper\n    limit: { hits: many }\n").unwrap();
    assert_eq!(cli(&r.cfg, &["check"]).code, 2);
    for args in [
        &["status"][..],
        &["bans"],
        &["ban", "198.51.100.9", "--for", "1h"],
        &["explain", "198.51.100.9"],
        &["unban", "198.51.100.9"],
    ] {
        let out = cli(&r.cfg, args);
        assert_eq!(out.code, 0, "{args:?}: {}", out.text());
        assert!(
            out.stderr.contains("the rule files have 2 error(s)") && out.stderr.contains("fleetban check"),
            "{args:?}: {}",
            out.stderr
        );
    }
    // An error in the main file still fails, naming it.
    let main = std::fs::read_to_string(&r.cfg).unwrap();
    std::fs::write(&r.cfg, format!("{main}bogus_key: 1\n")).unwrap();
    let out = cli(&r.cfg, &["status"]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(out.stderr.contains("fleetban.yaml"), "{}", out.stderr);
}

#[test]
fn flush_says_there_was_nothing_and_refuses_while_a_daemon_runs() {
    let r = rig();
    let out = cli(&r.cfg, &["flush"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("nothing to remove"), "{}", out.stdout);
    assert!(!out.stdout.contains("removed table"), "{}", out.stdout);

    let mut d = Daemon::start(None, &r.cfg, &r.control);
    let out = cli(&r.cfg, &["flush"]);
    assert_eq!(out.code, 2, "{}", out.text());
    assert!(
        out.stderr.contains("daemon is running") && out.stderr.contains("--force"),
        "{}",
        out.stderr
    );
    let out = cli(&r.cfg, &["flush", "--force"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("re-creates the table"), "{}", out.stdout);
    d.stop(Duration::from_secs(10));
    // Stopped: no refusal.
    assert_eq!(cli(&r.cfg, &["flush"]).code, 0);
}

#[test]
fn flush_counts_the_bans_of_the_table_it_removes() {
    let ns = NetNs::new("opsflush");
    let r = ConfigDir::new();
    r.write(
        &r.main_config().host_id("ops-host"),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }")],
    );
    let mut d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    for a in ["198.51.100.1", "198.51.100.2", "2001:db8:7::/64"] {
        assert_eq!(cli(&r.cfg, &["ban", a]).code, 0);
    }
    // A ban extended, then shortened with --replace: the kernel's element
    // takes each new end.
    let timeout = || {
        common::nft_bans(&ns, "fleetban", "v4")
            .into_iter()
            .find(|(e, _)| e == "198.51.100.1")
            .and_then(|(_, t)| t)
            .unwrap_or(0)
    };
    assert!(timeout() <= 3_600_000, "{}", timeout());
    assert!(cli(&r.cfg, &["ban", "198.51.100.1", "--for", "5h"])
        .stdout
        .contains("extended"));
    wait_until(Duration::from_secs(5), "the element's timeout extended", || {
        timeout() > 4 * 3_600_000
    });
    assert!(cli(&r.cfg, &["ban", "198.51.100.1", "--for", "10m", "--replace"])
        .stdout
        .contains("replaced"));
    wait_until(Duration::from_secs(5), "the element's timeout shortened", || {
        (1..=600_000).contains(&timeout())
    });
    let flush_with = |force: bool| {
        let mut argv = vec![fleetban_bin().to_str().unwrap().to_owned(), "flush".to_owned()];
        argv.extend(["-c".to_owned(), r.cfg.to_str().unwrap().to_owned()]);
        if force {
            argv.push("--force".to_owned());
        }
        ns.exec(&argv).output().expect("run fleetban flush in the namespace")
    };
    // With the daemon up: refused; forced, the daemon puts it all back.
    let out = flush_with(false);
    assert_eq!(out.status.code(), Some(2), "{}", String::from_utf8_lossy(&out.stderr));
    assert_eq!(common::nft_bans(&ns, "fleetban", "v4").len(), 2);
    let out = flush_with(true);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("removed table inet fleetban and the 3 ban(s)") && text.contains("re-creates the table"),
        "{text}"
    );
    wait_until(
        Duration::from_secs(15),
        "the daemon to re-create the table and its bans",
        || {
            let listed = ns.run(&["nft", "list", "tables"]);
            String::from_utf8_lossy(&listed.stdout).contains("table inet fleetban")
                && common::nft_bans(&ns, "fleetban", "v4").len() == 2
                && common::nft_bans(&ns, "fleetban", "v6").len() == 1
        },
    );
    d.stop(Duration::from_secs(10));
    let flush = || {
        let out = flush_with(false);
        assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
        String::from_utf8(out.stdout).unwrap()
    };
    let first = flush();
    assert!(
        first.contains("removed table inet fleetban and the 3 ban(s) in its sets"),
        "{first}"
    );
    let second = flush();
    assert!(
        second.contains("nothing to remove: there is no table inet fleetban"),
        "{second}"
    );
}

#[test]
fn a_ban_nft_refused_is_said_not_enforced_by_ban_and_bans() {
    let ns = NetNs::new("opsnft");
    let r = ConfigDir::new();
    r.write(
        &r.main_config().host_id("ops-host"),
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }")],
    );
    let shim = common::NftShim::new();
    let _d = Daemon::start_with_env(Some(&ns), &r.cfg, &r.control, &shim.env());
    let out = cli(&r.cfg, &["ban", "203.0.113.90"]);
    assert!(!out.stdout.contains("not enforced"), "{}", out.stdout);
    shim.fail();
    let out = cli(&r.cfg, &["ban", "203.0.113.91"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("warning: not enforced yet"), "{}", out.stdout);
    let listed = cli(&r.cfg, &["bans"]).stdout;
    assert!(listed.contains("203.0.113.91 (not enforced)"), "{listed}");
    assert!(!listed.contains("203.0.113.90 (not enforced)"), "{listed}");
    assert_eq!(ban_of(&r, "203.0.113.91").unwrap()["enforced"], false);
    let out = cli(&r.cfg, &["status"]);
    assert!(
        out.stdout.contains("firewall:  failing (")
            && out.stdout.contains("1 ban(s) not enforced (retried): 203.0.113.91"),
        "{}",
        out.stdout
    );
    shim.heal();
}

#[test]
fn rebanning_never_shortens_a_ban_and_keeps_its_reason_in_the_embedded_store() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    rebanning_never_shortens(&r);
}

#[test]
fn unban_names_the_wider_ban_that_still_covers_the_address() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    unban_names_the_wider_ban(&r);
}

#[test]
fn unban_of_a_network_names_the_narrower_bans_it_leaves() {
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    unban_names_the_narrower_bans(&r);
}

#[test]
fn status_and_bans_print_aligned_tables_and_bans_json_has_rfc3339_times() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &combined_lines("203.0.113.20", 1, "/", 200));
    d.wait_lines(1);
    assert_eq!(
        cli(&r.cfg, &["ban", "198.51.100.8", "--for", "2h", "--reason", "by hand"]).code,
        0
    );
    let out = cli(&r.cfg, &["status"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.starts_with("redis:     embedded"), "{}", out.stdout);
    assert!(out.stdout.contains("\nfirewall:  ok"), "{}", out.stdout);
    let rules: Vec<&str> = out
        .stdout
        .lines()
        .skip_while(|l| *l != "rules:")
        .skip(1)
        .take(2)
        .collect();
    assert_eq!(
        rules[0].trim_end(),
        "  RULE     LINES  UNPARSED  HITS  BANS",
        "{}",
        out.stdout
    );
    assert!(
        rules[1].starts_with("  scraper      1         0     1     0"),
        "{}",
        out.stdout
    );
    let sources: Vec<&str> = out.stdout.lines().skip_while(|l| *l != "sources:").skip(1).collect();
    assert!(
        sources[0].starts_with("  FILE") && sources[0].ends_with("LAG  BEHIND"),
        "{}",
        out.stdout
    );
    assert!(sources[1].contains("access.log"), "{}", out.stdout);

    let out = cli(&r.cfg, &["bans"]);
    let lines: Vec<&str> = out.stdout.lines().collect();
    assert!(lines[0].starts_with("ADDRESS       RULE    SINCE"), "{}", out.stdout);
    let left = lines[0].find("LEFT").unwrap();
    assert_eq!(&lines[1][left..left + 6], "in 1h ", "{}", out.stdout);
    assert!(lines[1].ends_with("by hand"), "{}", out.stdout);
    assert_eq!(lines.last(), Some(&"1 active ban(s)"));

    let b = ban_of(&r, "198.51.100.8").unwrap();
    // The documented field order, as printed.
    let line = cli(&r.cfg, &["bans", "--json"]).stdout;
    let at: Vec<usize> = [
        "addr", "rule", "reason", "host", "since", "until", "left_s", "count", "hits", "enforced",
    ]
    .iter()
    .map(|k| {
        line.find(&format!("\"{k}\":"))
            .unwrap_or_else(|| panic!("{k} in {line}"))
    })
    .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{line}");
    for t in ["since", "until"] {
        let s = b[t].as_str().unwrap();
        assert!(
            s.len() >= 20 && s.ends_with('Z') && s.as_bytes()[10] == b'T',
            "{t}: {s}"
        );
    }
    assert!(b["left_s"].as_i64().unwrap() > 7000, "{b}");
    assert_eq!(
        (b["host"].as_str(), b["count"].as_u64(), b["enforced"].as_bool()),
        (Some("ops-host"), Some(1), Some(true))
    );
}

#[test]
fn explain_says_why_an_address_is_or_is_not_banned_in_the_embedded_store() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &combined_lines("203.0.113.9", 3, "/", 200));
    d.wait_lines(3);
    explain_cases(&r);
}

/// Issue 25, item 5: one bound for a ban's length at every entry point. The
/// CLI refuses what overflows or is not positive, naming the bound; the
/// control socket refuses the same `for_ms`; nothing of it is banned.
#[test]
fn a_ban_too_long_or_not_positive_is_refused_by_the_cli_and_the_control_socket() {
    use std::io::{BufRead, Write};
    let r = rig();
    let _d = Daemon::start(None, &r.cfg, &r.control);
    for d in ["300000000y", "9999999999999999s", "3651d", "0s", "500ms"] {
        let out = cli(&r.cfg, &["ban", "198.51.100.51", "--for", d]);
        assert_eq!(out.code, 2, "--for {d}: {}", out.text());
        assert!(out.stderr.contains("--for"), "--for {d}: {}", out.stderr);
    }
    let out = cli(&r.cfg, &["ban", "198.51.100.51", "--for", "3651d"]);
    assert!(
        out.stderr.contains("at most 3650d") && out.stderr.contains("--permanent"),
        "{}",
        out.stderr
    );
    for ms in ["9223372036854775807", "-5000", "0", "999"] {
        let mut s = std::os::unix::net::UnixStream::connect(&r.control).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        writeln!(
            s,
            r#"{{"cmd":"ban","addr":"198.51.100.51","for_ms":{ms},"permanent":false,"reason":"x"}}"#
        )
        .unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&s).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(
            v["error"].as_str().is_some_and(|e| e.contains("a ban")),
            "for_ms {ms}: {line}"
        );
    }
    // A length that is no `for_ms` (a bare `"for": "90"`, a string) is
    // refused, not taken as the default hour (issue 26, item 2).
    for (body, says) in [
        (r#""for":"90""#, "unknown field `for`"),
        (r#""for_ms":"90""#, "expected i64"),
    ] {
        let mut s = std::os::unix::net::UnixStream::connect(&r.control).expect("connect");
        s.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
        writeln!(s, r#"{{"cmd":"ban","addr":"198.51.100.51",{body}}}"#).unwrap();
        let mut line = String::new();
        std::io::BufReader::new(&s).read_line(&mut line).unwrap();
        let v: serde_json::Value = serde_json::from_str(&line).unwrap_or_else(|e| panic!("{line}: {e}"));
        assert!(v["error"].as_str().is_some_and(|e| e.contains(says)), "{body}: {line}");
    }
    // The longest allowed still works, and nothing above was banned.
    assert_eq!(cli(&r.cfg, &["ban", "198.51.100.52", "--for", "3650d"]).code, 0);
    let bans = cli(&r.cfg, &["bans", "--json"]).stdout;
    assert!(
        !bans.contains("198.51.100.51") && bans.contains("198.51.100.52"),
        "{bans}"
    );
}

/// Issue 26, item 7: with the daemon stopped, an error is said once, with
/// the hint, whether the socket is absent or refuses; `bans` and `explain`
/// read the list the daemon saved (`state_dir/bans.json`) and say so.
#[test]
fn with_the_daemon_stopped_errors_are_said_once_and_bans_and_explain_read_the_saved_list() {
    let r = rig();
    let once = |out: &common::CliOutput, io: &str| {
        assert_eq!(out.code, 1, "{}", out.text());
        assert_eq!(out.stderr.matches(io).count(), 1, "said once: {}", out.stderr);
        assert!(
            out.stderr.contains("is fleetban running? (systemctl status fleetban)"),
            "{}",
            out.stderr
        );
    };
    once(&cli(&r.cfg, &["status"]), "No such file or directory");

    let mut d = Daemon::start(None, &r.cfg, &r.control);
    let out = cli(&r.cfg, &["ban", "198.51.100.7", "--for", "2h", "--reason", "probing"]);
    assert_eq!(out.code, 0, "{}", out.text());
    d.stop(Duration::from_secs(10));
    // A socket file nobody listens on: refused.
    let _ = std::fs::remove_file(&r.control);
    drop(std::os::unix::net::UnixListener::bind(&r.control).unwrap());
    once(&cli(&r.cfg, &["status"]), "Connection refused");

    let out = cli(&r.cfg, &["bans"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stderr.contains("reading the list it saved"), "{}", out.stderr);
    assert!(out.stderr.contains("bans.json"), "{}", out.stderr);
    assert!(
        out.stdout.contains("198.51.100.7") && out.stdout.contains("probing") && out.stdout.contains("1 active ban(s)"),
        "{}",
        out.stdout
    );
    let out = cli(&r.cfg, &["explain", "198.51.100.7"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stderr.contains("reading the list it saved"), "{}", out.stderr);
    assert!(
        out.stdout.contains("banned") && out.stdout.contains("probing"),
        "{}",
        out.stdout
    );
    let out = cli(&r.cfg, &["explain", "198.51.100.8", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("\"verdict\":\"not_banned\""), "{}", out.stdout);
}

/// Issue 26, item 7: `test` on a log it may not read (run as `nobody`)
/// says the permission error once.
#[test]
fn test_on_an_unreadable_log_says_the_error_once() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let r = rig();
    let mode = |p: &std::path::Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(r.path(), 0o755);
    mode(&r.cfg, 0o644);
    mode(&r.rules, 0o644);
    append(&r.log, &combined_lines("203.0.113.9", 3, "/", 200));
    mode(&r.log, 0o000);
    let out = std::process::Command::new(fleetban_bin())
        .args(["test", "-c"])
        .arg(&r.cfg)
        .arg(&r.log)
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert_eq!(stderr.matches("Permission denied").count(), 1, "{stderr}");
    assert!(stderr.contains(&r.log.display().to_string()), "{stderr}");
}

/// Issue 26, item 10: a ban's reason says what the rule counted: `hits: 0`
/// the path of the request that matched, `distinct:` the distinct values; the
/// daemon's log writes a ban's length as `check` does (`duration=1d`,
/// never `1day`) and no float seconds.
#[test]
fn reasons_say_what_was_counted_and_logs_write_durations_one_way() {
    let r = ConfigDir::new();
    r.write(
        &r.main_config().host_id("ops-host").log_firewall(),
        &[
            Rule::new("env", &r.log, "{ hits: 0, window: 1m }")
                .matching("{ path: '^/\\.env$' }")
                .ban("1d"),
            Rule::new("probe", &r.log, "{ distinct: path, hits: 5, window: 5m }")
                .matching("{ status: [404] }")
                .ban("1h"),
        ],
    );
    let d = Daemon::start_with_env(None, &r.cfg, &r.control, &[("RUST_LOG", "fleetban=debug")]);
    let mut lines = combined_lines("203.0.113.5", 1, "/.env", 404);
    for k in 0..6 {
        lines += &combined_lines("203.0.113.6", 1, &format!("/backup-{k}.zip"), 404);
    }
    append(&r.log, &lines);
    let mut bans: Vec<serde_json::Value> = Vec::new();
    wait_until(Duration::from_secs(20), "both bans", || {
        bans = cli(&r.cfg, &["bans", "--json"])
            .stdout
            .lines()
            .filter_map(|l| serde_json::from_str(l).ok())
            .collect();
        bans.len() == 2
    });
    let reason = |addr: &str| bans.iter().find(|b| b["addr"] == addr).map(|b| b["reason"].clone());
    assert_eq!(
        reason("203.0.113.5"),
        Some("first request for /.env".into()),
        "{bans:?}"
    );
    assert_eq!(
        reason("203.0.113.6"),
        Some("6 distinct paths within 5m".into()),
        "{bans:?}"
    );
    let log = d.log_text();
    assert!(log.contains("duration=1d"), "{log}");
    assert!(log.contains("took="), "{log}");
    assert!(!log.contains("1day") && !log.contains("seconds="), "{log}");
}
