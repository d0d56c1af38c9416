//! Network keys (`limit.key: network`) three ways: the Redis script on a
//! real redis-server shared by three hosts, the embedded store, and a plain
//! model written from docs/design.md §2 ("Network keys"). Random hits of
//! addresses from a few /24s (and IPv6 /56s) land on random hosts; a rule
//! counting networks and one counting addresses run side by side. For each
//! hit in order: skipped when a ban covers its address (its own or its
//! network's); otherwise each rule counts it under its key and a key whose
//! window is full is banned. The three must ban the same keys at the same
//! hits.

mod common;

use std::collections::HashMap;
use std::net::IpAddr;
use std::time::Duration;

use common::{connect, runtime, Redis};
use fleetban::addr::{AddrText, Keying};
use fleetban::bans::BanCache;
use fleetban::config::{Algorithm, Scope};
use fleetban::detect::Hit;
use fleetban::enforce::Until;
use fleetban::limit::{Batch, MemoryLimiter, RedisLimiter, RuleLimit, Verdict};
use fleetban::store::Keys;
use proptest::prelude::*;

const WINDOW: i64 = 10_000;
const BAN_MS: i64 = 4_000;
const HOSTS: usize = 3;

/// One request: which address, on which host, when.
#[derive(Clone, Debug)]
struct Req {
    addr: IpAddr,
    host: usize,
    time: i64,
}

/// Rule 0 counts /24 (IPv6 /56) networks, rule 1 addresses (IPv6 /64s).
fn keyings() -> [Keying; 2] {
    [Keying::Network { v4: 24, v6: 56 }, Keying::Address]
}

/// The model's key of `a` under rule `rule`, by text: the first three
/// octets, or the first 56 / 64 bits of the IPv6 address's segments.
fn model_key(a: &IpAddr, rule: usize) -> String {
    match a {
        IpAddr::V4(v4) if rule == 0 => {
            let o = v4.octets();
            format!("{}.{}.{}.0/24", o[0], o[1], o[2])
        }
        IpAddr::V4(v4) => v4.to_string(),
        IpAddr::V6(v6) => {
            let s = v6.segments();
            let bits = if rule == 0 { 56 } else { 64 };
            let mut kept = [0u16; 8];
            kept[..4].copy_from_slice(&s[..4]);
            if bits == 56 {
                kept[3] &= 0xff00;
            }
            format!("{}/{bits}", std::net::Ipv6Addr::from(kept))
        }
    }
}

/// Whether the model's `key` (an address or CIDR text) holds `a`.
fn holds(key: &str, a: &IpAddr) -> bool {
    let net: ipnet::IpNet = match key.contains('/') {
        true => key.parse().unwrap(),
        false => ipnet::IpNet::from(key.parse::<IpAddr>().unwrap()),
    };
    net.contains(a)
}

/// The model: (request index, rule, key) of each ban, in order.
fn model(reqs: &[Req], limits: [usize; 2]) -> Vec<(usize, usize, String)> {
    let mut windows: HashMap<(usize, String), Vec<i64>> = HashMap::new();
    let mut bans: Vec<(String, i64)> = Vec::new();
    let mut out = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        for (rule, &limit) in limits.iter().enumerate() {
            if bans.iter().any(|(k, until)| r.time < *until && holds(k, &r.addr)) {
                break;
            }
            let key = model_key(&r.addr, rule);
            let w = windows.entry((rule, key.clone())).or_default();
            w.retain(|&t| t > r.time - WINDOW);
            if w.len() >= limit {
                bans.push((key.clone(), r.time + BAN_MS));
                out.push((i, rule, key));
            } else {
                w.push(r.time);
            }
        }
    }
    out
}

/// Drives `check(host, batch)` as the daemon's scanner does: a hit of an
/// address a ban covers is not counted; each rule keys it by its keying.
fn drive(reqs: &[Req], mut check: impl FnMut(usize, Batch) -> Verdict) -> Vec<(usize, usize, String)> {
    let mut cache = BanCache::default();
    let mut out = Vec::new();
    for (i, r) in reqs.iter().enumerate() {
        for (rule, keying) in keyings().into_iter().enumerate() {
            if cache.covering(r.addr).is_some_and(|u| u > Until::At(r.time)) {
                break;
            }
            let key = keying.key(r.addr, 64);
            let hit = Hit::of_line(r.time, r.host as u64, i as u64);
            let batch = Batch {
                rule,
                key,
                hits: vec![hit],
            };
            if let Verdict::Over { .. } = check(r.host, batch) {
                cache.insert(key, Until::At(r.time + BAN_MS));
                out.push((i, rule, AddrText(&key).to_string()));
            }
        }
    }
    out
}

