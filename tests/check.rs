//! `fleetban check` as an operator runs it, and the daemon's side of the same
//! promise: a log that is not read is never silent. `check` warns (exit 0)
//! about every log missing, unreadable, a glob matching nothing, or a file
//! its rule's format parses none of; `--online` asks a real redis-server
//! (PING and the ACL user's rights) and nft in a namespace, exit 1 when
//! either fails; the daemon warns at start, says when the log appears, and
//! `status` lists it with its state. Its log lines carry no Rust debug dumps.
//!
//! Unreadable paths: a path through a regular file (ENOTDIR) and a
//! directory where a file is expected, as root meets them; a mode 000 file
//! with `check` run as `nobody` (root would read it anyway).

mod common;

use std::time::Duration;

use common::{cli, combined_lines, wait_until, ConfigDir, Daemon, NetNs, Redis, Rule, ACL_PASSWORD};

const LIMIT: &str = "{ hits: 10, window: 60s }";

/// Lines of `out`'s stdout starting with `warning:`.
fn warnings(out: &common::CliOutput) -> Vec<String> {
    out.stdout
        .lines()
        .filter(|l| l.starts_with("warning:"))
        .map(str::to_owned)
        .collect()
}

#[test]
fn check_warns_about_every_log_it_cannot_read_and_still_exits_0() {
    let c = ConfigDir::new();
    let missing = c.path().join("nonexistent/dir/access.log");
    let through_file = c.log.join("x.log");
    let glob = format!("{}/*.nomatch", c.path().display());
    let dir = c.path().join("state");
    std::fs::create_dir_all(&dir).unwrap();
    let logs = format!(
        "[{}, '{}', {}, {}]",
        missing.display(),
        glob,
        through_file.display(),
        dir.display()
    );
    let rules = format!(
        "rules:\n  - name: web\n    logs: {logs}\n    limit: {LIMIT}\n  - name: other\n    logs: [{}]\n    limit: {LIMIT}\n",
        missing.display()
    );
    std::fs::write(&c.rules, rules).unwrap();
    c.main_config().log_firewall().write(&c.cfg);
    let out = cli(&c.cfg, &["check"]);
    assert_eq!(out.code, 0, "warnings keep exit 0: {}", out.text());
    let w = warnings(&out);
    let find = |what: &str| {
        w.iter()
            .find(|l| l.contains(what))
            .unwrap_or_else(|| panic!("no warning about {what}:\n{}", out.text()))
            .clone()
    };
    let m = find(&missing.display().to_string());
    assert!(m.contains("missing") && m.contains("rules web, other"), "{m}");
    assert!(find(&glob).contains("the glob matches no file"));
    let t = find(&through_file.display().to_string());
    assert!(t.contains("unreadable") && t.contains("Not a directory"), "{t}");
    let d = find(&format!("log {} ", dir.display()));
    assert!(d.contains("unreadable") && d.contains("a directory"), "{d}");
    assert_eq!(w.len(), 4, "one warning per path, the shared one once:\n{}", out.text());
}

/// A permission refused, as an unprivileged operator meets it: `check` run
/// as `nobody` (root reads a mode 000 file anyway).
#[test]
fn check_as_an_unprivileged_user_warns_about_a_log_it_may_not_read() {
    use std::os::unix::fs::PermissionsExt;
    use std::os::unix::process::CommandExt;
    let c = ConfigDir::new();
    c.write(&c.main_config().log_firewall(), &[Rule::new("web", &c.log, LIMIT)]);
    let mode = |p: &std::path::Path, m: u32| std::fs::set_permissions(p, std::fs::Permissions::from_mode(m)).unwrap();
    mode(c.path(), 0o755);
    mode(&c.cfg, 0o644);
    mode(&c.rules, 0o644);
    mode(&c.log, 0o000);
    let out = std::process::Command::new(common::fleetban_bin())
        .args(["check", "-c"])
        .arg(&c.cfg)
        .uid(65534)
        .gid(65534)
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert_eq!(
        out.status.code(),
        Some(0),
        "{stdout}{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let want = format!(
        "warning: log {} (rule web): unreadable (Permission denied",
        c.log.display()
    );
    assert!(stdout.lines().any(|l| l.starts_with(&want)), "{stdout}");
}

