//! A private `redis-server` per test: a unix socket in a temp dir, no
//! persistence. It can be killed and restarted on the same socket to test
//! what the daemon does while Redis is down. For topologies a daemon reaches
//! over TCP (replicas, Sentinel, Cluster, TLS) a server also listens on
//! 127.0.0.1; the test's own checks still go through the socket.
//!
//! The library's side of the same server is here too: its `RedisConfig` and
//! a connection (`store::connect`), for tests that drive the library directly.

use super::{kill_and_reap, read_lossy, require, run_ok};
use fleetban::config::RedisConfig;
use fleetban::store::{self, Conn};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long a fresh server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(5);

/// The password [`Redis::add_acl_user`] gives user `fleetban`.
pub const ACL_PASSWORD: &str = "s3cret-pw";

pub struct Redis {
    /// Holds the socket, the log and the data dir; removed on Drop.
    dir: TempDir,
    /// None while killed.
    child: Option<Child>,
    /// The unix socket; stays the same across `restart`.
    pub socket: PathBuf,
    /// The TCP port on 127.0.0.1, for servers started with one.
    port: Option<u16>,
    /// `redis-server`, or `redis-sentinel`.
    program: &'static str,
    /// Given before everything else (a sentinel's config file).
    leading: Vec<String>,
    /// Given after the harness's own arguments (TLS, replication, cluster).
    extra: Vec<String>,
}

impl Redis {
    /// Spawns `redis-server` on a unix socket only and waits until it
    /// answers PING.
    pub fn start() -> Redis {
        Redis::start_with(&[])
    }

    /// As [`Redis::start`], with more server arguments (`--tls-port`, ...).
    pub fn start_with(extra: &[&str]) -> Redis {
        Redis::launch(None, extra)
    }

    /// As [`Redis::start_with`], also listening on 127.0.0.1 at a free port
    /// ([`Redis::port`]).
    pub fn start_tcp(extra: &[&str]) -> Redis {
        Redis::launch(Some(super::free_port()), extra)
    }

    /// A `redis-sentinel` on 127.0.0.1 at a free port, its config file
    /// holding `conf` (the sentinel rewrites it).
    /// Three masters joined by `redis-cli --cluster create`, state ok on
    /// each (private servers on loopback TCP, free ports).
    pub fn start_cluster() -> Vec<Redis> {
        let nodes: Vec<Redis> = (0..3)
            .map(|_| {
                // The bus port explicitly: the default (port + 10000) may not exist.
                let bus = super::free_port().to_string();
                Redis::start_tcp(&[
                    "--cluster-enabled",
                    "yes",
                    "--cluster-config-file",
                    "nodes.conf",
                    "--cluster-node-timeout",
                    "2000",
                    "--cluster-port",
                    &bus,
                ])
            })
            .collect();
        let addrs: Vec<String> = nodes.iter().map(|n| format!("127.0.0.1:{}", n.port())).collect();
        run_ok(
            Command::new(require("redis-cli"))
                .args(["--cluster", "create"])
                .args(&addrs)
                .args(["--cluster-replicas", "0", "--cluster-yes"])
                .stdin(Stdio::null()),
        );
        super::wait_until(Duration::from_secs(20), "cluster state ok on every node", || {
            nodes.iter().all(|n| {
                n.try_cli(&["CLUSTER", "INFO"])
                    .is_some_and(|i| i.contains("cluster_state:ok"))
            })
        });
        nodes
    }

    pub fn start_sentinel(conf: &str) -> Redis {
        let dir = temp_dir();
        let file = dir.path().join("sentinel.conf");
        std::fs::write(&file, conf).expect("write sentinel.conf");
        let mut redis = Redis::new(dir, "redis-sentinel", Some(super::free_port()));
        redis.leading = vec![file.display().to_string()];
        redis.spawn();
        redis
    }

    fn launch(port: Option<u16>, extra: &[&str]) -> Redis {
        let mut redis = Redis::new(temp_dir(), "redis-server", port);
        redis.extra = extra.iter().map(|s| s.to_string()).collect();
        redis.spawn();
        redis
    }

    fn new(dir: TempDir, program: &'static str, port: Option<u16>) -> Redis {
        let socket = dir.path().join("redis.sock");
        // sun_path is 108 bytes; a long $TMPDIR would make bind() fail obscurely.
        assert!(
            socket.as_os_str().len() < 100,
            "redis socket path too long for a unix socket: {} (set a shorter TMPDIR)",
            socket.display()
        );
        Redis {
            dir,
            child: None,
            socket,
            port,
            program,
            leading: Vec::new(),
            extra: Vec::new(),
        }
    }

    /// `unix://<socket>`, the form fleetban's `redis.url` takes.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The TCP port; panics for a server started without one.
    pub fn port(&self) -> u16 {
        self.port.expect("a server started with a TCP port")
    }

