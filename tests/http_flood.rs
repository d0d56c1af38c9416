//! The decision endpoint under a flood of connections from one local
//! process (issue 25, item 2): any process that may open its socket
//! (www-data's, a PHP-FPM pool) holds 2,000 connections to it, half
//! trickling a request head a byte at a time, half idle after a complete
//! request, and reopens each one the daemon closes. Meanwhile a banned
//! client asking Debian's real nginx, with the shipped snippet, is still
//! refused (not let through by the snippet's fail-open), a good one is
//! served, and a fresh connection to the socket gets its answer (nginx's
//! connections to the daemon are all opened during the flood). The
//! daemon runs with 1024 descriptors, what systemd gives the shipped unit
//! (no `LimitNOFILE=`).

mod common;

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::thread;
use std::time::{Duration, Instant};

use common::{cli, http_get_headers, veth_pair, wait_until, Checker, ConfigDir, Daemon, NetNs, Nginx, Rule, Site};

const WEB: &str = "10.213.70.1";
const BANNED: &str = "10.213.70.2";
const GOOD: &str = "10.213.70.3";
/// Connections the flood holds open.
const FLOOD: usize = 2000;
/// What systemd gives a unit without `LimitNOFILE=`.
const DAEMON_NOFILE: u64 = 1024;

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// The shipped http-context snippet with the test's socket.
fn snippet(files: &ConfigDir, socket: &Path) -> String {
    const SHIPPED_SOCKET: &str = "unix:/run/fleetban/http.sock";
    let shipped = std::fs::read_to_string(repo_file("nginx/fleetban.conf")).expect("read nginx/fleetban.conf");
    assert!(shipped.contains(SHIPPED_SOCKET), "fleetban.conf names {SHIPPED_SOCKET}");
    let conf = files.path().join("fleetban.conf");
    std::fs::write(
        &conf,
        shipped.replace(SHIPPED_SOCKET, &format!("unix:{}", socket.display())),
    )
    .unwrap();
    format!("    include {};\n", conf.display())
}

/// Raises this process's soft `RLIMIT_NOFILE` to hold the flood.
fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write only the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(lim.rlim_cur >= want, "RLIMIT_NOFILE {} < {want}", lim.rlim_cur);
}

/// One connection of the flood.
struct Flooder {
    sock: Option<UnixStream>,
    /// Trickling a head (else: idle after a complete request).
    trickle: bool,
}

const HEAD_START: &[u8] = b"GET /check HTTP/1.1\r\n";
const WHOLE: &[u8] = b"GET /check HTTP/1.1\r\nHost: fleetban\r\nX-Client-Addr: 192.0.2.1\r\n\r\n";

impl Flooder {
    /// (Re)opens the connection and sends its first bytes; false if
    /// connecting failed (tried again next round).
    fn open(&mut self, path: &Path) -> bool {
        let Ok(mut s) = UnixStream::connect(path) else {
            return false;
        };
        let first = if self.trickle { HEAD_START } else { WHOLE };
        if s.write_all(first).is_err() || s.set_nonblocking(true).is_err() {
            return false;
        }
        self.sock = Some(s);
        true
    }

    /// One round: a trickler sends one more byte; either kind finds out
    /// whether the daemon closed it (then it is reopened next round).
    fn tick(&mut self) {
        let Some(s) = &mut self.sock else { return };
        let mut buf = [0u8; 256];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        let closed = closed || (self.trickle && !matches!(s.write(b"X"), Ok(1)));
        if closed {
            self.sock = None;
        }
    }
}

