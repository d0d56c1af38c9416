//! A fleet on one machine, for the spread case: hosts (namespaces), each
//! with Debian's nginx writing its access log and its own `fleetban run`
//! (nft backend, inside the namespace), one shared Redis, and one client
//! namespace whose loopback answers for a whole range of addresses
//! ([`CLIENTS`], a local route), so any number of clients share it. Each
//! host has its own link to the client namespace. Used by `tests/fleet.rs`
//! and `bench/spread.rs`; everything goes on Drop.

use std::net::{Ipv4Addr, SocketAddrV4};
use std::path::Path;
use std::sync::{Arc, Barrier};
use std::time::{Duration, Instant};

use super::{get_from, nft_bans, veth_pair, ConfigDir, Daemon, MainConfig, NetNs, Nginx, Redis, Rule};

/// The clients' addresses: a local route on the client namespace's
/// loopback, each host routing it back over its own link.
pub const CLIENTS: &str = "10.213.64.0/18";

/// Where nginx listens on every host.
const PORT: u16 = 8080;

/// The path every client asks for.
pub const PAGE: &str = "/page";

/// The name of the one rule every daemon runs.
pub const RULE: &str = "spread";

pub struct FleetHost {
    /// Stopped first (fields drop in order): the daemon, then nginx, then
    /// the namespace with whatever is left in it.
    pub daemon: Daemon,
    pub nginx: Nginx,
    /// Its config and state.
    pub files: ConfigDir,
    pub ns: NetNs,
    /// nginx, as the clients reach it.
    pub addr: SocketAddrV4,
}

pub struct Fleet {
    pub hosts: Vec<FleetHost>,
    pub client: NetNs,
    /// Outlives the daemons.
    pub redis: Redis,
}

impl Fleet {
    /// `hosts` hosts (at most 20), each running the fleetban binary at
    /// `program` with one rule: GETs of nginx's log, `limit` (the YAML of
    /// `limit:`), banned 10 minutes; `redis_options` after the `url` of the
    /// `redis:` section ("" for the defaults).
    pub fn start(hosts: u8, limit: &str, redis_options: &str, program: &Path) -> Fleet {
        Fleet::start_with(hosts, limit, redis_options, program, |m| m)
    }

    /// As [`Fleet::start`], each host's main config passed through `main`
    /// (e.g. an `allow:` list).
    pub fn start_with(
        hosts: u8,
        limit: &str,
        redis_options: &str,
        program: &Path,
        main: impl Fn(MainConfig) -> MainConfig,
    ) -> Fleet {
        assert!((1..=20).contains(&hosts), "1 to 20 hosts, got {hosts}");
        let redis = Redis::start();
        let client = NetNs::new("clients");
        client.run(&["ip", "route", "add", "local", CLIENTS, "dev", "lo"]);
        let mut fleet = Fleet {
            hosts: Vec::new(),
            client,
            redis,
        };
        for i in 1..=hosts {
            let ns = NetNs::new(&format!("host{i}"));
            let (host_addr, client_addr) = (format!("10.213.{}.1", 40 + i), format!("10.213.{}.2", 40 + i));
            veth_pair(
                &ns,
                &format!("{host_addr}/24"),
                &fleet.client,
                &format!("{client_addr}/24"),
            );
            ns.run(&["ip", "route", "add", CLIENTS, "via", &client_addr]);
            let nginx = Nginx::start(&ns, &format!("0.0.0.0:{PORT}"), None);
            let files = ConfigDir::new();
            let rule = Rule::new(RULE, nginx.access_log(), limit)
                .matching("{ method: [GET] }")
                .ban("10m");
            files.write(
                &main(
                    files
                        .main_config()
                        .host_id(&format!("web-{i}"))
                        .redis(&fleet.redis.url(), redis_options),
                ),
                &[rule],
            );
            let daemon = Daemon::start_program(program, Some(&ns), &files.cfg, &files.control, &[]);
            fleet.hosts.push(FleetHost {
                daemon,
                nginx,
                files,
                ns,
                addr: SocketAddrV4::new(host_addr.parse().expect("an address"), PORT),
            });
        }
        fleet
    }

    /// Client `i`'s address in [`CLIENTS`] (10.213.64.1, ..., 10.213.64.250,
    /// 10.213.65.1, ...).
    pub fn client(i: usize) -> Ipv4Addr {
        assert!(i < 64 * 250, "client {i} outside {CLIENTS}");
        Ipv4Addr::new(10, 213, 64 + (i / 250) as u8, 1 + (i % 250) as u8)
    }

    /// Runs `f(i, hosts)` for i in 0..n, each on its own thread inside the
    /// client namespace, all released together; `hosts` are nginx's
    /// addresses in host order. The results in order of i.
    pub fn each_client<T: Send + 'static>(
        &self,
        n: usize,
        f: impl Fn(usize, &[SocketAddrV4]) -> T + Send + Sync + 'static,
    ) -> Vec<T> {
        let hosts: Arc<Vec<SocketAddrV4>> = Arc::new(self.hosts.iter().map(|h| h.addr).collect());
        let (f, start) = (Arc::new(f), Arc::new(Barrier::new(n)));
        let threads: Vec<_> = (0..n)
            .map(|i| {
                let (f, start, hosts) = (f.clone(), start.clone(), hosts.clone());
                self.client.spawn(move || {
                    start.wait();
                    f(i, &hosts)
                })
            })
            .collect();
        threads
            .into_iter()
            .map(|t| t.join().unwrap_or_else(|e| std::panic::resume_unwind(e)))
            .collect()
    }

    /// The v4 elements of every host's nft sets, in host order.
    pub fn sets(&self) -> Vec<Vec<String>> {
        self.hosts
            .iter()
            .map(|h| nft_bans(&h.ns, "fleetban", "v4").into_iter().map(|(e, _)| e).collect())
            .collect()
    }

    /// Every daemon's log, for a failure message.
    pub fn logs(&self) -> String {
        let logs: Vec<String> = self.hosts.iter().map(|h| h.daemon.log_text()).collect();
        logs.join("\n-----\n")
    }
}

/// `requests` GETs of [`PAGE`] from `from`, one after the other, round-robin
/// over `hosts` from the first: the instant the last one was written, or
/// the first request not answered 200 within `timeout`. Call it inside the
/// namespace owning `from` ([`Fleet::each_client`]).
pub fn spread_requests(
    from: Ipv4Addr,
    hosts: &[SocketAddrV4],
    requests: usize,
    timeout: Duration,
) -> Result<Instant, String> {
    let mut last = None;
    for (n, to) in hosts.iter().cycle().take(requests).enumerate() {
        match get_from(from, *to, PAGE, timeout) {
            Ok((sent, 200)) => last = Some(sent),
            Ok((_, status)) => return Err(format!("request {} of {from} to {to}: status {status}", n + 1)),
            Err(e) => return Err(format!("request {} of {from}: {e}", n + 1)),
        }
    }
    last.ok_or_else(|| "no request sent".to_owned())
}