    /// The temp dir holding the socket and `redis.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's pid, None while killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// `redis-cli -s SOCKET`, not yet run, for what [`Redis::cli`] does not
    /// do (run in the background, log in as another user).
    pub fn cli_command(&self) -> Command {
        let mut cmd = Command::new(require("redis-cli"));
        cmd.arg("-s").arg(&self.socket).stdin(Stdio::null());
        cmd
    }

    /// Redis's `used_memory` (INFO memory), in bytes.
    pub fn used_memory(&self) -> i64 {
        self.cli(&["INFO", "memory"])
            .lines()
            .find_map(|l| l.strip_prefix("used_memory:"))
            .and_then(|v| v.trim().parse().ok())
            .expect("used_memory in INFO memory")
    }

    /// Runs `redis-cli -s SOCKET --raw ARGS...` and returns its stdout without
    /// the final newline. Error replies come back as text ("ERR ..."), since
    /// redis-cli exits 0 for them; a redis-cli that fails (no server, the
    /// connection closed) panics.
    pub fn cli(&self, args: &[&str]) -> String {
        without_newline(run_ok(self.cli_command().arg("--raw").args(args)).stdout)
    }

    /// As [`Redis::cli`] with `last` as the command's last argument, read by
    /// `redis-cli -x` from stdin: for values past the kernel's bound on
    /// one argument (128 KiB), e.g. a megabyte of garbage.
    pub fn cli_last_from_stdin(&self, args: &[&str], last: &[u8]) -> String {
        use std::io::Write;
        let mut child = self
            .cli_command()
            .args(["--raw", "-x"])
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .spawn()
            .expect("spawn redis-cli");
        child.stdin.take().unwrap().write_all(last).unwrap();
        let out = child.wait_with_output().unwrap();
        assert!(out.status.success(), "redis-cli -x {args:?} failed");
        without_newline(out.stdout)
    }

    /// As [`Redis::cli`], None when redis-cli fails: for polls that wait
    /// through a server going away or dropping its clients (a master
    /// demoted to replica closes every connection).
    pub fn try_cli(&self, args: &[&str]) -> Option<String> {
        let out = self.cli_command().arg("--raw").args(args).output().ok()?;
        out.status.success().then(|| without_newline(out.stdout))
    }

    /// Creates user `fleetban` (password [`ACL_PASSWORD`]) with the rights of
    /// `config/redis-acl.conf`, plus the `extra` ones its comment names for a
    /// topology (`+role`): the daemon and the CLI then run as exactly that user.
    pub fn add_acl_user(&self, extra: &[&str]) {
        let acl = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/config/redis-acl.conf")).unwrap();
        let line = acl
            .lines()
            .find(|l| l.starts_with("user fleetban "))
            .expect("the user line");
        let password = format!(">{ACL_PASSWORD}");
        let mut args = vec!["ACL", "SETUSER", "fleetban"];
        args.extend(line["user fleetban ".len()..].split_whitespace().map(|w| {
            if w == ">PASSWORD" {
                password.as_str()
            } else {
                w
            }
        }));
        for right in extra {
            assert!(acl.contains(right), "config/redis-acl.conf names {right}");
            args.push(right);
        }
        assert_eq!(self.cli(&args), "OK");
    }

    /// One PING over the socket with short timeouts; true on `+PONG`.
    /// Puts `n` active bans ending at `until_ms` in `{fleetban}:bans`, in
    /// one script: 3/4 single IPv4 addresses, 1/4 IPv6 /64s (the
    /// benchmarks' list of 100,000).
    pub fn preload_bans(&self, n: u64, until_ms: i64) {
        let script = "local n = tonumber(ARGV[1]) local u = ARGV[2] \
            for i = 0, n - 1 do \
              local m \
              if i % 4 == 3 then m = string.format('2001:db8:%x:%x::/64', math.floor(i / 65536), i % 65536) \
              else m = string.format('%d.%d.%d.%d', 100 + math.floor(i / 16777216) % 50, math.floor(i / 65536) % 256, math.floor(i / 256) % 256, i % 256) end \
              redis.call('ZADD', KEYS[1], u, m) end return n";
        self.cli(&[
            "EVAL",
            script,
            "1",
            "{fleetban}:bans",
            &n.to_string(),
            &until_ms.to_string(),
        ]);
        assert_eq!(self.cli(&["ZCARD", "{fleetban}:bans"]), n.to_string());
    }

    pub fn ping(&self) -> bool {
        ping(&self.socket)
    }

