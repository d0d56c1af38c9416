//! Running fleetban as a service: SIGHUP reloads (a valid config changes
//! behaviour and keeps the windows; a broken one is refused and the old rules
//! keep banning), systemd's notify protocol (READY=1 after start, WATCHDOG=1
//! pings, RELOADING=1, STOPPING=1), SIGTERM exits 0 with offsets saved.
//! The daemon runs with `firewall: { backend: log }` and the embedded store:
//! no root needed, and the windows that must survive a reload live in the
//! process itself.

mod common;

use common::metrics::{http_get, sample};

use std::io::Write;
use std::os::unix::net::UnixDatagram;
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use common::{append, cli, combined_lines, control_status, wait_until, ConfigDir, Daemon, MainConfig, Redis, Rule};

/// GETs of `log`, `hits` in 10 minutes ban for an hour.
fn scraper_rule(log: &Path, hits: u32) -> Rule {
    Rule::new("scraper", log, &format!("{{ hits: {hits}, window: 10m }}"))
        .matching("{ method: [GET] }")
        .ban("1h")
}

/// The service's main config: host `svc`, bans logged (no nft), the
/// embedded store.
fn service_config(r: &ConfigDir) -> MainConfig {
    r.main_config().host_id("svc").log_firewall()
}

fn rig() -> ConfigDir {
    let r = ConfigDir::new();
    r.write(&service_config(&r), &[scraper_rule(&r.log, 10)]);
    r
}

fn hits(addr: &str, n: i64, path: &str, status: u16) -> String {
    combined_lines(addr, n, path, status)
}

fn rule_stat(status: &serde_json::Value, name: &str, field: &str) -> Option<u64> {
    status["rules"]
        .as_array()?
        .iter()
        .find(|r| r["name"] == name)?
        .get(field)?
        .as_u64()
}

#[test]
fn sighup_with_a_valid_config_changes_the_limit_keeps_the_window_and_follows_new_logs() {
    let r = rig();
    let log2 = r.empty_log("other.log");
    let d = Daemon::start(None, &r.cfg, &r.control);

    // 4 hits under a limit of 10: no ban.
    append(&r.log, &hits("203.0.113.7", 4, "/page", 200));
    d.wait_lines(4);
    assert_eq!(d.status()["bans"], 0);

    // Same rule, limit 5, and a new rule reading a new log.
    r.write_rules(&[
        scraper_rule(&r.log, 5),
        Rule::new("notfound", &log2, "{ hits: 2, window: 10m }")
            .matching("{ status: [404] }")
            .ban("1h"),
    ]);
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "reload applied", || d.status()["reloads"] == 1);
    assert!(rule_stat(&d.status(), "notfound", "hits").is_some(), "{}", d.status());

    // 2 more hits: 6 in the window the reload kept, over the new limit of 5.
    // Had the window been lost, 2 hits would be under it.
    append(&r.log, &hits("203.0.113.7", 2, "/page", 200));
    wait_until(Duration::from_secs(10), "ban under the reloaded limit", || {
        rule_stat(&d.status(), "scraper", "bans") == Some(1)
    });
    assert_eq!(rule_stat(&d.status(), "scraper", "hits"), Some(6), "{}", d.status());

    // The new rule's log is followed from now on.
    append(&log2, &hits("198.51.100.9", 3, "/nope", 404));
    wait_until(Duration::from_secs(10), "ban by the new rule on the new log", || {
        rule_stat(&d.status(), "notfound", "bans") == Some(1)
    });
    let log = d.log_text();
    assert!(log.contains("Configuration reloaded"), "{log}");
    assert!(log.contains("notfound"), "{log}");

    // Back to the scraper rule alone: the other log is no longer followed.
    r.write_rules(&[scraper_rule(&r.log, 5)]);
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "second reload", || d.status()["reloads"] == 2);
    let before = d.status()["lines"].as_u64().unwrap();
    append(&log2, &hits("198.51.100.10", 3, "/nope", 404));
    append(&r.log, &hits("198.51.100.11", 1, "/page", 200));
    d.wait_lines(before + 1);
    // Both files are polled in the same step; give a few more polls anyway.
    std::thread::sleep(Duration::from_millis(300));
    assert_eq!(d.status()["lines"].as_u64(), Some(before + 1), "{}", d.status());
    assert!(rule_stat(&d.status(), "notfound", "hits").is_none(), "{}", d.status());
}

