//! The shipped unit, checked with systemd's own tools and run under a live
//! one.
//!
//! `systemd-analyze security --offline=true` rates its exposure at most 2.0
//! while it keeps what fleetban needs (CAP_NET_ADMIN for nft, the adm group
//! for nginx's logs, group www-data for the HTTP endpoint's socket, its state
//! directory), and `systemd-analyze verify` finds nothing (with the built
//! binary in place of /usr/bin/fleetban and the generated man page).
//!
//! Under a live systemd (a Debian tree booted by systemd-nspawn, see
//! `common::Machine`; the unit exactly as shipped, the built binary as
//! /usr/bin/fleetban, an embedded-store config in /etc/fleetban): `systemctl
//! start` returns once the daemon is ready (Type=notify), `systemctl reload`
//! is a SIGHUP to the same process, `systemctl stop` a clean exit, a
//! SIGKILLed daemon is restarted, the watchdog restarts a daemon that stops
//! pinging, and the hardened daemon reads nginx's log, runs nft and writes
//! its state. The watchdog tests add one drop-in, `WatchdogSec=3s`, nothing
//! else; the daemon whose nft hangs stops its pings once the call has run
//! for half the interval.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{combined_lines, fleetban_bin, parse_set_json, require, rules_yaml, Machine, MainConfig, Rule};

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

/// The log the machine's nginx would write; the rule reads it.
const ACCESS_LOG: &str = "/var/log/nginx/access.log";
/// The unit, as `systemctl` names it.
const UNIT: &str = "fleetban.service";
/// Where the nft wrapper of [`HANG_WRAPPER`] reads the pid whose nft must hang.
const HANG_PID: &str = "/etc/fbtest-nft-hang";
/// A test's `WatchdogSec=`: the shipped 30 s would make the watchdog tests
/// slow, the mechanism is the same.
const TEST_WATCHDOG: &str = "[Service]\nWatchdogSec=3s\n";

/// A machine running the shipped unit, with the config it reads (a temp
/// dir mounted as /etc/fleetban; kept until the machine is gone).
struct Service {
    /// The booted machine; declared first, so it stops before the config goes.
    m: Machine,
    /// `fleetban.yaml` and `rules.yaml`.
    _etc: tempfile::TempDir,
}

impl Service {
    /// Boots a machine with the built binary as /usr/bin/fleetban, the unit
    /// of systemd/ as /etc/systemd/system/fleetban.service, an empty
    /// nginx log (www-data:adm 0640, as Debian's nginx writes it), and a
    /// config: embedded store, nftables, one rule banning for an hour
    /// a client of more than 10 GETs in 10 minutes. `extra`: more read-only binds.
    fn boot(extra: &[(&Path, &str)]) -> Service {
        let etc = tempfile::Builder::new().prefix("fbt-etc-").tempdir().unwrap();
        MainConfig::new()
            .host_id("machine")
            .write(&etc.path().join("fleetban.yaml"));
        let rule = Rule::new("scraper", ACCESS_LOG, "{ hits: 10, window: 10m }")
            .matching("{ method: [GET] }")
            .ban("1h");
        std::fs::write(etc.path().join("rules.yaml"), rules_yaml(&[rule])).unwrap();
        let bin = fleetban_bin();
        let unit = unit();
        let mut binds: Vec<(&Path, &str)> = vec![
            (&bin, "/usr/bin/fleetban"),
            (&unit, "/etc/systemd/system/fleetban.service"),
            (etc.path(), "/etc/fleetban"),
        ];
        binds.extend_from_slice(extra);
        let m = Machine::boot(&binds);
        m.write(ACCESS_LOG, "");
        let log = m.path(ACCESS_LOG);
        std::os::unix::fs::chown(&log, Some(m.uid("www-data")), Some(m.gid("adm"))).unwrap();
        std::fs::set_permissions(&log, std::os::unix::fs::PermissionsExt::from_mode(0o640)).unwrap();
        Service { m, _etc: etc }
    }

    /// `systemctl ARGS`; panics unless it succeeds.
    fn systemctl(&self, args: &[&str]) -> String {
        let argv: Vec<&str> = ["systemctl"].iter().chain(args).copied().collect();
        self.m.run(&argv)
    }

    fn main_pid(&self) -> u32 {
        self.m.property(UNIT, "MainPID").parse().expect("MainPID is a number")
    }

    fn restarts(&self) -> u32 {
        self.m
            .property(UNIT, "NRestarts")
            .parse()
            .expect("NRestarts is a number")
    }

    /// `active (running)` with a main process.
    fn running(&self) -> bool {
        self.m.property(UNIT, "ActiveState") == "active"
            && self.m.property(UNIT, "SubState") == "running"
            && self.main_pid() != 0
    }

