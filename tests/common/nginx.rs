//! A real nginx inside a test namespace, everything it writes in a temp dir:
//! the access log the daemon tails, rotated the way logrotate does it
//! (rename, then [`Nginx::reopen`]). [`Nginx::start`] serves fixed answers;
//! [`Nginx::start_site`] takes the test's own http-block lines and server
//! body ([`Site`]: includes, upstreams, proxying) around the same frame.

use super::{read_lossy, require, require_root, signal, wait_exit, NetNs};
use std::ffi::OsStr;
use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::thread;
use std::time::{Duration, Instant};
use tempfile::TempDir;

const START_TIMEOUT: Duration = Duration::from_secs(5);
const REOPEN_TIMEOUT: Duration = Duration::from_secs(5);
/// Graceful stop (SIGQUIT) gets this long before SIGKILL.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// Readiness probe location; `access_log off` so probes never reach access.log.
const READY_PATH: &str = "/__fbt_ready";

/// What [`Nginx::start_site`] puts in nginx.conf besides the frame (temp
/// paths, pid, error log, the readiness probe), as nginx text.
#[derive(Clone, Debug, Default)]
pub struct Site {
    /// The access log's `log_format`; None: `combined`.
    pub log_format: Option<String>,
    /// Lines in the http block before the server (includes, `upstream`s,
    /// realip).
    pub http: String,
    /// The server block's body after `listen`: its includes and locations.
    /// `{www}` stands for a directory holding `ok` ("ok\n"), for locations
    /// that serve a file (`return` runs before access checks such as
    /// `auth_request`; a file is served after them).
    pub server: String,
}

pub struct Nginx {
    /// Config, pid, logs and temp paths; removed on Drop.
    dir: TempDir,
    /// The master (the process `ip netns exec` became).
    child: Child,
    /// `host:port` as given to `start`.
    listen: String,
}

impl Nginx {
    /// Starts nginx in `ns` listening on `listen` (e.g. `"10.213.1.1:8080"`,
    /// an address `ns` owns) and waits until it answers. Access log format:
    /// `combined`, or `log_format` (an nginx `log_format` string) if given.
    /// Locations: `/` -> 200 "ok\n", `/static/` -> 200 "s\n", `/missing` -> 404.
    pub fn start(ns: &NetNs, listen: &str, log_format: Option<&str>) -> Nginx {
        let site = Site {
            log_format: log_format.map(str::to_owned),
            http: String::new(),
            server: DEFAULT_LOCATIONS.to_owned(),
        };
        Nginx::start_site(ns, listen, &site)
    }

    /// As [`Nginx::start`], with the http lines and server body of `site`
    /// instead of the fixed locations. The readiness probe answers before
    /// any access check, so a site behind `auth_request` starts as well.
    pub fn start_site(ns: &NetNs, listen: &str, site: &Site) -> Nginx {
        require_root("Nginx::start");
        let dir = tempfile::Builder::new()
            .prefix("fbt-nginx-")
            .tempdir()
            .expect("create temp dir for nginx");
        let d = dir.path();
        fs::create_dir(d.join("tmp")).expect("create nginx tmp dir");
        fs::create_dir(d.join("www")).expect("create nginx www dir");
        fs::write(d.join("www/ok"), "ok\n").expect("write www/ok");
        let conf = d.join("nginx.conf");
        let error_log = d.join("error.log");
        fs::write(&conf, config(d, listen, site)).expect("write nginx.conf");

        let argv: [&OsStr; 7] = [
            "nginx".as_ref(),
            "-p".as_ref(),
            d.as_os_str(),
            "-c".as_ref(),
            conf.as_os_str(),
            "-e".as_ref(),
            error_log.as_os_str(),
        ];
        let child = ns
            .exec(&argv)
            .stdout(Stdio::from(
                fs::File::create(d.join("stdout.log")).expect("create stdout.log"),
            ))
            .stderr(Stdio::from(
                fs::File::create(d.join("stderr.log")).expect("create stderr.log"),
            ))
            .spawn()
            .expect("spawn nginx");
        let mut nginx = Nginx {
            dir,
            child,
            listen: listen.to_string(),
        };
        nginx.wait_ready(ns);
        nginx
    }

