//! What a Redis Cluster costs the limiter: `RedisLimiter` on one server
//! (one pipeline per slice) against a Cluster (one call per key, sent
//! concurrently: the cluster client refuses pipelines across slots), same
//! sliding_window calls of one hit each. Run it with `bench/cluster.sh`,
//! which starts a private server and a private three-master cluster on
//! loopback.
//!
//! cargo bench --bench cluster -- SINGLE_URL CLUSTER_SEED_URL [ADDRESSES]
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

fn config(url: &str, servers: Servers) -> RedisConfig {
    RedisConfig {
        servers,
        ..RedisConfig::single(url, Duration::from_secs(30))
    }
}

/// Calls per second over `rounds` rounds of one hit for each of `addresses` addresses.
async fn run(cfg: &RedisConfig, addresses: u32, rounds: u32, base: u32) -> f64 {
    let con = store::connect(cfg, Some(Duration::from_secs(60)))
        .await
        .expect("connect");
    let rules = vec![RuleLimit::new("bench", Algorithm::SlidingWindow, 100, 60_000)];
    let mut lim = RedisLimiter::new(con, Keys::new("fleetban"), "h1", rules);
    let mut out = Vec::new();
    let start = Instant::now();
    for r in 0..rounds {
        let batches: Vec<Batch> = (0..addresses)
            .map(|i| Batch {
                rule: 0,
                key: IpNet::from(std::net::IpAddr::from((base + i).to_be_bytes())),
                hits: vec![Hit::of_line(T0 + i64::from(r) * 100, u64::from(i), u64::from(r))],
            })
            .collect();
        out.clear();
        lim.check(&batches, &mut out).await.expect("calls");
    }
    f64::from(rounds * addresses) / start.elapsed().as_secs_f64()
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let url = |i: usize| args.get(i).filter(|a| a.contains("://"));
    let (Some(single), Some(cluster)) = (url(1), url(2)) else {
        eprintln!("usage: cargo bench --bench cluster -- SINGLE_URL CLUSTER_SEED_URL [ADDRESSES] (bench/cluster.sh starts the servers)");
        return;
    };
    let addresses: u32 = args.get(3).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let rounds = 20;
    let one = config(single, Servers::Url);
    let many = config(cluster, Servers::Cluster(vec![cluster.clone()]));
    // Warm-up (script load, connections), then the measured runs.
    run(&one, 1000, 1, 0x0c00_0000).await;
    run(&many, 1000, 1, 0x0c00_0000).await;
    let a = run(&one, addresses, rounds, 0x0a00_0000).await;
    let b = run(&many, addresses, rounds, 0x0b00_0000).await;
    println!("| Redis | calls/s (sliding_window, 1 hit per call, {addresses} addresses x {rounds} rounds) |");
    println!("|---|---|");
    println!("| one server, pipelined | {a:.0} |");
    println!("| cluster of 3 masters, concurrent per-key calls | {b:.0} |");
    println!("ratio cluster / one server: {:.2}", b / a);
}