/// Holds FLOOD connections until `stop`: every round (2 s) each trickler
/// sends a byte and every closed connection is reopened. Counts reopenings.
fn flood(path: PathBuf, stop: Arc<AtomicBool>, opened: Arc<AtomicU64>, reopened: Arc<AtomicU64>) {
    let mut all: Vec<Flooder> = (0..FLOOD)
        .map(|i| Flooder {
            sock: None,
            trickle: i % 2 == 0,
        })
        .collect();
    // Bounded: the test stops it; 120 s at most in any case.
    let end = Instant::now() + Duration::from_secs(120);
    let mut first = true;
    while !stop.load(Relaxed) && Instant::now() < end {
        for f in &mut all {
            if f.sock.is_none() {
                if f.open(&path) && !first {
                    reopened.fetch_add(1, Relaxed);
                }
            } else {
                f.tick();
            }
        }
        if first {
            opened.store(all.iter().filter(|f| f.sock.is_some()).count() as u64, Relaxed);
            first = false;
        }
        for _ in 0..20 {
            if stop.load(Relaxed) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}

#[test]
fn a_flood_of_slow_and_idle_connections_neither_lets_a_banned_client_through_nor_starves_checks() {
    raise_nofile(FLOOD as u64 + 1024);
    let files = ConfigDir::new();
    let socket = files.path().join("http.sock");
    let web = NetNs::new("flw");
    let client = NetNs::new("flc");
    let (_, client_if) = veth_pair(&web, &format!("{WEB}/24"), &client, &format!("{BANNED}/24"));
    client.run(&["ip", "addr", "add", &format!("{GOOD}/24"), "dev", &client_if]);
    let site = Site {
        log_format: None,
        http: snippet(&files, &socket),
        server: format!(
            "include {};\n        location / {{ root {{www}}; try_files /ok =404; }}\n",
            repo_file("nginx/fleetban-location.conf").display()
        ),
    };
    let nginx = Nginx::start_site(&web, &format!("{WEB}:8080"), &site);
    let rule = Rule::new("pages", nginx.access_log(), "{ hits: 1000, window: 60s }");
    let main = files
        .main_config()
        .host_id("flood")
        .log_firewall()
        .http(&format!("{{ listen: '{}' }}", socket.display()));
    files.write(&main, &[rule]);
    let d = Daemon::start_with_nofile(None, &files.cfg, &files.control, &[], DAEMON_NOFILE);
    let out = cli(&files.cfg, &["ban", BANNED]);
    assert!(out.success(), "{}", out.text());
    let mut direct = Checker::unix(&socket);
    wait_until(Duration::from_secs(10), "the ban in the endpoint's view", || {
        direct.check(BANNED).status == 403
    });
    drop(direct);
    let get = |from: &str| {
        http_get_headers(
            &client,
            &format!("http://{WEB}:8080/page"),
            &["--interface", from],
            &["retry-after"],
            Duration::from_secs(3),
        )
    };
    // nginx has not asked yet: its pool of connections to the daemon is
    // empty when the flood begins, as after a reload or a quiet minute.

    let (stop, opened, reopened) = (
        Arc::new(AtomicBool::new(false)),
        Arc::new(AtomicU64::new(0)),
        Arc::new(AtomicU64::new(0)),
    );
    let flooder = {
        let (path, stop, opened, reopened) = (socket.clone(), stop.clone(), opened.clone(), reopened.clone());
        thread::spawn(move || flood(path, stop, opened, reopened))
    };
    wait_until(Duration::from_secs(30), "the flood's connections open", || {
        opened.load(Relaxed) > 0
    });
    assert_eq!(opened.load(Relaxed), FLOOD as u64, "every flood connection opened");
    // Trickled bytes, heads past their deadline, connections reopened.
    thread::sleep(Duration::from_secs(3));

    let mut answers = Vec::new();
    for _ in 0..20 {
        answers.push(get(BANNED).map(|r| (r.status, r.headers[0].clone())));
        answers.push(get(GOOD).map(|r| (r.status, r.headers[0].clone())));
        thread::sleep(Duration::from_millis(100));
    }
    for (i, pair) in answers.chunks(2).enumerate() {
        let (b, g) = (&pair[0], &pair[1]);
        assert!(
            matches!(b, Ok((403, retry)) if retry.parse::<u64>().is_ok()),
            "banned request {i} through nginx during the flood: {b:?}; all: {answers:?}"
        );
        assert!(matches!(g, Ok((200, _))), "good request {i}: {g:?}");
    }
    // A fresh connection straight to the socket (its reads bounded: 5 s).
    let mut fresh = Checker::unix(&socket);
    let (banned, good) = (fresh.check(BANNED), fresh.check(GOOD));
    let status = d.status();
    stop.store(true, Relaxed);
    flooder.join().expect("the flood thread");
    assert_eq!((banned.status, good.status), (403, 204), "a fresh connection's answers");
    let h = &status["http"];
    assert!(h["evicted"].as_u64() > Some(0), "the table was full: {status}");
    assert!(h["head_timeouts"].as_u64() > Some(0), "tricklers timed out: {status}");
    assert!(h["connections"].as_u64() <= Some(DAEMON_NOFILE), "{status}");
    println!(
        "flood: {FLOOD} connections, {} reopened; daemon: {h}",
        reopened.load(Relaxed)
    );
}