    /// The record of the ban of `addr` (as the list holds it) under the
    /// prefix `fleetban`, as the library reads it (`BanList::raw_records`: a
    /// compact record as JSON text, a JSON one as written); None without one.
    pub fn record_text(&self, addr: &str) -> Option<String> {
        let net = fleetban::addr::parse_member(addr).unwrap_or_else(|| panic!("{addr}: not a member"));
        let rt = runtime();
        let cfg = self.config("fleetban", Duration::from_secs(5));
        let con = connect(&rt, &cfg, Duration::from_secs(5));
        let mut list = fleetban::bans::BanList::redis(con, store::Keys::new("fleetban"));
        let mut recs = rt
            .block_on(list.raw_records(&[net]))
            .unwrap_or_else(|e| panic!("reading the record of {addr}: {e}"));
        recs.pop().flatten()
    }

    /// How many compact records the buckets `{fleetban}:banrec:N` hold.
    pub fn compact_records(&self) -> u64 {
        self.cli(&["--scan", "--pattern", "{fleetban}:banrec:*"])
            .lines()
            .filter(|k| !k.ends_with(":meta"))
            .map(|k| self.cli(&["HLEN", k]).trim().parse::<u64>().expect("HLEN"))
            .sum()
    }

    /// [`Redis::record_text`] parsed; panics without a record or with a
    /// damaged one.
    pub fn record(&self, addr: &str) -> serde_json::Value {
        let text = self.record_text(addr).unwrap_or_else(|| panic!("no record of {addr}"));
        serde_json::from_str(&text).unwrap_or_else(|e| panic!("the record of {addr} is not JSON ({e}): {text:?}"))
    }

    /// The library's config for this server (`RedisConfig::single` on its
    /// socket), keys under `prefix`, commands timing out after `timeout`.
    pub fn config(&self, prefix: &str, timeout: Duration) -> RedisConfig {
        RedisConfig {
            prefix: prefix.into(),
            ..RedisConfig::single(self.url(), timeout)
        }
    }

    /// SIGKILLs the server (no shutdown, no save) and reaps it.
    pub fn kill(&mut self) {
        if let Some(mut child) = self.child.take() {
            kill_and_reap(&mut child);
        }
    }

    /// Kills the server if it runs, then starts a fresh one on the same socket
    /// (with an empty dataset: nothing is persisted).
    pub fn restart(&mut self) {
        self.kill();
        self.spawn();
    }

    fn spawn(&mut self) {
        let log = self.dir.path().join("redis.log");
        let mut cmd = Command::new(require(self.program));
        cmd.args(&self.leading);
        match self.port {
            Some(port) => cmd.args(["--port", &port.to_string(), "--bind", "127.0.0.1"]),
            None => cmd.args(["--port", "0"]),
        };
        let child = cmd
            .arg("--unixsocket")
            .arg(&self.socket)
            .args(["--unixsocketperm", "777", "--save", "", "--appendonly", "no"])
            .args(&self.extra)
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap_or_else(|e| panic!("spawn {}: {e}", self.program));
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        for _ in 0..START_TIMEOUT.as_millis() / 20 + 2 {
            if self.ping() {
                return;
            }
            let child = self.child.as_mut().expect("just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                panic!(
                    "{} exited at start ({status}); log:\n{}",
                    self.program,
                    read_lossy(&log)
                );
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        panic!(
            "{} did not answer PING on {} within {START_TIMEOUT:?}; log:\n{}",
            self.program,
            self.socket.display(),
            read_lossy(&log)
        );
    }
}

impl Drop for Redis {
    fn drop(&mut self) {
        self.kill();
    }
}

fn without_newline(stdout: Vec<u8>) -> String {
    let mut s = String::from_utf8_lossy(&stdout).into_owned();
    if s.ends_with('\n') {
        s.pop();
    }
    s
}

fn temp_dir() -> TempDir {
    tempfile::Builder::new()
        .prefix("fbt-redis-")
        .tempdir()
        .expect("create temp dir for redis")
}

fn ping(socket: &Path) -> bool {
    let Ok(mut s) = UnixStream::connect(socket) else {
        return false;
    };
    let t = Some(Duration::from_millis(500));
    if s.set_read_timeout(t).is_err() || s.set_write_timeout(t).is_err() {
        return false;
    }
    if s.write_all(b"*1\r\n$4\r\nPING\r\n").is_err() {
        return false;
    }
    let mut buf = [0u8; 7];
    s.read_exact(&mut buf).is_ok() && &buf == b"+PONG\r\n"
}

/// A current-thread tokio runtime, for plain `#[test]`s that drive the
/// library's async API.
pub fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("build a tokio runtime")
}

/// `store::connect(cfg, Some(response_timeout))` on `rt`; panics if Redis
/// does not answer.
pub fn connect(rt: &tokio::runtime::Runtime, cfg: &RedisConfig, response_timeout: Duration) -> Conn {
    rt.block_on(store::connect(cfg, Some(response_timeout)))
        .unwrap_or_else(|e| panic!("connect to {}: {e}", cfg.url))
}
