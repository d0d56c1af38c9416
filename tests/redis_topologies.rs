//! Redis beyond one plain server: TLS (`rediss://` with a CA and a client
//! certificate), Sentinel (the daemon follows a failover to the promoted
//! replica), Cluster (three masters joined by `redis-cli --cluster create`).
//!
//! The servers listen on 127.0.0.1 (free ports picked by the test): daemons
//! in a test namespace could not reach the host's loopback, so the daemons
//! here run without a namespace and with `firewall: { backend: log }`; bans
//! are checked in Redis and through `status --json`.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use common::{combined_line, require, wait_until, Daemon};

/// A port nobody listens on right now (the kernel's pick for port 0).
fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    l.local_addr().unwrap().port()
}

/// One redis-server (or sentinel) process; killed on Drop.
struct Server {
    child: Option<Child>,
    port: u16,
    log: PathBuf,
}

impl Server {
    /// Starts `redis-server` with `args` in `dir`, logging to `dir/NAME.log`.
    fn start(dir: &Path, name: &str, args: &[String]) -> Server {
        Server::start_bin("redis-server", dir, name, args)
    }

    fn start_bin(bin: &str, dir: &Path, name: &str, args: &[String]) -> Server {
        let log = dir.join(format!("{name}.log"));
        let child = Command::new(require(bin))
            .args(args)
            .args(["--dir"])
            .arg(dir)
            .arg("--logfile")
            .arg(&log)
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        Server {
            child: Some(child),
            port: 0,
            log,
        }
    }

