//! Behind a load balancer, as a sysadmin would build it: clients in one
//! network namespace, an nginx balancer (`X-Forwarded-For` appended) in
//! another, two backend nginx hosts in two more, each with its own
//! `fleetban run` (nft in its namespace, the decision endpoint on a unix
//! socket) sharing one Redis. The backends use the shipped snippet
//! (`nginx/fleetban.conf` with the socket path substituted,
//! `nginx/fleetban-location.conf` as is) and the realip lines of its
//! comment. Behind the balancer every packet comes from the balancer, so
//! the refusal is the HTTP endpoint's: an attacker spread over both
//! backends is refused by both, a good client behind the same balancer is
//! not, the balancer is never banned, a forged `X-Forwarded-For` names no
//! one; and a stopped, killed or hung daemon, or its socket removed, lets
//! everyone through. Without realip both the daemon (from the logged
//! `X-Forwarded-For`) and the check (from the one nginx passes it) find
//! the client behind the balancer through `proxies:`.

mod common;

use std::path::{Path, PathBuf};
use std::thread;
use std::time::{Duration, Instant};

use common::{
    cli, http_get, http_get_headers, nft_bans, veth_pair, ConfigDir, Daemon, NetNs, Nginx, Redis, Reply, Rule, Site,
};

/// The clients' side of the balancer, one address each.
const LB_FRONT: &str = "10.213.60.1";
const ATTACKER: &str = "10.213.60.2";
const GOOD: &str = "10.213.60.3";
const FORGER: &str = "10.213.60.4";
/// Requests per minute a client may make (fleet-wide); the next one bans.
/// The good client makes fewer in every test (two or three per step).
const LIMIT: u32 = 12;
/// One request's bound: a check that hangs must not hold a request longer.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);

/// The backends' `log_format` when the daemon reads the client from
/// `X-Forwarded-For` (the combined format plus the header, as nginx's
/// documentation's `main` format).
const XFF_FORMAT: &str = "$remote_addr - $remote_user [$time_local] \"$request\" $status $body_bytes_sent \
                          \"$http_referer\" \"$http_user_agent\" \"$http_x_forwarded_for\"";

/// Where the backends' daemons find the client.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Logs {
    /// realip rewrites `$remote_addr`; the combined format.
    Realip,
    /// The log also carries `"$http_x_forwarded_for"`; `proxies:` names the
    /// balancer. realip still gives the check its client.
    Forwarded,
    /// As `Forwarded`, without realip: nginx's check asks about the
    /// balancer, with the request's `X-Forwarded-For`, and the endpoint
    /// walks that list through `proxies:` as the daemon walks the logged one.
    ForwardedNoRealip,
}

/// One backend host: its namespace, nginx with the snippet, its daemon.
/// Fields drop in order: the daemon and nginx before the namespace.
struct Backend {
    /// None while the test has it stopped.
    daemon: Option<Daemon>,
    nginx: Nginx,
    files: ConfigDir,
    ns: NetNs,
    /// `host:port`, as the balancer's `$upstream_addr` names it.
    upstream: String,
    /// The balancer's address on this backend's link.
    lb_addr: String,
}

impl Backend {
    fn socket(&self) -> PathBuf {
        self.files.path().join("http.sock")
    }

    fn start_daemon(&mut self) {
        assert!(self.daemon.is_none(), "{} already runs a daemon", self.upstream);
        self.daemon = Some(Daemon::start(Some(&self.ns), &self.files.cfg, &self.files.control));
    }

    fn daemon(&self) -> &Daemon {
        self.daemon.as_ref().expect("the daemon runs")
    }
}

struct Fleet {
    backends: Vec<Backend>,
    _lb: Nginx,
    lb_ns: NetNs,
    clients: NetNs,
    redis: Redis,
}

