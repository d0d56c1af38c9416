//! Redis beyond one plain server: TLS (`rediss://` with a CA and a client
//! certificate), Sentinel (the daemon follows a failover to the promoted
//! replica), Cluster (three masters joined by `redis-cli --cluster create`).
//!
//! The servers listen on 127.0.0.1 (free ports picked by the test): daemons
//! in a test namespace could not reach the host's loopback, so the daemons
//! here run without a namespace and with `firewall: { backend: log }`; bans
//! are checked in Redis and through `status --json`.

mod common;

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::Duration;

use common::{
    append, cli, combined_line, combined_lines, now_ms, require, run_ok, wait_until, ConfigDir, Daemon, Redis, Rule,
    ACL_PASSWORD,
};

/// `n` requests of `addr` now.
fn hits(addr: &str, n: i64) -> String {
    combined_lines(addr, n, "/", 200)
}

/// A daemon's files: the config with `redis_yaml` as its `redis:` section
/// (verbatim: the topology is what these tests are about), one rule (3 hits
/// per minute) on `access.log`.
fn rig(redis_yaml: &str) -> ConfigDir {
    let r = ConfigDir::new();
    let main = r.main_config().host_id("h1").log_firewall().redis_yaml(redis_yaml);
    r.write(&main, &[Rule::new("r", &r.log, "{ hits: 3, window: 60s }").ban("1h")]);
    r
}

/// The addresses `fleetban bans --json` lists.
fn listed(cfg: &Path) -> Vec<String> {
    let out = cli(cfg, &["bans", "--json"]);
    assert!(out.success(), "bans: {}", out.stderr);
    out.stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| r["addr"].as_str().map(|a| a.trim_end_matches("/32").to_owned()))
        .collect()
}

fn openssl(dir: &Path, args: &[&str]) {
    run_ok(
        Command::new(require("openssl"))
            .current_dir(dir)
            .args(args)
            .stdin(Stdio::null()),
    );
}

/// A throwaway CA, a server certificate for 127.0.0.1 and a client
/// certificate, all signed by the CA, in `dir`.
fn make_certs(dir: &Path) {
    let ec = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
    let mut ca = vec!["req", "-x509"];
    ca.extend(ec);
    ca.extend([
        "-keyout",
        "ca.key",
        "-out",
        "ca.crt",
        "-days",
        "2",
        "-subj",
        "/CN=fleetban test CA",
    ]);
    openssl(dir, &ca);
    for (name, ext) in [
        (
            "server",
            "subjectAltName=IP:127.0.0.1,DNS:localhost\nextendedKeyUsage=serverAuth\n",
        ),
        ("client", "extendedKeyUsage=clientAuth\n"),
    ] {
        let mut req = vec!["req"];
        req.extend(ec);
        let key = format!("{name}.key");
        let csr = format!("{name}.csr");
        let crt = format!("{name}.crt");
        let extf = format!("{name}.ext");
        let subj = format!("/CN=fleetban test {name}");
        std::fs::write(dir.join(&extf), ext).unwrap();
        req.extend(["-keyout", &key, "-out", &csr, "-subj", &subj]);
        openssl(dir, &req);
        openssl(
            dir,
            &[
                "x509",
                "-req",
                "-in",
                &csr,
                "-CA",
                "ca.crt",
                "-CAkey",
                "ca.key",
                "-CAcreateserial",
                "-out",
                &crt,
                "-days",
                "2",
                "-extfile",
                &extf,
            ],
        );
    }
}

/// `redis-cli ARGS` on `redis`, or "" while it fails: servers drop their
/// clients in a failover, and the polls below just ask again.
fn poll(redis: &Redis, args: &[&str]) -> String {
    redis.try_cli(args).unwrap_or_default()
}

fn zscore(redis: &Redis, addr: &str) -> String {
    poll(redis, &["ZSCORE", "{fleetban}:bans", addr])
}

