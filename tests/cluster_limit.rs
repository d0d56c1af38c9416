//! The bucket-tagged key layout on real servers. The limiter on a
//! three-master Redis Cluster, against the brute-force model
//! (`common/model.rs`): every algorithm, thousands of addresses (many per
//! address bucket, so script calls carry several), with a
//! `redis-cli --cluster reshard` moving the slots of buckets in use in the
//! middle of the run. Nothing lost, nothing doubled: the bans equal the
//! model's, hit for hit. And a key of the layout before buckets is found.

mod common;

use std::collections::HashMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::model::{model, rule_limits, Algo, ModelHit, ModelRule};
use common::{connect, require, runtime, Redis, Rng};
use fleetban::config::{RedisConfig, Servers};
use fleetban::detect::Hit;
use fleetban::limit::{Batch, RedisLimiter, RuleLimit, Verdict};
use fleetban::store::{self, Keys};
use ipnet::IpNet;

/// One rule per algorithm (the sliding window twice, with and without its
/// prefilter), limits low enough that bans come and go during the run.
fn rules() -> (Vec<ModelRule>, Vec<RuleLimit>) {
    let window = 10_000;
    let model = vec![
        ModelRule {
            limit: 6,
            window,
            ban_ms: 3_000,
            algo: Algo::Sliding { prefilter: 0 },
        },
        ModelRule {
            limit: 6,
            window,
            ban_ms: 3_000,
            algo: Algo::Sliding {
                prefilter: RuleLimit::threshold(0.5, 6) as usize,
            },
        },
        ModelRule {
            limit: 6,
            window,
            ban_ms: 3_000,
            algo: Algo::Fixed,
        },
        ModelRule {
            limit: 4,
            window,
            ban_ms: 3_000,
            algo: Algo::Bucket { interval_us: 2_000_000 },
        },
        ModelRule {
            limit: 6,
            window,
            ban_ms: 3_000,
            algo: Algo::Counter,
        },
    ];
    let limits = rule_limits(&model);
    (model, limits)
}

/// Address `a`: IPv4 for three in four, an IPv6 /64 for the rest.
fn address(a: usize) -> IpNet {
    if a % 4 == 3 {
        format!("2001:db8:{:x}::/64", a).parse().unwrap()
    } else {
        format!("10.{}.{}.{}/32", a >> 16 & 255, a >> 8 & 255, a & 255)
            .parse()
            .unwrap()
    }
}

/// `RedisLimiter::check` until it answers, as the daemon's limiter retries
/// a failed round trip (from the first batch without a verdict; members
/// and offsets make the resend safe). Bounded.
fn check_retrying(
    rt: &tokio::runtime::Runtime,
    lim: &mut RedisLimiter,
    batches: &[Batch],
    failures: &mut u32,
) -> Vec<Verdict> {
    let mut out = Vec::new();
    for _ in 0..50 {
        let done = out.len();
        match rt.block_on(lim.check(&batches[done..], &mut out)) {
            Ok(()) => return out,
            Err(e) => {
                *failures += 1;
                eprintln!("check failed after {} verdicts, retrying: {e}", out.len());
                std::thread::sleep(Duration::from_millis(100));
            }
        }
    }
    panic!("the cluster never answered the round trip");
}

