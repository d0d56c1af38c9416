//! The enforcer against a kernel and a host that do not stay as they were
//! left: the table flushed away under a running daemon, nft refusing or
//! hanging, descriptors exhausted, a second daemon on the same state, an
//! address added to the host after the start. Real daemon, nft in network
//! namespaces the tests create, the embedded store (no Redis) unless said.

mod common;

use std::time::Duration;

use common::{nft_bans, wait_until, ConfigDir, Daemon, NetNs, Rule};

fn set_has(ns: &NetNs, elem: &str) -> bool {
    nft_bans(ns, "fleetban", if elem.contains(':') { "v6" } else { "v4" })
        .iter()
        .any(|(e, _)| e == elem)
}

fn table_exists(ns: &NetNs) -> bool {
    let out = ns.run(&["nft", "list", "tables"]);
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.trim() == "table inet fleetban")
}

/// An embedded-store daemon's files: one rule on `access.log`.
fn rig() -> ConfigDir {
    let r = ConfigDir::new();
    let main = r.main_config().host_id("faults");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    r
}

fn ban(r: &ConfigDir, addr: &str) {
    fleetban::control::Client::new(&r.control)
        .ban(
            ipnet::IpNet::from(addr.parse::<std::net::IpAddr>().unwrap()),
            Some(3_600_000),
            false,
            "test",
        )
        .unwrap_or_else(|e| panic!("ban {addr}: {e}"));
}

#[test]
fn embedded_mode_recreates_a_flushed_table_with_its_bans_without_a_new_ban() {
    let ns = NetNs::new("flush");
    let r = rig();
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    ban(&r, "203.0.113.80");
    wait_until(Duration::from_secs(5), "the ban in nft", || {
        set_has(&ns, "203.0.113.80")
    });

    // What an nftables service reload does.
    ns.run(&["nft", "flush", "ruleset"]);
    assert!(!table_exists(&ns));
    // Nothing else happens: no line, no ban. The check (every 5 s) brings it back.
    wait_until(Duration::from_secs(15), "the table and the ban back", || {
        table_exists(&ns) && set_has(&ns, "203.0.113.80")
    });
    let log = d.log_text();
    assert_eq!(
        log.matches("The nftables table had vanished").count(),
        1,
        "one warning for the re-creation:\n{log}"
    );
}

/// A start that must be refused: it exits non-zero within 20 s, its message
/// contains each of `says`.
fn refused(r: &ConfigDir, says: &[&str]) {
    let (status, log) = Daemon::run_to_exit(None, &r.cfg, Duration::from_secs(20));
    assert!(!status.success(), "started anyway ({status}):\n{log}");
    for s in says {
        assert!(log.contains(s), "no {s:?} in:\n{log}");
    }
}

#[test]
fn a_control_path_that_is_a_file_or_a_directory_is_refused_and_left_alone() {
    let r = rig();
    std::fs::write(&r.control, "precious\n").unwrap();
    let path = r.control.to_string_lossy().into_owned();
    refused(&r, &[&path, "a regular file"]);
    assert_eq!(std::fs::read_to_string(&r.control).unwrap(), "precious\n");

    std::fs::remove_file(&r.control).unwrap();
    std::fs::create_dir(&r.control).unwrap();
    std::fs::write(r.control.join("inside"), "x").unwrap();
    refused(&r, &[&path, "a directory"]);
    assert!(r.control.join("inside").exists());
}

#[test]
fn a_stale_control_socket_is_replaced() {
    let r = rig();
    // A socket nobody answers on: what a killed daemon leaves.
    drop(std::os::unix::net::UnixListener::bind(&r.control).unwrap());
    assert!(r.control.exists());
    let d = Daemon::start(None, &r.cfg, &r.control);
    assert_eq!(d.status()["bans_active"], 0);
}

#[test]
fn a_second_daemon_on_the_same_state_dir_exits_naming_the_lock_and_the_first_pid() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    let lock = r.state.join("lock").to_string_lossy().into_owned();
    refused(&r, &[&lock, &format!("pid {}", d.pid())]);
    // The first one still answers, on its socket.
    assert_eq!(d.status()["bans_active"], 0);
}

#[test]
fn a_control_socket_another_daemon_answers_on_is_not_taken_over() {
    let r = rig();
    let d = Daemon::start(None, &r.cfg, &r.control);
    // Its own state dir, the first one's socket.
    let other = r.path().join("other-state");
    let main = r.main_config().host_id("faults").state_dir(&other);
    main.write(&r.cfg);
    let path = r.control.to_string_lossy().into_owned();
    refused(&r, &[&path, "another daemon answers on it"]);
    assert_eq!(d.status()["bans_active"], 0);
}
