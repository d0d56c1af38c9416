//! The host's view of the ban list (`BanCache`) with long lists: 100,000
//! and 1,000,000 bans shaped as `bench/scale.rs` loads them (3/4 random
//! IPv4 addresses, 1/4 IPv6 /64s). `lookup`: one client's ban asked, as the
//! pipeline and `/check` ask it for every line and request (a probe in four
//! banned, the rest not); `build`: the whole view built at start;
//! `ban_unban`: the oldest ban lifted and a new one added. `cargo bench --bench view`.

use std::hint::black_box;
use std::net::{Ipv4Addr, Ipv6Addr};
use std::time::Duration;

use criterion::{criterion_group, criterion_main, BatchSize, Criterion, Throughput};
use fleetban::bans::BanCache;
use fleetban::enforce::Until;
use ipnet::IpNet;

const NOW: i64 = 1_767_225_600_000;
const PROBES: usize = 4096;

/// A fixed pseudo-random sequence (xorshift), the same in every build.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 << 13;
        self.0 ^= self.0 >> 7;
        self.0 ^= self.0 << 17;
        self.0
    }

    /// A client key: an IPv4 address three times in four, else an IPv6 /64.
    fn client(&mut self) -> IpNet {
        let r = self.next();
        match r % 4 {
            0 => IpNet::new(Ipv6Addr::from(u128::from(r) << 64).into(), 64).unwrap(),
            _ => IpNet::from(std::net::IpAddr::from(Ipv4Addr::from((r >> 32) as u32))),
        }
    }
}

fn bans(n: usize) -> Vec<(IpNet, Until)> {
    let mut rng = Rng(0x9e37_79b9_7f4a_7c15);
    (0..n)
        .map(|i| (rng.client(), Until::At(NOW + 3_600_000 + i as i64)))
        .collect()
}

fn bench(c: &mut Criterion) {
    let mut g = c.benchmark_group("view");
    g.sample_size(20).measurement_time(Duration::from_secs(5));
    for (name, n) in [("100k", 100_000), ("1M", 1_000_000)] {
        let list = bans(n);
        let view = BanCache::built(list.iter().copied());
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let probes: Vec<IpNet> = (0..PROBES)
            .map(|i| match i % 4 {
                0 => list[rng.next() as usize % n].0,
                _ => rng.client(),
            })
            .collect();
        let banned = probes.iter().filter(|p| view.is_banned(p, NOW)).count();
        assert!(banned >= PROBES / 4, "every listed probe is banned ({banned})");
        g.throughput(Throughput::Elements(PROBES as u64));
        g.bench_function(format!("lookup_{name}"), |b| {
            b.iter(|| probes.iter().filter(|p| view.is_banned(black_box(p), NOW)).count())
        });
        g.throughput(Throughput::Elements(1));
        // The oldest ban lifted, a new one added: the view's tables go
        // through their rebuilds as a list that turns over does.
        let mut view = view;
        let mut queue: std::collections::VecDeque<IpNet> = list.iter().map(|b| b.0).collect();
        let mut extra = Rng(0x51_7cc1_b727_220a);
        g.bench_function(format!("ban_unban_{name}"), |b| {
            b.iter(|| {
                let old = queue.pop_front().unwrap();
                view.remove(black_box(&old));
                let net = extra.client();
                view.insert(net, Until::At(NOW + 60_000));
                queue.push_back(net);
            })
        });
        g.throughput(Throughput::Elements(n as u64));
        g.bench_function(format!("build_{name}"), |b| {
            b.iter_batched(|| list.clone(), BanCache::built, BatchSize::LargeInput)
        });
    }
    g.finish();
}

criterion_group!(benches, bench);
criterion_main!(benches);
