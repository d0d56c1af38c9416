//! What a Redis Cluster costs the limiter: `RedisLimiter` on one server
//! (one pipeline per slice, up to 64 addresses per script call) against a
//! Cluster (calls of one rule and one address bucket, one pipeline per
//! bucket, all at once), the same sliding_window batches of one hit each.
//! Per run: hits/s through `RedisLimiter::check`, and the Redis CPU per hit
//! (`used_cpu_sys` + `used_cpu_user` of INFO CPU, before and after, summed
//! over the masters), each master's share too. Runs alternate between the
//! two; medians are printed. Run it with `bench/cluster.sh`, which starts a
//! private server and a private three-master cluster on loopback.
//!
//! cargo bench --bench cluster -- SINGLE_URL NODE_URL[,NODE_URL...] [ADDRESSES] [REPS]
//!
//! Without the URLs (`cargo test --bench '*'`, a bare `cargo bench`) it
//! prints its usage and exits.

use std::time::{Duration, Instant};

use fleetban::config::{Algorithm, RedisConfig, Servers};
use fleetban::detect::Hit;
use fleetban::limit::Batch;
use fleetban::limit::{RedisLimiter, RuleLimit};
use fleetban::store::{self, Keys};
use ipnet::IpNet;

const T0: i64 = 1_700_000_040_000;
const ROUNDS: u32 = 20;

fn config(url: &str, servers: Servers) -> RedisConfig {
    RedisConfig {
        servers,
        ..RedisConfig::single(url, Duration::from_secs(30))
    }
}

/// Seconds of CPU the server at `url` has used.
async fn cpu(url: &str) -> f64 {
    let client = redis::Client::open(url).expect("url");
    let mut con = client
        .get_multiplexed_async_connection()
        .await
        .expect("connect to a node");
    let info: String = redis::cmd("INFO").arg("cpu").query_async(&mut con).await.expect("INFO");
    info.lines()
        .filter_map(|l| l.split_once(':'))
        .filter(|(k, _)| *k == "used_cpu_sys" || *k == "used_cpu_user")
        .filter_map(|(_, v)| v.trim().parse::<f64>().ok())
        .sum()
}

struct Run {
    hits_per_s: f64,
    /// Redis CPU per hit, summed over the servers, in µs.
    cpu_us_per_hit: f64,
    /// Each server's share of that CPU.
    per_node_us: Vec<f64>,
}

/// `ROUNDS` rounds of one hit for each of `addresses` addresses (new ones
/// each run: `base`), on the servers `nodes` measured for CPU.
async fn run(cfg: &RedisConfig, nodes: &[String], addresses: u32, base: u32) -> Run {
    let con = store::connect(cfg, Some(Duration::from_secs(60)))
        .await
        .expect("connect");
    let rules = vec![RuleLimit::new("bench", Algorithm::SlidingWindow, 100, 60_000)];
    let mut lim = RedisLimiter::new(con, Keys::new("fleetban"), "h1", rules);
    let mut out = Vec::new();
    let rounds: Vec<Vec<Batch>> = (0..ROUNDS)
        .map(|r| {
            (0..addresses)
                .map(|i| Batch {
                    rule: 0,
                    key: IpNet::from(std::net::IpAddr::from((base + i).to_be_bytes())),
                    hits: vec![Hit::of_line(T0 + i64::from(r) * 100, u64::from(i), u64::from(r))],
                })
                .collect()
        })
        .collect();
    let mut before = Vec::new();
    for n in nodes {
        before.push(cpu(n).await);
    }
    let start = Instant::now();
    for batches in &rounds {
        out.clear();
        lim.check(batches, &mut out).await.expect("calls");
    }
    let elapsed = start.elapsed().as_secs_f64();
    let hits = f64::from(ROUNDS * addresses);
    let mut per_node_us = Vec::new();
    for (n, b) in nodes.iter().zip(before) {
        per_node_us.push((cpu(n).await - b) * 1e6 / hits);
    }
    Run {
        hits_per_s: hits / elapsed,
        cpu_us_per_hit: per_node_us.iter().sum(),
        per_node_us,
    }
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    v[v.len() / 2]
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = |i: usize| args.get(i).filter(|a| a.contains("://"));
    let (Some(single), Some(cluster)) = (url(1), url(2)) else {
        eprintln!(
            "usage: cargo bench --bench cluster -- SINGLE_URL NODE_URL[,NODE_URL...] [ADDRESSES] [REPS] (bench/cluster.sh starts the servers)"
        );
        return;
    };
    let nodes: Vec<String> = cluster.split(',').map(str::to_owned).collect();
    let addresses: u32 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let reps: u32 = args.get(4).and_then(|a| a.parse().ok()).unwrap_or(5);
    let one = config(single, Servers::Url);
    let many = config(&nodes[0], Servers::Cluster(nodes.clone()));
    // Warm-up (script load, connections), then the measured runs, alternated.
    run(&one, std::slice::from_ref(single), 1000, 0x0c00_0000).await;
    run(&many, &nodes, 1000, 0x0c00_0000).await;
    let (mut a, mut b) = (Vec::new(), Vec::new());
    for rep in 0..reps {
        let base = 0x0a00_0000 + rep * 0x0010_0000;
        a.push(run(&one, std::slice::from_ref(single), addresses, base).await);
        b.push(run(&many, &nodes, addresses, base).await);
    }
    let hits = |v: &[Run]| median(v.iter().map(|r| r.hits_per_s).collect());
    let cpu = |v: &[Run]| median(v.iter().map(|r| r.cpu_us_per_hit).collect());
    let (ha, hb, ca, cb) = (hits(&a), hits(&b), cpu(&a), cpu(&b));
    println!(
        "| Redis (sliding_window, 1 hit per batch, {addresses} addresses x {ROUNDS} rounds, medians of {reps}) | hits/s | Redis CPU µs per hit (sum over masters) |"
    );
    println!("|---|---|---|");
    println!("| one server, one pipeline per slice | {ha:.0} | {ca:.2} |");
    println!(
        "| cluster of {} masters, one pipeline per bucket | {hb:.0} | {cb:.2} |",
        nodes.len()
    );
    let shares: Vec<String> = (0..nodes.len())
        .map(|i| format!("{:.2}", median(b.iter().map(|r| r.per_node_us[i]).collect())))
        .collect();
    println!("cluster CPU µs per hit per master (medians): {}", shares.join(", "));
    println!(
        "ratios cluster / one server: hits/s {:.2}, CPU per hit {:.2}",
        hb / ha,
        cb / ca
    );
}