    /// A plain TCP server on a free port, no persistence.
    fn plain(dir: &Path, name: &str, extra: &[&str]) -> Server {
        let port = free_port();
        let sub = dir.join(name);
        std::fs::create_dir_all(&sub).unwrap();
        let mut args: Vec<String> = [
            "--port",
            &port.to_string(),
            "--bind",
            "127.0.0.1",
            "--save",
            "",
            "--appendonly",
            "no",
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(extra.iter().map(|s| s.to_string()));
        let mut s = Server::start(&sub, name, &args);
        s.port = port;
        s.wait_ping();
        s
    }

    fn cli(&self, args: &[&str]) -> String {
        cli(self.port, args)
    }

    fn wait_ping(&mut self) {
        let port = self.port;
        let log = self.log.clone();
        for _ in 0..250 {
            if Command::new(require("redis-cli"))
                .args(["-p", &port.to_string(), "PING"])
                .output()
                .is_ok_and(|o| String::from_utf8_lossy(&o.stdout).trim() == "PONG")
            {
                return;
            }
            if let Some(Ok(Some(st))) = self.child.as_mut().map(|c| c.try_wait()) {
                panic!(
                    "redis-server exited ({st}): {}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "redis-server on {port} did not answer: {}",
            std::fs::read_to_string(&log).unwrap_or_default()
        );
    }

    fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.kill();
    }
}

/// `redis-cli -p PORT --raw ARGS` (on 127.0.0.1), stdout without the last newline.
fn cli(port: u16, args: &[&str]) -> String {
    let out = Command::new(require("redis-cli"))
        .args(["-p", &port.to_string(), "--raw"])
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn redis-cli");
    String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
}

fn append(log: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .unwrap()
        .write_all(text.as_bytes())
        .unwrap();
}

/// `n` requests of `addr` now.
fn hits(addr: &str, n: i64) -> String {
    let now = fleetban::now_ms();
    (0..n).map(|i| combined_line(addr, now + i, "/", 200)).collect()
}

/// A daemon's files: the config with `redis_yaml` as its `redis:` section,
/// one rule (3 hits per minute) on `access.log`.
struct Rig {
    dir: tempfile::TempDir,
    cfg: PathBuf,
    log: PathBuf,
    control: PathBuf,
}

fn rig(redis_yaml: &str) -> Rig {
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("access.log");
    std::fs::write(&log, "").unwrap();
    std::fs::write(
        dir.path().join("rules.yaml"),
        format!(
            "rules:\n  - name: r\n    logs: [{}]\n    limit: {{ hits: 3, window: 60s }}\n    ban: {{ duration: 1h }}\n",
            log.display()
        ),
    )
    .unwrap();
    let control = dir.path().join("control.sock");
    let cfg = dir.path().join("fleetban.yaml");
    std::fs::write(
        &cfg,
        format!(
            "host_id: h1\nstate_dir: {}\ncontrol: {}\nfirewall: {{ backend: log }}\n{redis_yaml}rules: [rules.yaml]\n",
            dir.path().join("state").display(),
            control.display()
        ),
    )
    .unwrap();
    Rig { dir, cfg, log, control }
}

fn fleetban(args: &[&str], cfg: &Path) -> std::process::Output {
    Command::new(common::fleetban_bin())
        .args(args)
        .arg("-c")
        .arg(cfg)
        .stdin(Stdio::null())
        .output()
        .expect("run fleetban")
}

/// The addresses `fleetban bans --json` lists.
fn listed(cfg: &Path) -> Vec<String> {
    let out = fleetban(&["bans", "--json"], cfg);
    assert!(out.status.success(), "bans: {}", String::from_utf8_lossy(&out.stderr));
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .filter_map(|l| serde_json::from_str::<serde_json::Value>(l).ok())
        .filter_map(|r| r["addr"].as_str().map(|a| a.trim_end_matches("/32").to_owned()))
        .collect()
}

fn openssl(dir: &Path, args: &[&str]) {
    let out = Command::new(require("openssl"))
        .current_dir(dir)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .expect("spawn openssl");
    assert!(
        out.status.success(),
        "openssl {args:?}: {}",
        String::from_utf8_lossy(&out.stderr)
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

/// Creates on the server at `port` the user of `config/redis-acl.conf`
/// (password `s3cret-pw`) with the `extra` rights its comment names for a
/// topology: the daemon and the CLI then run as exactly that user.
fn acl_user(port: u16, extra: &str) {
    let acl = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/redis-acl.conf")).unwrap();
    let line = acl
        .lines()
        .find(|l| l.starts_with("user fleetban "))
        .expect("the user line");
    assert!(acl.contains(extra), "config/redis-acl.conf names {extra}");
    let mut args = vec!["ACL", "SETUSER", "fleetban"];
    args.extend(
        line["user fleetban ".len()..]
            .split_whitespace()
            .map(|w| if w == ">PASSWORD" { ">s3cret-pw" } else { w }),
    );
    args.push(extra);
    assert_eq!(cli(port, &args), "OK");
}

fn zscore(port: u16, addr: &str) -> String {
    cli(port, &["ZSCORE", "{fleetban}:bans", addr])
}

#[test]
fn the_daemon_bans_through_tls_with_a_private_ca_and_a_client_certificate() {
    let certs = tempfile::tempdir().unwrap();
    make_certs(certs.path());
    let c = |f: &str| certs.path().join(f).display().to_string();
    // TLS only (`--port 0`), client certificates required; a unix socket
    // for the test's own checks.
    let port = free_port();
    let sock = certs.path().join("redis.sock");
    let args: Vec<String> = [
        "--port",
        "0",
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
        "--unixsocket",
        &sock.display().to_string(),
        "--save",
        "",
        "--appendonly",
        "no",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    let _server = Server::start(certs.path(), "tls", &args);
    let sockcli = |a: &[&str]| -> String {
        let out = Command::new(require("redis-cli"))
            .arg("-s")
            .arg(&sock)
            .arg("--raw")
            .args(a)
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).trim_end().to_owned()
    };
    wait_until(Duration::from_secs(5), "redis-server with TLS up", || {
        sockcli(&["PING"]) == "PONG"
    });

    // Without the CA the server's certificate is not trusted: refused.
    let untrusted = rig(&format!(
        "redis: {{ url: 'rediss://127.0.0.1:{port}/0', timeout: 1s, tls: {{ cert: {}, key: {} }} }}\n",
        c("client.crt"),
        c("client.key")
    ));
    let out = fleetban(&["bans"], &untrusted.cfg);
    assert!(!out.status.success(), "an untrusted server certificate must be refused");
    // Without the client certificate the server refuses us.
    let anonymous = rig(&format!(
        "redis: {{ url: 'rediss://127.0.0.1:{port}/0', timeout: 1s, tls: {{ ca: {} }} }}\n",
        c("ca.crt")
    ));
    assert!(
        !fleetban(&["bans"], &anonymous.cfg).status.success(),
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
        !sockcli(&["ZSCORE", "{fleetban}:bans", "198.51.100.7"]).is_empty()
    });
    wait_until(Duration::from_secs(5), "the ban applied locally", || {
        d.status()["bans_active"].as_u64() == Some(1)
    });
    assert_eq!(d.status()["redis"]["connected"], true, "{}", d.status());
    assert_eq!(listed(&r.cfg), vec!["198.51.100.7".to_owned()]);
    // An unban through TLS reaches the daemon through the events stream.
    let out = fleetban(&["unban", "198.51.100.7"], &r.cfg);
    assert!(out.status.success(), "unban: {}", String::from_utf8_lossy(&out.stderr));
    wait_until(Duration::from_secs(5), "unban applied", || {
        d.status()["bans_active"].as_u64() == Some(0)
    });
    drop(r.dir);
}

#[test]
fn a_tls_file_that_cannot_be_read_is_a_config_error_at_its_line() {
    let r = rig("redis:\n  url: rediss://127.0.0.1:6380/0\n  tls:\n    ca: /nonexistent/ca.pem\n");
    let out = fleetban(&["check"], &r.cfg);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("{}:8:9:", r.cfg.display())) && err.contains("redis.tls.ca"),
        "{err}"
    );
    let r = rig("redis:\n  url: redis://127.0.0.1:6379/0\n  cluster: [redis://127.0.0.1:7000]\n");
    let err = String::from_utf8_lossy(&fleetban(&["check"], &r.cfg).stderr).into_owned();
    assert!(err.contains("exactly one of `url`, `cluster` or `sentinel`"), "{err}");
    let r = rig("redis:\n  url: redis://127.0.0.1:6379/0\n  tls: { ca: ca.pem }\n");
    std::fs::write(r.dir.path().join("ca.pem"), "-----BEGIN CERTIFICATE-----\n").unwrap();
    let err = String::from_utf8_lossy(&fleetban(&["check"], &r.cfg).stderr).into_owned();
    assert!(err.contains("TLS needs `rediss://`"), "{err}");
}

/// A master, its replica and one sentinel watching them (quorum 1, down
/// after 1 s), all on loopback; returns when the sentinel knows the replica.
fn sentinel_trio(dir: &Path) -> (Server, Server, Server) {
    let master = Server::plain(dir, "master", &[]);
    let mport = master.port.to_string();
    let replica = Server::plain(dir, "replica", &["--replicaof", "127.0.0.1", &mport]);
    wait_until(Duration::from_secs(10), "replica in sync", || {
        replica.cli(&["INFO", "replication"]).contains("master_link_status:up")
    });
    let sport = free_port();
    let sdir = dir.join("sentinel");
    std::fs::create_dir_all(&sdir).unwrap();
    let conf = sdir.join("sentinel.conf");
    std::fs::write(
        &conf,
        format!(
            "port {sport}\nbind 127.0.0.1\nsentinel monitor mymaster 127.0.0.1 {mport} 1\n\
             sentinel down-after-milliseconds mymaster 1000\nsentinel failover-timeout mymaster 10000\n"
        ),
    )
    .unwrap();
    let mut sentinel = Server::start_bin("redis-sentinel", &sdir, "sentinel", &[conf.display().to_string()]);
    sentinel.port = sport;
    sentinel.wait_ping();
    let rport = replica.port.to_string();
    wait_until(Duration::from_secs(20), "the sentinel knows the replica", || {
        sentinel.cli(&["SENTINEL", "replicas", "mymaster"]).contains(&rport)
    });
    // The daemon logs in to the master as the minimal ACL user (not
    // replicated: created on both).
    acl_user(master.port, "+role");
    acl_user(replica.port, "+role");
    (master, replica, sentinel)
}

fn sentinel_rig(sentinel: &Server) -> Rig {
    rig(&format!(
        "redis: {{ sentinel: {{ service: mymaster, nodes: ['redis://127.0.0.1:{}'], user: fleetban, password: s3cret-pw }}, timeout: 500ms }}\n",
        sentinel.port
    ))
}

#[test]
fn the_daemon_follows_a_sentinel_failover_to_the_promoted_replica() {
    let dir = tempfile::tempdir().unwrap();
    let (mut master, replica, sentinel) = sentinel_trio(dir.path());
    let rport = replica.port.to_string();
    let r = sentinel_rig(&sentinel);
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("198.51.100.7", 5));
    wait_until(Duration::from_secs(10), "ban on the first master", || {
        !zscore(master.port, "198.51.100.7").is_empty()
    });