#[test]
fn the_daemon_bans_through_tls_with_a_private_ca_and_a_client_certificate() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let c = |f: &str| certs.path().join(f).display().to_string();
    // TLS only (no plain TCP port), client certificates required; the
    // harness's unix socket for the test's own checks.
    let port = common::free_port();
    let server = Redis::start_with(&[
        "--tls-port",
        &port.to_string(),
        "--bind",
        "127.0.0.1",
        "--tls-cert-file",
        &c("server.crt"),
        "--tls-key-file",
        &c("server.key"),
        "--tls-ca-cert-file",
        &c("ca.crt"),
        "--tls-auth-clients",
        "yes",
    ]);

    // Without the CA the server's certificate is not trusted: refused.
    let untrusted = rig(&format!(
        "redis: {{ url: 'rediss://127.0.0.1:{port}/0', timeout: 1s, tls: {{ cert: {}, key: {} }} }}\n",
        c("client.crt"),
        c("client.key")
    ));
    let out = cli(&untrusted.cfg, &["bans"]);
    assert!(!out.success(), "an untrusted server certificate must be refused");
    // Without the client certificate the server refuses us.
    let anonymous = rig(&format!(
        "redis: {{ url: 'rediss://127.0.0.1:{port}/0', timeout: 1s, tls: {{ ca: {} }} }}\n",
        c("ca.crt")
    ));
    assert!(
        !cli(&anonymous.cfg, &["bans"]).success(),
        "no client certificate: refused"
    );

    let r = rig(&format!(
        "redis: {{ url: 'rediss://127.0.0.1:{port}/0', tls: {{ ca: {}, cert: {}, key: {} }} }}\n",
        c("ca.crt"),
        c("client.crt"),
        c("client.key")
    ));
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("198.51.100.7", 5));
    wait_until(Duration::from_secs(10), "ban written through TLS", || {
        !zscore(&server, "198.51.100.7").is_empty()
    });
    wait_until(Duration::from_secs(5), "the ban applied locally", || {
        d.status()["bans_active"].as_u64() == Some(1)
    });
    assert_eq!(d.status()["redis"]["connected"], true, "{}", d.status());
    assert_eq!(listed(&r.cfg), vec!["198.51.100.7".to_owned()]);
    // An unban through TLS reaches the daemon through the events stream.
    let out = cli(&r.cfg, &["unban", "198.51.100.7"]);
    assert!(out.success(), "unban: {}", out.stderr);
    wait_until(Duration::from_secs(5), "unban applied", || {
        d.status()["bans_active"].as_u64() == Some(0)
    });
    drop(r.dir);
}

