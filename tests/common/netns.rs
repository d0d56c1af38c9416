//! Network namespaces as stand-in hosts, veth links between them, and curl as
//! the client. Names are `fbt-<tag>-<pid>-<n>`, so a leftover from a test run
//! that was killed outright can be recognised (its pid is gone) and removed.

use super::{require, require_root, run_ok, signal};
use std::ffi::OsStr;
use std::process::{Command, Output, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::Once;
use std::thread;
use std::time::{Duration, Instant};

static NS_COUNTER: AtomicU32 = AtomicU32::new(0);
static VETH_COUNTER: AtomicU32 = AtomicU32::new(0);
static SWEEP: Once = Once::new();

/// A network namespace created by this test; deleted (with every process in
/// it) on Drop.
pub struct NetNs {
    pub name: String,
}

impl NetNs {
    /// Creates `fbt-<tag>-<pid>-<n>` with `lo` up. `tag`: a short ASCII
    /// alphanumeric word saying what the namespace plays ("web", "a").
    pub fn new(tag: &str) -> NetNs {
        require_root("NetNs::new");
        assert!(
            !tag.is_empty() && tag.len() <= 12 && tag.bytes().all(|b| b.is_ascii_alphanumeric()),
            "netns tag must be 1-12 ASCII letters/digits, got {tag:?}"
        );
        SWEEP.call_once(sweep_stale);
        let n = NS_COUNTER.fetch_add(1, Ordering::Relaxed);
        let name = format!("fbt-{tag}-{}-{n}", std::process::id());
        ip(&["netns", "add", &name]);
        // From here on Drop deletes it, also if bringing lo up fails.
        let ns = NetNs { name };
        ip(&["-n", &ns.name, "link", "set", "lo", "up"]);
        ns
    }

    /// `ip netns exec NAME argv...`, not yet run. `argv[0]` is resolved with
    /// [`require`](super::require), so a missing binary fails clearly.
    pub fn exec<S: AsRef<OsStr>>(&self, argv: &[S]) -> Command {
        let (prog, args) = argv.split_first().expect("exec needs a program");
        let prog = require(prog.as_ref().to_str().expect("program name is UTF-8"));
        let mut cmd = Command::new(require("ip"));
        cmd.args(["netns", "exec", &self.name])
            .arg(prog)
            .args(args)
            .stdin(Stdio::null());
        cmd
    }

    /// Runs `argv` in the namespace to completion; panics (with its stderr)
    /// unless it succeeds.
    pub fn run<S: AsRef<OsStr>>(&self, argv: &[S]) -> Output {
        run_ok(&mut self.exec(argv))
    }

    /// Pids of the processes inside the namespace.
    pub fn pids(&self) -> Vec<u32> {
        ns_pids(&self.name)
    }
}

impl Drop for NetNs {
    fn drop(&mut self) {
        remove_ns(&self.name);
    }
}

/// Links `a` and `b` with a veth pair, addresses them (`/24` unless a prefix
/// is given) and brings both ends up. Addresses must be in 10.213.0.0/16.
/// Returns the interface names (in `a`, in `b`).
pub fn veth_pair(a: &NetNs, a_addr: &str, b: &NetNs, b_addr: &str) -> (String, String) {
    assert_ne!(a.name, b.name, "veth_pair needs two namespaces");
    let n = VETH_COUNTER.fetch_add(1, Ordering::Relaxed);
    let (if_a, if_b) = (format!("fbv{n}a"), format!("fbv{n}b"));
    ip(&[
        "-n", &a.name, "link", "add", &if_a, "type", "veth", "peer", "name", &if_b, "netns", &b.name,
    ]);
    for (ns, ifname, addr) in [(a, &if_a, a_addr), (b, &if_b, b_addr)] {
        assert!(
            addr.starts_with("10.213."),
            "test addresses must be in 10.213.0.0/16, got {addr}"
        );
        let cidr = if addr.contains('/') {
            addr.to_string()
        } else {
            format!("{addr}/24")
        };
        ip(&["-n", &ns.name, "addr", "add", &cidr, "dev", ifname]);
        ip(&["-n", &ns.name, "link", "set", ifname, "up"]);
    }
    (if_a, if_b)
}

/// GETs `url` with curl inside `ns`; the HTTP status, or Err when the request
/// fails (refused, timed out, dropped by nft).
pub fn http_get(ns: &NetNs, url: &str, timeout: Duration) -> Result<u16, String> {
    http_get_with(ns, url, &[], timeout)
}

/// As [`http_get`], with extra curl arguments (e.g. `["-A", "agent"]`,
/// `["-X", "POST"]`, `["--path-as-is"]`) placed before the URL.
pub fn http_get_with(ns: &NetNs, url: &str, extra: &[&str], timeout: Duration) -> Result<u16, String> {
    http_get_headers(ns, url, extra, &[], timeout).map(|r| r.status)
}

/// What [`http_get_headers`] got back.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Reply {
    pub status: u16,
    /// The headers asked for, in the order asked; "" for one not sent.
    pub headers: Vec<String>,
}

