//! The brute-force model of DESIGN §2, written as plainly as the text: each
//! hit in log order; a client banned at the hit's time is not counted;
//! members at or before now - window leave; a member seen before is not
//! counted twice; a window already holding `limit` members dated at or
//! before the hit bans (members dated after it, the log's clock having
//! gone back, are not counted against it) and those dated more than a
//! window after it leave (another timeline). A token bucket whose
//! theoretical arrival time is more than twice its fill time (burst x
//! interval) ahead of a hit, or a sliding counter whose window is two or
//! more after the hit's, starts afresh: the clock went back. A fixed
//! window (and the prefilter's) counts a line once: not again at or before
//! the last offset it counted from the line's origin. A window of distinct
//! values holds each value once, dated when it was last seen: a value
//! present is never counted again (its date moves to the later hit), a new
//! value finding `limit` values dated at or before it bans, and is not kept.
//! No batching, no expiry, no optimisation: the reference the real
//! implementations are compared with. The other algorithms (README,
//! "Choosing an algorithm") are modelled the same plain way.

use std::collections::HashMap;

use fleetban::config::{Algorithm, Distinct};
use fleetban::limit::RuleLimit;

#[derive(Clone, Debug)]
pub struct ModelHit {
    pub rule: usize,
    pub key: String,
    pub time: i64,
    pub member: u64,
    /// The file (on its host) the line was read from, and its offset there.
    pub origin: u64,
    pub offset: u64,
}

#[derive(Clone, Copy, Debug)]
pub struct ModelRule {
    pub limit: usize,
    pub window: i64,
    pub ban_ms: i64,
    pub algo: Algo,
}

#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Algo {
    /// `prefilter`: hits per fixed window counted before the exact window (0 = off).
    Sliding {
        prefilter: usize,
    },
    Fixed,
    /// `limit` is the burst.
    Bucket {
        interval_us: i64,
    },
    Counter,
    /// `distinct:`: a hit's member is its value.
    Distinct,
}

/// Per (rule, key) state of the algorithms other than the plain window.
#[derive(Default)]
struct Other {
    /// Fixed windows: hits counted per window number.
    fixed: HashMap<i64, usize>,
    /// Fixed windows: per (window number, origin) the offset of the last
    /// line counted.
    marks: HashMap<(i64, u64), u64>,
    /// Token bucket: theoretical arrival time (µs).
    tat: Option<i64>,
    /// Sliding counter: the window number each counted hit was counted in.
    counted: Vec<i64>,
    /// Sliding counter: the latest window number seen.
    cur: Option<i64>,
    /// Bucket and counter: the member of the last hit counted.
    mark: Option<u64>,
}

impl Other {
    /// Fixed window `n` counted this line before: the lines of one origin
    /// come in offset order, so a line at or before the last one counted
    /// from it was counted or judged already.
    fn seen(&self, n: i64, h: &ModelHit) -> bool {
        self.marks.get(&(n, h.origin)).is_some_and(|&m| h.offset <= m)
    }

    fn count(&mut self, n: i64, h: &ModelHit) {
        *self.fixed.entry(n).or_default() += 1;
        self.marks.insert((n, h.origin), h.offset);
    }
}

/// A ban the model decides: which hit (index into the input) crossed the limit.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ModelBan {
    pub hit: usize,
    pub key: String,
    pub rule: usize,
    pub at: i64,
    pub until: i64,
}