#[test]
fn check_warns_when_a_format_parses_none_of_the_first_lines() {
    let c = ConfigDir::new();
    let good = c.empty_log("good.log");
    common::append(&good, &combined_lines("203.0.113.7", 5, "/", 200));
    let junk: String = (0..1500).map(|i| format!("not an access log line {i}\n")).collect();
    std::fs::write(&c.log, junk).unwrap();
    c.write(
        &c.main_config().log_firewall(),
        &[
            Rule::new("reads-junk", &c.log, LIMIT),
            Rule::new("reads-good", &good, LIMIT),
            Rule::new("wrong-format", &good, LIMIT).format("{ log_format: '$remote_addr [$time_local] $status' }"),
            // access.log by its path and by a glob: tried once.
            Rule::new(
                "twice",
                format!("{}, '{}/*.log'", c.log.display(), c.path().display()),
                LIMIT,
            ),
        ],
    );
    let out = cli(&c.cfg, &["check"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let w = warnings(&out);
    let junk_warning = format!(
        "warning: rule reads-junk: {}: parses none of the first 1000 lines with format combined",
        c.log.display()
    );
    assert!(w.iter().any(|l| l.starts_with(&junk_warning)), "{}", out.text());
    let wrong = format!(
        "warning: rule wrong-format: {}: parses none of the first 5 lines",
        good.display()
    );
    assert!(w.iter().any(|l| l.starts_with(&wrong)), "{}", out.text());
    assert!(!w.iter().any(|l| l.contains("reads-good")), "{}", out.text());
    assert_eq!(
        w.iter().filter(|l| l.contains("rule twice:")).count(),
        1,
        "{}",
        out.text()
    );

    // A rotated, compressed log a glob matches: said to be gzip.
    let gz = c.path().join("access.log.2.gz");
    std::fs::write(&gz, [0x1f, 0x8b, 0x08, 0x00, 0, 0, 0, 0, 0, 0x03, b'\n', 0xff]).unwrap();
    c.write(
        &c.main_config().log_firewall(),
        &[Rule::new("rotated", format!("'{}/*.gz'", c.path().display()), LIMIT)],
    );
    let out = cli(&c.cfg, &["check"]);
    let want = format!("warning: rule rotated: {}: gzip-compressed", gz.display());
    assert!(warnings(&out).iter().any(|l| l.starts_with(&want)), "{}", out.text());
}

#[test]
fn check_shows_durations_as_configured_and_the_listpack_warning_only_with_redis() {
    let c = ConfigDir::new();
    let rules = [
        Rule::new("odd", &c.log, "{ hits: 10, window: 90s }").ban("1500ms"),
        Rule::new("big", &c.log, "{ hits: 1000, window: 10m }"),
    ];
    c.write(&c.main_config().log_firewall(), &rules);
    let out = cli(&c.cfg, &["check"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(
        out.stdout
            .contains("odd: 10 hits per 90s (sliding_window), scope fleet, ban 1500ms;"),
        "{}",
        out.stdout
    );
    assert!(out.stdout.contains("big: 1000 hits per 10m"), "{}", out.stdout);
    assert!(
        out.stdout.contains("redis: none (single host, embedded store)"),
        "{}",
        out.stdout
    );
    assert!(
        !out.stdout.contains("listpack"),
        "embedded store: no listpack warning\n{}",
        out.stdout
    );

    c.write(
        &c.main_config().log_firewall().redis("redis://127.0.0.1:1/0", ""),
        &rules,
    );
    let out = cli(&c.cfg, &["check"]);
    assert_eq!(out.code, 0, "without --online Redis is not contacted: {}", out.text());
    assert!(
        out.stdout
            .contains("redis: redis://127.0.0.1:1/0 (prefix fleetban; timeout 250ms, hold 1s, reconcile every 1m): not contacted (--online checks it)"),
        "{}",
        out.stdout
    );
    assert!(
        warnings(&out)
            .iter()
            .any(|l| l.contains("big") && l.contains("listpack")),
        "{}",
        out.stdout
    );
}

#[test]
fn check_online_asks_a_real_redis_and_names_every_right_the_user_lacks() {
    let redis = Redis::start();
    let c = ConfigDir::new();
    let rules = [Rule::new("web", &c.log, LIMIT)];
    c.write(&c.main_config().log_firewall().redis(&redis.url(), ""), &rules);
    let out = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let ok = format!(
        "redis: {} (prefix fleetban): ok, answers PING; the user may run every command fleetban sends",
        redis.url()
    );
    assert!(out.stdout.contains(&ok), "{}", out.stdout);
    assert!(out.stdout.contains("firewall: log backend"), "{}", out.stdout);

    // The window warning takes the server's listpack threshold online, Redis's
    // default (128) offline.
    assert_eq!(redis.cli(&["CONFIG", "SET", "zset-max-listpack-entries", "256"]), "OK");
    let wide = [Rule::new("wide", &c.log, "{ hits: 200, window: 60s }")];
    c.write(&c.main_config().log_firewall().redis(&redis.url(), ""), &wide);
    let offline = cli(&c.cfg, &["check"]);
    assert!(
        warnings(&offline)
            .iter()
            .any(|w| w.contains("wide") && w.contains("(128)")),
        "{}",
        offline.stdout
    );
    let online = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(online.code, 0, "{}", online.text());
    assert!(!online.stdout.contains("listpack"), "{}", online.stdout);

    // The shipped ACL user (config/redis-acl.conf) has every right the probe tries.
    redis.add_acl_user(&[]);
    let as_user = format!("{}?user=fleetban&pass={ACL_PASSWORD}", redis.url());
    c.write(&c.main_config().log_firewall().redis(&as_user, ""), &rules);
    let out = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(out.code, 0, "the shipped ACL passes: {}", out.text());
    assert!(
        !out.stdout.contains(ACL_PASSWORD),
        "the password is never printed: {}",
        out.stdout
    );

    // Without two of them, each is named and check fails.
    assert_eq!(redis.cli(&["ACL", "SETUSER", "fleetban", "-zcount", "-xadd"]), "OK");
    let out = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stdout.contains("FAILED: the user may not run zcount, xadd"),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("check --online failed"), "{}", out.stderr);
    assert_eq!(
        redis.cli(&["EXISTS", "fleetban:probe:{fleetban}", "{fleetban}:probe"]),
        "0",
        "the probe leaves no key"
    );
}

/// On a Redis Cluster, as the shipped ACL user with `+cluster|slots`: the
/// probe's keys share one slot, its script is loaded where they live.
#[test]
fn check_online_asks_a_cluster_as_the_acl_user() {
    let nodes = Redis::start_cluster();
    for n in &nodes {
        n.add_acl_user(&["+cluster|slots"]);
    }
    let c = ConfigDir::new();
    let seed = format!("redis://fleetban:{ACL_PASSWORD}@127.0.0.1:{}", nodes[0].port());
    c.write(
        &c.main_config()
            .log_firewall()
            .redis_yaml(&format!("redis: {{ cluster: ['{seed}'] }}\n")),
        &[Rule::new("web", &c.log, LIMIT)],
    );
    let out = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(
        out.stdout.contains("ok, answers PING; the user may run every command"),
        "{}",
        out.stdout
    );
    assert!(!out.stdout.contains(ACL_PASSWORD), "{}", out.stdout);
}

#[test]
fn check_online_fails_with_exit_1_for_an_unreachable_redis() {
    let c = ConfigDir::new();
    let gone = c.path().join("no-redis.sock");
    let url = format!("unix://{}", gone.display());
    c.write(
        &c.main_config().log_firewall().redis(&url, ""),
        &[Rule::new("web", &c.log, LIMIT)],
    );
    let out = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stdout.contains(&format!("redis: {url}: FAILED: cannot connect")),
        "{}",
        out.stdout
    );
    assert!(out.stderr.contains("check --online failed: redis"), "{}", out.stderr);
}

#[test]
fn check_online_runs_nft_in_a_namespace() {
    let ns = NetNs::new("chk");
    let c = ConfigDir::new();
    c.write(
        &c.main_config().firewall("{ table: fbcheck }"),
        &[Rule::new("web", &c.log, LIMIT)],
    );
    let bin = common::fleetban_bin();
    let run = |args: &[&str]| {
        let mut argv: Vec<String> = vec![bin.display().to_string()];
        argv.extend(args.iter().map(|a| a.to_string()));
        argv.extend(["-c".to_owned(), c.cfg.display().to_string()]);
        ns.exec(&argv).output().unwrap()
    };
    let out = run(&["check"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains("firewall: nftables, table inet fbcheck: not contacted (--online checks it)"),
        "{text}"
    );
    let out = run(&["check", "--online"]);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{text}{}", String::from_utf8_lossy(&out.stderr));
    assert!(
        text.contains("firewall: nftables: ok, nft lists the tables; table inet fbcheck not there yet"),
        "{text}"
    );
    ns.run(&["nft", "add", "table", "inet", "fbcheck"]);
    let text = String::from_utf8_lossy(&run(&["check", "--online"]).stdout).into_owned();
    assert!(text.contains("table inet fbcheck is there"), "{text}");
}

#[test]
fn the_daemon_warns_about_a_missing_log_lists_it_in_status_and_says_when_it_appears() {
    let c = ConfigDir::new();
    let later = c.path().join("later/access.log");
    c.write(
        &c.main_config().log_firewall(),
        &[Rule::new("web", &later, LIMIT), Rule::new("present", &c.log, LIMIT)],
    );
    // Seen first at start, so followed from its end: listed before any line is read.
    common::append(&c.log, &combined_lines("203.0.113.8", 3, "/", 200));
    let size = std::fs::metadata(&c.log).unwrap().len();
    let daemon = Daemon::start(None, &c.cfg, &c.control);
    let log = daemon.log_text();
    let warn = log
        .lines()
        .find(|l| l.contains("WARN") && l.contains(&later.display().to_string()))
        .unwrap_or_else(|| panic!("no WARN naming the missing log:\n{log}"));
    assert!(warn.contains("rules=web") && warn.contains("state=missing"), "{warn}");

    let out = cli(&c.cfg, &["status", "--json"]);
    assert!(out.success(), "{}", out.text());
    let status: serde_json::Value = serde_json::from_str(&out.stdout).unwrap();
    let sources = status["sources"].as_array().unwrap();
    let of = |path: &std::path::Path| {
        sources
            .iter()
            .find(|s| s["path"] == path.display().to_string())
            .unwrap_or_else(|| panic!("{} not in status: {status}", path.display()))
            .clone()
    };
    assert_eq!(of(&later)["state"], "missing");
    assert_eq!(of(&later)["error"], "no such file");
    assert_eq!(of(&c.log)["state"], "following");
    assert!(of(&c.log)["error"].is_null());
    assert_eq!(
        (of(&c.log)["offset"].as_u64(), of(&c.log)["bytes_behind"].as_u64()),
        (Some(size), Some(0))
    );
    assert_eq!(of(&c.log)["lines"], 0);
    let human = cli(&c.cfg, &["status"]);
    assert!(
        human
            .stdout
            .contains(&format!("{}  missing (no such file)", later.display())),
        "{}",
        human.stdout
    );

    std::fs::create_dir_all(later.parent().unwrap()).unwrap();
    std::fs::write(&later, combined_lines("203.0.113.9", 3, "/", 200)).unwrap();
    wait_until(Duration::from_secs(20), "the new log to be followed", || {
        daemon
            .log_text()
            .lines()
            .any(|l| l.contains("INFO") && l.contains("Log file appeared") && l.contains(&later.display().to_string()))
    });
    wait_until(Duration::from_secs(20), "status to show it followed", || {
        let s = daemon.status();
        s["sources"]
            .as_array()
            .unwrap()
            .iter()
            .any(|s| s["path"] == later.display().to_string() && s["state"] == "following" && s["lines"] == 3)
    });
}

#[test]
fn daemon_log_lines_carry_no_debug_dumps_nor_colour() {
    let c = ConfigDir::new();
    c.write(
        &c.main_config().log_firewall(),
        &[Rule::new("web", &c.log, "{ hits: 2, window: 60s }")],
    );
    let mut daemon = Daemon::start(None, &c.cfg, &c.control);
    common::append(&c.log, &combined_lines("203.0.113.7", 5, "/", 200));
    daemon.wait_lines(5);
    wait_until(Duration::from_secs(10), "the ban", || daemon.status()["bans"] == 1);
    // A reload and a stop log their own lines too.
    daemon.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "the reload", || {
        daemon.status()["reloads"] == 1
    });
    daemon.stop(Duration::from_secs(10));
    let log = daemon.log_text();
    assert!(log.contains("dry run: reconciled"), "{log}");
    let dump = regex::Regex::new(r"\w+ \{ ").unwrap();
    for line in log.lines() {
        assert!(!dump.is_match(line), "a Rust debug dump in a log line: {line}");
        assert!(!line.contains('\u{1b}'), "colour on a pipe: {line:?}");
    }
}

/// `check --json`: one object on stdout, valid or not; for errors, each
/// with its file, line and column (and the human errors on stderr, exit 2).
#[test]
fn check_json_reports_rules_warnings_and_every_error_with_its_place() {
    let c = ConfigDir::new();
    let missing = c.path().join("nowhere/access.log");
    c.write(
        &c.main_config().log_firewall(),
        &[
            Rule::new("web", &c.log, LIMIT),
            Rule::new("gone", &missing, LIMIT).ban("90s"),
        ],
    );
    let out = cli(&c.cfg, &["check", "--json"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let v: serde_json::Value =
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    // The documented field order, as printed (serde_json's Value sorts them).
    let at: Vec<usize> = ["config", "ok", "errors", "rules", "warnings", "failures", "lines"]
        .iter()
        .map(|k| out.stdout.find(&format!("\"{k}\":")).unwrap_or(usize::MAX))
        .collect();
    assert!(at.windows(2).all(|w| w[0] < w[1]), "{at:?} {}", out.stdout);
    assert_eq!(v["ok"], true, "{v}");
    assert_eq!(v["rules"][1]["name"], "gone", "{v}");
    assert_eq!(v["rules"][1]["ban"], "90s", "{v}");
    assert_eq!(v["rules"][1]["limit"], "10 hits per 1m (sliding_window)", "{v}");
    let warnings = v["warnings"].as_array().unwrap();
    assert!(
        warnings.iter().any(|w| w
            .as_str()
            .unwrap()
            .starts_with(&format!("log {} (rule gone): missing", missing.display()))),
        "{v}"
    );
    // The same report as the human one, line by line.
    let human = cli(&c.cfg, &["check"]);
    let lines: Vec<&str> = human.stdout.lines().collect();
    assert_eq!(v["lines"], serde_json::json!(lines), "{v}");

    // Two errors in two rules: both, placed.
    std::fs::write(
        &c.rules,
        format!(
            "rules:\n  - name: a\n    logs: [{}]\n    limit: {{ hits: many, window: 1m }}\n  - name: b\n    logs: [{}]\n    limit: {{ hits: 5, window: soon }}\n",
            c.log.display(),
            c.log.display()
        ),
    )
    .unwrap();
    let out = cli(&c.cfg, &["check", "--json"]);
    assert_eq!(out.code, 2, "{}", out.text());
    let v: serde_json::Value =
        serde_json::from_str(out.stdout.trim()).unwrap_or_else(|e| panic!("{e}: {}", out.stdout));
    assert_eq!(v["ok"], false, "{v}");
    let errors = v["errors"].as_array().unwrap();
    assert_eq!(errors.len(), 2, "{v}");
    assert_eq!(
        (errors[0]["line"].as_u64(), errors[1]["line"].as_u64()),
        (Some(4), Some(7)),
        "{v}"
    );
    assert!(
        errors
            .iter()
            .all(|e| e["file"] == c.rules.display().to_string() && e["column"].as_u64() > Some(0)),
        "{v}"
    );
    assert!(out.stderr.contains("2 error(s) in the configuration"), "{}", out.stderr);
}