impl Fleet {
    /// Builds the topology and starts everything; `deny_status` is the
    /// daemons' `http.deny_status`.
    fn start(logs: Logs, deny_status: u16) -> Fleet {
        let redis = Redis::start();
        let clients = NetNs::new("cli");
        let lb_ns = NetNs::new("lb");
        let (client_if, _) = veth_pair(&clients, &format!("{ATTACKER}/24"), &lb_ns, &format!("{LB_FRONT}/24"));
        for addr in [GOOD, FORGER] {
            clients.run(&["ip", "addr", "add", &format!("{addr}/24"), "dev", &client_if]);
        }

        let mut backends = Vec::new();
        let links = [("a", "10.213.61"), ("b", "10.213.62")];
        let proxies = links.iter().map(|(_, net)| format!("{net}.1")).collect::<Vec<_>>();
        for (name, net) in links {
            let ns = NetNs::new(&format!("web{name}"));
            let lb_addr = format!("{net}.1");
            veth_pair(&lb_ns, &format!("{lb_addr}/24"), &ns, &format!("{net}.2/24"));
            let files = ConfigDir::new();
            let socket = files.path().join("http.sock");
            let site = Site {
                log_format: (logs != Logs::Realip).then(|| XFF_FORMAT.to_owned()),
                http: backend_http(&files, &socket, &lb_addr, logs != Logs::ForwardedNoRealip),
                server: format!(
                    "include {};\n        location / {{ root {{www}}; try_files /ok =404; }}\n",
                    repo_file("nginx/fleetban-location.conf").display()
                ),
            };
            let upstream = format!("{net}.2:8080");
            let nginx = Nginx::start_site(&ns, &upstream, &site);
            let mut rule = Rule::new(
                "pages",
                nginx.access_log(),
                &format!("{{ hits: {LIMIT}, window: 60s }}"),
            )
            .matching("{ method: [GET], status: [2xx] }")
            .ban("10m");
            if logs != Logs::Realip {
                rule = rule.format(&format!("{{ log_format: '{XFF_FORMAT}' }}"));
            }
            let main = files
                .main_config()
                .host_id(name)
                .redis(&redis.url(), "")
                .proxies(&format!("[{}]", proxies.join(", ")))
                .http(&format!(
                    "{{ listen: '{}', deny_status: {deny_status} }}",
                    socket.display()
                ));
            files.write(&main, &[rule]);
            let mut backend = Backend {
                daemon: None,
                nginx,
                files,
                ns,
                upstream,
                lb_addr,
            };
            backend.start_daemon();
            backends.push(backend);
        }

        let upstreams: String = backends
            .iter()
            .map(|b| format!("        server {};\n", b.upstream))
            .collect();
        let lb_site = Site {
            log_format: None,
            http: format!("    upstream backends {{\n{upstreams}    }}\n"),
            server: "        location / {\n\
                     \x20           proxy_pass http://backends;\n\
                     \x20           proxy_set_header X-Forwarded-For $proxy_add_x_forwarded_for;\n\
                     \x20           proxy_next_upstream off;\n\
                     \x20           add_header X-Upstream $upstream_addr always;\n\
                     \x20       }\n"
                .to_owned(),
        };
        let lb = Nginx::start_site(&lb_ns, &format!("{LB_FRONT}:8080"), &lb_site);
        Fleet {
            backends,
            _lb: lb,
            lb_ns,
            clients,
            redis,
        }
    }

    /// GET /page through the balancer from `src`, with curl's `extra`
    /// arguments; the status, the backend that answered and `Retry-After`.
    fn get(&self, src: &str, extra: &[&str]) -> Result<Reply, String> {
        let mut args = vec!["--interface", src];
        args.extend_from_slice(extra);
        http_get_headers(
            &self.clients,
            &format!("http://{LB_FRONT}:8080/page"),
            &args,
            &["x-upstream", "retry-after"],
            REQUEST_TIMEOUT,
        )
    }