#[test]
fn sighup_with_a_broken_config_keeps_the_old_rules_which_still_ban() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("203.0.113.8", 3, "/page", 200));
    d.wait_lines(3);

    // Two errors: an unknown key and a bad limit; both must be logged.
    std::fs::write(
        &r.rules,
        common::rules_yaml(&[scraper_rule(&r.log, 5)]).replace("limit: { hits: 5", "limit: { hits: 0")
            + "    colour: red\n",
    )
    .unwrap();
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "reload refused", || {
        d.status()["reload_errors"] == 1
    });
    assert_eq!(d.status()["reloads"], 0);
    let log = d.log_text();
    assert!(log.contains("Reload refused"), "{log}");
    assert!(log.contains("rules.yaml:"), "errors name the file: {log}");

    // The old limit (10) still holds and still bans, window intact: 3 + 8 = 11.
    append(&r.log, &hits("203.0.113.8", 8, "/page", 200));
    wait_until(Duration::from_secs(10), "ban under the old rules", || {
        rule_stat(&d.status(), "scraper", "bans") == Some(1)
    });
    assert_eq!(rule_stat(&d.status(), "scraper", "hits"), Some(11), "{}", d.status());
}

/// Collects the datagrams the daemon sends to its NOTIFY_SOCKET.
struct NotifySocket {
    sock: UnixDatagram,
    path: PathBuf,
    seen: Vec<String>,
}

impl NotifySocket {
    fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let sock = UnixDatagram::bind(&path).unwrap();
        sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
        NotifySocket {
            sock,
            path,
            seen: Vec::new(),
        }
    }

    /// Waits (at most 15 s) for a datagram containing `what`; returns it.
    fn expect(&mut self, what: &str) -> String {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        while start.elapsed() < Duration::from_secs(15) {
            if let Ok(n) = self.sock.recv(&mut buf) {
                let msg = String::from_utf8_lossy(&buf[..n]).into_owned();
                self.seen.push(msg.clone());
                if msg.lines().any(|l| l == what || l.starts_with(what)) {
                    return msg;
                }
            }
        }
        panic!("no {what:?} on NOTIFY_SOCKET; got {:?}", self.seen);
    }
}

