//! The enforcer against a kernel and a host that do not stay as they were
//! left: the table flushed away under a running daemon, nft refusing or
//! hanging, descriptors exhausted, a second daemon on the same state, an
//! address added to the host after the start, a start held up in nft.
//! Real daemon, nft in network namespaces the tests create, the embedded
//! store (no Redis) unless said.

mod common;

use std::time::Duration;

use common::{nft_bans, wait_until, ConfigDir, Daemon, MainConfig, NetNs, NftShim, NotifySocket, Rule};
use fleetban::control::{Client, Request, Response};

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
    rig_with(|m| m)
}

/// As [`rig`], with the log firewall: for daemons run outside a namespace
/// (the host's own nftables is never touched).
fn rig_outside() -> ConfigDir {
    rig_with(MainConfig::log_firewall)
}

fn rig_with(firewall: impl FnOnce(MainConfig) -> MainConfig) -> ConfigDir {
    let r = ConfigDir::new();
    let main = firewall(r.main_config().host_id("faults"));
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    r
}

fn ban(r: &ConfigDir, addr: &str) {
    Client::new(&r.control)
        .ban(&Request::Ban {
            addr: ipnet::IpNet::from(addr.parse::<std::net::IpAddr>().unwrap()),
            for_ms: Some(3_600_000),
            permanent: false,
            reason: "test".into(),
            replace: false,
        })
        .unwrap_or_else(|e| panic!("ban {addr}: {e}"));
}

#[test]
fn embedded_mode_recreates_a_flushed_table_with_its_bans_without_a_new_ban() {
    let ns = NetNs::new("flush");
    let r = rig();
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    // The table's creation ran the nft program, its 5 s check asks
    // nf_tables itself and a ban is a netlink batch of its own: this daemon
    // never loads libnftables.
    let libnftables = || {
        std::fs::read_to_string(format!("/proc/{}/maps", d.pid()))
            .unwrap()
            .contains("libnftables")
    };
    assert!(
        !libnftables(),
        "libnftables loaded by a daemon without bans:\n{}",
        d.log_text()
    );
    ban(&r, "203.0.113.80");
    wait_until(Duration::from_secs(5), "the ban in nft", || {
        set_has(&ns, "203.0.113.80")
    });
    assert!(!libnftables(), "a ban is a batch of the daemon's own");

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
    let r = rig_outside();
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
    let r = rig_outside();
    // A socket nobody answers on: what a killed daemon leaves.
    drop(std::os::unix::net::UnixListener::bind(&r.control).unwrap());
    assert!(r.control.exists());
    let d = Daemon::start(None, &r.cfg, &r.control);
    assert_eq!(d.status()["bans_active"], 0);
}

#[test]
fn a_second_daemon_on_the_same_state_dir_exits_naming_the_lock_and_the_first_pid() {
    let r = rig_outside();
    let d = Daemon::start(None, &r.cfg, &r.control);
    let lock = r.state.join("lock").to_string_lossy().into_owned();
    refused(&r, &[&lock, &format!("pid {}", d.pid())]);
    // The first one still answers, on its socket.
    assert_eq!(d.status()["bans_active"], 0);
}

#[test]
fn a_control_socket_another_daemon_answers_on_is_not_taken_over() {
    let r = rig_outside();
    let d = Daemon::start(None, &r.cfg, &r.control);
    // Its own state dir, the first one's socket.
    let other = r.path().join("other-state");
    let main = r.main_config().host_id("faults").log_firewall().state_dir(&other);
    main.write(&r.cfg);
    let path = r.control.to_string_lossy().into_owned();
    refused(&r, &[&path, "another daemon answers on it"]);
    assert_eq!(d.status()["bans_active"], 0);
}

/// A ban through the control socket, its answer as sent.
fn ban_reply(r: &ConfigDir, addr: &str) -> Response {
    let req = Request::Ban {
        addr: ipnet::IpNet::from(addr.parse::<std::net::IpAddr>().unwrap()),
        for_ms: Some(3_600_000),
        permanent: false,
        reason: "test".into(),
        replace: false,
    };
    Client::new(&r.control)
        .call(&req)
        .unwrap_or_else(|e| panic!("ban {addr}: {e}"))
}

