//! The shipped nginx snippet (`nginx/fleetban.conf`,
//! `nginx/fleetban-location.conf`) in Debian's nginx: one check per client
//! request. `/` is served through `index` (an internal redirect to `/ok`),
//! which runs nginx's access phase again; the snippet keeps the first
//! check's answer. The decision endpoint is first a counting listener that
//! reads requests and never answers (a hung daemon, as SIGSTOP makes it:
//! connections accepted by the kernel, nobody answering): `/` costs it one
//! request, not two, and is let through (fail open). Then the real daemon
//! on the same socket: a banned client is refused on `/`, another served.

mod common;

use std::io::Read;
use std::os::unix::net::UnixListener;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use common::{cli, http_get_with, veth_pair, ConfigDir, Daemon, NetNs, Nginx, Rule, Site};

const WEB: &str = "10.213.72.1";
const CLIENT: &str = "10.213.72.2";
const OTHER: &str = "10.213.72.3";

/// A unix socket that reads requests and never answers, counting the
/// request heads it receives.
struct Counting {
    heads: Arc<AtomicUsize>,
    stop: Arc<AtomicBool>,
    accept: Option<std::thread::JoinHandle<()>>,
}

impl Counting {
    fn bind(path: &Path) -> Counting {
        let listener = UnixListener::bind(path).unwrap();
        listener.set_nonblocking(true).unwrap();
        let heads = Arc::new(AtomicUsize::new(0));
        let stop = Arc::new(AtomicBool::new(false));
        let (h, s) = (heads.clone(), stop.clone());
        let accept = std::thread::spawn(move || {
            let mut readers = Vec::new();
            // Bounded by the test: it sets `stop` (at most 10 minutes).
            for _ in 0..(10 * 60 * 50) {
                if s.load(Ordering::Relaxed) {
                    break;
                }
                match listener.accept() {
                    Ok((mut conn, _)) => {
                        let (h, s) = (h.clone(), s.clone());
                        readers.push(std::thread::spawn(move || {
                            conn.set_nonblocking(false).unwrap();
                            conn.set_read_timeout(Some(Duration::from_millis(20))).unwrap();
                            let mut seen = Vec::new();
                            let mut buf = [0u8; 4096];
                            while !s.load(Ordering::Relaxed) {
                                match conn.read(&mut buf) {
                                    Ok(0) => break,
                                    Ok(n) => {
                                        seen.extend_from_slice(&buf[..n]);
                                        while let Some(i) = seen.windows(4).position(|w| w == b"\r\n\r\n") {
                                            h.fetch_add(1, Ordering::Relaxed);
                                            seen.drain(..i + 4);
                                        }
                                    }
                                    Err(_) => {}
                                }
                            }
                        }));
                    }
                    Err(_) => std::thread::sleep(Duration::from_millis(20)),
                }
            }
            for r in readers {
                let _ = r.join();
            }
        });
        Counting {
            heads,
            stop,
            accept: Some(accept),
        }
    }

    fn heads(&self) -> usize {
        self.heads.load(Ordering::Relaxed)
    }
}

impl Drop for Counting {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(a) = self.accept.take() {
            let _ = a.join();
        }
    }
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// nginx in `web` with the shipped snippet (its socket `socket`) and `/`
/// served by `index` from a directory holding `ok`.
fn site(files: &ConfigDir, socket: &Path) -> Site {
    Site {
        log_format: None,
        http: common::shipped_snippet(files, socket).0,
        server: format!(
            "include {};\n        location / {{ root {{www}}; index ok; }}\n",
            repo_file("nginx/fleetban-location.conf").display()
        ),
    }
}

#[test]
fn an_index_redirect_is_checked_once_and_a_banned_client_still_refused() {
    let web = NetNs::new("snipweb");
    let client = NetNs::new("snipcli");
    let (_, client_if) = veth_pair(&web, &format!("{WEB}/24"), &client, &format!("{CLIENT}/24"));
    client.run(&["ip", "addr", "add", &format!("{OTHER}/24"), "dev", &client_if]);
    let files = ConfigDir::new();
    let socket = files.path().join("http.sock");
    let hung = Counting::bind(&socket);
    let nginx = Nginx::start_site(&web, &format!("{WEB}:8080"), &site(&files, &socket));
    let get = |from: &str, path: &str| {
        http_get_with(
            &client,
            &format!("http://{WEB}:8080{path}"),
            &["--interface", from],
            Duration::from_secs(10),
        )
        .unwrap_or_else(|e| panic!("GET {path} from {from}: {e}"))
    };

    // A hung endpoint: `/` fails open after one check, not two.
    let before = hung.heads();
    assert_eq!(get(CLIENT, "/"), 200);
    assert_eq!(hung.heads() - before, 1, "one check for `/` and its index redirect");
    // `/ok` directly: one check too.
    let before = hung.heads();
    assert_eq!(get(CLIENT, "/ok"), 200);
    assert_eq!(hung.heads() - before, 1);
    drop(hung);
    std::fs::remove_file(&socket).unwrap();

    // The real daemon on the same socket: the banned client is refused on
    // `/`, the other served.
    files.write(
        &files
            .main_config()
            .log_firewall()
            .http(&format!("{{ listen: '{}' }}", socket.display())),
        &[Rule::new("pages", nginx.access_log(), "{ hits: 1000, window: 60s }")],
    );
    let _d = Daemon::start(None, &files.cfg, &files.control);
    let out = cli(&files.cfg, &["ban", CLIENT, "--for", "1h"]);
    assert_eq!(out.code, 0, "{}", out.text());
    common::wait_until(Duration::from_secs(10), "the ban at /check", || get(CLIENT, "/") == 403);
    assert_eq!(get(OTHER, "/"), 200);
    assert_eq!(get(CLIENT, "/ok"), 403);
}