    /// Waits for a new main process `active (running)` after `old`, and
    /// `restarts` restarts in all.
    fn wait_restarted(&self, old: u32, restarts: u32, timeout: Duration) -> u32 {
        self.m.wait(timeout, "systemd to restart fleetban", || {
            self.restarts() == restarts && self.running() && self.main_pid() != old
        });
        self.main_pid()
    }

    /// `fleetban status --json` inside, through the control socket.
    fn status(&self) -> serde_json::Value {
        let out = self.m.run(&["fleetban", "status", "--json"]);
        serde_json::from_str(&out).unwrap_or_else(|e| panic!("status is not JSON ({e}): {out}"))
    }

    /// The addresses in the machine's nft set `inet fleetban v4` (read with
    /// the real nft, not a test wrapper).
    fn banned_v4(&self) -> Vec<String> {
        let out = self
            .m
            .run(&["/usr/sbin/nft", "-j", "list", "set", "inet", "fleetban", "v4"]);
        parse_set_json(&out)
            .unwrap_or_else(|e| panic!("nft -j list set: {e}\n{out}"))
            .into_iter()
            .map(|e| e.elem)
            .collect()
    }

    /// The journal of the unit: the daemon's lines and systemd's about it.
    fn journal(&self) -> String {
        self.m.journal(UNIT)
    }

    /// Installs `text` as a drop-in of the unit and reloads systemd.
    fn drop_in(&self, name: &str, text: &str) {
        self.m
            .write(&format!("/etc/systemd/system/fleetban.service.d/{name}"), text);
        self.systemctl(&["daemon-reload"]);
    }
}

#[test]
fn under_systemd_start_returns_when_ready_reload_is_a_sighup_to_the_same_process_and_stop_is_clean() {
    let s = Service::boot(&[]);
    s.systemctl(&["enable", UNIT]);
    assert_eq!(s.m.property(UNIT, "UnitFileState"), "enabled");

    // Type=notify: `start` comes back only once fleetban sent READY=1, which
    // it sends after the nft table exists and the control socket listens;
    // so both are there the moment it returns, without waiting.
    s.systemctl(&["start", UNIT]);
    assert!(s.running(), "not active (running) after start:\n{}", s.journal());
    assert_eq!(s.m.property(UNIT, "Type"), "notify");
    s.m.run(&["/usr/sbin/nft", "list", "table", "inet", "fleetban"]);
    assert_eq!(s.status()["reloads"], 0, "{}", s.status());
    let text = s.m.run(&["fleetban", "status"]);
    assert!(text.contains("scraper"), "fleetban status:\n{text}");
    assert!(
        !s.m.property(UNIT, "StatusText").is_empty(),
        "STATUS= summary under systemctl status"
    );

    let pid = s.main_pid();
    s.systemctl(&["reload", UNIT]);
    s.m.wait(Duration::from_secs(10), "the reload to be applied", || {
        s.status()["reloads"] == 1
    });
    let journal = s.journal();
    assert!(
        journal.contains("SIGHUP: reloading the configuration.") && journal.contains("Configuration reloaded."),
        "no reload lines:\n{journal}"
    );
    assert_eq!(s.main_pid(), pid, "reload must not restart the process");
    assert!(s.running());
    assert_eq!(s.restarts(), 0);

    // SIGTERM: a clean exit well within TimeoutStopSec=, not a failure.
    s.systemctl(&["stop", UNIT]);
    assert_eq!(s.m.property(UNIT, "ActiveState"), "inactive");
    assert_eq!(s.m.property(UNIT, "Result"), "success", "{}", s.journal());
}

#[test]
fn under_systemd_a_sigkilled_daemon_is_restarted() {
    let s = Service::boot(&[]);
    s.systemctl(&["start", UNIT]);
    let pid = s.main_pid();
    assert_eq!(s.restarts(), 0);

    s.systemctl(&["kill", "--signal=SIGKILL", UNIT]);
    // Restart=on-failure after RestartSec=2s.
    let new = s.wait_restarted(pid, 1, Duration::from_secs(20));
    assert_ne!(new, pid);
    assert!(s.status()["bans"].is_u64(), "{}", s.status());
    let journal = s.journal();
    assert!(journal.contains("code=killed, status=9/KILL"), "{journal}");
}

