//! A `fleetban run` under test: the real binary, in a network namespace when
//! given one (so its nft table is the namespace's), with its log captured.
//! Stopped with SIGTERM on Drop (SIGKILL if it lingers).

use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use super::{control_status, fleetban_bin, require, wait_until, NetNs};

pub struct Daemon {
    child: Option<Child>,
    pub config: PathBuf,
    pub log: PathBuf,
    pub control: PathBuf,
}

impl Daemon {
    /// Starts `fleetban run -c config` and waits until its control socket
    /// answers. `control` is the socket path the config names.
    pub fn start(ns: Option<&NetNs>, config: &Path, control: &Path) -> Daemon {
        Daemon::start_with_env(ns, config, control, &[])
    }

    /// [`Daemon::start`] with extra environment variables (NOTIFY_SOCKET, ...).
    pub fn start_with_env(ns: Option<&NetNs>, config: &Path, control: &Path, env: &[(&str, &str)]) -> Daemon {
        Daemon::start_program(&fleetban_bin(), ns, config, control, env)
    }

    /// As [`Daemon::start_with_env`], running the fleetban binary at
    /// `program` instead of this build's (benchmarks comparing two builds).
    pub fn start_program(
        program: &Path,
        ns: Option<&NetNs>,
        config: &Path,
        control: &Path,
        env: &[(&str, &str)],
    ) -> Daemon {
        Daemon::launch(program, ns, config, control, env, None, true)
    }

    /// [`Daemon::start_with_env`] with `RLIMIT_NOFILE` set to `nofile`
    /// (soft and hard) in the child before it runs: a daemon that runs out
    /// of descriptors.
    pub fn start_with_nofile(
        ns: Option<&NetNs>,
        config: &Path,
        control: &Path,
        env: &[(&str, &str)],
        nofile: u64,
    ) -> Daemon {
        Daemon::launch(&fleetban_bin(), ns, config, control, env, Some(nofile), true)
    }

