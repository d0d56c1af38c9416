//! The integration-test harness: real parts, no mocks.
//!
//! Every test that needs the outside world builds it from these guards: a
//! private `redis-server` on a unix socket, or on loopback for the
//! topologies that need TCP ([`Redis`]), network namespaces that stand in for
//! fleet hosts ([`NetNs`], [`veth_pair`]), an nginx writing a real access log
//! inside one of them ([`Nginx`], [`web_and_client`]), curl as the client
//! ([`http_get`]), nft read back as JSON ([`nft_bans`]), the real daemon
//! ([`Daemon`]) and a Debian tree booted under a live systemd
//! ([`Machine`]); [`fleet::Fleet`] puts them together as hosts sharing one
//! Redis, with a client namespace holding many addresses. Each guard cleans
//! up on Drop, also when the test panics. A missing binary is a loud failure
//! ([`require`]), never a silent skip: `scripts/ensure-deps.sh` installs
//! them.
//!
//! What the daemon is given comes from here too: its config files
//! ([`ConfigDir`], [`MainConfig`], [`Rule`]), its log lines
//! ([`combined_lines`], [`append`]) and its command line ([`cli`]). Its
//! decision endpoint is asked as nginx asks it ([`Checker`]). The
//! library's own API is called from these files only where a test needs it
//! for set-up (the control socket, a Redis connection, the clock), so a
//! rename there touches the harness alone.
//!
//! Test files use it with `mod common;`; not every test uses every helper.
#![allow(dead_code, unused_imports)]

mod access_log;
mod cli;
mod config;
mod daemon;
pub mod escalation;
pub mod fleet;
pub mod flood;
mod http;
mod machine;
pub mod metrics;
pub mod model;
mod netns;
mod nft;
mod nginx;
pub mod operator;
pub mod probe;
pub mod receiver;
mod redis;
pub mod replay;
pub use access_log::{append, combined_line, combined_lines, now_ms};
pub use cli::{cli, cli_on_terminal, control_status, fleetban_test_json, CliOutput};
pub use config::{rules_yaml, ConfigDir, MainConfig, Rule};
pub use daemon::{anon_mb, parse_rfc3339_us, proc_status_kb, rss_mb, strip_ansi, Daemon, NotifySocket};
pub use http::{Answer, Checker};
pub use machine::Machine;

pub use netns::{
    connect_from, get_from, http_get, http_get_headers, http_get_target, http_get_with, veth_pair, NetNs, Reply,
};
pub use nft::{
    ban_sets, nft_bans, nft_bans_detailed, nft_set_elements, nft_set_elements_detailed, parse_set_json, NftElem,
    NftShim,
};
pub use nginx::{shipped_snippet, web_and_client, Nginx, Site};
pub use redis::{connect, runtime, Redis, ACL_PASSWORD};

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output};
use std::thread;
use std::time::{Duration, Instant};

/// Where binaries are looked for besides `$PATH`: CI may run with a PATH that
/// lacks the sbin directories where Debian puts `ip`, `nft` and `nginx`.
const EXTRA_BIN_DIRS: &[&str] = &["/usr/local/sbin", "/usr/sbin", "/sbin"];

/// Finds `bin` on `$PATH` (and the sbin directories), or panics saying how to
/// get it. Tests must fail, not skip, when a dependency is missing.
pub fn require(bin: &str) -> PathBuf {
    if bin.contains('/') {
        let p = PathBuf::from(bin);
        assert!(is_executable(&p), "{bin} not found or not executable");
        return p;
    }
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(EXTRA_BIN_DIRS.iter().map(PathBuf::from))
        .map(|dir| dir.join(bin))
        .find(|p| is_executable(p))
        .unwrap_or_else(|| panic!("{bin} not found: run scripts/ensure-deps.sh"))
}

fn is_executable(p: &Path) -> bool {
    use std::os::unix::fs::PermissionsExt;
    std::fs::metadata(p)
        .map(|m| m.is_file() && m.permissions().mode() & 0o111 != 0)
        .unwrap_or(false)
}

/// Panics unless running as root: namespaces, nft and nginx's `user root` need it.
pub fn require_root(what: &str) {
    // SAFETY: geteuid has no preconditions and cannot fail.
    let euid = unsafe { libc::geteuid() };
    assert_eq!(euid, 0, "{what} needs root (tests run as root in CI)");
}

/// Polls `f` every 20 ms until it returns true; panics naming `what` if it has
/// not within `timeout`.
pub fn wait_until(timeout: Duration, what: &str, mut f: impl FnMut() -> bool) {
    let step = Duration::from_millis(20);
    let deadline = Instant::now() + timeout;
    let max_polls = timeout.as_millis() / step.as_millis() + 2;
    for _ in 0..max_polls {
        if f() {
            return;
        }
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(step);
    }
    panic!("timed out after {timeout:?} waiting for {what}");
}

/// The fleetban binary built by cargo for this test run.
pub fn fleetban_bin() -> PathBuf {
    match option_env!("CARGO_BIN_EXE_fleetban") {
        Some(p) => PathBuf::from(p),
        None => panic!("CARGO_BIN_EXE_fleetban is not set: only integration tests of the fleetban crate have it"),
    }
}

/// The sample access log kept in the repository
/// (`tests/data/corpus/elastic-examples-access.log`, its licence beside it).
pub fn corpus_path() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus/elastic-examples-access.log")
}

/// A TCP port on 127.0.0.1 nobody listens on right now (the kernel's pick
/// for port 0, released).
pub fn free_port() -> u16 {
    let l = std::net::TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
    l.local_addr().expect("a bound address").port()
}

/// Sends `sig` to `pid`; a process that is already gone is not an error.
pub(crate) fn signal(pid: u32, sig: libc::c_int) {
    let Ok(pid) = libc::pid_t::try_from(pid) else {
        return;
    };
    // SAFETY: kill(2) only takes plain integers; errors (ESRCH) are ignored.
    unsafe {
        libc::kill(pid, sig);
    }
}

/// SIGKILLs a child and reaps it, so it leaves no zombie behind.
pub(crate) fn kill_and_reap(child: &mut Child) {
    if let Ok(None) = child.try_wait() {
        signal(child.id(), libc::SIGKILL);
    }
    let _ = child.wait();
}

/// Waits up to `timeout` for `child` to exit; true if it has.
pub(crate) fn wait_exit(child: &mut Child, timeout: Duration) -> bool {
    let mut exited = false;
    let step = Duration::from_millis(20);
    let deadline = Instant::now() + timeout;
    for _ in 0..timeout.as_millis() / step.as_millis() + 2 {
        if !matches!(child.try_wait(), Ok(None)) {
            exited = true;
            break;
        }
        if Instant::now() >= deadline {
            break;
        }
        thread::sleep(step);
    }
    exited
}

/// Runs `cmd` to completion; panics with what it printed unless it succeeds.
pub fn run_ok(cmd: &mut Command) -> Output {
    let out = cmd.output().unwrap_or_else(|e| panic!("spawn {cmd:?}: {e}"));
    assert!(
        out.status.success(),
        "{cmd:?} failed ({}):\nstdout: {}\nstderr: {}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    out
}

/// Reads a file for a diagnostic message; never fails.
pub(crate) fn read_lossy(p: &Path) -> String {
    std::fs::read(p)
        .map(|b| String::from_utf8_lossy(&b).into_owned())
        .unwrap_or_else(|e| format!("<cannot read {}: {e}>", p.display()))
}

/// A small deterministic generator (xorshift), so a failure replays.
pub struct Rng(pub u64);

impl Rng {
    pub fn below(&mut self, n: u64) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0 % n
    }
}
