//! One ban list for the whole fleet. Three hosts (network namespaces), each
//! with its own nginx, its own `fleetban run` and its own nft table, share
//! one Redis over its unix socket. A client with one address and a link to
//! every host spreads its requests over them: under the limit on each host,
//! over it in total, so the fleet-wide window bans it and every host drops
//! it. `fleetban unban` on one host lets it back in everywhere. The events
//! stream is trimmed past a host's last id: the host notices and reconciles.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use common::{fleetban_bin, http_get_with, nft_set_elements, veth_pair, wait_until, Daemon, NetNs, Nginx, Redis};

/// The client's one address, on its loopback, reached by every host through
/// its own link.
const CLIENT: &str = "10.213.30.2";

struct Host {
    ns: NetNs,
    /// The address the client uses to reach this host.
    addr: String,
    _nginx: Option<Nginx>,
    daemon: Daemon,
    cfg: PathBuf,
    _dir: tempfile::TempDir,
}

/// Writes the config of host `id` (reading `log`) and starts its daemon.
fn start_host(
    ns: NetNs,
    addr: String,
    id: &str,
    log: &Path,
    nginx: Option<Nginx>,
    redis: &Redis,
    reconcile: &str,
) -> Host {
    let dir = tempfile::tempdir().unwrap();
    let control = dir.path().join("control.sock");
    std::fs::write(
        dir.path().join("rules.yaml"),
        format!(
            "rules:
  - name: scraper
    logs: [{}]
    match: {{ method: [GET] }}
    limit: {{ hits: 10, window: 60s, scope: fleet }}
    ban: {{ duration: 10m }}
",
            log.display()
        ),
    )
    .unwrap();
    let cfg = dir.path().join("fleetban.yaml");
    std::fs::write(
        &cfg,
        format!(
            "host_id: {id}\nstate_dir: {}\ncontrol: {}\nredis: {{ url: '{}', reconcile_every: {reconcile} }}\nrules: [rules.yaml]\n",
            dir.path().join("state").display(),
            control.display(),
            redis.url()
        ),
    )
    .unwrap();
    let daemon = Daemon::start(Some(&ns), &cfg, &control);
    Host {
        ns,
        addr,
        _nginx: nginx,
        daemon,
        cfg,
        _dir: dir,
    }
}