    /// Where nginx writes requests.
    pub fn access_log(&self) -> PathBuf {
        self.dir.path().join("access.log")
    }

    pub fn error_log(&self) -> PathBuf {
        self.dir.path().join("error.log")
    }

    /// The temp dir holding config, logs and pid file.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `http://<listen><path>`.
    pub fn url(&self, path: &str) -> String {
        format!("http://{}{}", self.listen, path)
    }

    /// The master's pid.
    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Tells nginx to reopen its logs (SIGUSR1, what logrotate's postrotate
    /// does) and waits until the worker has: after it returns, new requests go
    /// to a fresh `access_log()` if the old one was renamed away.
    pub fn reopen(&self) {
        let before = self.reopen_count();
        signal(self.pid(), libc::SIGUSR1);
        // The master logs "reopening logs" and then each worker (one here)
        // does; the worker's line means its fds point at the new files.
        let deadline = Instant::now() + REOPEN_TIMEOUT;
        for _ in 0..REOPEN_TIMEOUT.as_millis() / 20 + 2 {
            if self.reopen_count() >= before + 2 && self.access_log().exists() {
                return;
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(20));
        }
        panic!(
            "nginx did not reopen its logs within {REOPEN_TIMEOUT:?}; error.log:\n{}",
            read_lossy(&self.error_log())
        );
    }

    fn reopen_count(&self) -> usize {
        read_lossy(&self.error_log())
            .lines()
            .filter(|l| l.ends_with("reopening logs"))
            .count()
    }

    fn wait_ready(&mut self, ns: &NetNs) {
        let url = self.url(READY_PATH);
        let deadline = Instant::now() + START_TIMEOUT;
        let mut last = String::new();
        for _ in 0..START_TIMEOUT.as_millis() / 50 + 2 {
            if let Ok(Some(status)) = self.child.try_wait() {
                panic!(
                    "nginx exited at start ({status});\nstderr: {}\nerror.log:\n{}",
                    read_lossy(&self.dir.path().join("stderr.log")),
                    read_lossy(&self.error_log())
                );
            }
            match super::http_get(ns, &url, Duration::from_millis(500)) {
                Ok(204) => return,
                Ok(code) => last = format!("HTTP {code}"),
                Err(e) => last = e,
            }
            if Instant::now() >= deadline {
                break;
            }
            thread::sleep(Duration::from_millis(50));
        }
        panic!(
            "nginx on {} in {} not ready within {START_TIMEOUT:?} (last: {last});\nerror.log:\n{}",
            self.listen,
            ns.name,
            read_lossy(&self.error_log())
        );
    }
}

impl Drop for Nginx {
    fn drop(&mut self) {
        let master = self.child.id();
        signal(master, libc::SIGQUIT);
        if !wait_exit(&mut self.child, STOP_GRACE) {
            // Workers outlive a SIGKILLed master: kill them first, by parent.
            for pid in children_of(master) {
                signal(pid, libc::SIGKILL);
            }
            signal(master, libc::SIGKILL);
        }
        let _ = self.child.wait();
    }
}

/// The locations of [`Nginx::start`].
const DEFAULT_LOCATIONS: &str = "\
    location / { return 200 \"ok\\n\"; }
    location /static/ { return 200 \"s\\n\"; }
    location /missing { return 404; }
";

fn config(d: &Path, listen: &str, site: &Site) -> String {
    let dir = d.display();
    let mut c = String::new();
    let _ = write!(
        c,
        "worker_processes 1;\n\
         daemon off;\n\
         master_process on;\n\
         user root root;\n\
         pid {dir}/nginx.pid;\n\
         error_log {dir}/error.log notice;\n\
         events {{ worker_connections 64; }}\n\
         http {{\n\
         \x20   default_type text/plain;\n"
    );
    // Debian's nginx has compiled-in temp paths under /var/lib/nginx; keep ours
    // in the temp dir. Only name those whose module is compiled in.
    let built = nginx_build_flags();
    for (directive, module) in [
        ("client_body_temp_path", ""),
        ("proxy_temp_path", "proxy"),
        ("fastcgi_temp_path", "fastcgi"),
        ("uwsgi_temp_path", "uwsgi"),
        ("scgi_temp_path", "scgi"),
    ] {
        if module.is_empty() || !built.contains(&format!("--without-http_{module}_module")) {
            let _ = writeln!(c, "    {directive} {dir}/tmp/{directive};");
        }
    }
    match &site.log_format {
        Some(f) => {
            let escaped = f.replace('\\', "\\\\").replace('\'', "\\'");
            let _ = writeln!(c, "    log_format fbt '{escaped}';");
            let _ = writeln!(c, "    access_log {dir}/access.log fbt;");
        }
        None => {
            let _ = writeln!(c, "    access_log {dir}/access.log combined;");
        }
    }
    c += &site.http;
    let server = site.server.replace("{www}", &format!("{dir}/www"));
    let _ = write!(
        c,
        "\n    server {{\n\
         \x20       listen {listen};\n\
         \x20       server_name _;\n\
         {server}\n\
         \x20       location = {READY_PATH} {{ access_log off; return 204; }}\n\
         \x20   }}\n\
         }}\n"
    );
    c
}

/// `nginx -V` (configure arguments), to know which modules exist.
fn nginx_build_flags() -> String {
    Command::new(require("nginx"))
        .arg("-V")
        .stdin(Stdio::null())
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).into_owned())
        .unwrap_or_default()
}

