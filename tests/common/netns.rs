//! Network namespaces as stand-in hosts, veth links between them, and curl as
//! the client; for tests that send hundreds of requests, [`get_from`] on a
//! thread inside a namespace ([`NetNs::spawn`]) instead. Names are `fbt-<tag>-<pid>-<n>`, so a leftover from a test run
//! that was killed outright can be recognised (its pid is gone) and removed.

use super::{require, require_root, run_ok, signal};
use std::ffi::OsStr;
use std::io::{Read, Write};
use std::net::{IpAddr, Ipv4Addr, SocketAddr, SocketAddrV4, TcpStream};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};
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

    /// Runs `f` on a new thread inside the namespace: setns(2) moves only
    /// the calling thread, so the rest of the process stays where it is,
    /// and every socket `f` opens is the namespace's.
    pub fn spawn<T: Send + 'static>(&self, f: impl FnOnce() -> T + Send + 'static) -> thread::JoinHandle<T> {
        let path = format!("/run/netns/{}", self.name);
        thread::spawn(move || {
            let ns = std::fs::File::open(&path).unwrap_or_else(|e| panic!("open {path}: {e}"));
            // SAFETY: setns takes a descriptor we own and a constant.
            let rc = unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) };
            assert_eq!(rc, 0, "setns {path}: {}", std::io::Error::last_os_error());
            f()
        })
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