#[test]
fn systemd_notify_ready_watchdog_reloading_stopping_and_offsets_saved_on_sigterm() {
    let r = rig();
    let mut n = NotifySocket::bind(r.path());
    let path = n.path.to_string_lossy().into_owned();
    let mut d = Daemon::start_with_env(
        None,
        &r.cfg,
        &r.control,
        &[("NOTIFY_SOCKET", &path), ("WATCHDOG_USEC", "400000")],
    );
    let ready = n.expect("READY=1");
    assert!(ready.contains("STATUS="), "READY carries a status line: {ready}");
    // READY=1 comes once the control socket and the rules are up.
    assert!(d.status()["rules"].as_array().is_some_and(|r| r.len() == 1));
    n.expect("WATCHDOG=1");
    n.expect("WATCHDOG=1");

    append(&r.log, &hits("203.0.113.9", 3, "/page", 200));
    d.wait_lines(3);
    d.signal(libc::SIGHUP);
    let reloading = n.expect("RELOADING=1");
    assert!(reloading.contains("MONOTONIC_USEC="), "{reloading}");
    n.expect("READY=1");

    let (status, took) = d.stop(Duration::from_secs(10));
    assert!(status.success(), "exit status {status}");
    assert!(took < Duration::from_secs(5), "stopped in {took:?}");
    n.expect("STOPPING=1");

    // Offsets saved at stop: the whole file was read and committed.
    let saved = std::fs::read_to_string(r.state.join("offsets.json")).unwrap();
    let len = std::fs::metadata(&r.log).unwrap().len();
    let saved: serde_json::Value = serde_json::from_str(&saved).unwrap();
    let entry = &saved["files"][r.log.to_string_lossy().as_ref()];
    assert_eq!(entry["offset"].as_u64(), Some(len), "{saved}");
}
#[test]
fn status_json_and_the_metrics_endpoint_show_sources_rules_and_valve() {
    let r = rig();
    // A free port for the endpoint: bound and released (loopback only).
    let addr = format!("127.0.0.1:{}", common::free_port());
    service_config(&r)
        .metrics(&addr)
        .safety("{ max_bans_per_minute: 1 }")
        .write(&r.cfg);
    let d = Daemon::start(None, &r.cfg, &r.control);

    // Two offenders: the first ban passes the valve (1/min), the second trips it.
    append(
        &r.log,
        &(hits("203.0.113.10", 11, "/p", 200) + &hits("203.0.113.11", 11, "/p", 200)),
    );
    wait_until(Duration::from_secs(10), "valve refusal", || {
        d.status()["safety"]["refused"] == 1
    });

    use std::os::unix::fs::PermissionsExt;
    let mode = std::fs::metadata(&r.control).unwrap().permissions().mode();
    assert_eq!(mode & 0o777, 0o600, "control socket mode {mode:o}");

    let st = d.status();
    let src = &st["sources"][0];
    assert_eq!(src["path"], r.log.to_string_lossy().as_ref());
    assert_eq!(src["offset"].as_u64(), Some(std::fs::metadata(&r.log).unwrap().len()));
    assert_eq!(src["lines"], 22);
    assert_eq!(src["bytes_behind"], 0);
    assert!(src["lines_per_s"].is_number() && src["lag_ms"].is_number(), "{st}");
    // Both clients' lines came in one chunk: all 22 were counted before the flush banned.
    assert_eq!(rule_stat(&st, "scraper", "hits"), Some(22), "{st}");
    assert_eq!(rule_stat(&st, "scraper", "bans"), Some(1), "{st}");
    assert_eq!(st["safety"]["state"], "tripped");
    assert_eq!(st["safety"]["max_bans_per_minute"], 1);
    assert_eq!(st["redis"]["used"], false);
    assert_eq!(st["redis"]["connected"], false);
    assert_eq!(st["bans_active"], 1);

    // The human form carries the same.
    let human = cli(&r.cfg, &["status"]).stdout;
    assert!(human.contains("safety valve: tripped"), "{human}");
    assert!(human.contains("LINES/S"), "{human}");

    let resp = http_get(&addr, "/metrics");
    assert!(resp.starts_with("HTTP/1.0 200"), "{resp}");
    assert_eq!(sample(&resp, "fleetban_lines_total"), Some(22.0), "{resp}");
    assert_eq!(
        sample(&resp, "fleetban_hits_total{rule=\"scraper\"}"),
        Some(22.0),
        "{resp}"
    );
    assert_eq!(
        sample(&resp, "fleetban_bans_total{rule=\"scraper\"}"),
        Some(1.0),
        "{resp}"
    );
    assert_eq!(sample(&resp, "fleetban_safety_refused_total"), Some(1.0), "{resp}");
    assert_eq!(sample(&resp, "fleetban_redis_errors_total"), Some(0.0), "{resp}");
    assert_eq!(sample(&resp, "fleetban_bans_active"), Some(1.0), "{resp}");
    assert_eq!(sample(&resp, "fleetban_redis_connected"), Some(0.0), "{resp}");
    assert_eq!(
        sample(&resp, "fleetban_redis_state{state=\"embedded\"}"),
        Some(1.0),
        "{resp}"
    );
    assert_eq!(
        sample(&resp, "fleetban_redis_state{state=\"down\"}"),
        Some(0.0),
        "{resp}"
    );
    assert_eq!(sample(&resp, "fleetban_redis_down_since_seconds"), None, "{resp}");
    assert!(sample(&resp, "fleetban_sync_lag_seconds").is_some(), "{resp}");
    assert!(resp.contains("fleetban_redis_roundtrip_seconds_bucket"), "{resp}");
    // The log backend applies the ban: one firewall transaction observed.
    assert!(
        sample(&resp, "fleetban_nft_apply_seconds_count").is_some_and(|n| n >= 1.0),
        "{resp}"
    );
    assert!(http_get(&addr, "/other").starts_with("HTTP/1.0 404"));
}

#[test]
fn without_metrics_there_is_no_endpoint() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    let log = d.log_text();
    assert!(!log.contains("Prometheus"), "{log}");
}

#[test]
fn one_log_line_per_ban_and_unban_and_bad_lines_warned_once() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    let garbage: String = (0..500).map(|i| format!("not an access log line {i}\n")).collect();
    append(&r.log, &garbage);
    d.wait_lines(500);
    append(&r.log, &garbage);
    d.wait_lines(1000);
    append(&r.log, &hits("203.0.113.12", 11, "/p", 200));
    wait_until(Duration::from_secs(10), "ban", || d.status()["bans"] == 1);
    let out = cli(&r.cfg, &["unban", "203.0.113.12"]);
    assert!(out.success(), "{}", out.stderr);
    wait_until(Duration::from_secs(10), "unban logged", || {
        d.log_text().contains("Unbanned.")
    });

    let log = d.log_text();
    let warned: Vec<&str> = log.lines().filter(|l| l.contains("could parse")).collect();
    assert_eq!(warned.len(), 1, "1000 bad lines, one warning a minute:\n{log}");
    assert!(warned[0].contains("unparsed="), "{log}");
    let banned: Vec<&str> = log.lines().filter(|l| l.contains("Banned.")).collect();
    assert_eq!(banned.len(), 1, "{log}");
    for field in ["rule=scraper", "addr=203.0.113.12", "hits=11", "duration=1h"] {
        assert!(banned[0].contains(field), "{field} in {}", banned[0]);
    }
    let unbanned: Vec<&str> = log.lines().filter(|l| l.contains("Unbanned.")).collect();
    assert_eq!(unbanned.len(), 1, "{log}");
    assert!(unbanned[0].contains("addr=203.0.113.12"), "{}", unbanned[0]);
}

