//! Blocklists against a real kernel: a generated file of 100,000 networks
//! (with comments and garbage) read by `fleetban::blocklist` and loaded by
//! the nft enforcer inside a network namespace of the test's own, reloaded
//! by difference, and an allowed address inside a listed network still
//! connecting (needs root, `ip` and `nft`); and the daemon with the `log`
//! backend loading a file, showing it in `status`, applying a refresh,
//! keeping the last good networks when the file goes, and refusing bad
//! `blocklists:` entries with their line and column.

mod common;

use std::collections::BTreeSet;
use std::net::Ipv4Addr;
use std::path::PathBuf;
use std::time::Duration;

use common::{cli, wait_until, ConfigDir, Daemon, NetNs, Rule};
use fleetban::blocklist::{self, Format, Spec};
use fleetban::enforce::{Enforcer, NftOptions};
use ipnet::IpNet;
use serde_json::Value;

fn spec() -> Spec {
    Spec {
        file: PathBuf::from("/generated"),
        format: Format::Netset,
        refresh: Duration::from_secs(3600),
        max_entries: blocklist::DEFAULT_MAX_ENTRIES,
    }
}

/// `n` /24s two apart (never merged), starting at 20.0.0.0, plus `shift`
/// moved for the "changed" file: every 100th is replaced by one at 40.x.
fn generated(n: u32, changed: bool) -> (String, BTreeSet<String>) {
    let mut text = String::from("# generated netset\n#\n\n");
    let mut want = BTreeSet::new();
    for i in 0..n {
        let base = if changed && i % 100 == 0 {
            40u32 << 24
        } else {
            20u32 << 24
        };
        let a = Ipv4Addr::from(base + (i << 9));
        text.push_str(&format!("{a}/24\n"));
        want.insert(format!("{a}/24"));
        if i % 10_000 == 0 {
            text.push_str("garbage line\n999.1.2.3\n");
        }
    }
    // A listed /24 holding the allowed 127.0.0.2: split into 8 around it.
    text.push_str("127.0.0.0/24\n");
    for s in [
        "127.0.0.0/31",
        "127.0.0.3",
        "127.0.0.4/30",
        "127.0.0.8/29",
        "127.0.0.16/28",
        "127.0.0.32/27",
    ] {
        want.insert(s.to_owned());
    }
    want.insert("127.0.0.64/26".to_owned());
    want.insert("127.0.0.128/25".to_owned());
    (text, want)
}

fn nft_opts(ns: &NetNs) -> NftOptions {
    NftOptions {
        command: ["ip", "netns", "exec", &ns.name, "nft"].map(String::from).to_vec(),
        ..NftOptions::default()
    }
}

/// The networks of `family`'s blocklist sets (`block4` or `block6`: every
/// set `block4_L` holds the network addresses of the /L networks), written
/// `a.b.c.d/len`, or `a.b.c.d` for a whole address.
fn set_elements(ns: &NetNs, family: &str) -> BTreeSet<String> {
    let out = ns.run(&["nft", "-j", "list", "table", "inet", "fleetban"]);
    let v: Value = serde_json::from_slice(&out.stdout).unwrap();
    let mut got = BTreeSet::new();
    for o in v["nftables"].as_array().unwrap() {
        let Some(name) = o["set"]["name"].as_str() else {
            continue;
        };
        let Some(len) = name.strip_prefix(&format!("{family}_")) else {
            continue;
        };
        let full = if family == "block4" { "32" } else { "128" };
        for e in o["set"]["elem"].as_array().into_iter().flatten() {
            let a = e.as_str().unwrap_or_else(|| panic!("unexpected element {e} in {name}"));
            got.insert(match len == full {
                true => a.to_owned(),
                false => format!("{a}/{len}"),
            });
        }
    }
    got
}

