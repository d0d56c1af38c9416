//! Every algorithm in process memory: per rule, its algorithm's mirror of
//! its script (`limit::algorithm`, [`Mirror`]), which keeps the keys of that
//! rule as the script would in Redis, expiry included.
//!
//! In the daemon (the embedded store, and the fallback while Redis is down)
//! the state is bounded ([`MemoryLimiter::bound`], `safety.max_client_state`,
//! docs/design.md §2 "Memory"): past the bound, the windows farthest below
//! their limits are shed first, down to half of it.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

use super::algorithm::{Call, Mirror, Size};
use super::{LimitCounters, RuleLimit, Verdict};
use crate::detect::Hit;

/// The limiter state of every (rule, key) of this process.
pub struct MemoryLimiter {
    rules: Vec<RuleLimit>,
    /// Each rule's state, by rule index.
    mirrors: Vec<Box<dyn Mirror>>,
    last_sweep: i64,
    /// The daemon's memory bound; none in `fleetban test` (a replay keeps
    /// every window: its decisions must not depend on what fits).
    bound: Option<Bound>,
}

/// `safety.max_client_state` and what shedding to it reports.
struct Bound {
    max: usize,
    counters: Arc<LimitCounters>,
    /// One warning a minute at most.
    warned: crate::ratelog::Every,
}

/// The fills below which a key is shed, least useful first: windows far
/// below their limits go before those near them; the last pass takes any.
const SHED_BELOW: [f64; 6] = [0.0625, 0.125, 0.25, 0.5, 1.0, f64::INFINITY];

impl MemoryLimiter {
    pub fn new(rules: Vec<RuleLimit>) -> MemoryLimiter {
        let mirrors = rules.iter().map(|r| r.algorithm_impl().mirror()).collect();
        MemoryLimiter {
            rules,
            mirrors,
            last_sweep: 0,
            bound: None,
        }
    }

    /// Bounds the state to `max` bytes, reporting into `counters`.
    pub fn bound(&mut self, max: usize, counters: Arc<LimitCounters>) {
        self.bound = Some(Bound {
            max,
            counters,
            warned: crate::ratelog::Every::default(),
        });
    }

    /// What the state of every rule costs in memory.
    pub fn size(&self) -> Size {
        self.mirrors.iter().map(|m| m.size()).sum()
    }

    pub fn rules(&self) -> &[RuleLimit] {
        &self.rules
    }

    /// Keeps the state of rules that keep their name and algorithm; drops the others.
    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        let mut old: Vec<Option<(RuleLimit, Box<dyn Mirror>)>> = std::mem::take(&mut self.rules)
            .into_iter()
            .zip(std::mem::take(&mut self.mirrors))
            .map(Some)
            .collect();
        self.mirrors = rules
            .iter()
            .map(|r| {
                old.iter_mut()
                    .find(|o| {
                        o.as_ref().is_some_and(|(old, _)| {
                            old.name == r.name && old.algorithm == r.algorithm && old.distinct == r.distinct
                        })
                    })
                    .and_then(Option::take)
                    .map_or_else(|| r.algorithm_impl().mirror(), |(_, m)| m)
            })
            .collect();
        self.rules = rules;
    }

    /// Forgets every window of `key` (an unbanned address starts afresh).
    pub fn forget(&mut self, key: &IpNet) {
        self.mirrors.iter_mut().for_each(|m| m.forget(key));
    }

    pub fn tracked_keys(&self) -> usize {
        self.mirrors.iter().map(|m| m.tracked_keys()).sum()
    }

    /// Processes one batch in order; `wall_now` is the wall clock in ms (key
    /// expiry, and `now` for `clock: redis`).
    pub fn check(&mut self, rule_index: usize, key: IpNet, hits: &[Hit], wall_now: i64) -> Verdict {
        self.sweep(wall_now);
        let (Some(rule), Some(mirror)) = (self.rules.get(rule_index), self.mirrors.get_mut(rule_index)) else {
            return Verdict::Under { count: 0 };
        };
        if let Some(v) = super::first_match_over(rule, hits) {
            return v;
        }
        let verdict = mirror.check(&Call { rule, key, wall_now }, hits);
        self.keep_within(wall_now);
        verdict
    }

    /// What (rule, key) counts at `now` against the rule's limit, as the
    /// next hit would find it (`fleetban explain`). Reads only.
    pub fn peek(&self, rule_index: usize, key: &IpNet, now: i64) -> u64 {
        match (self.rules.get(rule_index), self.mirrors.get(rule_index)) {
            (Some(rule), Some(mirror)) => mirror.peek(rule, key, now),
            _ => 0,
        }
    }

    /// Drops expired keys, at most once a second.
    fn sweep(&mut self, wall_now: i64) {
        if wall_now - self.last_sweep < 1000 {
            return;
        }
        self.last_sweep = wall_now;
        self.mirrors.iter_mut().for_each(|m| m.sweep(wall_now));
    }

    /// Past the bound, sheds keys, the least full first, until what is left
    /// packs into 3/8 of it, and gives the tables' spare slots back; so the
    /// state is within the bound after every batch, and grows again by at
    /// least a quarter of it before the next shed. Reports the size either
    /// way.
    fn keep_within(&mut self, now: i64) {
        let Some(bound) = &mut self.bound else {
            return;
        };
        let before: Size = self.mirrors.iter().map(|m| m.size()).sum();
        if before.held <= bound.max {
            bound.report(before);
            return;
        }
        // A table shrunk to fit holds less than twice its packed share:
        // shed to 3/8 of the bound, and the tables hold at most 3/4 of it,
        // with a quarter left to grow into before the next shed.
        let target = bound.max / 8 * 3;
        let mut shed = 0;
        'passes: for below in SHED_BELOW {
            for i in 0..self.mirrors.len() {
                let total: Size = self.mirrors.iter().map(|m| m.size()).sum();
                if total.packed <= target {
                    break 'passes;
                }
                let (Some(rule), Some(mirror)) = (self.rules.get(i), self.mirrors.get_mut(i)) else {
                    continue;
                };
                let m = mirror.size();
                let per_key = (m.packed / m.keys.max(1)).max(1);
                let max = (total.packed - target).div_ceil(per_key);
                shed += mirror.shed(rule, below, max, now);
            }
        }
        self.mirrors.iter_mut().for_each(|m| m.shrink());
        let after: Size = self.mirrors.iter().map(|m| m.size()).sum();
        bound.shed(before, after, shed);
    }
}

