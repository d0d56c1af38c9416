//! The limiter: given hits per (rule, client key), decides which hit, if
//! any, goes over the rule's limit. Two implementations with one semantics
//! (docs/design.md §2): the Redis scripts of `lua/` for a fleet
//! ([`RedisLimiter`]), and [`MemoryLimiter`] for a single host, for
//! `fleetban test` and as the fallback while Redis is down. The
//! differential tests hold them to the same decisions hit by hit.
//!
//! Each algorithm is one module of `algorithm/` (its config, script, keys,
//! memory mirror and `explain` reading); the backends hold its
//! `LimitAlgorithm` and never ask which one it is.
//!
//! [`Limiter`] (`limiter.rs`) is what the daemon holds: the pending hits and
//! when they go (`pending.rs`), the backend, and what happens while Redis
//! does not answer (`fallback.rs`).

pub mod algorithm;
mod fallback;
mod limiter;
mod memory;
pub mod peek;
mod pending;
mod redis;

pub use self::limiter::{FleetNews, Flight, HotKey, Landed, LimitCounters, Limiter};
pub use self::memory::MemoryLimiter;
pub use self::pending::{Batch, HoldPolicy, Pending};
pub use self::redis::{RedisLimiter, MAX_CALLS_PER_TRIP, MAX_GROUPS_PER_CALL, MAX_HITS_PER_TRIP};

use crate::config::{Algorithm, Clock, Distinct, Rule, Scope};

/// Redis's default `zset-max-listpack-entries`: a ZSET with more members
/// leaves the compact encoding.
pub const LISTPACK_DEFAULT: u64 = 128;

/// The warning for a limit whose state per address can outgrow Redis's
/// compact listpack encoding (`zset-max-listpack-entries`, 128 by default):
/// past it every member costs about three times as much.
pub fn listpack_warning(l: &crate::config::Limit, threshold: u64) -> Option<String> {
    algorithm::of(l.algorithm, l.distinct).warning(l, threshold)
}

/// The member a hit gets in a sliding window's ZSET: its 63-bit member folded
/// to 24 bits when the window fits Redis's listpack (`hits` <= 128), to 32
/// bits otherwise (signed values, as Redis parses them). In a listpack a
/// 24-bit integer takes 5 bytes against 10 for 63 bits, which brings a window
/// of 100 hits from ~2.4 KB to ~1.9 KB per address (README, "Choosing an
/// algorithm"); past the listpack, members are strings and the shorter the
/// better too. The price: two hits of one address within one window share a
/// folded member with probability ~k^2 / 2^(bits+1) for k hits (3e-4 for 100
/// hits in 24 bits, 1e-4 for 1,000 in 32), and the second is then taken for a
/// re-read line and not counted. Below 2^23 the fold is the identity.
pub fn zset_member(member: u64, hits: u32) -> i32 {
    let folded = (member ^ (member >> 32)) as u32 as i32;
    if u64::from(hits) <= LISTPACK_DEFAULT {
        (folded << 8) >> 8
    } else {
        folded
    }
}

/// What the limiter needs to know of one rule.
#[derive(Clone, Debug, PartialEq)]
pub struct RuleLimit {
    pub name: String,
    pub algorithm: Algorithm,
    /// The limit; for `token_bucket` the burst.
    pub hits: u32,
    /// The window; for `token_bucket` the time to refill an empty bucket.
    pub window_ms: i64,
    /// `token_bucket`: microseconds per token.
    pub interval_us: i64,
    /// `sliding_window` with `prefilter`: hits per fixed window counted
    /// before the exact window is consulted (floor(fraction x hits)); 0 = off.
    pub prefilter: u32,
    /// `distinct:`: a sliding window of values (`lua/distinct.lua`), whose
    /// hits carry the value's hash as their member ([`crate::detect::value_member`]).
    pub distinct: Option<Distinct>,
    pub scope: Scope,
    pub clock: Clock,
}

impl RuleLimit {
    /// A plain rule of `algorithm` (tests and benchmarks).
    pub fn new(name: &str, algorithm: Algorithm, hits: u32, window_ms: i64) -> RuleLimit {
        RuleLimit {
            name: name.to_owned(),
            algorithm,
            hits,
            window_ms,
            interval_us: 0,
            prefilter: 0,
            distinct: None,
            scope: Scope::Fleet,
            clock: Clock::Log,
        }
    }