#[test]
fn a_tls_file_that_cannot_be_read_is_a_config_error_at_its_line() {
    let r = rig("redis:\n  url: rediss://127.0.0.1:6380/0\n  tls:\n    ca: /nonexistent/ca.pem\n");
    let out = cli(&r.cfg, &["check"]);
    assert!(!out.success());
    let err = out.stderr;
    assert!(
        err.contains(&format!("{}:8:9:", r.cfg.display())) && err.contains("redis.tls.ca"),
        "{err}"
    );
    let r = rig("redis:\n  url: redis://127.0.0.1:6379/0\n  cluster: [redis://127.0.0.1:7000]\n");
    let err = cli(&r.cfg, &["check"]).stderr;
    assert!(err.contains("exactly one of `url`, `cluster` or `sentinel`"), "{err}");
    let r = rig("redis:\n  url: redis://127.0.0.1:6379/0\n  tls: { ca: ca.pem }\n");
    std::fs::write(r.path().join("ca.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    let err = cli(&r.cfg, &["check"]).stderr;
    assert!(err.contains("TLS needs `rediss://`"), "{err}");
}

/// A master, its replica and one sentinel watching them (quorum 1, down
/// after 1 s), all on loopback; returns when the sentinel knows the replica.
fn sentinel_trio() -> (Redis, Redis, Redis) {
    let master = Redis::start_tcp(&[]);
    let mport = master.port().to_string();
    let replica = Redis::start_tcp(&["--replicaof", "127.0.0.1", &mport]);
    wait_until(Duration::from_secs(10), "replica in sync", || {
        poll(&replica, &["INFO", "replication"]).contains("master_link_status:up")
    });
    let sentinel = Redis::start_sentinel(&format!(
        "sentinel monitor mymaster 127.0.0.1 {mport} 1\n\
         sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 10000\n"
    ));
    let rport = replica.port().to_string();
    wait_until(Duration::from_secs(20), "the sentinel knows the replica", || {
        poll(&sentinel, &["SENTINEL", "replicas", "mymaster"]).contains(&rport)
    });
    // The daemon logs in to the master as the minimal ACL user (not
    // replicated: created on both).
    master.add_acl_user(&["+role"]);
    replica.add_acl_user(&["+role"]);
    (master, replica, sentinel)
}

/// Waits until the daemon applies both bans of a failover test (one before,
/// one after), connected to Redis, and checks `fleetban bans` lists them.
fn wait_both_bans(d: &Daemon, cfg: &Path) {
    wait_until(Duration::from_secs(10), "both bans applied, Redis connected", || {
        let s = d.status();
        s["bans_active"].as_u64() == Some(2) && s["redis"]["connected"] == true
    });
    let mut l = listed(cfg);
    l.sort();
    assert_eq!(l, vec!["198.51.100.7".to_owned(), "198.51.100.8".to_owned()]);
}

fn sentinel_rig(sentinel: &Redis) -> ConfigDir {
    rig(&format!(
        "redis: {{ sentinel: {{ service: mymaster, nodes: ['redis://127.0.0.1:{}'], user: fleetban, password: {ACL_PASSWORD} }}, timeout: 500ms }}\n",
        sentinel.port()
    ))
}

#[test]
fn the_daemon_follows_a_sentinel_failover_to_the_promoted_replica() {
    let (mut master, replica, sentinel) = sentinel_trio();
    let rport = replica.port().to_string();
    let r = sentinel_rig(&sentinel);
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("198.51.100.7", 5));
    wait_until(Duration::from_secs(10), "ban on the first master", || {
        !zscore(&master, "198.51.100.7").is_empty()
    });

    master.kill();
    wait_until(Duration::from_secs(30), "the sentinel promotes the replica", || {
        poll(&sentinel, &["SENTINEL", "get-master-addr-by-name", "mymaster"]).ends_with(&rport)
    });
    append(&r.log, &hits("198.51.100.8", 5));
    wait_until(Duration::from_secs(30), "ban on the promoted replica", || {
        !zscore(&replica, "198.51.100.8").is_empty()
    });
    assert!(
        !zscore(&replica, "198.51.100.7").is_empty(),
        "the first ban was replicated"
    );
    wait_both_bans(&d, &r.cfg);
    // The daemon asked the sentinels again: its log says where it went.
    assert!(
        d.log_text().contains("asking the sentinels again") && d.log_text().contains(&format!("127.0.0.1:{rport}")),
        "no switch to the new master logged:\n{}",
        d.log_text()
    );
    // A fleet-wide unban on the new master reaches the daemon.
    assert!(cli(&r.cfg, &["unban", "198.51.100.8"]).success());
    wait_until(Duration::from_secs(10), "unban applied", || {
        d.status()["bans_active"].as_u64() == Some(1)
    });
}

#[test]
fn a_switchover_demoting_the_master_is_followed() {
    // SENTINEL FAILOVER: the old master stays up as a replica (writes to it
    // answer READONLY, or its clients are disconnected); the daemon must move.
    let (master, replica, sentinel) = sentinel_trio();
    let r = sentinel_rig(&sentinel);
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("198.51.100.7", 5));
    wait_until(Duration::from_secs(10), "ban on the first master", || {
        !zscore(&master, "198.51.100.7").is_empty()
    });
    // The sentinel learns of the replica from the master's INFO (every 10 s
    // at first): until then it answers NOGOODSLAVE. Ask again until it can.
    let mut answer = String::new();
    wait_until(Duration::from_secs(30), "the sentinel to accept a failover", || {
        answer = poll(&sentinel, &["SENTINEL", "FAILOVER", "mymaster"]);
        !answer.starts_with("NOGOODSLAVE")
    });
    assert_eq!(answer.trim_end(), "OK");
    let rport = replica.port().to_string();
    wait_until(
        Duration::from_secs(30),
        "the replica promoted, the master demoted",
        || {
            poll(&sentinel, &["SENTINEL", "get-master-addr-by-name", "mymaster"]).ends_with(&rport)
                && poll(&master, &["INFO", "replication"]).contains("master_link_status:up")
        },
    );
    append(&r.log, &hits("198.51.100.8", 5));
    wait_until(Duration::from_secs(30), "ban on the new master", || {
        !zscore(&replica, "198.51.100.8").is_empty()
    });
    wait_both_bans(&d, &r.cfg);
    // Moved after an error from the demoted master, or before one, the
    // sentinels having named the new master at the periodic check.
    let log = d.log_text();
    assert!(
        log.contains("asking the sentinels again") || log.contains("name another Redis master"),
        "{log}"
    );
}