#[test]
fn cluster_limiter_agrees_with_model_through_a_reshard() {
    let nodes = Redis::start_cluster();
    let rt = runtime();
    let urls: Vec<String> = nodes
        .iter()
        .map(|n| format!("redis://127.0.0.1:{}", n.port()))
        .collect();
    let cfg = RedisConfig {
        servers: Servers::Cluster(urls.clone()),
        ..RedisConfig::single(&urls[0], Duration::from_secs(2))
    };
    let con = connect(&rt, &cfg, Duration::from_secs(5));
    let (model_rules, limits) = rules();
    let keys = Keys::new("fleetban");
    let mut lim = RedisLimiter::new(con, keys.clone(), "h1", limits);

    // Addresses disjoint per rule (no ban of one rule cuts another's batch
    // short, a known limit of batching across rules), ~10 per (rule, bucket).
    let per_rule = 10 * usize::from(store::ADDRESS_BUCKETS);
    let addresses: Vec<IpNet> = (0..per_rule * model_rules.len()).map(address).collect();
    let moved_from = nodes[0].cli(&["CLUSTER", "MYID"]);
    let moved_to = nodes[1].cli(&["CLUSTER", "MYID"]);
    // Node 0's first 2,000 slots move (redis-cli takes them in order):
    // buckets 0..7 are there.
    let moving = (0..store::ADDRESS_BUCKETS)
        .filter(|&b| keys.slot_of_bucket(b) < 2000)
        .count();
    assert!(moving >= 7, "{moving} buckets in the moved slots");

    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    let mut hits: Vec<ModelHit> = Vec::new();
    let mut bans: Vec<(usize, String, i64)> = Vec::new();
    let mut banned_until: HashMap<usize, i64> = HashMap::new();
    let mut offsets = [0u64; 3];
    let mut t = 1_700_000_000_000i64;
    let mut reshard: Option<Child> = None;
    let mut resharded_at: Option<usize> = None;
    let (mut checks, mut failures) = (0u32, 0u32);
    let started = Instant::now();
    let mut round = 0;
    // Bounded in rounds and time; ends 10 rounds after the reshard did.
    while round < 2_000 && started.elapsed() < Duration::from_secs(240) {
        if resharded_at.is_some_and(|r| round >= r + 10) {
            break;
        }
        if round == 3 {
            reshard = Some(
                Command::new(require("redis-cli"))
                    .args(["--cluster", "reshard", &format!("127.0.0.1:{}", nodes[0].port())])
                    .args(["--cluster-from", &moved_from, "--cluster-to", &moved_to])
                    .args(["--cluster-slots", "2000", "--cluster-yes"])
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(Stdio::piped())
                    .spawn()
                    .expect("spawn redis-cli --cluster reshard"),
            );
        }
        if resharded_at.is_none() {
            if let Some(child) = reshard.as_mut() {
                if let Some(status) = child.try_wait().expect("wait for redis-cli") {
                    assert!(status.success(), "reshard failed: {status}");
                    eprintln!("reshard done at round {round}");
                    resharded_at = Some(round);
                }
            }
        }
        // This round: about half the addresses, 1 to 3 hits each, in log
        // order per (rule, address); the model sees them in the same order.
        t += 300 + rng.below(2_700) as i64;
        let mut pending: Vec<(usize, usize, Vec<usize>)> = Vec::new();
        for (a, _) in addresses.iter().enumerate() {
            if rng.below(2) == 0 {
                continue;
            }
            let rule = a / per_rule;
            let mut idx = Vec::new();
            let mut time = t;
            for _ in 0..1 + rng.below(3) {
                time += rng.below(400) as i64;
                let origin = (a % 3) as u64;
                offsets[a % 3] += 100;
                idx.push(hits.len());
                hits.push(ModelHit {
                    rule,
                    key: a.to_string(),
                    time,
                    member: hits.len() as u64 + 1,
                    origin,
                    offset: offsets[a % 3],
                });
            }
            pending.push((rule, a, idx));
        }
        // All of the round's batches in one check; the hits after a ban are
        // judged again against it, in a check of their own.
        while !pending.is_empty() {
            let mut sent: Vec<(usize, Vec<usize>)> = Vec::new();
            let mut batches: Vec<Batch> = Vec::new();
            for (rule, a, idx) in pending.drain(..) {
                let idx: Vec<usize> = idx
                    .into_iter()
                    .filter(|&i| banned_until.get(&a).is_none_or(|&u| hits[i].time >= u))
                    .collect();
                if idx.is_empty() {
                    continue;
                }
                batches.push(Batch {
                    rule,
                    key: addresses[a],
                    hits: idx
                        .iter()
                        .map(|&i| Hit {
                            time_ms: hits[i].time,
                            member: hits[i].member,
                            origin: hits[i].origin,
                            offset: hits[i].offset,
                        })
                        .collect(),
                });
                sent.push((a, idx));
            }
            if batches.is_empty() {
                break;
            }
            checks += 1;
            let verdicts = check_retrying(&rt, &mut lim, &batches, &mut failures);
            assert_eq!(verdicts.len(), batches.len());
            for ((b, (a, idx)), v) in batches.iter().zip(sent).zip(verdicts) {
                if let Verdict::Over { index, .. } = v {
                    let i = idx[index];
                    banned_until.insert(a, hits[i].time + model_rules[b.rule].ban_ms);
                    bans.push((i, a.to_string(), hits[i].time));
                    if index + 1 < idx.len() {
                        pending.push((b.rule, a, idx[index + 1..].to_vec()));
                    }
                }
            }
        }
        round += 1;
    }
    let Some(done) = resharded_at else {
        let mut child = reshard.expect("the reshard started");
        let _ = child.kill();
        let _ = child.wait();
        panic!("the reshard did not end within the run's bounds ({round} rounds)");
    };
    assert!(done > 3, "the reshard ended before traffic could meet it");
    // The moved slots are node 1's now.
    let slots = nodes[1].cli(&["CLUSTER", "COUNTKEYSINSLOT", &keys.slot_of_bucket(0).to_string()]);
    assert!(
        slots.parse::<u64>().unwrap_or(0) > 0,
        "bucket 0's keys on node 1: {slots}"
    );
    eprintln!(
        "{} hits, {} bans, {round} rounds, {checks} checks, {} round trips, {} calls redirected, {failures} failed checks",
        hits.len(),
        bans.len(),
        lim.round_trips,
        lim.redirected
    );
    // Calls met the moving slots (a MOVED at least: the client's slot map
    // is stale after the reshard until a reply says so).
    assert!(lim.redirected > 0, "no call was redirected");
    let mut want: Vec<(usize, String, i64)> = model(&hits, &model_rules)
        .into_iter()
        .map(|b| (b.hit, b.key, b.at))
        .collect();
    bans.sort();
    want.sort();
    assert!(want.len() > 100, "the run bans ({} bans)", want.len());
    assert_eq!(bans.len(), want.len());
    assert!(
        bans == want,
        "first difference: {:?}",
        bans.iter().zip(&want).find(|(a, b)| a != b)
    );
}

#[test]
fn a_key_of_the_layout_before_buckets_is_found_and_new_ones_are_not() {
    let redis = Redis::start();
    let rt = runtime();
    let mut con = connect(
        &rt,
        &redis.config("fleetban", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let keys = Keys::new("fleetban");
    // 500 keys of the new layout and the ban list: nothing old.
    for i in 0..500 {
        let key = keys.window(&address(i), "scraper", None);
        assert_eq!(redis.cli(&["ZADD", &key, "1", "1"]), "1");
    }
    assert_eq!(redis.cli(&["ZADD", &keys.bans(), "1", "203.0.113.7"]), "1");
    assert_eq!(rt.block_on(store::old_layout_key(&mut con, &keys)), None);
    // One window of the old layout among them.
    assert_eq!(
        redis.cli(&["ZADD", "fleetban:win:{203.0.113.7}:scraper", "1", "1"]),
        "1"
    );
    assert_eq!(
        rt.block_on(store::old_layout_key(&mut con, &keys)).as_deref(),
        Some("fleetban:win:{203.0.113.7}:scraper")
    );
}
