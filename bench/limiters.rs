//! What each limiter costs in Redis: bytes per tracked address and script
//! calls per second, against the redis-server given by URL (run it with
//! `bench/limiters.sh`, which starts a private one).
//!
//! For each algorithm at limits 100 and 1,000 (`distinct` at 30 and 1,000,
//! its hits each a new value): 10,000 addresses are filled
//! to the limit (hits spread over half the window, 100 hits per call, the
//! real member encoding of `detect::member`), and `used_memory` before and
//! after gives bytes per address. Then 200,000 calls of one hit each (20 per
//! address of a fresh set, all under the limit) are sent through
//! `RedisLimiter` (pipelined, as the daemon does): calls/s from the client,
//! and Redis CPU µs per call from the server's `used_cpu_user + used_cpu_sys`.
//! `network_/24` is the sliding window keyed by a /24 (`limit.key:
//! network`): one key per 100 addresses, limit 2,000, each key filled with
//! 2,000 hits, then the same 200,000 one-hit calls, 100 addresses' hits
//! landing in each (fresh) key; its bytes are per key.
//!
//! cargo bench --bench limiters -- unix:///path/redis.sock [ADDRESSES [ALGORITHM...]]
//! (with ALGORITHMs: only those whose name contains one of them)
//!
//! Without a URL (`cargo test --bench '*'`, a bare `cargo bench`) it prints
//! its usage and exits.

use std::time::{Duration, Instant};

use fleetban::config::{Algorithm, Distinct, RedisConfig};
use fleetban::detect::{member, Hit};
use fleetban::limit::Batch;
use fleetban::limit::{RedisLimiter, RuleLimit, Verdict};
use fleetban::store::{self, Keys};
use ipnet::IpNet;

const WINDOW_MS: i64 = 60_000;
/// A window boundary: every hit of a fill falls in one fixed window.
const T0: i64 = 1_700_000_040_000;

fn addr(i: u32, base: u32) -> IpNet {
    IpNet::from(std::net::IpAddr::from((base + i).to_be_bytes()))
}

async fn info(con: &mut store::Conn, section: &str, field: &str) -> f64 {
    let text: String = redis::cmd("INFO").arg(section).query_async(con).await.expect("INFO");
    text.lines()
        .find_map(|l| l.strip_prefix(&format!("{field}:")))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(f64::NAN)
}

async fn cpu(con: &mut store::Conn) -> f64 {
    info(con, "cpu", "used_cpu_user").await + info(con, "cpu", "used_cpu_sys").await
}

/// The client key of address `i` (from `base`): the address, or for the
/// network rows its /24 (addresses `i` and `i + keys` share one).
fn key_of(name: &str, i: u32, keys: u32, base: u32) -> IpNet {
    if name.starts_with("network") {
        IpNet::new(std::net::IpAddr::from((base + (i % keys) * 256).to_be_bytes()), 24).expect("a /24")
    } else {
        addr(i, base)
    }
}

fn rule(name: &str, limit: u32) -> RuleLimit {
    match name {
        "sliding_window" | "network_/24" => RuleLimit::new("bench", Algorithm::SlidingWindow, limit, WINDOW_MS),
        "distinct" => RuleLimit::distinct("bench", Distinct::Path, limit, WINDOW_MS),
        "sliding_window+prefilter_0.8" => RuleLimit {
            prefilter: RuleLimit::threshold(0.8, limit),
            ..RuleLimit::new("bench", Algorithm::SlidingWindow, limit, WINDOW_MS)
        },
        "fixed_window" => RuleLimit::new("bench", Algorithm::FixedWindow, limit, WINDOW_MS),
        "sliding_counter" => RuleLimit::new("bench", Algorithm::SlidingCounter, limit, WINDOW_MS),
        // Burst = limit, refilled over the window.
        _ => RuleLimit::bucket("bench", limit, WINDOW_MS * 1000 / i64::from(limit)),
    }
}