    /// Requests from `src` until each backend has answered one that `want`
    /// accepts; how long after the call each took. At most 400 requests in
    /// 20 s, else a panic naming `what` and the last replies.
    fn until_both(&self, src: &str, extra: &[&str], what: &str, want: impl Fn(&Reply) -> bool) -> Vec<Duration> {
        let start = Instant::now();
        let mut seen: Vec<Option<Duration>> = vec![None; self.backends.len()];
        let mut last = Vec::new();
        for _ in 0..400 {
            if start.elapsed() > Duration::from_secs(20) {
                break;
            }
            let reply = self.get(src, extra);
            if let Ok(r) = &reply {
                if let Some(i) = self.backends.iter().position(|b| r.headers[0] == b.upstream) {
                    if seen[i].is_none() && want(r) {
                        seen[i] = Some(start.elapsed());
                    }
                }
            }
            if seen.iter().all(Option::is_some) {
                return seen.into_iter().flatten().collect();
            }
            last.push(reply);
            let excess = last.len().saturating_sub(6);
            last.drain(..excess);
            thread::sleep(Duration::from_millis(25));
        }
        panic!("{what}: not from every backend within 20 s; last replies: {last:?}");
    }

    /// `src` is served (200) by both backends, each request within
    /// [`REQUEST_TIMEOUT`]; the slowest request.
    fn served_by_both(&self, src: &str, what: &str) -> Duration {
        let mut slowest = Duration::ZERO;
        let mut seen = vec![false; self.backends.len()];
        for _ in 0..8 {
            let t = Instant::now();
            let r = self.get(src, &[]).unwrap_or_else(|e| panic!("{what}: {src}: {e}"));
            slowest = slowest.max(t.elapsed());
            assert_eq!(r.status, 200, "{what}: {src} refused: {r:?}");
            if let Some(i) = self.backends.iter().position(|b| r.headers[0] == b.upstream) {
                seen[i] = true;
            }
            if seen.iter().all(|s| *s) {
                return slowest;
            }
        }
        panic!("{what}: {src} did not reach both backends in 8 requests: {seen:?}");
    }

    /// The members of `{fleetban}:bans`.
    fn banned(&self) -> Vec<String> {
        let list = self.redis.cli(&["ZRANGE", "{fleetban}:bans", "0", "-1"]);
        list.lines().map(str::to_owned).collect()
    }

    /// Every backend's nft set holds `addr` (the fleet's events reach all).
    fn wait_nft(&self, addr: &str, present: bool) {
        for b in &self.backends {
            common::wait_until(
                Duration::from_secs(10),
                &format!("{addr} in {}'s nft set: {present}", b.upstream),
                || nft_bans(&b.ns, "fleetban", "v4").iter().any(|(e, _)| e == addr) == present,
            );
        }
    }

    /// The balancer's own requests (a health check, say), straight to each
    /// backend, well over the limit: it is in `proxies`, never counted.
    fn balancer_requests(&self) {
        for b in &self.backends {
            for i in 0..LIMIT + 5 {
                let url = format!("http://{}/page", b.upstream);
                assert_eq!(
                    http_get(&self.lb_ns, &url, REQUEST_TIMEOUT),
                    Ok(200),
                    "balancer's request {i}"
                );
            }
        }
    }

    /// The attacker and the forger are in the ban list and every nft set;
    /// the balancer and the good client in none; every line was parsed.
    fn banned_are_the_attackers_only(&self) {
        self.wait_nft(ATTACKER, true);
        self.wait_nft(FORGER, true);
        let banned = self.banned();
        assert!(
            banned.contains(&ATTACKER.to_owned()) && banned.contains(&FORGER.to_owned()),
            "{banned:?}"
        );
        for addr in self.lb_addrs().iter().map(String::as_str).chain([GOOD]) {
            assert!(!banned.iter().any(|b| b == addr), "{addr} in the ban list: {banned:?}");
            for b in &self.backends {
                let set = nft_bans(&b.ns, "fleetban", "v4");
                assert!(
                    !set.iter().any(|(e, _)| e == addr),
                    "{addr} in {}'s nft set: {set:?}",
                    b.upstream
                );
            }
        }
        for b in &self.backends {
            let st = b.daemon().status();
            assert_eq!(st["unparsed"], 0, "{st}");
        }
    }

    /// The balancer's addresses, as clients and backends see it.
    fn lb_addrs(&self) -> Vec<String> {
        let mut addrs = vec![LB_FRONT.to_owned()];
        addrs.extend(self.backends.iter().map(|b| b.lb_addr.clone()));
        addrs
    }
}

