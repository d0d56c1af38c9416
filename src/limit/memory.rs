//! The sliding window in process memory, mirroring `lua/sliding_window.lua`
//! step for step, including key expiry: a key lives `window + 1000` ms of
//! wall-clock time after its last addition, as PEXPIRE makes it in Redis.

use std::collections::HashMap;

use ipnet::IpNet;

use super::{RuleLimit, Verdict};
use crate::config::Clock;
use crate::detect::Hit;

struct Window {
    /// (score = hit time ms, member), in insertion order.
    members: Vec<(i64, u64)>,
    /// Wall-clock ms at which the key expires (PEXPIRE).
    expires_at: i64,
}

/// Sliding windows of every (rule, key) of this process.
pub struct MemoryLimiter {
    rules: Vec<RuleLimit>,
    windows: HashMap<(usize, IpNet), Window, foldhash::fast::RandomState>,
    last_sweep: i64,
}

impl MemoryLimiter {
    pub fn new(rules: Vec<RuleLimit>) -> MemoryLimiter {
        MemoryLimiter {
            rules,
            windows: HashMap::default(),
            last_sweep: 0,
        }
    }

    /// Keeps the windows of rules that keep their name; drops the others.
    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        let moved: Vec<Option<usize>> = self
            .rules
            .iter()
            .map(|old| rules.iter().position(|r| r.name == old.name))
            .collect();
        let windows = std::mem::take(&mut self.windows);
        self.windows = windows
            .into_iter()
            .filter_map(|((rule, key), w)| Some(((moved.get(rule).copied().flatten()?, key), w)))
            .collect();
        self.rules = rules;
    }

    /// Forgets every window of `key` (an unbanned address starts afresh).
    pub fn forget(&mut self, key: &IpNet) {
        self.windows.retain(|(_, k), _| k != key);
    }

    pub fn tracked_keys(&self) -> usize {
        self.windows.len()
    }

    /// Processes one batch in order; `wall_now` is the wall clock in ms (key
    /// expiry, and `now` for `clock: redis`).
    pub fn check(&mut self, rule_index: usize, key: IpNet, hits: &[Hit], wall_now: i64) -> Verdict {
        self.sweep(wall_now);
        let Some(rule) = self.rules.get(rule_index) else {
            return Verdict::Under { count: 0 };
        };
        let (window_ms, limit, server_clock) = (rule.window_ms, rule.hits as usize, rule.clock == Clock::Redis);
        let w = self.windows.entry((rule_index, key)).or_insert(Window {
            members: Vec::new(),
            expires_at: 0,
        });
        if w.expires_at <= wall_now {
            w.members.clear();
        }
        let mut swept: Option<i64> = None;
        let mut added = false;
        for (i, hit) in hits.iter().enumerate() {
            let now = if server_clock { wall_now } else { hit.time_ms };
            if swept.is_none_or(|s| now > s) {
                let cutoff = now - window_ms;
                w.members.retain(|&(score, _)| score > cutoff);
                swept = Some(now);
            }
            if w.members.iter().any(|&(_, m)| m == hit.member) {
                continue;
            }
            let count = w.members.len();
            if count >= limit {
                if added {
                    w.expires_at = wall_now + window_ms + 1000;
                }
                return Verdict::Over {
                    index: i,
                    count: count as u32,
                };
            }
            w.members.push((now, hit.member));
            added = true;
        }
        if added {
            w.expires_at = wall_now + window_ms + 1000;
        }
        Verdict::Under {
            count: w.members.len() as u32,
        }
    }

    /// Drops expired keys, at most once a second.
    fn sweep(&mut self, wall_now: i64) {
        if wall_now - self.last_sweep < 1000 {
            return;
        }
        self.last_sweep = wall_now;
        self.windows.retain(|_, w| w.expires_at > wall_now);
    }
}