#[tokio::main(flavor = "current_thread")]
async fn main() {
    let args: Vec<String> = std::env::args().collect();
    let Some(url) = args.get(1).filter(|a| a.contains("://")).cloned() else {
        eprintln!("usage: cargo bench --bench limiters -- REDIS_URL [ADDRESSES] (bench/limiters.sh starts a Redis)");
        return;
    };
    let addresses: u32 = args.get(2).and_then(|a| a.parse().ok()).unwrap_or(10_000);
    let cfg = RedisConfig::single(url, Duration::from_secs(30));
    let mut con = store::connect(&cfg, Some(Duration::from_secs(60)))
        .await
        .expect("connect");
    println!(
        "| algorithm | limit | bytes per key (address; network: /24), used_memory delta | MEMORY USAGE of one key | encoding | calls/s (1 hit/call, pipelined) | Redis CPU µs/call |"
    );
    println!("|---|---|---|---|---|---|---|");
    // Further arguments: only the algorithms whose name contains one of them.
    let only = &args[args.len().min(3)..];
    for name in [
        "sliding_window",
        "sliding_window+prefilter_0.8",
        "fixed_window",
        "token_bucket",
        "sliding_counter",
        "distinct",
        "network_/24",
    ]
    .into_iter()
    .filter(|n| only.is_empty() || only.iter().any(|o| n.contains(o.as_str())))
    {
        let limits: &[u32] = match name {
            "distinct" => &[30, 1000],
            "network_/24" => &[2000],
            _ => &[100, 1000],
        };
        // Tracked keys: one per address, or per 100 addresses for a network.
        let keys_n = if name.starts_with("network") {
            (addresses / 100).max(1)
        } else {
            addresses
        };
        for &limit in limits {
            let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.expect("FLUSHALL");
            let rules = vec![rule(name, limit)];
            let mut lim = RedisLimiter::new(con.clone(), Keys::new("fleetban"), "h1", rules);
            let before = info(&mut con, "memory", "used_memory").await;
            // Fill: `limit` hits per address over half the window, 100 per call.
            let step = WINDOW_MS / 2 / i64::from(limit);
            let mut out = Vec::new();
            for chunk in 0..limit.div_ceil(100) {
                let batches: Vec<Batch> = (0..keys_n)
                    .map(|i| Batch {
                        rule: 0,
                        key: key_of(name, i, keys_n, 0x0a00_0000),
                        hits: (chunk * 100..((chunk + 1) * 100).min(limit))
                            .map(|k| Hit::of_line(T0 + i64::from(k) * step, u64::from(i), u64::from(k) * 200))
                            .collect(),
                    })
                    .collect();
                out.clear();
                lim.check(&batches, &mut out).await.expect("fill");
                assert!(
                    out.iter().all(|v| matches!(v, Verdict::Under { .. })),
                    "{name}: fill went over"
                );
            }
            let after = info(&mut con, "memory", "used_memory").await;
            let per_addr = (after - before) / f64::from(keys_n);
            let (keys, one) = (Keys::new("fleetban"), key_of(name, 1, keys_n, 0x0a00_0000));
            let fixed = format!("{}:{}", keys.fixed(&one, "bench", None), T0 / WINDOW_MS);
            let sample_key = match name {
                "fixed_window" => fixed.clone(),
                "token_bucket" => keys.bucket(&one, "bench", None),
                "sliding_counter" => keys.counter(&one, "bench", None),
                _ => keys.window(&one, "bench", None),
            };
            let mut usage = 0i64;
            let mut keys_of_one = vec![sample_key.clone()];
            if name.contains("prefilter") {
                keys_of_one.push(fixed);
            }
            for k in &keys_of_one {
                let u: Option<i64> = redis::cmd("MEMORY")
                    .arg("USAGE")
                    .arg(k)
                    .arg("SAMPLES")
                    .arg(0)
                    .query_async(&mut con)
                    .await
                    .unwrap_or(None);
                usage += u.unwrap_or(0);
            }
            let enc: Option<String> = redis::cmd("OBJECT")
                .arg("ENCODING")
                .arg(&sample_key)
                .query_async(&mut con)
                .await
                .ok();
            // Throughput: one hit per call, 20 rounds over a fresh set of addresses.
            let rounds = 20u32;
            let cpu0 = cpu(&mut con).await;
            let start = Instant::now();
            for r in 0..rounds {
                let batches: Vec<Batch> = (0..addresses)
                    .map(|i| Batch {
                        rule: 0,
                        key: key_of(name, i, keys_n, 0x0b00_0000),
                        hits: vec![Hit::of_line(
                            T0 + i64::from(r) * 100,
                            u64::from(i) + 1_000_000,
                            u64::from(r),
                        )],
                    })
                    .collect();
                out.clear();
                lim.check(&batches, &mut out).await.expect("calls");
            }
            let secs = start.elapsed().as_secs_f64();
            let cpu1 = cpu(&mut con).await;
            let calls = f64::from(rounds * addresses);
            println!(
                "| {name} | {limit} | {per_addr:.0} | {usage} | {} | {:.0} | {:.1} |",
                enc.unwrap_or_else(|| "-".into()),
                calls / secs,
                (cpu1 - cpu0) * 1e6 / calls
            );
        }
    }
    // The member encoding, for the record: the same sliding window of 100
    // filled with members of 63 bits (before the fold), 32 and 24 bits.
    println!();
    println!(
        "| sliding_window, limit 100, member width | bytes/address, used_memory delta | MEMORY USAGE of one address |"
    );
    println!("|---|---|---|");
    for (bits, mask) in [(63u32, i64::MAX as u64), (32, u64::from(u32::MAX)), (24, 0xff_ffff)] {
        let _: () = redis::cmd("FLUSHALL").query_async(&mut con).await.expect("FLUSHALL");
        let before = info(&mut con, "memory", "used_memory").await;
        let keys = Keys::new("fleetban");
        for chunk in 0..addresses.div_ceil(1000) {
            let mut pipe = redis::pipe();
            for i in chunk * 1000..((chunk + 1) * 1000).min(addresses) {
                let key = keys.window(&addr(i, 0x0a00_0000), "bench", None);
                let fw = keys.fixed(&addr(i, 0x0a00_0000), "bench", None);
                let mut c = fleetban::limit::algorithm::sliding_window::SCRIPT.cmd(&[&key, &fw]);
                c.arg(WINDOW_MS).arg(100).arg(0).arg(0).arg(1).arg(100);
                for k in 0..100u64 {
                    let m = member(u64::from(i), k * 200) & mask;
                    // As Redis parses it: a signed value of `bits` bits.
                    let m = if bits < 63 && m >= 1 << (bits - 1) {
                        m as i64 - (1i64 << bits)
                    } else {
                        m as i64
                    };
                    c.arg(T0 + k as i64 * 300).arg(m);
                }
                pipe.add_command(c);
            }
            let _: Vec<redis::Value> = pipe.query_async(&mut con).await.expect("fill");
        }
        let after = info(&mut con, "memory", "used_memory").await;
        let usage: Option<i64> = redis::cmd("MEMORY")
            .arg("USAGE")
            .arg(keys.window(&addr(1, 0x0a00_0000), "bench", None))
            .arg("SAMPLES")
            .arg(0)
            .query_async(&mut con)
            .await
            .unwrap_or(None);
        println!(
            "| {bits} | {:.0} | {} |",
            (after - before) / f64::from(addresses),
            usage.unwrap_or(0)
        );
    }
}