/// As `wait_until`, with the daemons' logs in the failure message.
fn wait_for(hosts: &[&Host], timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let t = std::time::Instant::now();
    while t.elapsed() < timeout {
        if f() {
            return;
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    let logs: Vec<String> = hosts.iter().map(|h| h.daemon.log_text()).collect();
    panic!(
        "timed out after {timeout:?} waiting for {what}\n{}",
        logs.join("\n-----\n")
    );
}

fn cli(cfg: &Path, args: &[&str]) -> (i32, String) {
    let out = Command::new(fleetban_bin())
        .args(args)
        .arg("-c")
        .arg(cfg)
        .output()
        .unwrap();
    (
        out.status.code().unwrap_or(-1),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn v4_set(ns: &NetNs) -> Vec<String> {
    nft_set_elements(ns, "fleetban", "v4")
        .into_iter()
        .map(|(e, _)| e)
        .collect()
}

fn get(client: &NetNs, host: &Host, timeout: Duration) -> Result<u16, String> {
    http_get_with(
        client,
        &format!("http://{}:8080/page", host.addr),
        &["--interface", CLIENT],
        timeout,
    )
}

#[test]
fn a_client_spread_over_three_hosts_is_banned_by_all_and_unbanned_everywhere() {
    let redis = Redis::start();
    let client = NetNs::new("client");
    client.run(&["ip", "addr", "add", &format!("{CLIENT}/32"), "dev", "lo"]);
    let mut hosts = Vec::new();
    for i in 1..=3u8 {
        let ns = NetNs::new(&format!("host{i}"));
        let (host_addr, client_addr) = (format!("10.213.2{i}.1"), format!("10.213.2{i}.2"));
        veth_pair(&ns, &format!("{host_addr}/24"), &client, &format!("{client_addr}/24"));
        ns.run(&["ip", "route", "add", &format!("{CLIENT}/32"), "via", &client_addr]);
        let nginx = Nginx::start(&ns, "0.0.0.0:8080", None);
        let log = nginx.access_log();
        hosts.push(start_host(
            ns,
            host_addr,
            &format!("web-{i}"),
            &log,
            Some(nginx),
            &redis,
            "1h",
        ));
    }

    // Four pages from each host: 4 < 10 on every host, 12 > 10 in the fleet.
    for round in 0..4 {
        for h in &hosts {
            assert_eq!(
                get(&client, h, Duration::from_secs(2)),
                Ok(200),
                "round {round} to {}",
                h.addr
            );
        }
    }
    for h in &hosts {
        wait_until(Duration::from_secs(10), "the ban in every host's set", || {
            v4_set(&h.ns).contains(&CLIENT.to_owned())
        });
    }
    for h in &hosts {
        assert!(
            get(&client, h, Duration::from_secs(1)).is_err(),
            "{} still serves the client",
            h.addr
        );
    }
    // One host decided (whichever saw the 11th hit); none saw more than 4.
    let bans: u64 = hosts
        .iter()
        .map(|h| h.daemon.status()["rules"][0]["bans"].as_u64().unwrap())
        .sum();
    assert_eq!(bans, 1);
    assert_eq!(redis.cli(&["ZCARD", "{fleetban}:bans"]), "1");
    let rec: serde_json::Value = serde_json::from_str(&redis.cli(&["HGET", "{fleetban}:banrec", CLIENT])).unwrap();
    assert_eq!(rec["hits"], 11, "{rec}");

    let (code, out) = cli(&hosts[1].cfg, &["unban", CLIENT]);
    assert_eq!(code, 0, "{out}");
    for h in &hosts {
        wait_for(
            &hosts.iter().collect::<Vec<_>>(),
            Duration::from_secs(10),
            "the unban on every host",
            || !v4_set(&h.ns).contains(&CLIENT.to_owned()),
        );
        assert_eq!(
            get(&client, h, Duration::from_secs(2)),
            Ok(200),
            "{} after unban",
            h.addr
        );
    }
}

#[test]
fn a_host_whose_events_were_trimmed_reconciles() {
    let redis = Redis::start();
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    // No periodic reconcile to hide behind: only gap detection can repair.
    let h = start_host(NetNs::new("gap"), String::new(), "gap-1", &log, None, &redis, "1h");
    let (code, out) = cli(&h.cfg, &["ban", "203.0.113.1", "--for", "1h"]);
    assert_eq!(code, 0, "{out}");
    wait_until(Duration::from_secs(5), "a ban by event", || {
        v4_set(&h.ns).contains(&"203.0.113.1".to_owned())
    });

    // A list entry whose event is lost: written directly, then an event the
    // host has not read is trimmed away (XADD + XTRIM in one atomic call,
    // as MAXLEN ~ does to a host that fell behind), with a garbage entry
    // that must never reach nft.
    redis.cli(&["ZADD", "{fleetban}:bans", "+inf", "203.0.113.2"]);
    redis.cli(&["ZADD", "{fleetban}:bans", "+inf", "garbage; flush ruleset"]);
    redis.cli(&[
        "EVAL",
        "redis.call('XADD', KEYS[1], '*', 'op', 'ban', 'addr', 'also garbage', 'until', 'inf') \
         return redis.call('XTRIM', KEYS[1], 'MAXLEN', 0)",
        "1",
        "{fleetban}:events",
    ]);
    wait_for(
        &[&h],
        Duration::from_secs(5),
        "reconcile after the trimmed stream",
        || v4_set(&h.ns).contains(&"203.0.113.2".to_owned()),
    );
    assert_eq!(v4_set(&h.ns), vec!["203.0.113.1".to_owned(), "203.0.113.2".to_owned()]);
    assert!(h.daemon.log_text().contains("trimmed"), "{}", h.daemon.log_text());

    let (code, out) = cli(&h.cfg, &["ban", "203.0.113.5", "--for", "1h"]);
    assert_eq!(code, 0, "{out}");
    wait_until(Duration::from_secs(5), "a ban by event after the reconcile", || {
        v4_set(&h.ns).contains(&"203.0.113.5".to_owned())
    });
    // The stream is deleted (as a Redis restarted empty would have it):
    // the host's last id is now ahead of the stream, noticed, reconciled.
    redis.cli(&["DEL", "{fleetban}:events"]);
    redis.cli(&["ZADD", "{fleetban}:bans", "+inf", "203.0.113.3"]);
    wait_for(
        &[&h],
        Duration::from_secs(5),
        "reconcile after the stream was reset",
        || v4_set(&h.ns).contains(&"203.0.113.3".to_owned()),
    );
    // And it follows the new stream: a ban by event arrives again.
    let (code, out) = cli(&h.cfg, &["ban", "203.0.113.4", "--for", "1h"]);
    assert_eq!(code, 0, "{out}");
    wait_until(Duration::from_secs(5), "an event on the new stream", || {
        v4_set(&h.ns).contains(&"203.0.113.4".to_owned())
    });
    let text = h.daemon.log_text();
    assert!(text.contains("not an address"), "garbage warned about:\n{text}");
}