/// Pids whose parent is `parent` (from /proc/*/stat).
fn children_of(parent: u32) -> Vec<u32> {
    let Ok(entries) = fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
            // "pid (comm) state ppid ...": comm may hold spaces and parens.
            stat.rsplit_once(')')
                .and_then(|(_, rest)| rest.split_whitespace().nth(1)?.parse::<u32>().ok())
                == Some(parent)
        })
        .collect()
}

/// A web host (namespace `web`, nginx on `<subnet>.1:8080`) and a client
/// (namespace `client`, `<subnet>.2`) on one veth link; `subnet` is the first
/// three octets, in 10.213.0.0/16 (`"10.213.31"`). The access log's format
/// as for [`Nginx::start`].
pub fn web_and_client(web: &str, client: &str, subnet: &str, log_format: Option<&str>) -> (NetNs, NetNs, Nginx) {
    let (web, client) = (NetNs::new(web), NetNs::new(client));
    super::veth_pair(&web, &format!("{subnet}.1"), &client, &format!("{subnet}.2"));
    let nginx = Nginx::start(&web, &format!("{subnet}.1:8080"), log_format);
    (web, client, nginx)
}

/// The shipped http-context snippet (`nginx/fleetban.conf`) with the
/// test's `socket` in place of the packaged one, written into `files`: the
/// `include` line for nginx's http block, and the shipped text.
pub fn shipped_snippet(files: &super::ConfigDir, socket: &Path) -> (String, String) {
    const SHIPPED_SOCKET: &str = "unix:/run/fleetban/http.sock";
    let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("nginx/fleetban.conf");
    let shipped = fs::read_to_string(&path).expect("read nginx/fleetban.conf");
    assert!(shipped.contains(SHIPPED_SOCKET), "fleetban.conf names {SHIPPED_SOCKET}");
    let conf = files.path().join("fleetban.conf");
    let ours = shipped.replace(SHIPPED_SOCKET, &format!("unix:{}", socket.display()));
    fs::write(&conf, ours).expect("write the snippet's copy");
    (format!("    include {};\n", conf.display()), shipped)
}