pub fn model(hits: &[ModelHit], rules: &[ModelRule]) -> Vec<ModelBan> {
    let mut windows: HashMap<(usize, String), Vec<(i64, u64)>> = HashMap::new();
    let mut others: HashMap<(usize, String), Other> = HashMap::new();
    let mut banned_until: HashMap<String, i64> = HashMap::new();
    let mut out = Vec::new();
    for (i, h) in hits.iter().enumerate() {
        if banned_until.get(&h.key).is_some_and(|&u| h.time < u) {
            continue;
        }
        let r = rules[h.rule];
        let o = others.entry((h.rule, h.key.clone())).or_default();
        let n = h.time.div_euclid(r.window);
        let over = match r.algo {
            Algo::Sliding { prefilter } => {
                if prefilter > 0 {
                    if o.seen(n, h) {
                        continue;
                    }
                    if o.fixed.get(&n).copied().unwrap_or(0) < prefilter {
                        o.count(n, h);
                        continue;
                    }
                }
                let w = windows.entry((h.rule, h.key.clone())).or_default();
                w.retain(|&(score, _)| score > h.time - r.window && score <= h.time + r.window);
                if w.iter().any(|&(_, m)| m == h.member) {
                    continue;
                }
                if w.iter().filter(|&&(score, _)| score <= h.time).count() + prefilter >= r.limit {
                    true
                } else {
                    w.push((h.time, h.member));
                    false
                }
            }
            Algo::Distinct => {
                let w = windows.entry((h.rule, h.key.clone())).or_default();
                w.retain(|&(score, _)| score > h.time - r.window && score <= h.time + r.window);
                if let Some(seen) = w.iter_mut().find(|(_, m)| *m == h.member) {
                    seen.0 = seen.0.max(h.time);
                    continue;
                }
                if w.iter().filter(|&&(score, _)| score <= h.time).count() >= r.limit {
                    true
                } else {
                    w.push((h.time, h.member));
                    false
                }
            }
            Algo::Fixed => {
                if o.seen(n, h) {
                    continue;
                }
                if o.fixed.get(&n).copied().unwrap_or(0) >= r.limit {
                    true
                } else {
                    o.count(n, h);
                    false
                }
            }
            Algo::Bucket { interval_us } => {
                if o.mark == Some(h.member) {
                    continue;
                }
                let now = h.time * 1000;
                let fill = r.limit as i64 * interval_us;
                let t = match o.tat {
                    // More than the fill time behind the bucket: the clock went back.
                    Some(t) if t - now > 2 * fill => now,
                    tat => tat.unwrap_or(now).max(now),
                };
                if t + interval_us - now > r.limit as i64 * interval_us {
                    true
                } else {
                    o.tat = Some(t + interval_us);
                    o.mark = Some(h.member);
                    false
                }
            }
            Algo::Counter => {
                if o.mark == Some(h.member) {
                    continue;
                }
                // Two windows or more behind the counter: the clock went back.
                if o.cur.is_some_and(|c| n < c - 1) {
                    o.counted.clear();
                    o.cur = None;
                }
                let cur = o.cur.unwrap_or(n).max(n);
                o.cur = Some(cur);
                // A hit older than the current window counts as at its start.
                let elapsed = if n == cur { h.time - cur * r.window } else { 0 };
                let c = o.counted.iter().filter(|&&w| w == cur).count() as i64;
                let p = o.counted.iter().filter(|&&w| w == cur - 1).count() as i64;
                // The estimate p x (1 - elapsed / window) + c, compared in exact integers.
                if p * (r.window - elapsed) + c * r.window >= r.limit as i64 * r.window {
                    true
                } else {
                    o.counted.push(cur);
                    o.mark = Some(h.member);
                    false
                }
            }
        };
        if over {
            let until = h.time + r.ban_ms;
            banned_until.insert(h.key.clone(), until);
            out.push(ModelBan {
                hit: i,
                key: h.key.clone(),
                rule: h.rule,
                at: h.time,
                until,
            });
        }
    }
    out
}

/// The limiter rules of `rules`, named `r0`, `r1`, ... (the differential
/// tests run the real limiters under these).
pub fn rule_limits(rules: &[ModelRule]) -> Vec<RuleLimit> {
    rules
        .iter()
        .enumerate()
        .map(|(i, r)| {
            let name = format!("r{i}");
            match r.algo {
                Algo::Sliding { prefilter } => RuleLimit {
                    prefilter: prefilter as u32,
                    ..RuleLimit::new(&name, Algorithm::SlidingWindow, r.limit as u32, r.window)
                },
                Algo::Fixed => RuleLimit::new(&name, Algorithm::FixedWindow, r.limit as u32, r.window),
                Algo::Bucket { interval_us } => RuleLimit::bucket(&name, r.limit as u32, interval_us),
                Algo::Counter => RuleLimit::new(&name, Algorithm::SlidingCounter, r.limit as u32, r.window),
                Algo::Distinct => RuleLimit::distinct(&name, Distinct::Path, r.limit as u32, r.window),
            }
        })
        .collect()
}