    master.kill();
    wait_until(Duration::from_secs(30), "the sentinel promotes the replica", || {
        sentinel
            .cli(&["SENTINEL", "get-master-addr-by-name", "mymaster"])
            .ends_with(&rport)
    });
    append(&r.log, &hits("198.51.100.8", 5));
    wait_until(Duration::from_secs(30), "ban on the promoted replica", || {
        !zscore(replica.port, "198.51.100.8").is_empty()
    });
    assert!(
        !zscore(replica.port, "198.51.100.7").is_empty(),
        "the first ban was replicated"
    );
    wait_until(Duration::from_secs(10), "both bans applied, Redis connected", || {
        let s = d.status();
        s["bans_active"].as_u64() == Some(2) && s["redis"]["connected"] == true
    });
    let mut l = listed(&r.cfg);
    l.sort();
    assert_eq!(l, vec!["198.51.100.7".to_owned(), "198.51.100.8".to_owned()]);
    // The daemon asked the sentinels again: its log says where it went.
    assert!(
        d.log_text().contains("asking the sentinels again") && d.log_text().contains(&format!("127.0.0.1:{rport}")),
        "no switch to the new master logged:\n{}",
        d.log_text()
    );
    // A fleet-wide unban on the new master reaches the daemon.
    assert!(fleetban(&["unban", "198.51.100.8"], &r.cfg).status.success());
    wait_until(Duration::from_secs(10), "unban applied", || {
        d.status()["bans_active"].as_u64() == Some(1)
    });
}