#[test]
fn under_systemd_the_hardened_daemon_reads_nginx_logs_runs_nft_and_writes_its_state() {
    let s = Service::boot(&[]);
    s.systemctl(&["start", UNIT]);

    // A user of its own, CAP_NET_ADMIN and nothing else.
    let proc_status = std::fs::read_to_string(s.m.path(&format!("/proc/{}/status", s.main_pid()))).unwrap();
    let field = |name: &str| {
        proc_status
            .lines()
            .find_map(|l| l.strip_prefix(name))
            .map(|v| v.split_whitespace().next().unwrap_or("").to_owned())
            .unwrap_or_else(|| panic!("no {name} in:\n{proc_status}"))
    };
    assert_ne!(field("Uid:"), "0", "DynamicUser=yes:\n{proc_status}");
    const CAP_NET_ADMIN: u32 = 12;
    assert_eq!(
        field("CapEff:"),
        format!("{:016x}", 1u64 << CAP_NET_ADMIN),
        "{proc_status}"
    );

    // nginx's log, www-data:adm 0640, read through SupplementaryGroups=adm:
    // 11 GETs over the limit of 10 ban their client.
    common::append(&s.m.path(ACCESS_LOG), &combined_lines("203.0.113.5", 11, "/page", 200));
    // A manual ban through the control socket.
    let out = s.m.run(&["fleetban", "ban", "192.0.2.7"]);
    assert!(out.contains("banned 192.0.2.7"), "{out}");
    s.m.wait(Duration::from_secs(15), "both bans in the machine's nft set", || {
        let set = s.banned_v4();
        set.contains(&"203.0.113.5".to_owned()) && set.contains(&"192.0.2.7".to_owned())
    });

    // StateDirectory= with DynamicUser=: /var/lib/fleetban links to
    // /var/lib/private/fleetban, where the state is written.
    let link = std::fs::read_link(s.m.path("/var/lib/fleetban")).unwrap();
    assert_eq!(link, Path::new("private/fleetban"));
    let state = s.m.path("/var/lib/private/fleetban");
    let bans = std::fs::read_to_string(state.join("bans.json")).unwrap();
    assert!(
        bans.contains("192.0.2.7") && bans.contains("203.0.113.5"),
        "bans.json: {bans}"
    );
    s.m.wait(Duration::from_secs(10), "offsets.json to name the log", || {
        std::fs::read_to_string(state.join("offsets.json")).is_ok_and(|o| o.contains(ACCESS_LOG))
    });
    assert_eq!(s.status()["bans"], 2, "{}", s.status());
}

#[test]
fn under_systemd_the_watchdog_restarts_a_daemon_that_stops_pinging() {
    let s = Service::boot(&[]);
    s.drop_in("watchdog.conf", TEST_WATCHDOG);
    s.systemctl(&["start", UNIT]);
    assert_eq!(s.m.property(UNIT, "WatchdogUSec"), "3s");
    let pid = s.main_pid();

    // A stopped process sends no WATCHDOG=1.
    s.systemctl(&["kill", "--kill-whom=main", "--signal=SIGSTOP", UNIT]);
    s.wait_restarted(pid, 1, Duration::from_secs(30));
    let journal = s.journal();
    assert!(journal.contains("Failed with result 'watchdog'"), "{journal}");
}

/// The wrapper that makes one daemon's nft hang.
const HANG_WRAPPER: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/tests/common/nft-hang.sh");

#[test]
fn under_systemd_the_watchdog_restarts_a_daemon_whose_nft_hangs() {
    let s = Service::boot(&[(Path::new(HANG_WRAPPER), "/usr/local/sbin/nft")]);
    s.drop_in("watchdog.conf", TEST_WATCHDOG);
    // nft as a program for every command (a ban's transaction would run in
    // the daemon's process, through libnftables, which no wrapper can
    // hang); the watchdog watches the enforcer's call either way.
    s.drop_in("nft.conf", "[Service]\nEnvironment=FLEETBAN_NFT=/usr/local/sbin/nft\n");
    s.systemctl(&["start", UNIT]);
    let pid = s.main_pid();

    // From now on every nft this daemon runs hangs; the ban is recorded
    // (bans.json) but cannot reach the kernel.
    s.m.write(HANG_PID, &format!("{pid}\n"));
    let _ = s.m.try_run(&["fleetban", "ban", "192.0.2.9"]);
    s.m.wait(Duration::from_secs(10), "the daemon's nft to hang", || {
        // Any of its threads may have spawned it.
        let tasks = std::fs::read_dir(s.m.path(&format!("/proc/{pid}/task"))).unwrap();
        tasks.flatten().any(|t| {
            let children = std::fs::read_to_string(t.path().join("children")).unwrap_or_default();
            children.split_whitespace().any(|child| {
                std::fs::read_to_string(s.m.path(&format!("/proc/{child}/cmdline")))
                    .is_ok_and(|cmd| cmd.starts_with("sleep"))
            })
        })
    });

    // The pings stop, systemd kills and restarts it; the new daemon's nft
    // works and applies the ban list, the hung ban included.
    s.wait_restarted(pid, 1, Duration::from_secs(30));
    let journal = s.journal();
    assert!(journal.contains("Failed with result 'watchdog'"), "{journal}");
    s.m.wait(
        Duration::from_secs(15),
        "the ban applied by the restarted daemon",
        || s.banned_v4().contains(&"192.0.2.9".to_owned()),
    );
}