#[test]
fn the_journal_is_chosen_only_when_stderr_is_the_journal_stream() {
    use fleetban::daemon::wants_journal;
    assert!(wants_journal(None, Some("8:1234"), Some((8, 1234))));
    assert!(
        !wants_journal(None, Some("8:1234"), Some((8, 999))),
        "inherited from a parent"
    );
    assert!(!wants_journal(None, None, Some((8, 1234))));
    assert!(!wants_journal(None, Some("garbage"), Some((8, 1234))));
    assert!(wants_journal(Some("journal"), None, None));
    assert!(!wants_journal(Some("stderr"), Some("8:1234"), Some((8, 1234))));
}

/// Under systemd the journal gets native fields: run the daemon with a
/// journal socket of the test's own (private mount namespace) and read the
/// datagrams journald would have received.
#[test]
fn under_the_journal_bans_are_logged_with_native_fields() {
    common::require_root("a private mount namespace");
    common::require("unshare");
    let r = rig();
    let jdir = r.path().join("journal");
    std::fs::create_dir(&jdir).unwrap();
    let sock = UnixDatagram::bind(jdir.join("socket")).unwrap();
    sock.set_read_timeout(Some(Duration::from_millis(200))).unwrap();
    let script = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("scripts/in-journal-ns.sh");
    let mut child = std::process::Command::new(script)
        .arg(&jdir)
        .arg("--")
        .arg(common::fleetban_bin())
        .args(["run", "-c"])
        .arg(&r.cfg)
        .env("FLEETBAN_LOG", "journal")
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .unwrap();
    let status = || control_status(&r.control);
    wait_until(Duration::from_secs(20), "daemon up", || status().is_some());
    append(&r.log, &hits("203.0.113.13", 11, "/p", 200));
    wait_until(Duration::from_secs(10), "ban", || {
        status().is_some_and(|s| s["bans"] == 1)
    });

    let mut banned = None;
    let mut seen = Vec::new();
    let mut buf = vec![0u8; 65536];
    let start = Instant::now();
    while banned.is_none() && start.elapsed() < Duration::from_secs(10) {
        if let Ok(n) = sock.recv(&mut buf) {
            let fields = journal_fields(&buf[..n]);
            seen.push(format!("{fields:?}"));
            if fields.iter().any(|f| f == "MESSAGE=Banned.") {
                banned = Some(fields);
            }
        }
    }
    // SAFETY: signalling our own child (the script execs into fleetban).
    unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
    let exit = child.wait().unwrap();
    let mut err = String::new();
    std::io::Read::read_to_string(child.stderr.as_mut().unwrap(), &mut err).unwrap();
    let msg = banned.unwrap_or_else(|| panic!("no Banned. datagram in {seen:?}; stderr:\n{err}"));
    for field in [
        "RULE=scraper",
        "ADDR=203.0.113.13",
        "HITS=11",
        "DURATION=1h",
        "PRIORITY=5",
        "SYSLOG_IDENTIFIER=fleetban",
    ] {
        assert!(msg.iter().any(|l| l == field), "{field} in {msg:?}");
    }
    assert!(exit.success(), "{exit}: {err}");
    assert!(!err.contains("Banned."), "with the journal, nothing on stderr: {err}");
}

/// Decodes one datagram of journald's native protocol into `KEY=value`
/// strings: each field is `KEY=value\n`, or `KEY\n` + 64-bit LE length +
/// value + `\n` when the value may hold newlines.
fn journal_fields(mut d: &[u8]) -> Vec<String> {
    let mut out = Vec::new();
    while !d.is_empty() {
        let Some(nl) = d.iter().position(|&b| b == b'\n') else {
            break;
        };
        let head = &d[..nl];
        if let Some(eq) = head.iter().position(|&b| b == b'=') {
            out.push(format!(
                "{}={}",
                String::from_utf8_lossy(&head[..eq]),
                String::from_utf8_lossy(&head[eq + 1..])
            ));
            d = &d[nl + 1..];
        } else {
            let rest = &d[nl + 1..];
            if rest.len() < 8 {
                break;
            }
            let len = u64::from_le_bytes(rest[..8].try_into().unwrap()) as usize;
            let value = &rest[8..(8 + len).min(rest.len())];
            out.push(format!(
                "{}={}",
                String::from_utf8_lossy(head),
                String::from_utf8_lossy(value)
            ));
            d = &rest[(8 + len + 1).min(rest.len())..];
        }
    }
    out
}

