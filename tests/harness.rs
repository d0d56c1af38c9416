//! Smoke tests of the test harness itself (`tests/common`): if these fail,
//! every other integration test's verdict is meaningless.

mod common;

use common::*;
use std::fs;
use std::path::Path;
use std::process::Command;
use std::time::Duration;

const T: Duration = Duration::from_secs(5);

fn lines(p: &Path) -> Vec<String> {
    fs::read_to_string(p)
        .unwrap_or_default()
        .lines()
        .map(str::to_string)
        .collect()
}

fn netns_listed(name: &str) -> bool {
    let out = Command::new(require("ip"))
        .args(["netns", "list"])
        .output()
        .expect("ip netns list");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .any(|l| l.split_whitespace().next() == Some(name))
}

fn proc_alive(pid: u32) -> bool {
    Path::new(&format!("/proc/{pid}")).exists()
}

#[test]
fn redis_answers_and_restarts_on_the_same_socket() {
    let mut redis = Redis::start();
    assert!(redis.ping());
    assert_eq!(redis.url(), format!("unix://{}", redis.socket.display()));
    assert_eq!(redis.cli(&["CONFIG", "GET", "port"]), "port\n0", "no TCP listener");
    assert_eq!(redis.cli(&["SET", "k", "v"]), "OK");
    assert_eq!(redis.cli(&["GET", "k"]), "v");
    assert_eq!(redis.cli(&["GET", "absent"]), "");

    let socket = redis.socket.clone();
    let pid = redis.pid().expect("running");
    redis.kill();
    assert!(!proc_alive(pid), "killed redis is reaped");
    assert!(!redis.ping(), "no answer while killed");

    redis.restart();
    assert_eq!(redis.socket, socket);
    assert!(redis.ping());
    assert_eq!(redis.cli(&["GET", "k"]), "", "nothing persisted");
    assert_eq!(redis.cli(&["SET", "k", "w"]), "OK");
    assert_eq!(redis.cli(&["GET", "k"]), "w");

    let pid = redis.pid().expect("running");
    let dir = redis.dir().to_path_buf();
    drop(redis);
    assert!(!proc_alive(pid), "Drop kills and reaps redis");
    assert!(!dir.exists(), "Drop removes the temp dir");
}

#[test]
fn netns_is_created_and_removed_with_its_processes() {
    let ns = NetNs::new("smoke");
    let name = ns.name.clone();
    assert!(netns_listed(&name));
    let lo = ns.run(&["ip", "-o", "link", "show", "lo"]);
    assert!(String::from_utf8_lossy(&lo.stdout).contains("UP"), "lo is up");
    let mut sleeper = ns.exec(&["sleep", "30"]).spawn().expect("spawn sleep");
    wait_until(T, "sleep to enter the namespace", || ns.pids().contains(&sleeper.id()));

    drop(ns);
    assert!(!netns_listed(&name), "{name} still listed after drop");
    let status = sleeper.wait().expect("reap sleep");
    assert!(!status.success(), "sleep was killed, not finished: {status}");
}

#[test]
fn nginx_serves_a_neighbour_through_a_veth_and_logs_its_address() {
    let web = NetNs::new("web");
    let client = NetNs::new("cli");
    let (if_web, if_cli) = veth_pair(&web, "10.213.1.1", &client, "10.213.1.2");
    assert_ne!(if_web, if_cli);
    let nginx = Nginx::start(&web, "10.213.1.1:8080", None);
    assert_eq!(lines(&nginx.access_log()).len(), 0, "readiness probes are not logged");

    assert_eq!(http_get(&client, &nginx.url("/"), T), Ok(200));
    assert_eq!(http_get(&client, &nginx.url("/static/a.css"), T), Ok(200));
    assert_eq!(http_get(&client, &nginx.url("/missing"), T), Ok(404));
    let ua = ["-A", "smoke-agent/1.0"];
    assert_eq!(http_get_with(&client, &nginx.url("/ua"), &ua, T), Ok(200));

    wait_until(T, "4 access log lines", || lines(&nginx.access_log()).len() == 4);
    let log = lines(&nginx.access_log());
    for l in &log {
        assert!(l.starts_with("10.213.1.2 - - ["), "combined line from the client: {l}");
    }
    assert!(log[0].contains("\"GET / HTTP/1.1\" 200 3 \"-\""), "{}", log[0]);
    assert!(log[1].contains("\"GET /static/a.css HTTP/1.1\" 200 2"), "{}", log[1]);
    assert!(log[2].contains("\"GET /missing HTTP/1.1\" 404 "), "{}", log[2]);
    assert!(log[3].ends_with("\"smoke-agent/1.0\""), "{}", log[3]);

    // Nothing listens on 9; the failure is an Err, not a status.
    assert!(http_get(&client, "http://10.213.1.1:9/", T).is_err());

    let pid = nginx.pid();
    drop(nginx);
    assert!(!proc_alive(pid), "Drop stops nginx");
    assert!(web.pids().is_empty(), "no nginx worker left: {:?}", web.pids());
}

