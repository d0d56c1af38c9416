//! The decision endpoint of `fleetban run` (`http:`) for real: the daemon
//! with the embedded store or a shared redis-server, its firewall a log
//! (nft is not what is under test here), asked as nginx asks it. A client
//! over a rule's limit, an operator's network ban, an IPv6 /64 and /128, a
//! ban made by another host on the same Redis or found by a reconcile:
//! denied here; an unban, the ban's end, or its absence at a reconcile
//! lifts it; a good client and a malformed header get 204,
//! and `status` counts.

mod common;

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{
    append, cli, combined_lines, fleetban_bin, free_port, wait_until, Checker, ConfigDir, Daemon, MainConfig, Redis,
    Rule,
};

/// A scraper rule on the dir's own log: at most 5 GETs a minute, banned
/// for `ban`.
fn scraper(r: &ConfigDir, ban: &str) -> Rule {
    Rule::new("scraper", &r.log, "{ hits: 5, window: 60s }")
        .matching("{ method: [GET] }")
        .ban(ban)
}

/// Asks until `addr` is answered `status` (bounded: 10 s).
fn wait_answer(c: &mut Checker, addr: &str, status: u16) {
    wait_until(Duration::from_secs(10), &format!("{addr} answered {status}"), || {
        c.check(addr).status == status
    });
}

fn has_group(name: &str) -> bool {
    std::fs::read_to_string("/etc/group")
        .unwrap_or_default()
        .lines()
        .any(|l| l.split(':').next() == Some(name))
}

#[test]
fn embedded_store_denies_the_banned_and_allows_the_rest() {
    let r = ConfigDir::new();
    let sock = r.path().join("run/http.sock");
    let main = r
        .main_config()
        .host_id("web-1")
        .log_firewall()
        .http(&format!("{{ listen: '{}' }}", sock.display()));
    r.write(&main, &[scraper(&r, "1h")]);
    let d = Daemon::start(None, &r.cfg, &r.control);
    assert!(
        d.log_text().contains("Decision endpoint on GET /check."),
        "{}",
        d.log_text()
    );
    let meta = std::fs::metadata(&sock).expect("the socket exists");
    if has_group("www-data") {
        assert_eq!(meta.permissions().mode() & 0o777, 0o660);
        assert_ne!(meta.gid(), 0, "the socket's group is www-data");
    } else {
        assert_eq!(meta.permissions().mode() & 0o777, 0o600);
    }

    let mut c = Checker::unix(&sock);
    assert_eq!(c.check("203.0.113.7").status, 204);
    let mut lines = combined_lines("203.0.113.7", 8, "/page", 200);
    lines += &combined_lines("2001:db8:1:2::77", 8, "/page", 200);
    lines += &combined_lines("203.0.113.50", 3, "/page", 200);
    append(&r.log, &lines);

    // Over the limit: denied, with the ban's time left.
    wait_answer(&mut c, "203.0.113.7", 403);
    let a = c.check("203.0.113.7");
    assert!(a.retry_after.is_some_and(|s| (3_500..=3_600).contains(&s)), "{a:?}");
    assert_eq!(c.check("::ffff:203.0.113.7").status, 403, "mapped IPv6 is its IPv4");
    // An IPv6 client is banned by its /64.
    wait_answer(&mut c, "2001:db8:1:2::1", 403);
    assert_eq!(c.check("2001:db8:1:3::1").status, 204);
    d.wait_lines(19);
    assert_eq!(c.check("203.0.113.50").status, 204, "under the limit");

    // An operator's network ban, then its unban.
    let out = cli(&r.cfg, &["ban", "198.51.100.0/24"]);
    assert!(out.success(), "{}", out.text());
    wait_answer(&mut c, "198.51.100.77", 403);
    assert_eq!(c.check("198.51.101.1").status, 204);
    let out = cli(&r.cfg, &["unban", "198.51.100.0/24"]);
    assert!(out.success(), "{}", out.text());
    wait_answer(&mut c, "198.51.100.77", 204);
    // One IPv6 address, inside a /64 nobody banned.
    let out = cli(&r.cfg, &["ban", "2001:db8:9::5", "--permanent"]);
    assert!(out.success(), "{}", out.text());
    wait_answer(&mut c, "2001:db8:9::5", 403);
    assert_eq!(c.check("2001:db8:9::5").retry_after, Some(86_400));
    assert_eq!(c.check("2001:db8:9::6").status, 204);

    // A ban that ends stops denying, whether or not anything removed it.
    let out = cli(&r.cfg, &["ban", "203.0.113.99", "--for", "1s"]);
    assert!(out.success(), "{}", out.text());
    wait_answer(&mut c, "203.0.113.99", 403);
    wait_answer(&mut c, "203.0.113.99", 204);

    // Malformed or missing: allowed, and counted.
    let bad = c.send("GET /check HTTP/1.1\r\nX-Client-Addr: 203.0.113.7, 10.0.0.1\r\n\r\n");
    assert_eq!(bad.status, 204);
    assert_eq!(c.send("GET /check HTTP/1.1\r\nHost: x\r\n\r\n").status, 204);
    assert_eq!(c.send("GET /metrics HTTP/1.1\r\n\r\n").status, 404);
    assert_eq!(c.send("POST /check HTTP/1.1\r\nContent-Length: 0\r\n\r\n").status, 405);

    let s = d.status();
    let h = &s["http"];
    assert_eq!(h["listen"], format!("unix:{}", sock.display()));
    assert_eq!(h["malformed"], 2, "{s}");
    let (checks, denials) = (h["checks"].as_u64().unwrap(), h["denials"].as_u64().unwrap());
    assert!(denials >= 8, "{s}");
    assert!(checks >= denials + 2 + 7, "{s}");
    // The latency quantiles are bucket bounds, in µs: p50 <= p99.
    let (p50, p99) = (
        h["p50_us"].as_u64().expect("p50_us"),
        h["p99_us"].as_u64().expect("p99_us"),
    );
    assert!(p50 >= 10 && p50 <= p99, "{s}");
    let text = cli(&r.cfg, &["status"]);
    assert!(
        text.stdout.contains(&format!("http:      unix:{}; ", sock.display()))
            && text.stdout.contains(&format!("answered within p50 {p50} µs, p99 ")),
        "{}",
        text.text()
    );
}