fn enforced(reply: &Response) -> Option<bool> {
    match reply {
        Response::Ban(answer) if answer.banned => answer.enforced,
        other => panic!("not a new ban: {other:?}"),
    }
}

#[test]
fn a_ban_nft_refused_is_reported_not_enforced_and_retried_until_it_is() {
    let ns = NetNs::new("nftfail");
    let r = rig();
    let shim = NftShim::new();
    let d = Daemon::start_with_env(Some(&ns), &r.cfg, &r.control, &shim.env());
    let reply = ban_reply(&r, "203.0.113.82");
    assert_eq!(enforced(&reply), Some(true), "{reply:?}");

    shim.fail();
    let reply = ban_reply(&r, "203.0.113.81");
    assert_eq!(enforced(&reply), Some(false), "{reply:?}");
    assert!(shim.refused() >= 2, "the transaction and its retry were refused");
    assert!(!set_has(&ns, "203.0.113.81"));
    let fw = &d.status()["firewall"];
    assert_eq!(fw["failing"], true, "{fw}");
    assert_eq!(fw["not_enforced"], 1, "{fw}");
    assert_eq!(fw["not_enforced_sample"], serde_json::json!(["203.0.113.81"]), "{fw}");
    match Client::new(&r.control).call(&Request::Bans).unwrap() {
        Response::Bans { bans, not_enforced, .. } => {
            assert_eq!(bans.len(), 2);
            assert_eq!(not_enforced, vec!["203.0.113.81".to_owned()]);
        }
        other => panic!("{other:?}"),
    }

    // nft works again: the retry (backing off from 1 s) puts it in, with no new ban.
    shim.heal();
    wait_until(Duration::from_secs(20), "the ban retried into the kernel", || {
        set_has(&ns, "203.0.113.81") && d.status()["firewall"]["not_enforced"] == 0
    });
    assert_eq!(d.status()["firewall"]["failing"], false);
    assert!(set_has(&ns, "203.0.113.82"));
}

/// The "nft transaction applied" debug lines' `via=` words, in order.
fn transactions_via(log: &str) -> Vec<String> {
    log.lines()
        .filter(|l| l.contains("nft transaction applied"))
        .filter_map(|l| l.split_whitespace().find_map(|w| w.strip_prefix("via=")))
        .map(str::to_owned)
        .collect()
}

/// A ban (elements alone, into a set the kernel holds) is a netlink batch
/// of the daemon's own; the first network of a new length, whose set the
/// same transaction creates, runs through libnftables in process.
#[test]
fn a_ban_is_a_netlink_batch_and_a_refusal_there_is_retried_from_a_listing() {
    let ns = NetNs::new("libnft");
    let r = rig();
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    let reply = ban_reply(&r, "203.0.113.81");
    assert_eq!(enforced(&reply), Some(true), "{reply:?}");
    assert!(set_has(&ns, "203.0.113.81"));
    // The table's creation runs the program (once a start); the ban, the
    // daemon's own batch.
    let via = transactions_via(&d.log_text());
    assert_eq!(via, ["nft", "netlink"], "{}", d.log_text());

    // Someone deletes the element under the daemon: its unban's delete is
    // refused by the kernel; the daemon lists and plans again.
    let out = ns.run(&["nft", "delete", "element", "inet", "fleetban", "v4", "{ 203.0.113.81 }"]);
    assert!(out.status.success(), "{out:?}");
    let (removed, queued, _) = Client::new(&r.control)
        .unban(ipnet::IpNet::from("203.0.113.81".parse::<std::net::IpAddr>().unwrap()))
        .unwrap();
    assert!(removed && !queued);
    wait_until(Duration::from_secs(5), "the refused delete logged", || {
        d.log_text().contains("nft transaction failed; re-reading the kernel")
    });
    let log = d.log_text();
    let refused = log
        .lines()
        .find(|l| l.contains("nft transaction failed; re-reading the kernel"))
        .unwrap_or_else(|| panic!("no refusal logged:\n{log}"));
    assert!(
        refused.contains("(nf_tables)")
            && refused.contains("nf_tables refused deleting from set v4: No such file or directory"),
        "the kernel's answer, named: {refused}"
    );
    assert_eq!(
        d.status()["firewall"]["failing"],
        false,
        "the retry found nothing left to do"
    );

    let reply = ban_reply(&r, "203.0.113.82");
    assert_eq!(enforced(&reply), Some(true), "{reply:?}");
    assert!(set_has(&ns, "203.0.113.82") && !set_has(&ns, "203.0.113.81"));
    assert_eq!(
        transactions_via(&d.log_text()).last().map(String::as_str),
        Some("netlink")
    );

    // A /24: its set is new, made in the same transaction, in process;
    // the next /24 goes into it as a batch.
    for (net, via) in [("198.51.100.0/24", "libnftables"), ("198.51.101.0/24", "netlink")] {
        let reply = Client::new(&r.control)
            .call(&Request::Ban {
                addr: net.parse().unwrap(),
                for_ms: Some(3_600_000),
                permanent: false,
                reason: "test".into(),
                replace: false,
            })
            .unwrap();
        assert_eq!(enforced(&reply), Some(true), "{reply:?}");
        assert_eq!(
            transactions_via(&d.log_text()).last().map(String::as_str),
            Some(via),
            "{net}"
        );
    }
    let v4n24: Vec<String> = common::nft_set_elements(&ns, "fleetban", "v4n24")
        .into_iter()
        .map(|(e, _)| e)
        .collect();
    assert_eq!(v4n24, ["198.51.100.0", "198.51.101.0"]);
}

