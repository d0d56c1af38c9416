//! What decides while Redis is down or slower than `redis.timeout`
//! (`redis.on_down`). `local` (default): an in-process [`MemoryLimiter`]
//! whose fleet-wide limits are divided by `fleet_size` (each host takes its
//! share; `scope: host` limits stay whole). `pause`: nothing is decided;
//! the hits wait and Redis is retried with backoff (reading stops at the
//! backpressure bound), bans already known stay enforced.

use super::{MemoryLimiter, RuleLimit};
use crate::config::{OnDown, Scope};

pub(super) struct Fallback {
    pub mode: OnDown,
    /// Decides while down (`local` only), limits divided by `fleet_size`.
    pub local: MemoryLimiter,
    /// Hosts sharing a `scope: fleet` limit (`redis.fleet_size`).
    fleet_size: u32,
}

impl Fallback {
    pub fn new(mode: OnDown, rules: Vec<RuleLimit>, fleet_size: u32) -> Fallback {
        Fallback {
            mode,
            local: MemoryLimiter::new(local_limits(rules, fleet_size)),
            fleet_size,
        }
    }

    /// New rules (SIGHUP): the fallback's windows are kept by rule name.
    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        self.local.set_rules(local_limits(rules, self.fleet_size));
    }
}

/// The fallback limits: a `scope: fleet` limit shared by `fleet_size` hosts
/// becomes ceil(hits / fleet_size) per host (rounded up: the fallback must
/// not ban a client that stays under the fleet's limit on one host by more
/// than rounding).
pub fn local_limits(mut rules: Vec<RuleLimit>, fleet_size: u32) -> Vec<RuleLimit> {
    let n = fleet_size.max(1);
    for r in &mut rules {
        if r.scope == Scope::Fleet && n > 1 {
            let old = r.hits;
            r.hits = r.hits.div_ceil(n).max(1);
            // A token bucket refills n times slower; a prefilter keeps its fraction.
            r.interval_us = r.interval_us.saturating_mul(i64::from(n));
            r.prefilter = (u64::from(r.prefilter) * u64::from(r.hits) / u64::from(old.max(1))) as u32;
        }
    }
    rules
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Clock;

    fn rule(hits: u32, scope: Scope) -> RuleLimit {
        RuleLimit {
            scope,
            clock: Clock::Log,
            ..RuleLimit::new("r", crate::config::Algorithm::SlidingWindow, hits, 1000)
        }
    }

    #[test]
    fn fleet_limits_are_shared_and_host_limits_kept() {
        let l = local_limits(
            vec![rule(10, Scope::Fleet), rule(10, Scope::Host), rule(1, Scope::Fleet)],
            3,
        );
        assert_eq!(l.iter().map(|r| r.hits).collect::<Vec<_>>(), vec![4, 10, 1]);
        let bucket = RuleLimit {
            interval_us: 200_000,
            prefilter: 0,
            ..rule(20, Scope::Fleet)
        };
        let l = local_limits(
            vec![
                bucket,
                RuleLimit {
                    prefilter: 8,
                    ..rule(10, Scope::Fleet)
                },
            ],
            2,
        );
        assert_eq!((l[0].hits, l[0].interval_us), (10, 400_000));
        assert_eq!((l[1].hits, l[1].prefilter), (5, 4));
    }
}