#[test]
fn a_switchover_demoting_the_master_is_followed() {
    // SENTINEL FAILOVER: the old master stays up as a replica (writes to it
    // answer READONLY, or its clients are disconnected); the daemon must move.
    let dir = tempfile::tempdir().unwrap();
    let (master, replica, sentinel) = sentinel_trio(dir.path());
    let r = sentinel_rig(&sentinel);
    let d = Daemon::start(None, &r.cfg, &r.control);
    append(&r.log, &hits("198.51.100.7", 5));
    wait_until(Duration::from_secs(10), "ban on the first master", || {
        !zscore(master.port, "198.51.100.7").is_empty()
    });
    // The sentinel learns of the replica from the master's INFO (every 10 s
    // at first): until then it answers NOGOODSLAVE. Ask again until it can.
    let mut answer = String::new();
    wait_until(Duration::from_secs(30), "the sentinel to accept a failover", || {
        answer = sentinel.cli(&["SENTINEL", "FAILOVER", "mymaster"]);
        !answer.starts_with("NOGOODSLAVE")
    });
    assert_eq!(answer, "OK");
    let rport = replica.port.to_string();
    wait_until(
        Duration::from_secs(30),
        "the replica promoted, the master demoted",
        || {
            sentinel
                .cli(&["SENTINEL", "get-master-addr-by-name", "mymaster"])
                .ends_with(&rport)
                && master.cli(&["INFO", "replication"]).contains("master_link_status:up")
        },
    );
    append(&r.log, &hits("198.51.100.8", 5));
    wait_until(Duration::from_secs(30), "ban on the new master", || {
        !zscore(replica.port, "198.51.100.8").is_empty()
    });
    wait_until(Duration::from_secs(10), "both bans applied, Redis connected", || {
        let s = d.status();
        s["bans_active"].as_u64() == Some(2) && s["redis"]["connected"] == true
    });
    let mut l = listed(&r.cfg);
    l.sort();
    assert_eq!(l, vec!["198.51.100.7".to_owned(), "198.51.100.8".to_owned()]);
    assert!(d.log_text().contains("asking the sentinels again"), "{}", d.log_text());
}