#[tokio::test]
async fn loads_100k_networks_reloads_by_difference_and_allowed_still_connects() {
    let ns = NetNs::new("block");
    // 127.0.1.10 is reached from 127.0.0.2 (allowed), 127.0.1.11 from .3
    // (listed); the answers come from 127.0.1.x, which is not listed.
    for (dst, src) in [("127.0.1.10/32", "127.0.0.2"), ("127.0.1.11/32", "127.0.0.3")] {
        ns.run(&[
            "ip", "route", "add", "local", dst, "dev", "lo", "src", src, "table", "local",
        ]);
    }
    let allowed: Vec<IpNet> = vec!["127.0.0.2/32".parse().unwrap()];
    let (text, want) = generated(99_990, false);
    let loaded = blocklist::from_text(&text, &spec(), &allowed);
    assert_eq!(
        (loaded.listed, loaded.garbage, loaded.comments, loaded.split),
        (99_991, 20, 3, 1)
    );
    assert_eq!(loaded.nets.len(), 99_998);

    let mut e = Enforcer::nft(nft_opts(&ns)).unwrap();
    e.init(common::now_ms()).await.unwrap();
    // The interval sets of the first blocklist layout, left by an older
    // daemon: the first load replaces them.
    ns.run(&[
        "nft",
        "add set inet fleetban block4 { type ipv4_addr; flags interval; elements = { 10.9.0.0/16 } }",
    ]);
    ns.run(&[
        "nft",
        "add chain inet fleetban blocklist { type filter hook input priority -11; }",
    ]);
    ns.run(&["nft", "add rule inet fleetban blocklist ip saddr @block4 drop"]);
    let a = e.set_blocklist(&loaded.nets).await.unwrap();
    let listing =
        String::from_utf8_lossy(&ns.run(&["nft", "-t", "list", "table", "inet", "fleetban"]).stdout).to_string();
    assert!(
        !listing.contains("set block4 {") && listing.contains("set block4_24 {"),
        "{listing}"
    );
    assert!(a.full && a.added == 99_998, "{a:?}");
    // Read back until whole: a dump of a plain (hash) set while the kernel
    // still grows its table after 100k insertions can miss elements.
    wait_until(Duration::from_secs(20), "the listing to hold the whole list", || {
        set_elements(&ns, "block4").len() == 99_998
    });
    let got = set_elements(&ns, "block4");
    assert_eq!(got, want);
    assert!(
        !got.iter().any(|s| s.starts_with("127.0.0.2")),
        "the allowed address is not in the set"
    );
    assert_eq!(probe(&ns), ["PROBE 127.0.1.10 ok", "PROBE 127.0.1.11 fail"]);

    // 1% changed: only the difference goes to nft.
    let (text, want) = generated(99_990, true);
    let loaded = blocklist::from_text(&text, &spec(), &allowed);
    let a = e.set_blocklist(&loaded.nets).await.unwrap();
    assert_eq!(
        (a.full, a.added, a.deleted, a.total),
        (false, 1000, 1000, 99_998),
        "{a:?}"
    );
    wait_until(Duration::from_secs(20), "the listing to hold the changed list", || {
        set_elements(&ns, "block4") == want
    });
    assert_eq!(probe(&ns), ["PROBE 127.0.1.10 ok", "PROBE 127.0.1.11 fail"]);

    // The ban chain is untouched and still works beside the blocklist.
    let tables = ns.run(&["nft", "list", "table", "inet", "fleetban"]);
    let listing = String::from_utf8_lossy(&tables.stdout);
    assert!(
        listing.contains("chain blocklist") && listing.contains("chain input"),
        "{listing}"
    );

    // No file configured any more: chain and sets go.
    e.remove_blocklist().await.unwrap();
    let listing = String::from_utf8_lossy(&ns.run(&["nft", "list", "table", "inet", "fleetban"]).stdout).to_string();
    assert!(
        !listing.contains("block4_") && listing.contains("chain input"),
        "{listing}"
    );
    assert_eq!(probe(&ns), ["PROBE 127.0.1.10 ok", "PROBE 127.0.1.11 ok"]);
}

/// Helper for the test above, run inside the namespace as a child process;
/// does nothing in a normal test run.
#[test]
fn packet_probe_child() {
    common::probe::child();
}

fn probe(ns: &NetNs) -> Vec<String> {
    common::probe::run(ns, "127.0.1.10,127.0.1.11")
}

/// The main file with `blocklists:` (one line, after the other keys).
fn with_blocklists(c: &ConfigDir, entries: &str) {
    let main = c.main_config().log_firewall().allow("[198.51.100.7]");
    c.write(&main, &[Rule::new("web", &c.log, "{ hits: 10, window: 60s }")]);
    let yaml = format!("{}blocklists: {entries}\n", main.yaml());
    std::fs::write(&c.cfg, yaml).unwrap();
}