#[test]
fn a_ban_by_another_host_on_the_same_redis_is_denied_here_and_unban_lifts_it() {
    let redis = Redis::start();
    let addr = format!("127.0.0.1:{}", free_port());
    let here = ConfigDir::new();
    here.write(
        &here
            .main_config()
            .host_id("web-1")
            .log_firewall()
            .redis(&redis.url(), "reconcile_every: 1s")
            .http(&format!("{{ listen: '{addr}', deny_status: 429 }}")),
        &[scraper(&here, "10m")],
    );
    let there = ConfigDir::new();
    there.write(
        &there
            .main_config()
            .host_id("web-2")
            .log_firewall()
            .redis(&redis.url(), ""),
        &[scraper(&there, "10m")],
    );
    let _d_here = Daemon::start(None, &here.cfg, &here.control);
    let _d_there = Daemon::start(None, &there.cfg, &there.control);
    let mut c = Checker::tcp(&addr);
    assert_eq!(c.check("203.0.113.7").status, 204);

    append(&there.log, &combined_lines("203.0.113.7", 8, "/page", 200));
    wait_answer(&mut c, "203.0.113.7", 429);
    let a = c.check("203.0.113.7");
    assert!(a.retry_after.is_some_and(|s| (1..=600).contains(&s)), "{a:?}");
    assert_eq!(c.check("203.0.113.8").status, 204);

    let out = cli(&here.cfg, &["unban", "203.0.113.7"]);
    assert!(out.success(), "{}", out.text());
    wait_answer(&mut c, "203.0.113.7", 204);
    let out = cli(&there.cfg, &["ban", "198.51.100.0/24", "--permanent"]);
    assert!(out.success(), "{}", out.text());
    wait_answer(&mut c, "198.51.100.9", 429);
    assert_eq!(c.check("198.51.100.9").retry_after, Some(86_400));

    // Written to the list behind the events' back: a reconcile brings it,
    // and takes away what left the list the same way.
    let until = (common::now_ms() + 600_000).to_string();
    redis.cli(&["ZADD", "{fleetban}:bans", &until, "203.0.113.200"]);
    wait_answer(&mut c, "203.0.113.200", 429);
    redis.cli(&["ZREM", "{fleetban}:bans", "198.51.100.0/24"]);
    wait_answer(&mut c, "198.51.100.9", 204);
}

/// Runs `fleetban run -c cfg` until it exits (bounded: 20 s); its status
/// and stderr.
fn run_to_exit(cfg: &Path) -> (Option<i32>, String) {
    let err = cfg.with_extension("err");
    let mut child = Command::new(fleetban_bin())
        .args(["run", "-c"])
        .arg(cfg)
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("spawn fleetban run");
    let start = Instant::now();
    let status = loop {
        if let Some(st) = child.try_wait().unwrap() {
            break st.code();
        }
        if start.elapsed() > Duration::from_secs(20) {
            let _ = child.kill();
            let _ = child.wait();
            panic!("fleetban run did not exit");
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    (status, std::fs::read_to_string(&err).unwrap_or_default())
}

#[test]
fn an_endpoint_it_cannot_bind_fails_the_start() {
    let r = ConfigDir::new();
    // A regular file where the socket's folder should be.
    let blocked = r.path().join("not-a-dir");
    std::fs::write(&blocked, "").unwrap();
    let main = r
        .main_config()
        .log_firewall()
        .http(&format!("{{ listen: '{}' }}", blocked.join("http.sock").display()));
    r.write(&main, &[scraper(&r, "1h")]);
    let (code, err) = run_to_exit(&r.cfg);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("decision endpoint unix:"), "{err}");

    // A port already taken, the same.
    let taken = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = taken.local_addr().unwrap();
    let main: MainConfig = r.main_config().log_firewall().http(&format!("{{ listen: '{addr}' }}"));
    r.write(&main, &[scraper(&r, "1h")]);
    let (code, err) = run_to_exit(&r.cfg);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains(&format!("decision endpoint {addr}")), "{err}");
}