/// With Redis the windows live there, keyed by rule name: a reload that
/// lowers the limit bans on the window the old rules filled.
#[test]
fn sighup_with_redis_keeps_the_fleet_windows() {
    let redis = Redis::start();
    let r = rig();
    service_config(&r).redis(&redis.url(), "").write(&r.cfg);
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("203.0.113.14", 4, "/page", 200));
    d.wait_lines(4);
    wait_until(Duration::from_secs(10), "window in Redis", || {
        redis.cli(&[
            "ZCARD",
            &fleetban::store::Keys::new("fleetban").window(&"203.0.113.14/32".parse().unwrap(), "scraper", None),
        ]) == "4"
    });

    r.write_rules(&[scraper_rule(&r.log, 5)]);
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "reload applied", || d.status()["reloads"] == 1);
    append(&r.log, &hits("203.0.113.14", 2, "/page", 200));
    wait_until(Duration::from_secs(10), "ban in the shared list", || {
        redis
            .cli(&["ZSCORE", "{fleetban}:bans", "203.0.113.14"])
            .parse::<f64>()
            .is_ok()
    });
    assert_eq!(rule_stat(&d.status(), "scraper", "bans"), Some(1), "{}", d.status());
    assert_eq!(d.status()["redis"]["connected"], true);
    assert_eq!(d.status()["redis"]["used"], true);
}

/// Known limit of issue 14: a reload that changes the list of logs while a
/// rotated file is still being drained (nginx writing on to its old file
/// until it reopens) goes on draining it: the lines written there after the
/// reload are read, none twice.
#[test]
fn a_reload_during_a_rotation_goes_on_draining_the_rotated_file() {
    let r = rig();
    let log2 = r.empty_log("other.log");
    let d = Daemon::start(None, &r.cfg, &r.control);
    // nginx's open file, kept across the rotation.
    let mut nginx = std::fs::OpenOptions::new().append(true).open(&r.log).unwrap();
    nginx.write_all(hits("203.0.113.8", 3, "/a", 200).as_bytes()).unwrap();
    d.wait_lines(3);
    // logrotate: rename, create; nginx not told yet.
    std::fs::rename(&r.log, r.log.with_extension("log.1")).unwrap();
    std::fs::write(&r.log, "").unwrap();
    nginx.write_all(hits("203.0.113.8", 2, "/b", 200).as_bytes()).unwrap();
    d.wait_lines(5);
    // Seen as a rotation, or, when the follower looked between the rename
    // and the create (inotify wakes it at the rename), as the file gone
    // from its path: drained either way.
    wait_until(Duration::from_secs(10), "the rotation seen", || {
        let log = d.log_text();
        log.contains("File rotated; draining the old one.") || log.contains("File gone from its path; draining it.")
    });

    // A reload that changes the logs, while the old file is drained.
    r.write_rules(&[
        scraper_rule(&r.log, 10),
        Rule::new("other", &log2, "{ hits: 2, window: 10m }"),
    ]);
    d.signal(libc::SIGHUP);
    wait_until(Duration::from_secs(10), "reload applied", || d.status()["reloads"] == 1);
    nginx.write_all(hits("203.0.113.8", 4, "/c", 200).as_bytes()).unwrap();
    wait_until(Duration::from_secs(10), "the lines written after the reload", || {
        d.status()["lines"].as_u64().unwrap_or(0) >= 9
    });
    // Then nginx reopens: the new file is read as well, and nothing twice.
    drop(nginx);
    append(&r.log, &hits("203.0.113.9", 1, "/d", 200));
    wait_until(Duration::from_secs(10), "the new file read", || {
        d.status()["lines"].as_u64().unwrap_or(0) >= 10
    });
    std::thread::sleep(Duration::from_millis(500));
    assert_eq!(d.status()["lines"], 10, "{}", d.status());
    // The new follower took the rotated file up where the old one was.
    let log = d.log_text();
    assert!(log.contains("logs_changed=true"), "{log}");
    assert!(log.contains("Draining a rotated file left unfinished"), "{log}");
}