/// A start's list of 12,000 bans (three pages of the list) goes to
/// nf_tables as the daemon's own netlink batches, once the transaction
/// that makes a page's sets (nft's) has run: every ban in the set of its
/// family or length, with the time it has left, the permanent one
/// without.
#[test]
fn a_long_list_at_start_goes_to_nf_tables_as_batches_every_ban_in_its_set() {
    let redis = common::Redis::start();
    let now = common::now_ms();
    let hour = (now + 3_600_000).to_string();
    let mut members: Vec<(String, String)> = Vec::new();
    for i in 0..6_000u32 {
        members.push((hour.clone(), format!("10.{}.{}.{}", i >> 16, (i >> 8) & 255, i & 255)));
    }
    for i in 0..4_000u32 {
        members.push((hour.clone(), format!("172.{}.{}.0/24", 16 + (i >> 8), i & 255)));
    }
    for i in 0..1_999u32 {
        members.push((hour.clone(), format!("2001:db8:{:x}::/48", i + 1)));
    }
    members.push(("+inf".to_owned(), "2001:db8:ffff::/48".to_owned()));
    for chunk in members.chunks(2_000) {
        let mut args = vec!["ZADD", "{fleetban}:bans"];
        for (score, member) in chunk {
            args.extend([score.as_str(), member.as_str()]);
        }
        redis.cli(&args);
    }
    let ns = NetNs::new("batchstart");
    let r = ConfigDir::new();
    let main = r.main_config().host_id("batch").redis(&redis.url(), "");
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    wait_until(Duration::from_secs(30), "the list applied", || {
        d.log_text().contains("Ban list applied.")
    });
    let log = d.log_text();
    let via = transactions_via(&log);
    assert!(via.iter().any(|v| v == "netlink"), "{via:?}:\n{log}");
    assert!(!log.contains("WARN"), "{log}");

    let count = |set: &str| common::nft_set_elements_detailed(&ns, "fleetban", set);
    let (v4, v4n24, v6n48) = (count("v4"), count("v4n24"), count("v6n48"));
    assert_eq!((v4.len(), v4n24.len(), v6n48.len()), (6_000, 4_000, 2_000));
    assert!(v4.iter().any(|e| e.elem == "10.0.23.111"));
    assert!(v4n24.iter().any(|e| e.elem == "172.31.159.0"));
    // The time left as the list has it: the hour less the start's seconds.
    let left = |e: &common::NftElem| e.timeout_ms.unwrap_or(0);
    for e in v4
        .iter()
        .chain(&v4n24)
        .chain(v6n48.iter().filter(|e| e.elem != "2001:db8:ffff::"))
    {
        assert!((3_540_000..=3_600_000).contains(&left(e)), "{e:?}");
    }
    let permanent = v6n48
        .iter()
        .find(|e| e.elem == "2001:db8:ffff::")
        .expect("the permanent ban");
    assert_eq!(permanent.timeout_ms, None, "{permanent:?}");
}