/// Sends `GET target` (exactly as given: `--request-target`, so curl
/// neither squashes dot segments nor re-encodes anything) to `url`'s host
/// from the address `from` of `ns`; the status and the body.
pub fn http_get_target(
    ns: &NetNs,
    from: &str,
    url: &str,
    target: &str,
    timeout: Duration,
) -> Result<(u16, String), String> {
    let max_time = format!("{:.3}", timeout.as_secs_f64());
    let argv = [
        "curl",
        "-sS",
        "-w",
        "\n%{http_code}",
        "--noproxy",
        "*",
        "--max-time",
        &max_time,
        "--interface",
        from,
        "--request-target",
        target,
        "--",
        url,
    ];
    let out = ns.exec(&argv).output().map_err(|e| format!("spawn curl: {e}"))?;
    if !out.status.success() {
        return Err(format!(
            "curl {target} from {from}: {} ({})",
            String::from_utf8_lossy(&out.stderr).trim(),
            out.status
        ));
    }
    let text = String::from_utf8_lossy(&out.stdout).into_owned();
    let (body, code) = text.rsplit_once('\n').unwrap_or(("", &text));
    match code.trim().parse::<u16>() {
        Ok(status) if status != 0 => Ok((status, body.to_owned())),
        _ => Err(format!("curl {target}: no HTTP status (got {text:?})")),
    }
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

/// `GET path` over HTTP/1.0 from `from` to `to`, sent by this process (no
/// curl, no fork): the instant the request was written and the status, or
/// Err when connecting or the answer fails or takes longer than `timeout`
/// (e.g. dropped by nft). Call it on a thread inside the namespace owning
/// `from` ([`NetNs::spawn`]).
pub fn get_from(from: Ipv4Addr, to: SocketAddrV4, path: &str, timeout: Duration) -> Result<(Instant, u16), String> {
    let deadline = Instant::now() + timeout;
    let fail = |what: &str, e: std::io::Error| format!("GET http://{to}{path} from {from}: {what}: {e}");
    let mut stream = connect_from(IpAddr::V4(from), SocketAddr::V4(to), timeout).map_err(|e| fail("connect", e))?;
    let left = deadline
        .saturating_duration_since(Instant::now())
        .max(Duration::from_millis(1));
    stream.set_read_timeout(Some(left)).map_err(|e| fail("timeout", e))?;
    stream.set_write_timeout(Some(left)).map_err(|e| fail("timeout", e))?;
    let sent = Instant::now();
    stream
        .write_all(format!("GET {path} HTTP/1.0\r\nHost: fleetban-test\r\n\r\n").as_bytes())
        .map_err(|e| fail("send", e))?;
    // HTTP/1.0: the server closes after the answer; a small page.
    let mut answer = Vec::new();
    (&mut stream)
        .take(64 * 1024)
        .read_to_end(&mut answer)
        .map_err(|e| fail("read", e))?;
    let head = String::from_utf8_lossy(&answer[..answer.len().min(64)]).into_owned();
    let status = head
        .strip_prefix("HTTP/1.")
        .and_then(|r| r.get(2..5))
        .and_then(|c| c.parse().ok())
        .ok_or_else(|| format!("GET http://{to}{path} from {from}: not an HTTP answer: {head:?}"))?;
    Ok((sent, status))
}

/// A TCP connection from `from` (bound before connecting, which std's
/// `TcpStream` cannot do) to `to`, given up after `timeout`. Either family;
/// `from` and `to` of the same one.
pub fn connect_from(from: IpAddr, to: SocketAddr, timeout: Duration) -> std::io::Result<TcpStream> {
    // A sockaddr of either family, as bytes, and its length.
    fn raw(a: SocketAddr) -> (libc::sockaddr_storage, libc::socklen_t) {
        // SAFETY: an all-zero sockaddr_storage is valid.
        let mut st: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match a {
            SocketAddr::V4(a) => {
                let sin = libc::sockaddr_in {
                    sin_family: libc::AF_INET as libc::sa_family_t,
                    sin_port: a.port().to_be(),
                    sin_addr: libc::in_addr {
                        s_addr: u32::from(*a.ip()).to_be(),
                    },
                    sin_zero: [0; 8],
                };
                // SAFETY: sockaddr_storage is larger than sockaddr_in and aligned for it.
                unsafe { std::ptr::write((&raw mut st).cast(), sin) };
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                let sin6 = libc::sockaddr_in6 {
                    sin6_family: libc::AF_INET6 as libc::sa_family_t,
                    sin6_port: a.port().to_be(),
                    sin6_flowinfo: 0,
                    sin6_addr: libc::in6_addr {
                        s6_addr: a.ip().octets(),
                    },
                    sin6_scope_id: 0,
                };
                // SAFETY: sockaddr_storage is larger than sockaddr_in6 and aligned for it.
                unsafe { std::ptr::write((&raw mut st).cast(), sin6) };
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        (st, len as libc::socklen_t)
    }
    let family = if to.is_ipv4() { libc::AF_INET } else { libc::AF_INET6 };
    // SAFETY: socket(2) takes constants; the descriptor is owned at once.
    let fd = unsafe { libc::socket(family, libc::SOCK_STREAM | libc::SOCK_CLOEXEC, 0) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error());
    }
    // SAFETY: a fresh descriptor nobody else owns.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let check = |rc: libc::c_int| {
        if rc == 0 {
            Ok(())
        } else {
            Err(std::io::Error::last_os_error())
        }
    };
    let (src, len) = raw(SocketAddr::new(from, 0));
    // SAFETY: `src` is a valid sockaddr of `len` bytes.
    check(unsafe { libc::bind(fd, (&raw const src).cast(), len) })?;
    // Linux bounds a blocking connect by SO_SNDTIMEO (EINPROGRESS past it).
    let tv = libc::timeval {
        tv_sec: timeout.as_secs() as libc::time_t,
        tv_usec: libc::suseconds_t::from(timeout.subsec_micros()),
    };
    let tv_len = std::mem::size_of::<libc::timeval>() as libc::socklen_t;
    // SAFETY: `tv` is a valid timeval of `tv_len` bytes.
    check(unsafe { libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_SNDTIMEO, (&raw const tv).cast(), tv_len) })?;
    let (dst, len) = raw(to);
    // SAFETY: `dst` is a valid sockaddr of `len` bytes.
    match check(unsafe { libc::connect(fd, (&raw const dst).cast(), len) }) {
        Err(e) if e.raw_os_error() == Some(libc::EINPROGRESS) => Err(std::io::Error::new(
            std::io::ErrorKind::TimedOut,
            format!("no answer within {timeout:?}"),
        )),
        r => r.map(|()| TcpStream::from(sock)),
    }
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