    /// A token bucket of `burst` tokens, one every `interval_us`.
    pub fn bucket(name: &str, burst: u32, interval_us: i64) -> RuleLimit {
        RuleLimit {
            interval_us,
            ..RuleLimit::new(
                name,
                Algorithm::TokenBucket,
                burst,
                (i64::from(burst) * interval_us + 999) / 1000,
            )
        }
    }

    /// A window of at most `hits` distinct values of `field`.
    pub fn distinct(name: &str, field: Distinct, hits: u32, window_ms: i64) -> RuleLimit {
        RuleLimit {
            distinct: Some(field),
            ..RuleLimit::new(name, Algorithm::SlidingWindow, hits, window_ms)
        }
    }

    /// Its algorithm: the script, keys and memory mirror to use.
    pub fn algorithm_impl(&self) -> &'static dyn algorithm::LimitAlgorithm {
        algorithm::of(self.algorithm, self.distinct)
    }

    /// The prefilter threshold of `fraction` of `hits`.
    pub fn threshold(fraction: f64, hits: u32) -> u32 {
        (fraction * f64::from(hits) + 1e-9).floor() as u32
    }
}

impl RuleLimit {
    pub fn of(rules: &[Rule]) -> Vec<RuleLimit> {
        rules
            .iter()
            .map(|r| RuleLimit {
                name: r.name.clone(),
                algorithm: r.limit.algorithm,
                hits: r.limit.hits,
                window_ms: r.limit.window_ms,
                interval_us: r.limit.interval_us,
                prefilter: r.limit.prefilter.map_or(0, |f| RuleLimit::threshold(f, r.limit.hits)),
                distinct: r.limit.distinct,
                scope: r.limit.scope,
                clock: r.limit.clock,
            })
            .collect()
    }
}

/// `hits: 0` (or a bucket of `burst: 0`) bans on the first matching
/// request, fail2ban's `maxretry = 1`: its first hit is over with nothing
/// counted, decided here with no window to read, in Redis or in memory.
pub(crate) fn first_match_over(rule: &RuleLimit, hits: &[crate::detect::Hit]) -> Option<Verdict> {
    (rule.hits == 0 && !hits.is_empty()).then_some(Verdict::Over { index: 0, count: 0 })
}

/// The decision for one batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Verdict {
    /// Every hit fitted; `count` is the window's size afterwards (per
    /// algorithm: ZSET members, the last counter, tokens in use, or the
    /// current fixed window's count; see the scripts).
    Under { count: u32 },
    /// `hits[index]` found `count` hits already counted (count >= limit; for
    /// the bucket tokens in use, for the counter the estimate): it crosses
    /// the limit, and the hits after it in the batch were not counted.
    Over { index: usize, count: u32 },
}

#[derive(Debug, thiserror::Error)]
pub enum LimitError {
    #[error("redis: {0}")]
    Redis(#[from] ::redis::RedisError),
    #[error("unexpected reply from the window script: {0}")]
    Reply(String),
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_distinct_window_past_the_listpack_is_warned_about_without_the_prefilter_remedy() {
        let limit = |hits| crate::config::Limit {
            algorithm: Algorithm::SlidingWindow,
            hits,
            window_ms: 60_000,
            interval_us: 0,
            prefilter: None,
            distinct: Some(Distinct::Path),
            scope: Scope::Fleet,
            clock: Clock::Log,
            keying: crate::addr::Keying::Address,
        };
        assert_eq!(listpack_warning(&limit(128), LISTPACK_DEFAULT), None);
        let w = listpack_warning(&limit(500), LISTPACK_DEFAULT).expect("a warning past 128");
        assert!(w.contains("distinct path holds up to 500 values"), "{w}");
        assert!(!w.contains("prefilter"), "{w}");
    }

    #[test]
    fn zset_members_fold_to_24_or_32_bits() {
        assert_eq!(zset_member(12_345, 100), 12_345);
        assert_eq!(zset_member(12_345, 1000), 12_345);
        let m = crate::detect::member(7, 4242);
        let small = zset_member(m, 128);
        assert!((-(1 << 23)..(1 << 23)).contains(&small), "{small}");
        assert_eq!(small, zset_member(m, 1));
        let wide = zset_member(m, 129);
        assert_eq!((wide << 8) >> 8, small);
        assert_ne!(zset_member(m, 100), zset_member(crate::detect::member(7, 4243), 100));
    }
}