#[test]
fn check_answers_from_the_list_read_while_the_first_sync_is_held_up_in_nft() {
    let redis = common::Redis::start();
    let until = (common::now_ms() + 600_000).to_string();
    // An address, and a /24 around an allowed address: the start's pages
    // put the address in nft; the /24 is the first sync's (cut around it).
    redis.cli(&[
        "ZADD",
        "{fleetban}:bans",
        &until,
        "203.0.113.200",
        &until,
        "198.51.100.0/24",
    ]);
    let ns = NetNs::new("syncheld");
    let r = ConfigDir::new();
    let sock = r.path().join("http.sock");
    let main = r
        .main_config()
        .host_id("held")
        .allow("[198.51.100.77]")
        .redis(&redis.url(), "")
        .http(&format!("{{ listen: '{}' }}", sock.display()));
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    let shim = NftShim::new();
    shim.hang_if("198.51.100.");
    let d = Daemon::spawn(Some(&ns), &r.cfg, &r.control, &shim.env());

    wait_until(Duration::from_secs(10), "the endpoint up", || {
        std::os::unix::net::UnixStream::connect(&sock).is_ok()
    });
    let mut c = common::Checker::unix(&sock);
    assert_eq!(c.check("203.0.113.200").status, 403);
    assert_eq!(c.check("198.51.100.9").status, 403);
    assert_eq!(c.check("198.51.100.77").status, 204, "allowed, inside the /24");
    assert_eq!(c.check("203.0.113.201").status, 204);
    // The first sync had not been applied: it is held in nft (on a loaded
    // machine its transaction may reach nft only after the answers).
    wait_until(
        Duration::from_secs(10),
        "the first sync's transaction held in nft",
        || shim.hanging(),
    );
    assert!(!d.log_text().contains("Ban list applied."), "{}", d.log_text());

    shim.release_if();
    let d = d.wait_up();
    assert!(d.log_text().contains("Ban list applied."));
    let v4 = nft_bans(&ns, "fleetban", "v4");
    assert!(
        v4.iter().any(|(e, _)| e == "198.51.100.128/25"),
        "the cut /24 in nft: {v4:?}"
    );
    assert!(set_has(&ns, "203.0.113.200"));
}

#[test]
fn out_of_descriptors_the_control_socket_waits_instead_of_spinning_and_recovers() {
    let r = ConfigDir::new();
    let main = r.main_config().host_id("nofile").log_firewall();
    r.write(
        &main,
        &[Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }").ban("1h")],
    );
    let d = Daemon::start_with_nofile(None, &r.cfg, &r.control, &[], 64);
    // More connections than the daemon has descriptors: it accepts what it
    // can (each waits up to 5 s for its request) and then accept fails.
    let held: Vec<_> = (0..200)
        .map(|_| std::os::unix::net::UnixStream::connect(&r.control).expect("connect"))
        .collect();
    std::thread::sleep(Duration::from_millis(300));
    let before = d.cpu_time();
    std::thread::sleep(Duration::from_secs(2));
    let used = d.cpu_time() - before;
    assert!(used < Duration::from_millis(500), "{used:?} of CPU in 2 s: spinning");
    let log = d.log_text();
    assert!(
        log.contains("Control socket: accept failed"),
        "descriptors were exhausted:\n{log}"
    );

    drop(held);
    wait_until(Duration::from_secs(20), "the control socket to answer again", || {
        common::control_status(&r.control).is_some()
    });
}