fn first_blocklist(d: &Daemon) -> Value {
    d.status()["blocklists"][0].clone()
}

#[test]
fn daemon_loads_shows_refreshes_and_keeps_the_last_good_list() {
    let c = ConfigDir::new();
    let list = c.path().join("drop.txt");
    std::fs::write(
        &list,
        "; DROP\n192.0.2.0/24 ; SBL1\n198.51.100.0/24 ; SBL2\nbogus ; SBL3\n",
    )
    .unwrap();
    with_blocklists(&c, "[{ file: drop.txt, format: drop, refresh: 1s }]");
    // In a namespace of its own: only loopback is this host's (the test
    // machine's own addresses would be taken out of the list too).
    let ns = NetNs::new("blkd");
    let d = Daemon::start(Some(&ns), &c.cfg, &c.control);
    let b = first_blocklist(&d);
    assert_eq!(b["file"], list.display().to_string());
    // 198.51.100.0/24 minus the allowed .7: 8 networks, and 192.0.2.0/24.
    assert_eq!((b["entries"].as_u64(), b["listed"].as_u64()), (Some(9), Some(2)), "{b}");
    assert_eq!(
        (b["skipped_lines"].as_u64(), b["split_entries"].as_u64()),
        (Some(1), Some(1)),
        "{b}"
    );
    assert!(b["last_refresh"].as_str().is_some_and(|t| t.contains('T')), "{b}");
    assert!(b["error"].is_null(), "{b}");
    let log = d.log_text();
    assert!(
        log.contains("drop.txt:4: \\\"bogus\\\"") || log.contains("drop.txt:4: \"bogus\""),
        "{log}"
    );
    assert!(log.contains("dry run: blocklist sets would change"), "{log}");

    // A refresh picks up a change: one network more.
    std::fs::write(&list, "192.0.2.0/24\n198.51.100.0/24\n203.0.113.0/24\n").unwrap();
    wait_until(Duration::from_secs(10), "the refresh to load the change", || {
        first_blocklist(&d)["entries"].as_u64() == Some(10)
    });
    assert!(d.log_text().contains("added=1"), "{}", d.log_text());

    // The file goes: the last good networks stay, the error is shown.
    std::fs::remove_file(&list).unwrap();
    wait_until(Duration::from_secs(10), "the missing file to be reported", || {
        first_blocklist(&d)["error"]
            .as_str()
            .is_some_and(|e| e.contains("drop.txt"))
    });
    assert_eq!(first_blocklist(&d)["entries"].as_u64(), Some(10));
    assert!(d
        .log_text()
        .contains("Blocklist unreadable; its last good networks stay dropped."));
    assert!(!d.log_text().contains("would delete the blocklist"));

    // The human status shows the file.
    let out = cli(&c.cfg, &["status"]);
    assert!(out.text().contains("drop.txt"), "{}", out.text());

    // explain names the blocklist network holding an address, and none
    // for the allowed one inside it.
    std::fs::write(&list, "198.51.100.0/24 ; SBL2\n").unwrap();
    let e = cli(&c.cfg, &["explain", "--json", "198.51.100.9"]);
    let v: Value = serde_json::from_str(&e.stdout).unwrap_or_else(|_| panic!("{}", e.text()));
    assert_eq!(
        v["blocklisted"],
        serde_json::json!([format!("{}: 198.51.100.8/29", list.display())]),
        "{v}"
    );
    let v: Value = serde_json::from_str(&cli(&c.cfg, &["explain", "--json", "198.51.100.7"]).stdout).unwrap();
    assert_eq!(v["blocklisted"], serde_json::json!([]), "{v}");
}

#[test]
fn bad_blocklist_entries_name_line_and_column() {
    let c = ConfigDir::new();
    with_blocklists(&c, "[{ file: a.txt, format: netset, refresh: 0s, max_entries: 0 }]");
    let out = cli(&c.cfg, &["check"]);
    assert!(!out.success());
    let text = out.text();
    let line = text
        .lines()
        .find(|l| l.contains("refresh must be at least 1s"))
        .unwrap_or_else(|| panic!("{text}"));
    assert!(
        line.contains("fleetban.yaml:") && line.matches(':').count() >= 3,
        "{line}"
    );
    assert!(text.contains("max_entries must be between 1 and 5000000"), "{text}");
    with_blocklists(&c, "[{ file: a.txt, format: csv }]");
    let text = cli(&c.cfg, &["check"]).text();
    assert!(text.contains("fleetban.yaml:") && text.contains("csv"), "{text}");
    with_blocklists(&c, "[{ file: a.txt, format: netset, refersh: 1h }]");
    let text = cli(&c.cfg, &["check"]).text();
    assert!(text.contains("refersh"), "{text}");
}

