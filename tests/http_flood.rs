//! The decision endpoint under a flood of connections from one local
//! process (issue 25, item 2): any process that may open its socket
//! (www-data's, a PHP-FPM pool) holds 2,000 connections to it, half
//! trickling a request head a byte at a time, half idle after a complete
//! request, and reopens each one the daemon closes. Meanwhile a banned
//! client asking Debian's real nginx, with the shipped snippet, is still
//! refused (not let through by the snippet's fail-open), a good one is
//! served, and a fresh connection to the socket gets its answer (nginx's
//! connections to the daemon are all opened during the flood). The
//! daemon runs with 1024 descriptors, what systemd gives the shipped unit
//! (no `LimitNOFILE=`).

mod common;

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::flood::{flood, raise_nofile};
use common::{cli, http_get_headers, veth_pair, wait_until, Checker, ConfigDir, Daemon, NetNs, Nginx, Rule, Site};

const WEB: &str = "10.213.70.1";
const BANNED: &str = "10.213.70.2";
const GOOD: &str = "10.213.70.3";
/// Connections the flood holds open.
const FLOOD: usize = 2000;
/// What systemd gives a unit without `LimitNOFILE=`.
const DAEMON_NOFILE: u64 = 1024;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The shipped http-context snippet with the test's socket.
fn snippet(files: &ConfigDir, socket: &Path) -> String {
    common::shipped_snippet(files, socket).0
}

#[test]
fn a_flood_of_slow_and_idle_connections_neither_lets_a_banned_client_through_nor_starves_checks() {
    raise_nofile(FLOOD as u64 + 1024);
    let files = ConfigDir::new();
    let socket = files.path().join("http.sock");
    let web = NetNs::new("flw");
    let client = NetNs::new("flc");
    let (_, client_if) = veth_pair(&web, &format!("{WEB}/24"), &client, &format!("{BANNED}/24"));
    client.run(&["ip", "addr", "add", &format!("{GOOD}/24"), "dev", &client_if]);
    let site = Site {
        log_format: None,
        http: snippet(&files, &socket),
        server: format!(
            "include {};\n        location / {{ root {{www}}; try_files /ok =404; }}\n",
            repo_file("nginx/fleetban-location.conf").display()
        ),
    };
    let nginx = Nginx::start_site(&web, &format!("{WEB}:8080"), &site);
    let rule = Rule::new("pages", nginx.access_log(), "{ hits: 1000, window: 60s }");
    let main = files
        .main_config()
        .host_id("flood")
        .log_firewall()
        .http(&format!("{{ listen: '{}' }}", socket.display()));
    files.write(&main, &[rule]);
    let d = Daemon::start_with_nofile(None, &files.cfg, &files.control, &[], DAEMON_NOFILE);
    let out = cli(&files.cfg, &["ban", BANNED]);
    assert!(out.success(), "{}", out.text());
    let mut direct = Checker::unix(&socket);
    wait_until(Duration::from_secs(10), "the ban in the endpoint's view", || {
        direct.check(BANNED).status == 403
    });
    drop(direct);
    let get = |from: &str| {
        http_get_headers(
            &client,
            &format!("http://{WEB}:8080/page"),
            &["--interface", from],
            &["retry-after"],
            Duration::from_secs(3),
        )
    };
    // nginx has not asked yet: its pool of connections to the daemon is
    // empty when the flood begins, as after a reload or a quiet minute.

    let (stop, opened, reopened) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let flooder = {
        let (path, stop, opened, reopened) = (socket.clone(), stop.clone(), opened.clone(), reopened.clone());
        thread::spawn(move || flood(&path, FLOOD, &stop, &opened, &reopened))
    };
    wait_until(Duration::from_secs(30), "the flood's connections open", || {
        opened.load(Relaxed) > 0
    });
    assert_eq!(opened.load(Relaxed), FLOOD as u64, "every flood connection opened");
    // Trickled bytes, heads past their deadline, connections reopened.
    thread::sleep(Duration::from_secs(3));

    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(get(BANNED).map(|r| (r.status, r.headers[0].clone())));
        answers.push(get(GOOD).map(|r| (r.status, r.headers[0].clone())));
        thread::sleep(Duration::from_millis(100));
    }
    for (i, pair) in answers.chunks(2).enumerate() {
        let (b, g) = (&pair[0], &pair[1]);
        assert!(
            matches!(b, Ok((403, retry)) if retry.parse::<u64>().is_ok()),
            "banned request {i} through nginx during the flood: {b:?}; all: {answers:?}"
        );
        assert!(matches!(g, Ok((200, _))), "good request {i}: {g:?}");
    }
    // A fresh connection straight to the socket (its reads bounded: 5 s).
    let mut fresh = Checker::unix(&socket);
    let (banned, good) = (fresh.check(BANNED), fresh.check(GOOD));
    let status = d.status();
    stop.store(true, Relaxed);
    flooder.join().expect("the flood thread");
    assert_eq!((banned.status, good.status), (403, 204), "a fresh connection's answers");
    let h = &status["http"];
    assert!(h["evicted"].as_u64() > Some(0), "the table was full: {status}");
    assert!(h["head_timeouts"].as_u64() > Some(0), "tricklers timed out: {status}");
    assert!(h["connections"].as_u64() <= Some(DAEMON_NOFILE), "{status}");
    println!(
        "flood: {FLOOD} connections, {} reopened; daemon: {h}",
        reopened.load(Relaxed)
    );
}
