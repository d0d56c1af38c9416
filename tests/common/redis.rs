//! A private `redis-server` per test: unix socket in a temp dir, no TCP port,
//! no persistence. It can be killed and restarted on the same socket to test
//! what the daemon does while Redis is down.

use super::{kill_and_reap, read_lossy, require};
use std::io::{Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

/// How long a fresh server may take to answer PING.
const START_TIMEOUT: Duration = Duration::from_secs(5);

pub struct Redis {
    /// Holds the socket, the log and the (unused) data dir; removed on Drop.
    dir: TempDir,
    /// None while killed.
    child: Option<Child>,
    /// The unix socket; stays the same across `restart`.
    pub socket: PathBuf,
}

impl Redis {
    /// Spawns `redis-server` and waits until it answers PING.
    pub fn start() -> Redis {
        let dir = tempfile::Builder::new()
            .prefix("fbt-redis-")
            .tempdir()
            .expect("create temp dir for redis");
        let socket = dir.path().join("redis.sock");
        // sun_path is 108 bytes; a long $TMPDIR would make bind() fail obscurely.
        assert!(
            socket.as_os_str().len() < 100,
            "redis socket path too long for a unix socket: {} (set a shorter TMPDIR)",
            socket.display()
        );
        let mut redis = Redis {
            dir,
            child: None,
            socket,
        };
        redis.spawn();
        redis
    }

    /// `unix://<socket>`, the form fleetban's `redis.url` takes.
    pub fn url(&self) -> String {
        format!("unix://{}", self.socket.display())
    }

    /// The temp dir holding the socket and `redis.log`.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The server's pid, None while killed.
    pub fn pid(&self) -> Option<u32> {
        self.child.as_ref().map(Child::id)
    }

    /// Runs `redis-cli -s SOCKET --raw ARGS...` and returns its stdout without
    /// the final newline. Error replies come back as text ("ERR ..."), since
    /// redis-cli exits 0 for them; a redis-cli that cannot run panics.
    pub fn cli(&self, args: &[&str]) -> String {
        let out = Command::new(require("redis-cli"))
            .arg("-s")
            .arg(&self.socket)
            .arg("--raw")
            .args(args)
            .stdin(Stdio::null())
            .output()
            .expect("spawn redis-cli");
        assert!(
            out.status.success(),
            "redis-cli {args:?} failed ({}): {}{}",
            out.status,
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        let mut s = String::from_utf8_lossy(&out.stdout).into_owned();
        if s.ends_with('\n') {
            s.pop();
        }
        s
    }

    /// One PING over the socket with short timeouts; true on `+PONG`.
    pub fn ping(&self) -> bool {
        ping(&self.socket)
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
        let child = Command::new(require("redis-server"))
            .args(["--port", "0", "--unixsocket"])
            .arg(&self.socket)
            .args(["--unixsocketperm", "777", "--save", "", "--appendonly", "no"])
            .arg("--dir")
            .arg(self.dir.path())
            .arg("--logfile")
            .arg(&log)
            .args(["--daemonize", "no"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .expect("spawn redis-server");
        self.child = Some(child);

        let deadline = Instant::now() + START_TIMEOUT;
        for _ in 0..START_TIMEOUT.as_millis() / 20 + 2 {
            if self.ping() {
                return;
            }
            let child = self.child.as_mut().expect("just spawned");
            if let Ok(Some(status)) = child.try_wait() {
                self.child = None;
                panic!("redis-server exited at start ({status}); log:\n{}", read_lossy(&log));
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        self.kill();
        panic!(
            "redis-server did not answer PING on {} within {START_TIMEOUT:?}; log:\n{}",
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
