//! `notify:` against a real receiver on loopback (tests/common/receiver.rs)
//! and real daemons (the `log` firewall; a redis-server of the test's own
//! where the fleet matters): one signed POST per ban for the whole fleet,
//! a retry after a 5xx and none after a 4xx, a burst folded into
//! summaries, the slack and ntfy shapes, the valve and unban events,
//! `check` validating the section and `--notify-test`, and no secret in
//! logs, `status` or `check`.

mod common;

use std::io::Write;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::receiver::{Post, Receiver};
use common::{append, cli, combined_line, combined_lines, now_ms, wait_until, ConfigDir, Daemon, Redis, Rule};

const WAIT: Duration = Duration::from_secs(30);

/// HMAC-SHA256 by openssl: not the implementation under test.
fn openssl_hmac(key: &str, body: &[u8]) -> String {
    let mut child = Command::new(common::require("openssl"))
        .args(["dgst", "-sha256", "-hmac", key, "-r"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn()
        .expect("run openssl");
    child.stdin.take().unwrap().write_all(body).unwrap();
    let out = child.wait_with_output().unwrap();
    String::from_utf8_lossy(&out.stdout)
        .split_whitespace()
        .next()
        .unwrap()
        .to_owned()
}

fn notify_status(d: &Daemon) -> Vec<serde_json::Value> {
    d.status()["notify"].as_array().cloned().unwrap_or_default()
}

fn sum(d: &[&Daemon], field: &str) -> u64 {
    d.iter()
        .flat_map(|d| notify_status(d))
        .map(|t| t[field].as_u64().unwrap_or(0))
        .sum()
}

fn events(posts: &[Post], kind: &str) -> Vec<serde_json::Value> {
    posts.iter().map(Post::json).filter(|j| j["event"] == kind).collect()
}

#[test]
fn two_hosts_sharing_redis_send_exactly_one_signed_post_for_a_ban_spread_over_both() {
    let redis = Redis::start();
    let receiver = Receiver::start(&[]);
    let hosts: Vec<ConfigDir> = (0..2).map(|_| ConfigDir::new()).collect();
    let secret = hosts[0].path().join("webhook.secret");
    std::fs::write(&secret, "s3cr3t-key\n").unwrap();
    let daemons: Vec<Daemon> = hosts
        .iter()
        .enumerate()
        .map(|(i, h)| {
            h.write(
                &h.main_config()
                    .host_id(&format!("web-{i}"))
                    .log_firewall()
                    .notify(&format!(
                        "[{{ url: '{}', format: json, secret_file: '{}' }}]",
                        receiver.url("/hook"),
                        secret.display()
                    ))
                    .redis(&redis.url(), "hold: 0s"),
                &[Rule::new("scraper", &h.log, "{ hits: 10, window: 60s }").ban("1h")],
            );
            Daemon::start(None, &h.cfg, &h.control)
        })
        .collect();
    // The attacker's requests alternate between the two hosts.
    for _ in 0..10 {
        for h in &hosts {
            append(&h.log, &combined_line("198.51.100.77", now_ms(), "/", 200));
        }
    }
    wait_until(WAIT, "both hosts enforce the ban", || {
        daemons.iter().all(|d| d.status()["bans_active"].as_u64() >= Some(1))
    });
    // (A limit of 10 bans at the 11th hit.) Each host queued what it would tell before its view had the ban; now
    // every queued message is delivered (or failed) and the receiver has
    // all that was sent.
    let d: Vec<&Daemon> = daemons.iter().collect();
    wait_until(WAIT, "the notifications delivered", || {
        sum(&d, "queued") == 0 && sum(&d, "sent") >= 1 && receiver.posts().len() as u64 == sum(&d, "sent")
    });
    let posts = receiver.posts();
    assert_eq!(
        posts.len(),
        1,
        "one notification for the fleet: {:?}",
        posts.iter().map(Post::text).collect::<Vec<_>>()
    );
    assert_eq!(sum(&d, "failed"), 0);
    let p = &posts[0];
    assert_eq!(p.request_line, "POST /hook HTTP/1.1");
    assert_eq!(p.header("content-type"), Some("application/json"));
    let sig = p.header("x-fleetban-signature").expect("signed");
    assert_eq!(sig, format!("sha256={}", openssl_hmac("s3cr3t-key", &p.body)));
    let j = p.json();
    assert_eq!(j["event"], "ban");
    assert_eq!(j["addr"], "198.51.100.77");
    assert_eq!(j["rule"], "scraper");
    assert_eq!(j["network"], false);
    assert!(j["host"] == "web-0" || j["host"] == "web-1", "{j}");
    assert!(j["until"].as_str().is_some_and(|u| u.ends_with('Z')), "{j}");
    assert!(j["at"].as_str().is_some_and(|u| u.ends_with('Z')), "{j}");
    assert!(j["hits"].as_u64() >= Some(10), "{j}");
}

/// One host, the embedded store, the log firewall, `notify` as given.
fn single(notify: &str, safety: &str, limit: &str) -> (ConfigDir, Daemon) {
    let c = ConfigDir::new();
    let mut main = c.main_config().host_id("solo").log_firewall().notify(notify);
    if !safety.is_empty() {
        main = main.safety(safety);
    }
    c.write(&main, &[Rule::new("scraper", &c.log, limit).ban("1h")]);
    let d = Daemon::start(None, &c.cfg, &c.control);
    (c, d)
}

#[test]
fn a_receiver_answering_500_then_200_gets_the_ban_once_after_the_retry() {
    let receiver = Receiver::start(&[500]);
    let (c, d) = single(
        &format!("[{{ url: '{}' }}]", receiver.url("/")),
        "",
        "{ hits: 3, window: 60s }",
    );
    append(&c.log, &combined_lines("203.0.113.5", 4, "/", 200));
    wait_until(WAIT, "the ban delivered", || sum(&[&d], "sent") == 1);
    let posts = receiver.posts();
    assert_eq!(posts.len(), 2, "the 500, then the retry: {posts:?}");
    assert_eq!(posts[0].body, posts[1].body, "the same message again");
    assert_eq!(posts[1].json()["addr"], "203.0.113.5");
    let t = &notify_status(&d)[0];
    assert_eq!((t["failed"].as_u64(), t["queued"].as_u64()), (Some(0), Some(0)), "{t}");
}

#[test]
fn a_4xx_is_not_retried_and_shows_in_status_and_metrics() {
    let receiver = Receiver::start(&[404]);
    let c = ConfigDir::new();
    let port = common::free_port();
    c.write(
        &c.main_config()
            .log_firewall()
            .metrics(&format!("127.0.0.1:{port}"))
            .notify(&format!("[{{ url: '{}' }}]", receiver.url("/gone"))),
        &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &c.cfg, &c.control);
    append(&c.log, &combined_lines("203.0.113.6", 4, "/", 200));
    wait_until(WAIT, "the ban given up on", || sum(&[&d], "failed") == 1);
    // A second ban goes through: had the first been retried, the receiver
    // would have read it again before this one (one sender, in order).
    append(&c.log, &combined_lines("203.0.113.8", 4, "/", 200));
    wait_until(WAIT, "the second ban delivered", || sum(&[&d], "sent") == 1);
    let posts = receiver.posts();
    let addrs: Vec<String> = posts.iter().map(|p| p.json()["addr"].to_string()).collect();
    assert_eq!(addrs, ["\"203.0.113.6\"", "\"203.0.113.8\""], "no retry of the 404");
    let t = &notify_status(&d)[0];
    assert!(t["last_error"].as_str().is_some_and(|e| e.contains("HTTP 404")), "{t}");
    assert_eq!(t["target"], format!("http://127.0.0.1:{}", receiver.port));
    let metrics = common::metrics::http_get(&format!("127.0.0.1:{port}"), "/metrics");
    let target = format!("target=\"0:http://127.0.0.1:{}\"", receiver.port);
    for line in [
        format!("fleetban_notify_failed_total{{{target}}} 1"),
        format!("fleetban_notify_sent_total{{{target}}} 1"),
        format!("fleetban_notify_dropped_total{{{target}}} 0"),
    ] {
        assert!(metrics.contains(&line), "{line} in\n{metrics}");
    }
    assert!(!metrics.contains("/gone"), "no path in the metrics");
}

#[test]
fn a_burst_of_1000_bans_yields_summaries_not_1000_posts() {
    let receiver = Receiver::start(&[]);
    let (c, d) = single(
        &format!("[{{ url: '{}' }}]", receiver.url("/")),
        "{ max_bans_per_minute: 100000 }",
        "{ hits: 1, window: 60s }",
    );
    let now = now_ms();
    let lines: String = (0..1000)
        .map(|i| combined_line(&format!("10.9.{}.{}", i / 200, i % 200 + 1), now, "/", 200).repeat(2))
        .collect();
    append(&c.log, &lines);
    wait_until(WAIT, "1000 bans", || d.status()["bans"].as_u64() == Some(1000));
    wait_until(WAIT, "every ban told, one by one or summarised", || {
        let posts = receiver.posts();
        let single = events(&posts, "ban").len() as u64;
        let summed: u64 = events(&posts, "summary")
            .iter()
            .map(|s| s["bans"].as_u64().unwrap())
            .sum();
        single + summed == 1000
    });
    let posts = receiver.posts();
    let summaries = events(&posts, "summary");
    // At most five a second are told one by one (this debug build bans
    // the 1000 over a few seconds); the rest are in summaries.
    assert!(posts.len() < 100, "{} posts for 1000 bans", posts.len());
    assert!(!summaries.is_empty());
    let s = &summaries[0];
    assert_eq!(s["host"], "solo");
    assert_eq!(s["top_rules"][0]["rule"], "scraper");
    let top = s["top_networks"].as_array().unwrap();
    assert!(!top.is_empty() && top.len() <= 5, "{s}");
    assert!(top[0]["network"].as_str().unwrap().starts_with("10.9."), "{s}");
    assert!(top[0]["network"].as_str().unwrap().ends_with(".0/24"), "{s}");
    assert_eq!(
        sum(&[&d], "folded"),
        summaries.iter().map(|s| s["bans"].as_u64().unwrap()).sum::<u64>()
    );
}

#[test]
fn slack_and_ntfy_bodies_have_their_documented_shapes() {
    let receiver = Receiver::start(&[]);
    let (c, d) = single(
        &format!(
            "[{{ url: '{}', format: slack }}, {{ url: '{}', format: ntfy }}]",
            receiver.url("/slack"),
            receiver.url("/ntfy")
        ),
        "",
        "{ hits: 3, window: 60s }",
    );
    append(&c.log, &combined_lines("203.0.113.9", 4, "/", 200));
    wait_until(WAIT, "both targets told", || sum(&[&d], "sent") == 2);
    let posts = receiver.posts();
    let slack = posts.iter().find(|p| p.request_line.contains("/slack")).unwrap();
    assert_eq!(slack.header("content-type"), Some("application/json"));
    let j = slack.json();
    let o = j.as_object().unwrap();
    assert_eq!(
        o.keys().collect::<Vec<_>>(),
        ["text"],
        "an incoming-webhook message: {j}"
    );
    let text = o["text"].as_str().unwrap();
    assert!(text.contains("203.0.113.9") && text.contains("scraper"), "{text}");
    let ntfy = posts.iter().find(|p| p.request_line.contains("/ntfy")).unwrap();
    assert_eq!(ntfy.header("content-type"), Some("text/plain; charset=utf-8"));
    assert_eq!(ntfy.header("title"), Some("fleetban: banned 203.0.113.9"));
    assert!(ntfy.header("tags").is_some());
    assert!(
        ntfy.text().starts_with("Banned address 203.0.113.9 until "),
        "{}",
        ntfy.text()
    );
}

#[test]
fn filters_the_valve_and_an_operator_unban_are_told_as_configured() {
    let receiver = Receiver::start(&[]);
    let (c, d) = single(
        &format!(
            "[{{ url: '{}', events: [ban, unban, valve], min_duration: 2h }}]",
            receiver.url("/")
        ),
        "{ max_bans_per_minute: 1 }",
        "{ hits: 3, window: 60s }",
    );
    // A rule ban of 1h: shorter than min_duration, not told.
    append(&c.log, &combined_lines("203.0.113.20", 4, "/", 200));
    // The valve refuses the second ban of the minute: tripped.
    append(&c.log, &combined_lines("203.0.113.21", 4, "/", 200));
    wait_until(WAIT, "the valve tripped told", || {
        !events(&receiver.posts(), "valve").is_empty()
    });
    // An operator's permanent ban passes the filter; its unban is told.
    let out = cli(&c.cfg, &["ban", "198.51.100.40", "--permanent", "--reason", "by hand"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let out = cli(&c.cfg, &["unban", "198.51.100.40"]);
    assert_eq!(out.code, 0, "{}", out.text());
    wait_until(WAIT, "the unban told", || {
        !events(&receiver.posts(), "unban").is_empty()
    });
    let posts = receiver.posts();
    let bans = events(&posts, "ban");
    assert_eq!(bans.len(), 1, "only the operator's permanent ban: {bans:?}");
    assert_eq!(bans[0]["addr"], "198.51.100.40");
    assert_eq!(bans[0]["until"], serde_json::Value::Null);
    assert_eq!(bans[0]["reason"], "by hand");
    let valve = &events(&posts, "valve")[0];
    assert_eq!(
        (&valve["state"], &valve["max_bans_per_minute"]),
        (&"tripped".into(), &1.into())
    );
    assert_eq!(events(&posts, "unban")[0]["addr"], "198.51.100.40");
    drop(d);
}

#[test]
fn check_validates_the_section_and_notify_test_sends_one_test_event() {
    let c = ConfigDir::new();
    let bad = [
        (
            "[{ url: 'http://hooks.example.com/x' }]",
            "http:// is allowed only to loopback",
        ),
        (
            "[{ url: 'https://h.example/x', secret_file: missing.secret }]",
            "cannot read",
        ),
        (
            "[{ url: 'https://h.example/x', events: [ban, bann] }]",
            "unknown event `bann`",
        ),
        (
            "[{ url: 'https://h.example/x', rules: [scrapper] }]",
            "no rule is named `scrapper`",
        ),
        ("[{ url: 'https://h.example/x', format: xml }]", "xml"),
    ];
    for (section, want) in bad {
        c.write(
            &c.main_config().log_firewall().notify(section),
            &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }")],
        );
        let out = cli(&c.cfg, &["check"]);
        assert_eq!(out.code, 2, "{section}: {}", out.text());
        assert!(out.stderr.contains(want), "{section}: want {want:?} in {}", out.stderr);
        assert!(
            out.stderr.contains("fleetban.yaml:4:"),
            "names the line: {}",
            out.stderr
        );
    }
    let receiver = Receiver::start(&[]);
    let secret = c.path().join("hook.secret");
    std::fs::write(&secret, "k3y-never-shown").unwrap();
    c.write(
        &c.main_config().host_id("checker").log_firewall().notify(&format!(
            "[{{ url: '{}', secret_file: hook.secret }}]",
            receiver.url("/path-token-xyz")
        )),
        &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }")],
    );
    let out = cli(&c.cfg, &["check", "--online"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("nothing sent"), "{}", out.stdout);
    assert!(receiver.posts().is_empty(), "--online alone sends nothing");
    let out = cli(&c.cfg, &["check", "--online", "--notify-test"]);
    assert_eq!(out.code, 0, "{}", out.text());
    assert!(out.stdout.contains("test event sent, HTTP 200"), "{}", out.stdout);
    let posts = receiver.posts();
    assert_eq!(posts.len(), 1);
    assert_eq!(
        (&posts[0].json()["event"], &posts[0].json()["host"]),
        (&"test".into(), &"checker".into())
    );
    assert_eq!(
        posts[0].header("x-fleetban-signature").map(str::to_owned),
        Some(format!("sha256={}", openssl_hmac("k3y-never-shown", &posts[0].body)))
    );
    for args in [
        &["check"][..],
        &["check", "--json"],
        &["check", "--online", "--notify-test"],
    ] {
        let out = cli(&c.cfg, args);
        for secret in ["path-token-xyz", "k3y-never-shown"] {
            assert!(!out.text().contains(secret), "{args:?} shows {secret}: {}", out.text());
        }
    }
    drop(receiver);
    // A target that does not answer fails the test, exit 1.
    let out = cli(&c.cfg, &["check", "--online", "--notify-test"]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(out.stdout.contains("FAILED: connect"), "{}", out.stdout);
}

#[test]
fn secrets_never_appear_in_the_log_or_status() {
    let receiver = Receiver::start(&[401, 401]);
    let c = ConfigDir::new();
    std::fs::write(c.path().join("hook.secret"), "k3y-never-shown").unwrap();
    c.write(
        &c.main_config().log_firewall().notify(&format!(
            "[{{ url: '{}', secret_file: hook.secret }}]",
            receiver.url("/T0KEN-in-path")
        )),
        &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &c.cfg, &c.control);
    append(&c.log, &combined_lines("203.0.113.30", 4, "/", 200));
    wait_until(WAIT, "the failure counted", || sum(&[&d], "failed") == 1);
    let status = d.status().to_string();
    let text = cli(&c.cfg, &["status"]).text();
    assert!(text.contains("HTTP 401"), "{text}");
    for shown in [status, text, d.log_text()] {
        for secret in ["T0KEN", "k3y-never-shown"] {
            assert!(!shown.contains(secret), "{secret} in {shown}");
        }
    }
}

#[test]
fn a_redis_outage_and_its_end_are_told() {
    let mut redis = Redis::start();
    let receiver = Receiver::start(&[]);
    let c = ConfigDir::new();
    c.write(
        &c.main_config()
            .host_id("web-r")
            .log_firewall()
            .notify(&format!("[{{ url: '{}', events: [redis] }}]", receiver.url("/")))
            .redis(&redis.url(), ""),
        &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }").ban("1h")],
    );
    let d = Daemon::start(None, &c.cfg, &c.control);
    wait_until(WAIT, "Redis connected", || d.status()["redis"]["state"] == "connected");
    redis.kill();
    wait_until(WAIT, "the outage told", || {
        !events(&receiver.posts(), "redis").is_empty()
    });
    redis.restart();
    wait_until(WAIT, "its end told", || events(&receiver.posts(), "redis").len() == 2);
    let ev = events(&receiver.posts(), "redis");
    assert_eq!((&ev[0]["state"], &ev[0]["host"]), (&"down".into(), &"web-r".into()));
    assert_eq!(ev[1]["state"], "up");
    assert!(events(&receiver.posts(), "ban").is_empty());
}

#[test]
fn an_https_target_is_spoken_to_in_tls_and_a_plain_answer_fails_the_handshake() {
    // A server that answers plain HTTP at once, whatever it is sent.
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let port = listener.local_addr().unwrap().port();
    let server = std::thread::spawn(move || {
        let (mut conn, _) = listener.accept().unwrap();
        let _ = conn.write_all(b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n");
        let mut first = [0u8; 1];
        let _ = std::io::Read::read(&mut conn, &mut first);
        first[0]
    });
    let c = ConfigDir::new();
    c.write(
        &c.main_config()
            .log_firewall()
            .notify(&format!("[{{ url: 'https://127.0.0.1:{port}/hook' }}]")),
        &[Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }")],
    );
    let out = cli(&c.cfg, &["check", "--online", "--notify-test"]);
    assert_eq!(out.code, 1, "{}", out.text());
    assert!(
        out.stdout.contains(&format!(
            "notify: https://127.0.0.1:{port} (json; events ban, valve, redis): FAILED: TLS:"
        )),
        "{}",
        out.stdout
    );
    // 0x16: a TLS handshake record, the ClientHello.
    assert_eq!(server.join().unwrap(), 0x16);
}

#[test]
fn a_reload_keeps_the_running_targets_and_says_a_change_needs_a_restart() {
    let (first, second) = (Receiver::start(&[]), Receiver::start(&[]));
    let (c, d) = single(
        &format!("[{{ url: '{}' }}]", first.url("/")),
        "",
        "{ hits: 3, window: 60s }",
    );
    let rules = [Rule::new("scraper", &c.log, "{ hits: 3, window: 60s }").ban("1h")];
    c.write(
        &c.main_config()
            .host_id("solo")
            .log_firewall()
            .notify(&format!("[{{ url: '{}' }}]", second.url("/"))),
        &rules,
    );
    d.signal(libc::SIGHUP);
    wait_until(WAIT, "the reload's warning", || {
        d.log_text().contains("setting=\"notify\"") || d.log_text().contains("setting=notify")
    });
    append(&c.log, &combined_lines("203.0.113.50", 4, "/", 200));
    wait_until(WAIT, "the ban told", || sum(&[&d], "sent") == 1);
    assert_eq!(first.posts().len(), 1, "the running target");
    assert!(second.posts().is_empty());
}