/// A failover that leaves the old master alive and a master (the sentinels
/// could not reach it to demote it; here: told to watch another server):
/// no error ever sends the daemon back to the sentinels, yet within a few
/// seconds its connections, the events one too, move to the master they
/// name, and the bans written there reach it.
#[test]
fn the_daemon_moves_to_the_master_the_sentinels_name_while_the_old_one_lives() {
    let old = Redis::start_tcp(&[]);
    let new = Redis::start_tcp(&[]);
    old.add_acl_user(&["+role"]);
    new.add_acl_user(&["+role"]);
    let sentinel = Redis::start_sentinel(&format!(
        "sentinel monitor mymaster 127.0.0.1 {} 1\nsentinel down-after-milliseconds mymaster 1000\n",
        old.port()
    ));
    wait_until(Duration::from_secs(10), "the sentinel names the first master", || {
        poll(&sentinel, &["SENTINEL", "get-master-addr-by-name", "mymaster"]).ends_with(&old.port().to_string())
    });
    let r = sentinel_rig(&sentinel);
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("198.51.100.7", 5));
    wait_until(Duration::from_secs(10), "ban on the first master", || {
        !zscore(&old, "198.51.100.7").is_empty()
    });
    let xread_on = |redis: &Redis| poll(redis, &["CLIENT", "LIST"]).contains("cmd=xread");
    wait_until(
        Duration::from_secs(5),
        "the events connection on the first master",
        || xread_on(&old),
    );

    // The sentinels name the other server; the old one answers as before.
    assert_eq!(poll(&sentinel, &["SENTINEL", "REMOVE", "mymaster"]), "OK");
    let port = new.port().to_string();
    assert_eq!(
        poll(&sentinel, &["SENTINEL", "MONITOR", "mymaster", "127.0.0.1", &port, "1"]),
        "OK"
    );
    // An operator's ban goes to the new master (the CLI asks the sentinels).
    assert!(cli(&r.cfg, &["ban", "198.51.100.9"]).success());
    wait_until(
        Duration::from_secs(20),
        "the daemon's events read from the new master",
        || xread_on(&new) && !xread_on(&old),
    );
    wait_until(Duration::from_secs(10), "the new master's ban applied", || {
        d.status()["bans_active"].as_u64() == Some(2)
    });
    append(&r.log, &hits("198.51.100.8", 5));
    wait_until(Duration::from_secs(10), "a rule's ban on the new master", || {
        !zscore(&new, "198.51.100.8").is_empty()
    });
    assert!(zscore(&old, "198.51.100.8").is_empty(), "written to the old master");
    assert!(d.log_text().contains("name another Redis master"), "{}", d.log_text());
}