    fn launch(
        program: &Path,
        ns: Option<&NetNs>,
        config: &Path,
        control: &Path,
        env: &[(&str, &str)],
        nofile: Option<u64>,
        wait: bool,
    ) -> Daemon {
        let log = config.with_extension("log");
        let err = std::fs::File::create(&log).unwrap();
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new(require("ip"));
                c.args(["netns", "exec", &ns.name]).arg(program);
                c
            }
            None => Command::new(program),
        };
        cmd.args(["run", "-c"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err);
        cmd.env("RUST_LOG", "fleetban=debug,info");
        cmd.envs(env.iter().copied());
        if let Some(n) = nofile {
            use std::os::unix::process::CommandExt;
            // SAFETY: only setrlimit, async-signal-safe, between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    match libc::setrlimit(libc::RLIMIT_NOFILE, &lim) {
                        0 => Ok(()),
                        _ => Err(std::io::Error::last_os_error()),
                    }
                });
            }
        }
        let child = cmd.spawn().expect("spawn fleetban run");
        let d = Daemon {
            child: Some(child),
            config: config.to_path_buf(),
            log,
            control: control.to_path_buf(),
        };
        if wait {
            d.wait_up()
        } else {
            d
        }
    }

    /// [`Daemon::start_with_env`] without waiting for the control socket:
    /// a test that looks at the start itself, then calls `wait_up`.
    pub fn spawn(ns: Option<&NetNs>, config: &Path, control: &Path, env: &[(&str, &str)]) -> Daemon {
        Daemon::launch(&fleetban_bin(), ns, config, control, env, None, false)
    }

    /// Waits until the control socket answers (20 s at most).
    pub fn wait_up(mut self) -> Daemon {
        let d = &mut self;
        let start = Instant::now();
        loop {
            if d.status_opt().is_some() {
                break;
            }
            if let Some(st) = d.child.as_mut().unwrap().try_wait().unwrap() {
                panic!("fleetban exited early ({st}):\n{}", d.log_text());
            }
            assert!(
                start.elapsed() < Duration::from_secs(20),
                "fleetban did not come up:\n{}",
                d.log_text()
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        self
    }

    /// Runs `fleetban run -c config` expecting it to exit by itself within
    /// `limit` (a start it must refuse); its exit status and its log.
    /// Killed, and a panic, if it is still running then.
    pub fn run_to_exit(ns: Option<&NetNs>, config: &Path, limit: Duration) -> (ExitStatus, String) {
        let log = config.with_extension("refused.log");
        let err = std::fs::File::create(&log).unwrap();
        let mut cmd = match ns {
            Some(ns) => {
                let mut c = Command::new(require("ip"));
                c.args(["netns", "exec", &ns.name]).arg(fleetban_bin());
                c
            }
            None => Command::new(fleetban_bin()),
        };
        let mut child = cmd
            .args(["run", "-c"])
            .arg(config)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(err)
            .spawn()
            .expect("spawn fleetban run");
        let start = Instant::now();
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return (st, std::fs::read_to_string(&log).unwrap_or_default());
            }
            if start.elapsed() > limit {
                let _ = child.kill();
                let _ = child.wait();
                panic!(
                    "fleetban kept running for {limit:?}:\n{}",
                    std::fs::read_to_string(&log).unwrap_or_default()
                );
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    pub fn log_text(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    fn status_opt(&self) -> Option<serde_json::Value> {
        control_status(&self.control)
    }

    pub fn status(&self) -> serde_json::Value {
        self.status_opt()
            .unwrap_or_else(|| panic!("no status from the daemon:\n{}", self.log_text()))
    }

    /// Waits until the daemon has read `lines` lines in all.
    pub fn wait_lines(&self, lines: u64) {
        wait_until(Duration::from_secs(20), "daemon to read the lines", || {
            self.status()["lines"].as_u64().unwrap_or(0) >= lines
        });
    }

    pub fn pid(&self) -> u32 {
        self.child.as_ref().unwrap().id()
    }

    /// CPU time the daemon has used so far (user + system, from
    /// `/proc/PID/stat`), for a daemon started without a namespace (with
    /// one, the pid is `ip netns exec`'s, which execs into it: the same).
    pub fn cpu_time(&self) -> Duration {
        let stat = std::fs::read_to_string(format!("/proc/{}/stat", self.pid())).expect("read /proc/PID/stat");
        // Fields after the command's closing parenthesis; utime and stime
        // are the 14th and 15th of the line, the 12th and 13th after it.
        let rest = &stat[stat.rfind(')').expect("comm in stat") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().unwrap() + f[12].parse::<u64>().unwrap();
        // SAFETY: sysconf reads a constant.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// Sends `sig` (SIGHUP, ...) to the daemon.
    pub fn signal(&self, sig: i32) {
        // SAFETY: signalling our own child.
        unsafe { libc::kill(self.pid() as i32, sig) };
    }

    /// SIGTERM, then wait (at most `limit`).
    pub fn stop(&mut self, limit: Duration) -> (ExitStatus, Duration) {
        let mut child = self.child.take().expect("running");
        let t = Instant::now();
        // SAFETY: signalling our own child.
        unsafe { libc::kill(child.id() as i32, libc::SIGTERM) };
        loop {
            if let Some(st) = child.try_wait().unwrap() {
                return (st, t.elapsed());
            }
            if t.elapsed() > limit {
                let _ = child.kill();
                panic!("fleetban did not stop within {limit:?}:\n{}", self.log_text());
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    pub fn kill9(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

impl Drop for Daemon {
    fn drop(&mut self) {
        if let Some(mut c) = self.child.take() {
            unsafe { libc::kill(c.id() as i32, libc::SIGTERM) };
            let t = Instant::now();
            while t.elapsed() < Duration::from_secs(5) {
                if let Ok(Some(_)) = c.try_wait() {
                    return;
                }
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = c.kill();
            let _ = c.wait();
        }
    }
}

/// The test's end of a daemon's `NOTIFY_SOCKET`: a unix datagram socket the
/// test binds, collecting what the daemon says to systemd.
pub struct NotifySocket {
    sock: std::os::unix::net::UnixDatagram,
    pub path: PathBuf,
}

impl NotifySocket {
    /// Binds `dir/notify.sock`.
    pub fn bind(dir: &Path) -> NotifySocket {
        let path = dir.join("notify.sock");
        let sock = std::os::unix::net::UnixDatagram::bind(&path).expect("bind the notify socket");
        sock.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        NotifySocket { sock, path }
    }

    /// The datagrams that arrive within `d` (bounded: `d`, then it returns).
    pub fn during(&self, d: Duration) -> Vec<String> {
        let start = Instant::now();
        let mut out = Vec::new();
        let mut buf = [0u8; 4096];
        while start.elapsed() < d {
            if let Ok(n) = self.sock.recv(&mut buf) {
                out.push(String::from_utf8_lossy(&buf[..n]).into_owned());
            }
        }
        out
    }

    /// Waits (at most `limit`) for a datagram with a line `what`.
    pub fn expect(&self, what: &str, limit: Duration) {
        let start = Instant::now();
        let mut buf = [0u8; 4096];
        while start.elapsed() < limit {
            if let Ok(n) = self.sock.recv(&mut buf) {
                if String::from_utf8_lossy(&buf[..n]).lines().any(|l| l == what) {
                    return;
                }
            }
        }
        panic!("no {what:?} on the notify socket within {limit:?}");
    }
}

/// A line of the daemon's log with its terminal colours taken out.
pub fn strip_ansi(s: &str) -> String {
    let mut out = String::new();
    let mut esc = false;
    for c in s.chars() {
        match (esc, c) {
            (false, '\x1b') => esc = true,
            (true, 'm') => esc = false,
            (true, _) => {}
            (false, c) => out.push(c),
        }
    }
    out
}

/// `2026-11-30T00:41:32.123456Z` -> µs since the epoch.
pub fn parse_rfc3339_us(s: &str) -> i64 {
    let num = |x: &str| x.parse::<i64>().unwrap_or(0);
    let Some((date, time)) = s.split_once('T') else {
        return 0;
    };
    let d: Vec<i64> = date.split('-').map(num).collect();
    let time = time.trim_end_matches('Z');
    let (hms, frac) = time.split_once('.').unwrap_or((time, "0"));
    let t: Vec<i64> = hms.split(':').map(num).collect();
    if d.len() != 3 || t.len() != 3 {
        return 0;
    }
    let us = num(&format!("{frac:0<6}")[..6]);
    let (y, m) = if d[1] <= 2 {
        (d[0] - 1, d[1] + 9)
    } else {
        (d[0], d[1] - 3)
    };
    let era = y.div_euclid(400);
    let yoe = y - era * 400;
    let doy = (153 * m + 2) / 5 + d[2] - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    let days = era * 146_097 + doe - 719_468;
    ((days * 86_400 + t[0] * 3600 + t[1] * 60 + t[2]) * 1_000_000) + us
}

/// A field of `/proc/PID/status` in kB (`VmRSS`, `RssAnon`, ...); None when
/// the process or the field is gone.
pub fn proc_status_kb(pid: u32, field: &str) -> Option<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
    let value = status.lines().find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))?;
    value.split_whitespace().next()?.parse().ok()
}

/// Resident memory of process `pid` in MB (VmRSS; NaN when gone).
pub fn rss_mb(pid: u32) -> f64 {
    proc_status_kb(pid, "VmRSS").map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}

/// The anonymous part of it in MB (RssAnon: the heap and stacks, not the
/// pages of the binary's own code, which count in VmRSS but are the page
/// cache's, shared and reclaimable).
pub fn anon_mb(pid: u32) -> f64 {
    proc_status_kb(pid, "RssAnon").map_or(f64::NAN, |kb| kb as f64 / 1024.0)
}