/// The backend's http-block lines: the shipped `fleetban.conf` with the test's
/// socket, and (with `realip`) the realip lines of its comment trusting the
/// balancer.
fn backend_http(files: &ConfigDir, socket: &Path, lb_addr: &str, use_realip: bool) -> String {
    let (mut http, shipped) = common::shipped_snippet(files, socket);
    // The commented block, uncommented; its example networks replaced above.
    let realip: Vec<&str> = shipped
        .lines()
        .filter_map(|l| l.strip_prefix('#').map(str::trim))
        .filter(|l| l.starts_with("real_ip_"))
        .collect();
    assert_eq!(
        realip,
        ["real_ip_header X-Forwarded-For;", "real_ip_recursive on;"],
        "the realip block of nginx/fleetban.conf"
    );
    if use_realip {
        http += &format!("    set_real_ip_from {lb_addr};\n");
        for line in realip {
            http += &format!("    {line}\n");
        }
    }
    http
}

fn repo_file(path: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join(path)
}

/// What a refused client gets with this `deny_status`: that status, and in
/// `Retry-After` the whole seconds left of its 10-minute ban.
fn refused(deny_status: u16) -> impl Fn(&Reply) -> bool {
    move |r| r.status == deny_status && matches!(r.headers[1].parse::<u64>(), Ok(s) if (1..=600).contains(&s))
}

/// The attacker's LIMIT + 1 requests, all served (the one crossing the
/// limit is logged after it is answered), then how long until each backend
/// refuses it.
fn attack(fleet: &Fleet, deny_status: u16) -> Vec<Duration> {
    let mut seen = Vec::new();
    for i in 0..=LIMIT {
        let r = fleet
            .get(ATTACKER, &[])
            .unwrap_or_else(|e| panic!("attacker's request {i}: {e}"));
        assert_eq!(r.status, 200, "attacker's request {i}, before the limit: {r:?}");
        seen.push(r.headers[0].clone());
    }
    for b in &fleet.backends {
        assert!(seen.contains(&b.upstream), "the balancer spread the attack: {seen:?}");
    }
    fleet.until_both(ATTACKER, &[], "the attacker refused", refused(deny_status))
}

fn scenario(logs: Logs, deny_status: u16) {
    let fleet = Fleet::start(logs, deny_status);

    fleet.balancer_requests();
    fleet.served_by_both(GOOD, "the good client at first");

    let took = attack(&fleet, deny_status);
    println!(
        "{logs:?}, deny_status {deny_status}: the attacker refused by backend a {:?} and b {:?} after its \
         request over the limit",
        took[0], took[1]
    );
    fleet.served_by_both(GOOD, "the good client beside the attacker");

    // The forger names the good client in X-Forwarded-For; the balancer
    // appends the forger's own address, the one realip and the daemon take.
    let forged = format!("X-Forwarded-For: {GOOD}");
    for i in 0..=LIMIT {
        let r = fleet
            .get(FORGER, &["-H", &forged])
            .unwrap_or_else(|e| panic!("forger's request {i}: {e}"));
        assert_eq!(r.status, 200, "forger's request {i}: {r:?}");
    }
    fleet.until_both(FORGER, &["-H", &forged], "the forger refused", refused(deny_status));
    fleet.served_by_both(GOOD, "the good client the forger named");

    fleet.banned_are_the_attackers_only();
}

/// Without realip the logs still name the client: the daemon walks the
/// logged `X-Forwarded-For` from the right through `proxies:`, and the
/// check, asked about the balancer with the request's `X-Forwarded-For`,
/// walks it the same way: the attacker and the forger are refused, never
/// the good client the forger named nor the balancer.
#[test]
fn without_realip_the_check_takes_the_client_from_the_forwarded_list_too() {
    scenario(Logs::ForwardedNoRealip, 403);
}

#[test]
fn behind_a_balancer_with_realip_the_attacker_is_refused_by_every_backend_and_no_one_else() {
    scenario(Logs::Realip, 403);
}