#[test]
fn the_daemon_bans_through_a_three_master_cluster() {
    let nodes = Redis::start_cluster();
    let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
    // Two rules: the sliding window with its prefilter tier and the fixed
    // window, whose scripts derive counter keys from KEYS[1] (same slot).
    for n in &nodes {
        n.add_acl_user(&["+cluster|slots"]);
    }
    let r = rig(&format!(
        "redis: {{ cluster: ['redis://fleetban:{ACL_PASSWORD}@{}'] }}\n",
        addrs[0]
    ));
    r.write_rules(&[
        Rule::new("r", &r.log, "{ hits: 3, window: 60s, prefilter: 0.5 }")
            .ignoring("{ path: ^/f }")
            .ban("1h"),
        Rule::new("f", &r.log, "{ hits: 3, window: 60s, algorithm: fixed_window }")
            .matching("{ path: ^/f }")
            .ban("1h"),
    ]);
    let d = Daemon::start(None, &r.cfg, &r.control);
    // Addresses spread over the three masters' slots, plus one under the limit.
    let banned: Vec<String> = (1..=12).map(|i| format!("198.51.100.{i}")).collect();
    let mut text = String::new();
    for a in &banned {
        text += &hits(a, 5);
    }
    text += &hits("198.51.100.200", 2);
    let now = now_ms();
    for i in 0..5 {
        text += &combined_line("203.0.113.9", now + i, "/f", 200);
    }
    // At 2 of 3, hot: a mark for the fleet.
    for i in 0..2 {
        text += &combined_line("203.0.113.10", now + i, "/f", 200);
    }
    append(&r.log, &text);
    wait_until(Duration::from_secs(20), "every ban applied", || {
        d.status()["bans_active"].as_u64() == Some(13)
    });
    let out = cli(&r.cfg, &["bans", "--json"]);
    let by_f = out
        .stdout
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .find(|r| r["addr"].as_str().is_some_and(|a| a.starts_with("203.0.113.9")))
        .map(|r| r["rule"].clone());
    assert_eq!(
        by_f,
        Some(serde_json::json!("f")),
        "the fixed window banned it:\n{}",
        d.log_text()
    );
    // The fleet's keys ({fleetban}: one slot) work as on one server: the
    // host registered and counted, its hot marks published.
    let status = d.status();
    assert_eq!(status["redis"]["fleet_hosts"], 1, "{}", d.log_text());
    assert_eq!(status["redis"]["hot_clients"], 1, "{}", d.log_text());
    wait_until(Duration::from_secs(10), "the marks in the cluster", || {
        nodes
            .iter()
            .any(|n| poll(n, &["ZCARD", "{fleetban}:hot"]).parse::<u64>().unwrap_or(0) > 0)
    });
    let log = d.log_text();
    assert!(
        !log.contains("Publishing hot clients failed") && !log.contains("Registering this host refused"),
        "{log}"
    );
    let mut l = listed(&r.cfg);
    l.sort();
    let mut want = banned.clone();
    want.push("203.0.113.9".to_owned());
    want.sort();
    assert_eq!(l, want, "{}", d.log_text());
    // The windows really are spread over the masters.
    let holding = nodes
        .iter()
        .filter(|n| n.cli(&["DBSIZE"]).parse::<u64>().unwrap_or(0) > 0)
        .count();
    assert_eq!(holding, 3, "keys on every master");
    let s = d.status();
    assert_eq!(s["redis"]["connected"], true, "{s}");
    assert_eq!(s["redis"]["errors"].as_u64(), Some(0), "{s}");
    assert!(cli(&r.cfg, &["unban", "198.51.100.1"]).success());
    wait_until(Duration::from_secs(10), "unban applied", || {
        d.status()["bans_active"].as_u64() == Some(12)
    });
}
