//! The shipped unit, checked with systemd's own tools: `systemd-analyze
//! security --offline=true` rates its exposure at most 2.0 while it keeps
//! what fleetban needs (CAP_NET_ADMIN for nft, the adm group for nginx's logs,
//! group www-data for the HTTP endpoint's socket, its state directory), and `systemd-analyze verify` finds nothing (with the
//! built binary in place of /usr/bin/fleetban and the generated man page).

mod common;

use std::path::PathBuf;
use std::process::Command;

use common::{fleetban_bin, require};

fn unit() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("systemd/fleetban.service")
}

#[test]
fn unit_exposure_is_at_most_2_and_it_keeps_what_fleetban_needs() {
    let out = Command::new(require("systemd-analyze"))
        .args(["security", "--offline=true", "--no-pager"])
        .arg(unit())
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let level: f64 = text
        .lines()
        .find_map(|l| l.split("Overall exposure level for fleetban.service:").nth(1))
        .and_then(|rest| rest.split_whitespace().next())
        .and_then(|n| n.parse().ok())
        .unwrap_or_else(|| panic!("no exposure level in:\n{text}"));
    assert!(level <= 2.0, "exposure {level} > 2.0:\n{text}");

    let unit = std::fs::read_to_string(unit()).unwrap();
    let has = |line: &str| unit.lines().any(|l| l.trim() == line);
    assert!(has("Type=notify"), "Type=notify");
    assert!(unit.lines().any(|l| l.starts_with("WatchdogSec=")), "WatchdogSec");
    assert!(has("CapabilityBoundingSet=CAP_NET_ADMIN"), "nft needs CAP_NET_ADMIN");
    assert!(has("AmbientCapabilities=CAP_NET_ADMIN"), "nft needs CAP_NET_ADMIN");
    assert!(unit.contains("AF_NETLINK"), "nft talks netlink");
    assert!(has("SupplementaryGroups=adm"), "nginx logs are group adm");
    assert!(
        has("Group=www-data") && has("RuntimeDirectoryMode=0750"),
        "nginx's workers (www-data) reach the HTTP endpoint's socket in /run/fleetban"
    );
    assert!(has("StateDirectory=fleetban"), "offsets and bans need a state dir");
    assert!(
        has("RuntimeDirectory=fleetban"),
        "the control socket lives in /run/fleetban"
    );
    assert!(
        !unit.contains("InaccessiblePaths=/var/log") && !unit.contains("PrivateNetwork=yes"),
        "logs readable, host network reachable"
    );
}

#[test]
fn unit_verifies_clean() {
    let dir = tempfile::tempdir().unwrap();
    let text = std::fs::read_to_string(unit())
        .unwrap()
        .replace("/usr/bin/fleetban", &fleetban_bin().to_string_lossy());
    let copy = dir.path().join("fleetban.service");
    std::fs::write(&copy, text).unwrap();
    // `verify` runs `man fleetban(1)` for Documentation=: give it the page.
    let man1 = dir.path().join("man/man1");
    std::fs::create_dir_all(&man1).unwrap();
    let page = Command::new(fleetban_bin()).arg("manpage").output().unwrap();
    assert!(page.status.success());
    std::fs::write(man1.join("fleetban.1"), page.stdout).unwrap();
    require("man");
    let out = Command::new(require("systemd-analyze"))
        .args(["verify", "--man=yes"])
        .arg(&copy)
        .env("MANPATH", dir.path().join("man"))
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr);
    let problems: Vec<&str> = text.lines().filter(|l| l.contains("fleetban.service")).collect();
    assert!(
        out.status.success() && problems.is_empty(),
        "systemd-analyze verify:\n{text}"
    );
}