#[test]
fn nginx_reopen_after_rename_writes_a_new_access_log() {
    let (_web, client, nginx) = web_and_client("web", "cli", "10.213.2", None);
    let log = nginx.access_log();
    let rotated = log.with_extension("log.1");

    assert_eq!(http_get(&client, &nginx.url("/before"), T), Ok(200));
    wait_until(T, "first line", || lines(&log).len() == 1);
    fs::rename(&log, &rotated).expect("rename access.log");
    assert_eq!(http_get(&client, &nginx.url("/between"), T), Ok(200));
    wait_until(T, "the line written before reopen to land in the renamed file", || {
        lines(&rotated).len() == 2
    });
    assert!(!log.exists(), "nginx keeps writing the renamed file until reopen");

    nginx.reopen();
    assert_eq!(http_get(&client, &nginx.url("/after"), T), Ok(200));
    wait_until(T, "a line in the new access.log", || lines(&log).len() == 1);
    assert!(lines(&log)[0].contains("GET /after "), "{:?}", lines(&log));
    assert_eq!(lines(&rotated).len(), 2, "old file got nothing new");
}

#[test]
fn nginx_custom_log_format_with_quotes() {
    let fmt = r#"$remote_addr '$status' "$request_uri" \ $request_method"#;
    let (_web, client, nginx) = web_and_client("web", "cli", "10.213.3", Some(fmt));
    assert_eq!(http_get(&client, &nginx.url("/x?a=1"), T), Ok(200));
    wait_until(T, "one line", || lines(&nginx.access_log()).len() == 1);
    assert_eq!(lines(&nginx.access_log())[0], r#"10.213.3.2 '200' "/x?a=1" \ GET"#);
}

#[test]
fn nft_set_elements_reads_timeouts_prefixes_and_permanent_elements() {
    let ns = NetNs::new("nft");
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.nft");
    fs::write(
        &rules,
        "table inet fbtest {\n\
         set v4 { type ipv4_addr; flags interval, timeout; }\n\
         set v6 { type ipv6_addr; flags interval, timeout; }\n\
         set empty { type ipv4_addr; flags interval, timeout; }\n\
         }\n\
         add element inet fbtest v4 { 203.0.113.7 timeout 1h, 198.51.100.9 }\n\
         add element inet fbtest v6 { 2001:db8::/64 timeout 90s, 2001:db8:1::1 }\n",
    )
    .unwrap();
    ns.run(&[Path::new("nft").as_os_str(), "-f".as_ref(), rules.as_os_str()]);

    assert_eq!(
        nft_set_elements(&ns, "fbtest", "v4"),
        vec![
            ("198.51.100.9".to_string(), None),
            ("203.0.113.7".to_string(), Some(3_600_000)),
        ]
    );
    assert_eq!(
        nft_set_elements(&ns, "fbtest", "v6"),
        vec![
            ("2001:db8:1::1".to_string(), None),
            ("2001:db8::/64".to_string(), Some(90_000)),
        ]
    );
    assert_eq!(nft_set_elements(&ns, "fbtest", "empty"), vec![]);

    let detailed = nft_set_elements_detailed(&ns, "fbtest", "v4");
    let e = detailed.iter().find(|e| e.elem == "203.0.113.7").unwrap();
    let left = e.expires_ms.expect("a timed element expires");
    assert!((3_500_000..=3_600_000).contains(&left), "expires {left}");

    // The namespace's ruleset is its own: the host's is untouched.
    let host = Command::new(require("nft")).args(["list", "tables"]).output().unwrap();
    assert!(!String::from_utf8_lossy(&host.stdout).contains("fbtest"));
}

#[test]
fn parse_set_json_handles_ranges_and_rejects_garbage() {
    let json = r#"{"nftables":[{"metainfo":{}},{"set":{"name":"v4","elem":[
        {"elem":{"val":{"range":["192.0.2.1","192.0.2.5"]},"timeout":2,"expires":1}},
        {"prefix":{"addr":"198.51.100.0","len":24}}]}}]}"#;
    let got = parse_set_json(json).unwrap();
    assert_eq!(
        got,
        vec![
            NftElem {
                elem: "192.0.2.1-192.0.2.5".into(),
                timeout_ms: Some(2000),
                expires_ms: Some(1000)
            },
            NftElem {
                elem: "198.51.100.0/24".into(),
                timeout_ms: None,
                expires_ms: None
            },
        ]
    );
    assert!(parse_set_json(r#"{"nftables":[{"set":{"elem":[{"weird":1}]}}]}"#).is_err());
    assert!(parse_set_json("not json").is_err());
}

#[test]
fn nft_drop_in_a_namespace_makes_http_get_fail() {
    let (web, client, nginx) = web_and_client("web", "cli", "10.213.4", None);
    assert_eq!(http_get(&client, &nginx.url("/"), T), Ok(200));
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("drop.nft");
    fs::write(
        &rules,
        "table inet fbtest {\n\
         chain input { type filter hook input priority -10; policy accept; ip saddr 10.213.4.2 drop; }\n\
         }\n",
    )
    .unwrap();
    web.run(&[Path::new("nft").as_os_str(), "-f".as_ref(), rules.as_os_str()]);
    let r = http_get(&client, &nginx.url("/"), Duration::from_millis(500));
    assert!(r.is_err(), "dropped client got {r:?}");
}

#[test]
#[should_panic(expected = "waiting for the impossible")]
fn wait_until_panics_on_timeout() {
    wait_until(Duration::from_millis(100), "the impossible", || false);
}

#[test]
#[should_panic(expected = "fbt-no-such-binary not found: run scripts/ensure-deps.sh")]
fn require_names_the_missing_binary() {
    require("fbt-no-such-binary");
}

#[test]
fn corpus_is_found() {
    let p = corpus_path();
    assert!(fs::metadata(&p).unwrap().len() > 0, "{} is empty", p.display());
}