impl Bound {
    fn report(&self, size: Size) {
        self.counters.state_bytes.store(size.held as u64, Relaxed);
        self.counters.state_keys.store(size.keys as u64, Relaxed);
    }

    /// Counts a shed and warns of it (once a minute at most).
    fn shed(&mut self, before: Size, after: Size, keys: usize) {
        self.report(after);
        self.counters.shed_keys.fetch_add(keys as u64, Relaxed);
        self.counters.sheds.fetch_add(1, Relaxed);
        if let Some(sheds) = self.warned.note(1, Duration::from_secs(60)) {
            tracing::warn!(
                max_client_state = %crate::config::ByteSize(self.max as u64),
                before = %crate::config::ByteSize(before.held as u64),
                after = %crate::config::ByteSize(after.held as u64),
                keys_shed = keys,
                sheds,
                "Client state reached safety.max_client_state: shed the windows farthest below their limits; \
                 those clients count again from zero."
            );
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Algorithm;

    /// A rule of `hits` per 10 minutes (a bucket of `hits` refilled in 10
    /// minutes); `prefilter` hits first counted by the fixed window.
    fn rule(name: &str, algorithm: Algorithm, hits: u32, prefilter: u32) -> RuleLimit {
        match algorithm {
            Algorithm::TokenBucket => RuleLimit::bucket(name, hits, 600_000_000 / i64::from(hits)),
            _ => RuleLimit {
                prefilter,
                ..RuleLimit::new(name, algorithm, hits, 600_000)
            },
        }
    }

    /// The client key of number `i`: a /64 of its own.
    fn client(i: u64) -> IpNet {
        let a = std::net::Ipv6Addr::from((0x2001_0db8_u128 << 96) | (u128::from(i) << 64));
        IpNet::new(a.into(), 64).unwrap()
    }

    fn hits(times: std::ops::Range<i64>, offset: u64) -> Vec<Hit> {
        times.map(|t| Hit::of_line(t, 7, offset + t as u64)).collect()
    }

    /// Rotating clients, one hit each, against every algorithm, and one
    /// attacker among them near its limit: the state never passes the
    /// bound after a batch, the clients are shed, the attacker is not, and
    /// it is banned on time.
    #[test]
    fn rotating_clients_are_shed_within_the_bound_and_the_attacker_is_kept() {
        let max = 4 << 20;
        let rules = vec![
            rule("window", Algorithm::SlidingWindow, 20, 0),
            rule("prefiltered", Algorithm::SlidingWindow, 20, 10),
            rule("fixed", Algorithm::FixedWindow, 20, 0),
            rule("bucket", Algorithm::TokenBucket, 20, 0),
            rule("counter", Algorithm::SlidingCounter, 20, 0),
        ];
        let counters = Arc::new(LimitCounters::default());
        let mut m = MemoryLimiter::new(rules.clone());
        counters.state_max.store(max as u64, Relaxed);
        m.bound(max, counters.clone());
        let attacker = client(u64::MAX >> 1);
        let now = 1_000_000;
        let mut attacker_hits = 0;
        for i in 0..60_000u64 {
            for r in 0..rules.len() {
                m.check(r, client(i), &hits(now..now + 1, i), now);
            }
            assert!(m.size().held <= max, "after client {i}: {:?} > {max}", m.size());
            if i % 4_000 == 0 && attacker_hits < 19 {
                for r in 0..rules.len() {
                    let v = m.check(r, attacker, &hits(now..now + 1, 1 << 40 | attacker_hits), now);
                    assert!(matches!(v, Verdict::Under { .. }), "rule {r}: {v:?}");
                }
                attacker_hits += 1;
            }
        }
        assert!(counters.shed_keys.load(Relaxed) > 100_000, "{:?}", counters.shed_keys);
        assert!(counters.sheds.load(Relaxed) >= 2);
        assert_eq!(counters.state_max.load(Relaxed), max as u64);
        for (r, rule) in rules.iter().enumerate() {
            assert_eq!(m.peek(r, &attacker, now), attacker_hits, "{}", rule.name);
        }
        // Its hits up to the 21st: the 21st is over every limit.
        let rest = 21 - attacker_hits as i64;
        for (r, rule) in rules.iter().enumerate() {
            let v = m.check(r, attacker, &hits(now..now + rest, 1 << 41), now);
            let at = (rest - 1) as usize;
            assert!(
                matches!(v, Verdict::Over { index, .. } if index == at),
                "{}: {v:?}",
                rule.name
            );
        }
    }

    /// Without a bound (`fleetban test`) nothing is shed.
    #[test]
    fn an_unbounded_store_keeps_every_client() {
        let mut m = MemoryLimiter::new(vec![rule("window", Algorithm::SlidingWindow, 20, 0)]);
        for i in 0..20_000u64 {
            m.check(0, client(i), &hits(0..1, i), 1_000);
        }
        assert_eq!(m.tracked_keys(), 20_000);
    }
}
