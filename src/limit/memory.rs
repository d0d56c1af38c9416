//! Every algorithm in process memory: per rule, its algorithm's mirror of
//! its script (`limit::algorithm`, [`Mirror`]), which keeps the keys of that
//! rule as the script would in Redis, expiry included.

use ipnet::IpNet;

use super::algorithm::{Call, Mirror};
use super::{RuleLimit, Verdict};
use crate::detect::Hit;

/// The limiter state of every (rule, key) of this process.
pub struct MemoryLimiter {
    rules: Vec<RuleLimit>,
    /// Each rule's state, by rule index.
    mirrors: Vec<Box<dyn Mirror>>,
    last_sweep: i64,
}

impl MemoryLimiter {
    pub fn new(rules: Vec<RuleLimit>) -> MemoryLimiter {
        let mirrors = rules.iter().map(|r| r.algorithm_impl().mirror()).collect();
        MemoryLimiter {
            rules,
            mirrors,
            last_sweep: 0,
        }
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
        mirror.check(&Call { rule, key, wall_now }, hits)
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
}