#[test]
fn an_address_the_host_takes_after_the_start_never_enters_its_nft_set() {
    let ns = NetNs::new("ownaddr");
    let r = rig();
    let d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    // Banned before it is ours: enforced.
    assert_eq!(enforced(&ban_reply(&r, "10.213.99.8")), Some(true));
    assert!(set_has(&ns, "10.213.99.8"));

    // A VIP arrives (keepalived, DHCP), then a ban of it.
    ns.run(&["ip", "addr", "add", "10.213.99.7/32", "dev", "lo"]);
    let reply = ban_reply(&r, "10.213.99.7");
    assert_eq!(enforced(&reply), Some(false), "{reply:?}");
    assert!(!set_has(&ns, "10.213.99.7"));
    let log = d.log_text();
    assert!(
        log.contains("Ban of a never-banned address") && log.contains("10.213.99.7"),
        "says why:\n{log}"
    );

    // The address already banned becomes ours: lifted here within the check.
    ns.run(&["ip", "addr", "add", "10.213.99.8/32", "dev", "lo"]);
    wait_until(Duration::from_secs(15), "the ban of our new address lifted", || {
        !set_has(&ns, "10.213.99.8")
    });
    let log = d.log_text();
    assert_eq!(
        log.matches("A ban covers an address this host now has").count(),
        1,
        "said once:\n{log}"
    );
    // Still in the list (the fleet's view), not in this host's kernel.
    assert_eq!(d.status()["bans_active"], 2);
}

fn pings(datagrams: &[String]) -> usize {
    datagrams
        .iter()
        .filter(|d| d.lines().any(|l| l == "WATCHDOG=1"))
        .count()
}

#[test]
fn a_hung_nft_stops_the_watchdog_pings_until_it_returns() {
    let ns = NetNs::new("hungnft");
    let r = rig();
    let shim = NftShim::new();
    let notify = NotifySocket::bind(r.path());
    let path = notify.path.to_string_lossy().into_owned();
    let mut env = shim.env();
    // Pings every 0.5 s; an nft call of 0.5 s or more stops them.
    env.extend([("NOTIFY_SOCKET", path.as_str()), ("WATCHDOG_USEC", "1000000")]);
    let d = Daemon::start_with_env(Some(&ns), &r.cfg, &r.control, &env);
    notify.expect("WATCHDOG=1", Duration::from_secs(10));
    assert!(
        pings(&notify.during(Duration::from_secs(2))) >= 2,
        "pinging while nft works"
    );

    // nft hangs on the ban's transaction (the pipeline itself stays idle).
    shim.hang();
    let reply = ban_reply(&r, "203.0.113.83");
    assert_eq!(
        enforced(&reply),
        Some(false),
        "not in the kernel while nft hangs: {reply:?}"
    );
    wait_until(Duration::from_secs(10), "an nft call hanging", || shim.hanging());
    // A ping already due may still go within the first half interval.
    notify.during(Duration::from_secs(1));
    let quiet = notify.during(Duration::from_millis(2500));
    assert_eq!(pings(&quiet), 0, "pinged while nft hung: {quiet:?}");
    assert!(
        d.log_text().contains("Enforcer stuck in an nft call"),
        "{}",
        d.log_text()
    );

    shim.release();
    notify.expect("WATCHDOG=1", Duration::from_secs(10));
    wait_until(Duration::from_secs(10), "the ban in nft", || {
        set_has(&ns, "203.0.113.83")
    });
}

/// Issue 14, item 4, the counting side: requests from an address the host
/// takes after the start are not counted from then on (the pipeline reads
/// the host's addresses again every second), so they ban nobody, in the
/// fleet's list or here; the same requests from another address do.
#[test]
fn requests_from_an_address_the_host_takes_later_are_never_counted() {
    let ns = NetNs::new("owncount");
    let r = rig();
    let mut d = Daemon::start(Some(&ns), &r.cfg, &r.control);
    ns.run(&["ip", "addr", "add", "10.213.98.7/32", "dev", "lo"]);
    wait_until(Duration::from_secs(10), "the new address seen", || {
        d.log_text().contains("This host has a new address")
    });
    let now = common::now_ms();
    let lines: String = (0..20)
        .map(|i| common::combined_line("10.213.98.7", now + i, "/", 200))
        .chain((0..20).map(|i| common::combined_line("203.0.113.99", now + i, "/", 200)))
        .collect();
    common::append(&r.log, &lines);
    wait_until(Duration::from_secs(10), "the other client banned", || {
        set_has(&ns, "203.0.113.99")
    });
    assert_eq!(d.status()["bans_active"], 1, "{}", d.status());
    assert!(!set_has(&ns, "10.213.98.7"));
    d.stop(Duration::from_secs(10));
}