#[test]
fn behind_a_balancer_with_forwarded_logs_the_attacker_gets_429_with_retry_after() {
    scenario(Logs::Forwarded, 429);
}

/// How the test stops a daemon.
#[derive(Clone, Copy, Debug)]
enum Stop {
    /// SIGTERM: a clean stop.
    Term,
    /// SIGTERM, then the socket file removed: nothing at the path.
    Gone,
    /// SIGKILL: its socket file left behind, nobody listening.
    Kill,
    /// SIGSTOP: the socket accepts connections nobody answers.
    Hang,
}

impl Stop {
    /// What nginx's error log says of a check that failed this way (any of).
    fn causes(self) -> &'static [&'static str] {
        const REFUSED: &str = "(111: Connection refused) while connecting to upstream";
        const MISSING: &str = "(2: No such file or directory) while connecting to upstream";
        match self {
            // The endpoint may leave its socket file or remove it.
            Stop::Term => &[REFUSED, MISSING],
            Stop::Gone => &[MISSING],
            Stop::Kill => &[REFUSED],
            Stop::Hang => &["upstream timed out"],
        }
    }
}

#[test]
fn a_stopped_killed_or_hung_daemon_fails_open_and_unban_lifts_the_refusal_everywhere() {
    let mut fleet = Fleet::start(Logs::Realip, 403);
    attack(&fleet, 403);

    for stop in [Stop::Term, Stop::Gone, Stop::Kill, Stop::Hang] {
        for b in &mut fleet.backends {
            // This step's failed checks only.
            std::fs::write(b.nginx.error_log(), "").expect("truncate nginx's error.log");
            match stop {
                Stop::Term | Stop::Gone => {
                    let (status, _) = b.daemon.take().expect("running").stop(Duration::from_secs(10));
                    assert!(status.success(), "{status}");
                    if matches!(stop, Stop::Gone) && b.socket().exists() {
                        std::fs::remove_file(b.socket()).expect("remove the socket file");
                    }
                }
                Stop::Kill => {
                    b.daemon.take().expect("running").kill9();
                    assert!(b.socket().exists(), "a killed daemon leaves its socket file");
                }
                Stop::Hang => b.daemon().signal(libc::SIGSTOP),
            }
        }
        let slowest = [ATTACKER, GOOD]
            .iter()
            .map(|src| fleet.served_by_both(src, &format!("daemons stopped by {stop:?}")))
            .max()
            .unwrap_or_default();
        println!("daemons stopped by {stop:?}: everyone served, slowest request {slowest:?}");
        // Served because the check failed as this stop makes it fail, not
        // because it was skipped.
        for b in &fleet.backends {
            let log = std::fs::read_to_string(b.nginx.error_log()).unwrap_or_default();
            let failed = |l: &&str| l.contains("/.fleetban-check") && stop.causes().iter().any(|c| l.contains(c));
            assert!(
                log.lines().any(|l| failed(&l)),
                "{}'s error.log names no check failed as {stop:?} makes it fail ({:?}):\n{log}",
                b.upstream,
                stop.causes()
            );
        }
        for b in &mut fleet.backends {
            match stop {
                Stop::Term | Stop::Gone | Stop::Kill => b.start_daemon(),
                Stop::Hang => b.daemon().signal(libc::SIGCONT),
            }
        }
        let took = fleet.until_both(
            ATTACKER,
            &[],
            &format!("the ban enforced again after {stop:?}"),
            refused(403),
        );
        println!(
            "after {stop:?}: the attacker refused again by a {:?} and b {:?}",
            took[0], took[1]
        );
    }

    let out = cli(&fleet.backends[0].files.cfg, &["unban", ATTACKER]);
    assert!(out.success(), "{}", out.text());
    let took = fleet.until_both(ATTACKER, &[], "the attacker served after unban", |r| r.status == 200);
    println!("unban: the attacker served by a {:?} and b {:?}", took[0], took[1]);
    assert!(!fleet.banned().contains(&ATTACKER.to_owned()));
    fleet.wait_nft(ATTACKER, false);
}