fn rules(limits: [usize; 2]) -> Vec<RuleLimit> {
    (0..2)
        .map(|i| RuleLimit {
            scope: Scope::Fleet,
            ..RuleLimit::new(&format!("r{i}"), Algorithm::SlidingWindow, limits[i] as u32, WINDOW)
        })
        .collect()
}

/// Addresses of three /24s (eight each) and two IPv6 /56s (two /64s each,
/// two addresses per /64), times going forward in steps of 0 to 700 ms.
fn requests() -> impl Strategy<Value = (Vec<Req>, [usize; 2])> {
    let addr = prop_oneof![
        4 => (0u8..3, 1u8..9).prop_map(|(net, a)| IpAddr::from([198, 51, 100 + net, a])),
        1 => (0u16..2, 0u16..2, 1u16..3).prop_map(|(net, sub, a)| {
            IpAddr::from([0x2001, 0xdb8, 7, (net << 8) | sub, 0, 0, 0, a])
        }),
    ];
    (
        prop::collection::vec((addr, 0..HOSTS, 0i64..700), 1..160),
        6usize..30,
        2usize..8,
    )
        .prop_map(|(raw, net_limit, addr_limit)| {
            let mut t = 1_780_000_000_000i64;
            let reqs = raw
                .into_iter()
                .map(|(addr, host, step)| {
                    t += step;
                    Req { addr, host, time: t }
                })
                .collect();
            (reqs, [net_limit, addr_limit])
        })
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 200, ..ProptestConfig::default() })]

    #[test]
    fn memory_network_keys_agree_with_the_model((reqs, limits) in requests()) {
        let mut m = MemoryLimiter::new(rules(limits));
        let got = drive(&reqs, |_, b| m.check(b.rule, b.key, &b.hits, 0));
        prop_assert_eq!(got, model(&reqs, limits));
    }
}

/// Three hosts, one Redis: each request goes through the limiter of the
/// host that served it; Redis, the embedded store and the model agree.
#[test]
fn redis_network_keys_over_three_hosts_agree_with_memory_and_the_model() {
    let redis = Redis::start();
    let rt = runtime();
    let con = connect(
        &rt,
        &redis.config("nets", Duration::from_secs(2)),
        Duration::from_secs(5),
    );
    let case = std::cell::Cell::new(0u32);
    let mut runner = proptest::test_runner::TestRunner::new(ProptestConfig {
        cases: 60,
        ..ProptestConfig::default()
    });
    let banned_networks = std::cell::Cell::new(0usize);
    runner
        .run(&requests(), |(reqs, limits)| {
            case.set(case.get() + 1);
            let keys = Keys::new(&format!("nets{}", case.get()));
            let mut hosts: Vec<RedisLimiter> = (0..HOSTS)
                .map(|h| RedisLimiter::new(con.clone(), keys.clone(), &format!("h{h}"), rules(limits)))
                .collect();
            let got = drive(&reqs, |h, b| {
                let mut out = Vec::new();
                rt.block_on(hosts[h].check(std::slice::from_ref(&b), &mut out))
                    .expect("redis check");
                out[0]
            });
            let want = model(&reqs, limits);
            banned_networks.set(banned_networks.get() + want.iter().filter(|(_, rule, _)| *rule == 0).count());
            prop_assert_eq!(&got, &want);
            let mut m = MemoryLimiter::new(rules(limits));
            prop_assert_eq!(got, drive(&reqs, |_, b| m.check(b.rule, b.key, &b.hits, 0)));
            Ok(())
        })
        .unwrap();
    // The sequences did reach network bans (not only address ones).
    assert!(
        banned_networks.get() > 10,
        "only {} network bans in 60 cases",
        banned_networks.get()
    );
}