#[test]
fn daemon_with_nft_loads_and_refreshes_the_sets() {
    let c = ConfigDir::new();
    let list = c.path().join("list.netset");
    std::fs::write(&list, "# x\n192.0.2.0/24\n2001:db8::/32\njunk\n").unwrap();
    let main = c.main_config();
    c.write(&main, &[Rule::new("web", &c.log, "{ hits: 10, window: 60s }")]);
    std::fs::write(
        &c.cfg,
        format!(
            "{}blocklists: [{{ file: list.netset, format: netset, refresh: 1s }}]\n",
            main.yaml()
        ),
    )
    .unwrap();
    let ns = NetNs::new("blkn");
    let d = Daemon::start(Some(&ns), &c.cfg, &c.control);
    let want = |v4: &[&str], v6: &[&str]| {
        let s = |l: &[&str]| l.iter().map(|x| x.to_string()).collect::<BTreeSet<String>>();
        (s(v4), s(v6))
    };
    wait_until(Duration::from_secs(10), "the daemon to load the sets", || {
        ns.exec(&["nft", "list", "set", "inet", "fleetban", "block6_32"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    assert_eq!(
        (set_elements(&ns, "block4"), set_elements(&ns, "block6")),
        want(&["192.0.2.0/24"], &["2001:db8::/32"])
    );
    std::fs::write(&list, "198.51.100.0/24\n2001:db8::/32\n").unwrap();
    wait_until(Duration::from_secs(10), "the refresh to reach nft", || {
        set_elements(&ns, "block4") == want(&["198.51.100.0/24"], &[]).0
    });
    assert_eq!(set_elements(&ns, "block6"), want(&[], &["2001:db8::/32"]).1);
    assert_eq!(d.status()["blocklists"][0]["entries"].as_u64(), Some(2));

    // Restarted without `blocklists:`: the chain and sets the earlier
    // configuration left in the table are removed, never kept dropping.
    let mut d = d;
    d.stop(Duration::from_secs(10));
    std::fs::write(&c.cfg, main.yaml()).unwrap();
    let _d = Daemon::start(Some(&ns), &c.cfg, &c.control);
    let table = || {
        let out = ns.exec(&["nft", "list", "table", "inet", "fleetban"]).output().unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    };
    wait_until(Duration::from_secs(10), "the old blocklist removed", || {
        let t = table();
        !t.contains("block4") && !t.contains("chain blocklist")
    });
    assert!(table().contains("chain input"), "{}", table());
}

/// A blocklist entry that would drop (nearly) everything is refused as an
/// operator's ban of it is (issue 25, item 4): `0.0.0.0/0`, `::/0`, a mapped
/// `::ffff:0.0.0.0/96` and `224.0.0.0/3` are wider than IPv4 /8 or IPv6 /16.
/// None reaches the kernel (the next entry does), `status` counts them,
/// `check` names each by file and line, and `fleetban ban` refuses the
/// same width where no never-banned address is inside (`128.0.0.0/1`).
#[test]
fn blocklist_networks_wider_than_the_widest_are_refused_and_named() {
    let c = ConfigDir::new();
    let list = c.path().join("wide.netset");
    std::fs::write(
        &list,
        "0.0.0.0/0\n::/0\n# comment\n::ffff:0.0.0.0/96\n224.0.0.0/3\n198.51.100.0/24\n10.0.0.0/8\n2001:db8::/32\n",
    )
    .unwrap();
    let main = c.main_config();
    c.write(&main, &[Rule::new("web", &c.log, "{ hits: 10, window: 60s }")]);
    std::fs::write(
        &c.cfg,
        format!("{}blocklists: [{{ file: wide.netset, format: netset }}]\n", main.yaml()),
    )
    .unwrap();

    let text = cli(&c.cfg, &["check"]).text();
    for (line, net) in [(1, "0.0.0.0/0"), (2, "::/0"), (4, "0.0.0.0/0"), (5, "224.0.0.0/3")] {
        let want = format!(
            "warning: {}:{line}: {net} is wider than /8 (IPv4) or /16 (IPv6)",
            list.display()
        );
        assert!(text.contains(&want), "{want}\n{text}");
    }
    assert!(!text.contains(":6: "), "{text}");

    let ns = NetNs::new("blkwide");
    let d = Daemon::start(Some(&ns), &c.cfg, &c.control);
    wait_until(Duration::from_secs(10), "the daemon to load the sets", || {
        ns.exec(&["nft", "list", "set", "inet", "fleetban", "block6_32"])
            .output()
            .is_ok_and(|o| o.status.success())
    });
    let s = |l: &[&str]| l.iter().map(|x| x.to_string()).collect::<BTreeSet<String>>();
    assert_eq!(set_elements(&ns, "block4"), s(&["10.0.0.0/8", "198.51.100.0/24"]));
    assert_eq!(set_elements(&ns, "block6"), s(&["2001:db8::/32"]));
    let b = &d.status()["blocklists"][0];
    assert_eq!(b["too_wide"].as_u64(), Some(4), "{b}");
    assert_eq!(b["entries"].as_u64(), Some(3), "{b}");

    let out = cli(&c.cfg, &["ban", "128.0.0.0/1"]);
    assert!(!out.success(), "{}", out.text());
    assert!(
        out.text().contains("wider than /8 (IPv4) or /16 (IPv6)"),
        "{}",
        out.text()
    );
    assert!(cli(&c.cfg, &["ban", "11.0.0.0/8"]).success());
}

/// Issue 26, item 4: `check` reads every blocklist as the daemon does: a
/// line per file with the networks it yields (the allowed address cut
/// out), its refusals by line, and a warning for a file missing, one it
/// cannot read (a directory) and one that yields nothing; exit 0.
#[test]
fn check_says_what_each_blocklist_yields_and_warns_about_those_it_cannot_read() {
    let c = ConfigDir::new();
    std::fs::write(
        c.path().join("good.netset"),
        "# x\n198.51.100.0/24\n0.0.0.0/0\nnot-a-net\n192.0.2.0/24\n",
    )
    .unwrap();
    std::fs::write(c.path().join("allowed.txt"), "198.51.100.7/32 ; SBL1\n").unwrap();
    std::fs::create_dir(c.path().join("dir.netset")).unwrap();
    with_blocklists(
        &c,
        "[{ file: good.netset, format: netset, refresh: 90s }, { file: gone.netset, format: netset }, \
         { file: dir.netset, format: netset }, { file: allowed.txt, format: drop }]",
    );
    let out = cli(&c.cfg, &["check"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let p = |f: &str| c.path().join(f).display().to_string();
    let lines: Vec<&str> = out.stdout.lines().collect();
    let has = |want: &str| assert!(lines.contains(&want), "no line `{want}`:\n{}", out.stdout);
    // 198.51.100.0/24 around .7 is 8 networks, and 192.0.2.0/24.
    has(&format!(
        "  blocklist {} (netset, refresh 90s): 2 networks listed, refused 1 too wide, 1 not a network \
         (1 split around never-banned networks), yields 9 network(s) to drop",
        p("good.netset")
    ));
    has(&format!(
        "warning: {}:3: 0.0.0.0/0 is wider than /8 (IPv4) or /16 (IPv6), the widest network fleetban drops: refused",
        p("good.netset")
    ));
    has(&format!(
        "warning: {}:4: \"not-a-net\" is not a network: skipped",
        p("good.netset")
    ));
    has(&format!(
        "warning: blocklist {}: missing (no such file); the daemon drops nothing from it until it can read it",
        p("gone.netset")
    ));
    let dir = format!("warning: blocklist {}: unreadable (", p("dir.netset"));
    assert!(lines.iter().any(|l| l.starts_with(&dir)), "{dir}\n{}", out.stdout);
    has(&format!(
        "  blocklist {} (drop, refresh 1h): 1 networks listed (1 wholly never banned), yields 0 network(s) to drop",
        p("allowed.txt")
    ));
    has(&format!(
        "warning: blocklist {}: yields no network: the daemon drops nothing from it",
        p("allowed.txt")
    ));
}