/// As [`http_get_with`], also reading the response headers `names`
/// (case-insensitive; curl's `%header{}`).
pub fn http_get_headers(
    ns: &NetNs,
    url: &str,
    extra: &[&str],
    names: &[&str],
    timeout: Duration,
) -> Result<Reply, String> {
    let max_time = format!("{:.3}", timeout.as_secs_f64());
    // One line per value: the status, then each header.
    let mut write_out = String::from("%{http_code}");
    for name in names {
        assert!(
            name.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'-'),
            "a header name, got {name:?}"
        );
        write_out += &format!("\\n%header{{{name}}}");
    }
    let mut argv = vec![
        "curl",
        "-sS",
        "-o",
        "/dev/null",
        "-w",
        &write_out,
        "--noproxy",
        "*",
        "--max-time",
        &max_time,
    ];
    argv.extend_from_slice(extra);
    argv.push("--");
    argv.push(url);
    let out = ns.exec(&argv).output().map_err(|e| format!("spawn curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl {url} from {}: {} ({})",
            ns.name,
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let mut lines = text.split('\n');
    let code = lines.next().unwrap_or_default().trim();
    let status = match code.parse::<u16>() {
        Ok(c) if c != 0 => c,
        _ => return Err(format!("curl {url}: no HTTP status (got {text:?})")),
    };
    let headers: Vec<String> = lines.map(|l| l.trim().to_owned()).collect();
    if headers.len() != names.len() {
        return Err(format!(
            "curl {url}: expected {} header lines, got {text:?}",
            names.len()
        ));
    }
    Ok(Reply { status, headers })
}

/// Runs `ip ARGS`, panicking with its stderr on failure.
fn ip(args: &[&str]) {
    run_ok(Command::new(require("ip")).args(args).stdin(Stdio::null()));
}

fn ns_pids(name: &str) -> Vec<u32> {
    Command::new(require("ip"))
        .args(["netns", "pids", name])
        .stdin(Stdio::null())
        .output()
        .map(|o| {
            String::from_utf8_lossy(&o.stdout)
                .split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// Kills everything in the namespace, then deletes it. Never panics: it runs
/// in Drop, possibly while a test is already panicking.
fn remove_ns(name: &str) {
    let step = Duration::from_millis(20);
    let deadline = Instant::now() + Duration::from_secs(2);
    for _ in 0..100 {
        let pids = ns_pids(name);
        if pids.is_empty() || Instant::now() >= deadline {
            break;
        }
        for pid in pids {
            signal(pid, libc::SIGKILL);
        }
        thread::sleep(step);
    }
    let out = Command::new(require("ip"))
        .args(["netns", "del", name])
        .stdin(Stdio::null())
        .output();
    match out {
        Ok(o) if o.status.success() => {}
        Ok(o) => eprintln!("warning: ip netns del {name}: {}", String::from_utf8_lossy(&o.stderr)),
        Err(e) => eprintln!("warning: ip netns del {name}: {e}"),
    }
}

/// Removes `fbt-<tag>-<pid>-<n>` namespaces whose creating process is gone
/// (left by a test run that was SIGKILLed, so its Drops never ran).
fn sweep_stale() {
    let Ok(out) = Command::new(require("ip"))
        .args(["netns", "list"])
        .stdin(Stdio::null())
        .output()
    else {
        return;
    };
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let Some(name) = line.split_whitespace().next() else {
            continue;
        };
        let parts: Vec<&str> = name.split('-').collect();
        let [first, _tag, pid, n] = parts[..] else {
            continue;
        };
        let (Ok(pid), Ok(_)) = (pid.parse::<u32>(), n.parse::<u32>()) else {
            continue;
        };
        if first == "fbt" && !std::path::Path::new(&format!("/proc/{pid}")).exists() {
            eprintln!("removing stale test namespace {name}");
            remove_ns(name);
        }
    }
}