#[test]
fn the_daemon_bans_through_a_three_master_cluster() {
    let dir = tempfile::tempdir().unwrap();
    let nodes: Vec<Server> = (0..3)
        .map(|i| {
            // The bus port explicitly: the default (port + 10000) may not exist.
            let bus = free_port().to_string();
            Server::plain(
                dir.path(),
                &format!("node{i}"),
                &[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus,
                ],
            )
        })
        .collect();
    let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port)).collect();
    let out = Command::new(require("redis-cli"))
        .arg("--cluster")
        .arg("create")
        .args(&addrs)
        .args(["--cluster-replicas", "0", "--cluster-yes"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "cluster create: {}",
        String::from_utf8_lossy(&out.stdout)
    );
    wait_until(Duration::from_secs(20), "cluster state ok on every node", || {
        nodes
            .iter()
            .all(|n| n.cli(&["CLUSTER", "INFO"]).contains("cluster_state:ok"))
    });
    // Two rules: the sliding window with its prefilter tier and the fixed
    // window, whose scripts derive counter keys from KEYS[1] (same slot).
    for n in &nodes {
        acl_user(n.port, "+cluster|slots");
    }
    let r = rig(&format!(
        "redis: {{ cluster: ['redis://fleetban:s3cret-pw@{}'] }}\n",
        addrs[0]
    ));
    std::fs::write(
        r.dir.path().join("rules.yaml"),
        format!(
            "rules:\n  - name: r\n    logs: [{log}]\n    ignore: {{ path: ^/f }}\n    limit: {{ hits: 3, window: 60s, prefilter: 0.5 }}\n    ban: {{ duration: 1h }}\n\
             \x20 - name: f\n    logs: [{log}]\n    match: {{ path: ^/f }}\n    limit: {{ hits: 3, window: 60s, algorithm: fixed_window }}\n    ban: {{ duration: 1h }}\n",
            log = r.log.display()
        ),
    )
    .unwrap();
    let d = Daemon::start(None, &r.cfg, &r.control);
    // Addresses spread over the three masters' slots, plus one under the limit.
    let banned: Vec<String> = (1..=12).map(|i| format!("198.51.100.{i}")).collect();
    let mut text = String::new();
    for a in &banned {
        text += &hits(a, 5);
    }
    text += &hits("198.51.100.200", 2);
    let now = fleetban::now_ms();
    for i in 0..5 {
        text += &combined_line("203.0.113.9", now + i, "/f", 200);
    }
    append(&r.log, &text);
    wait_until(Duration::from_secs(20), "every ban applied", || {
        d.status()["bans_active"].as_u64() == Some(13)
    });
    let out = fleetban(&["bans", "--json"], &r.cfg);
    let by_f = String::from_utf8_lossy(&out.stdout)
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
    assert!(fleetban(&["unban", "198.51.100.1"], &r.cfg).status.success());
    wait_until(Duration::from_secs(10), "unban applied", || {
        d.status()["bans_active"].as_u64() == Some(12)
    });
}
