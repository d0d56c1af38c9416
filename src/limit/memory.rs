//! Every algorithm in process memory, mirroring the scripts of `lua/` step
//! for step, including key expiry: a key lives as long as PEXPIRE makes it
//! live in Redis (wall-clock time, set where the script sets it).

use std::collections::HashMap;

use ipnet::IpNet;

use super::{RuleLimit, Verdict};
use crate::config::{Algorithm, Clock};
use crate::detect::Hit;

/// The state of one (rule, key), as the Redis key(s) of its algorithm.
enum State {
    /// `sliding_window.lua`'s ZSET: (score = hit time ms, folded member), in
    /// insertion order; `distinct.lua`'s: (score = latest time seen, value hash).
    Window(Vec<(i64, i32)>),
    /// `token_bucket.lua`'s HASH: t (µs), m.
    Bucket { tat: i64, mark: u64 },
    /// `sliding_counter.lua`'s HASH: n, c, p, m.
    Counter { cur: i64, c: i64, p: i64, mark: u64 },
}

struct Entry {
    state: State,
    /// Wall-clock ms at which the key expires (PEXPIRE).
    expires_at: i64,
}

/// One fixed-window counter (the HASH `fixed:{ADDR}:RULE:N`): its count
/// and, per origin, the offset of the last line it counted.
struct Fixed {
    count: u32,
    marks: Vec<(u64, u64)>,
    expires_at: i64,
}

/// What a fixed-window counter makes of one line (`tier_offer` in the scripts).
enum Offer {
    /// Counted before: at or before the last offset counted from its origin.
    Seen,
    /// The counter already holds its cap: not counted.
    Full,
    Counted,
}

/// The scalars of a [`RuleLimit`] (no name: no allocation per batch).
#[derive(Clone, Copy)]
struct Params {
    algorithm: Algorithm,
    hits: u32,
    window_ms: i64,
    interval_us: i64,
    prefilter: u32,
    distinct: bool,
    clock: Clock,
}

impl Params {
    fn of(r: &RuleLimit) -> Params {
        Params {
            algorithm: r.algorithm,
            hits: r.hits,
            window_ms: r.window_ms,
            interval_us: r.interval_us,
            prefilter: r.prefilter,
            distinct: r.distinct.is_some(),
            clock: r.clock,
        }
    }
}

/// One batch to decide: its rule, the rule's index, the key, and the wall
/// clock (key expiry, and `now` for `clock: redis`).
#[derive(Clone, Copy)]
struct Call {
    rule: Params,
    ri: usize,
    key: IpNet,
    wall_now: i64,
}

impl Call {
    fn parts(&self) -> (Params, usize, IpNet, i64) {
        (self.rule, self.ri, self.key, self.wall_now)
    }

    /// The time a hit is judged at, as the scripts take it.
    fn now_of(&self, h: &Hit) -> i64 {
        if self.rule.clock == Clock::Redis {
            self.wall_now
        } else {
            h.time_ms
        }
    }
}

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;
type FixedMap = Map<(usize, IpNet, i64), Fixed>;

/// The ZSET of `key` (`sliding_window.lua`'s and `distinct.lua`'s), a fresh
/// one when it expired or held another algorithm's state, with its expiry
/// for the caller to move when it adds. None never happens (a window was
/// just made); the callers answer it as an empty window.
fn window_of(
    windows: &mut Map<(usize, IpNet), Entry>,
    key: (usize, IpNet),
    wall_now: i64,
) -> Option<(&mut i64, &mut Vec<(i64, i32)>)> {
    let Entry { state, expires_at } = windows.entry(key).or_insert(Entry {
        state: State::Window(Vec::new()),
        expires_at: 0,
    });
    if *expires_at <= wall_now || !matches!(state, State::Window(_)) {
        *state = State::Window(Vec::new());
    }
    match state {
        State::Window(members) => Some((expires_at, members)),
        _ => None,
    }
}

/// The limiter state of every (rule, key) of this process.
pub struct MemoryLimiter {
    rules: Vec<RuleLimit>,
    windows: Map<(usize, IpNet), Entry>,
    /// Fixed-window counters (fixed_window, and the prefilter's first tier)
    /// by (rule, key, window number).
    fixed: FixedMap,
    last_sweep: i64,
}

impl MemoryLimiter {
    pub fn new(rules: Vec<RuleLimit>) -> MemoryLimiter {
        MemoryLimiter {
            rules,
            windows: HashMap::default(),
            fixed: HashMap::default(),
            last_sweep: 0,
        }
    }

    pub fn rules(&self) -> &[RuleLimit] {
        &self.rules
    }

    /// Keeps the state of rules that keep their name and algorithm; drops the others.
    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        let moved: Vec<Option<usize>> = self
            .rules
            .iter()
            .map(|old| {
                rules
                    .iter()
                    .position(|r| r.name == old.name && r.algorithm == old.algorithm && r.distinct == old.distinct)
            })
            .collect();
        let windows = std::mem::take(&mut self.windows);
        self.windows = windows
            .into_iter()
            .filter_map(|((rule, key), w)| Some(((moved.get(rule).copied().flatten()?, key), w)))
            .collect();
        let fixed = std::mem::take(&mut self.fixed);
        self.fixed = fixed
            .into_iter()
            .filter_map(|((rule, key, n), f)| Some(((moved.get(rule).copied().flatten()?, key, n), f)))
            .collect();
        self.rules = rules;
    }

    /// Forgets every window of `key` (an unbanned address starts afresh).
    pub fn forget(&mut self, key: &IpNet) {
        self.windows.retain(|(_, k), _| k != key);
        self.fixed.retain(|(_, k, _), _| k != key);
    }

    pub fn tracked_keys(&self) -> usize {
        self.windows.len() + self.fixed.len()
    }

    /// Processes one batch in order; `wall_now` is the wall clock in ms (key
    /// expiry, and `now` for `clock: redis`).
    pub fn check(&mut self, rule_index: usize, key: IpNet, hits: &[Hit], wall_now: i64) -> Verdict {
        self.sweep(wall_now);
        let Some(rule) = self.rules.get(rule_index) else {
            return Verdict::Under { count: 0 };
        };
        if let Some(v) = super::first_match_over(rule, hits) {
            return v;
        }
        let call = Call {
            rule: Params::of(rule),
            ri: rule_index,
            key,
            wall_now,
        };
        let rule = call.rule;
        let now_of = |h: &Hit| call.now_of(h);
        match rule.algorithm {
            Algorithm::SlidingWindow if rule.distinct => self.distinct(&call, hits),
            Algorithm::SlidingWindow => self.sliding(&call, hits),
            Algorithm::FixedWindow => {
                let mut count = 0;
                for (i, h) in hits.iter().enumerate() {
                    let n = now_of(h).div_euclid(rule.window_ms);
                    let (offer, c) = Self::offer(
                        &mut self.fixed,
                        (rule_index, key, n),
                        h,
                        rule.hits,
                        wall_now,
                        rule.window_ms,
                    );
                    if let Offer::Full = offer {
                        return Verdict::Over { index: i, count: c };
                    }
                    count = c;
                }
                Verdict::Under { count }
            }
            Algorithm::TokenBucket => self.bucket(&call, hits),
            Algorithm::SlidingCounter => self.counter(&call, hits),
        }
    }

    /// What (rule, key) counts at `now` against the rule's limit, as the
    /// next hit would find it (`fleetban explain`): a sliding window's
    /// members in (now - window, now] (with a prefilter, its first tier's
    /// count until that is full), a fixed window's count, a sliding
    /// counter's estimate, a token bucket's tokens in use. Reads only.
    pub fn peek(&self, rule_index: usize, key: &IpNet, now: i64) -> u64 {
        let Some(rule) = self.rules.get(rule_index) else {
            return 0;
        };
        let w = rule.window_ms.max(1);
        let live = self.windows.get(&(rule_index, *key)).filter(|e| e.expires_at > now);
        let fixed = |n: i64| {
            self.fixed
                .get(&(rule_index, *key, n))
                .filter(|f| f.expires_at > now)
                .map_or(0, |f| u64::from(f.count))
        };
        match (rule.algorithm, live.map(|e| &e.state)) {
            (Algorithm::FixedWindow, _) => fixed(now.div_euclid(w)),
            (Algorithm::SlidingWindow, state) => {
                let members = match state {
                    Some(State::Window(m)) => m.iter().filter(|(t, _)| *t > now - w && *t <= now).count() as u64,
                    _ => 0,
                };
                let pre = u64::from(rule.prefilter);
                match pre {
                    0 => members,
                    _ => match fixed(now.div_euclid(w)) {
                        f if f < pre => f,
                        _ => pre + members,
                    },
                }
            }
            (Algorithm::TokenBucket, Some(&State::Bucket { tat, .. })) => {
                let d = tat - now.saturating_mul(1000);
                let interval = rule.interval_us.max(1);
                if d <= 0 {
                    0
                } else {
                    ((d + interval - 1) / interval) as u64
                }
            }
            (Algorithm::SlidingCounter, Some(&State::Counter { cur, c, p, .. })) => {
                super::peek::estimate(cur, c, p, now, w)
            }
            _ => 0,
        }
    }

    /// The live entry of (rule, key), if any.
    fn entry(&mut self, rule: usize, key: IpNet, wall_now: i64) -> Option<&mut Entry> {
        self.windows.get_mut(&(rule, key)).filter(|e| e.expires_at > wall_now)
    }

    /// Offers the line of `hit` to the fixed-window counter `at` of at most
    /// `cap` hits (`tier_offer` of `lua/fixed_window.lua`); also the count
    /// after it. A counter created here expires `window_ms` + 1 s from now.
    fn offer(
        fixed: &mut FixedMap,
        at: (usize, IpNet, i64),
        hit: &Hit,
        cap: u32,
        wall_now: i64,
        window_ms: i64,
    ) -> (Offer, u32) {
        let f = fixed.entry(at).or_insert(Fixed {
            count: 0,
            marks: Vec::new(),
            expires_at: 0,
        });
        if f.expires_at <= wall_now {
            f.count = 0;
            f.marks.clear();
        }
        let mark = f.marks.iter_mut().find(|(origin, _)| *origin == hit.origin);
        if mark.as_ref().is_some_and(|(_, offset)| hit.offset <= *offset) {
            return (Offer::Seen, f.count);
        }
        if f.count >= cap {
            return (Offer::Full, f.count);
        }
        match mark {
            Some(m) => m.1 = hit.offset,
            None => f.marks.push((hit.origin, hit.offset)),
        }
        f.count += 1;
        if f.count == 1 {
            f.expires_at = wall_now + window_ms + 1000;
        }
        (Offer::Counted, f.count)
    }

    /// The sliding window's steps (`lua/sliding_window.lua`, one group),
    /// with its entry looked up once per batch, not per hit.
    fn sliding(&mut self, call: &Call, hits: &[Hit]) -> Verdict {
        let (rule, ri, key, wall_now) = call.parts();
        let now_of = |h: &Hit| call.now_of(h);
        let (window_ms, limit, pre) = (rule.window_ms, rule.hits as usize, rule.prefilter);
        let fixed = &mut self.fixed;
        let Some((expires_at, members)) = window_of(&mut self.windows, (ri, key), wall_now) else {
            return Verdict::Under { count: 0 };
        };
        let mut swept: Option<i64> = None;
        let mut low: Option<i64> = None;
        let mut added = false;
        let mut over = None;
        for (i, hit) in hits.iter().enumerate() {
            let now = now_of(hit);
            // Two tiers: the first `pre` hits of each fixed window are only
            // counted; a line that counter counted before is skipped.
            if pre > 0 {
                let n = now.div_euclid(window_ms);
                if !matches!(
                    Self::offer(fixed, (ri, key, n), hit, pre, wall_now, window_ms).0,
                    Offer::Full
                ) {
                    continue;
                }
            }
            if swept.is_none_or(|s| now > s) {
                let cutoff = now - window_ms;
                members.retain(|&(score, _)| score > cutoff);
                swept = Some(now);
            }
            if low.is_none_or(|l| now < l) {
                // More than a window after the hit: the clock went back.
                let ahead = now + window_ms;
                members.retain(|&(score, _)| score <= ahead);
                low = Some(now);
            }
            let member = super::zset_member(hit.member, rule.hits);
            if members.iter().any(|&(_, m)| m == member) {
                continue;
            }
            let mut count = members.len() + pre as usize;
            if count >= limit {
                // Members dated after the hit are not counted against it.
                count -= members.iter().filter(|&&(score, _)| score > now).count();
            }
            if count >= limit {
                over = Some(Verdict::Over {
                    index: i,
                    count: count as u32,
                });
                break;
            }
            members.push((now, member));
            added = true;
            // Dated before the last sweep, or more than a window after the
            // earliest hit: a later hit's sweep may have to remove it.
            if swept.is_some_and(|s| now < s) {
                swept = None;
            }
            if low.is_some_and(|l| now > l + window_ms) {
                low = None;
            }
        }
        let count = members.len() as u32;
        if added {
            *expires_at = wall_now + window_ms + 1000;
        }
        over.unwrap_or(Verdict::Under { count })
    }

    /// `lua/distinct.lua`'s steps for one group: a value present is not
    /// counted again (its time raised to the hit's), a value not present is
    /// judged on the members dated at or before the hit and, over the limit,
    /// not added.
    fn distinct(&mut self, call: &Call, hits: &[Hit]) -> Verdict {
        let (rule, ri, key, wall_now) = call.parts();
        let (window_ms, limit) = (rule.window_ms, rule.hits as usize);
        let Some((expires_at, members)) = window_of(&mut self.windows, (ri, key), wall_now) else {
            return Verdict::Under { count: 0 };
        };
        let mut added = false;
        let mut over = None;
        for (i, hit) in hits.iter().enumerate() {
            let now = call.now_of(hit);
            // The script's two sweeps, which its bookkeeping only skips when
            // they would remove nothing.
            members.retain(|&(score, _)| score > now - window_ms && score <= now + window_ms);
            let member = super::zset_member(hit.member, rule.hits);
            if let Some(m) = members.iter_mut().find(|(_, m)| *m == member) {
                if now > m.0 {
                    m.0 = now;
                    added = true;
                }
                continue;
            }
            let within = members.iter().filter(|&&(score, _)| score <= now).count();
            if within >= limit {
                over = Some(Verdict::Over {
                    index: i,
                    count: within as u32,
                });
                break;
            }
            members.push((now, member));
            added = true;
        }
        let count = members.len() as u32;
        if added {
            *expires_at = wall_now + window_ms + 1000;
        }
        over.unwrap_or(Verdict::Under { count })
    }

    /// Where a batch starts: after the hit carrying `mark` (sent already).
    fn start(hits: &[Hit], mark: Option<u64>) -> usize {
        mark.and_then(|m| hits.iter().position(|h| h.member == m))
            .map_or(0, |p| p + 1)
    }

    fn bucket(&mut self, call: &Call, hits: &[Hit]) -> Verdict {
        let (rule, ri, key, wall_now) = call.parts();
        let now_of = |h: &Hit| call.now_of(h);
        let interval = rule.interval_us.max(1);
        let burst = i64::from(rule.hits);
        let (mut tat, mut mark) = match self.entry(ri, key, wall_now).map(|e| &e.state) {
            Some(&State::Bucket { tat, mark }) => (Some(tat), Some(mark)),
            _ => (None, None),
        };
        let in_use = |t: i64, now: i64| (t - now).div_euclid(interval) + i64::from((t - now).rem_euclid(interval) > 0);
        let mut result = None;
        let mut last_now = None;
        for (i, h) in hits.iter().enumerate().skip(Self::start(hits, mark)) {
            if Some(h.member) == mark {
                continue;
            }
            let now = now_of(h) * 1000;
            // More than twice the fill time ahead: the clock went back.
            let t = tat
                .filter(|&t| t - now <= 2 * burst * interval)
                .map_or(now, |t| t.max(now));
            if t + interval - now > burst * interval {
                result = Some(Verdict::Over {
                    index: i,
                    count: clamp(in_use(t, now)),
                });
                break;
            }
            tat = Some(t + interval);
            mark = Some(h.member);
            last_now = Some(now);
        }
        if let (Some(_), Some(t), Some(m)) = (last_now, tat, mark) {
            self.windows.insert(
                (ri, key),
                Entry {
                    state: State::Bucket { tat: t, mark: m },
                    expires_at: wall_now + rule.window_ms + 1000,
                },
            );
        }
        result.unwrap_or_else(|| Verdict::Under {
            count: match (last_now, tat) {
                (Some(now), Some(t)) => clamp(in_use(t, now)),
                _ => 0,
            },
        })
    }

    fn counter(&mut self, call: &Call, hits: &[Hit]) -> Verdict {
        let (rule, ri, key, wall_now) = call.parts();
        let now_of = |h: &Hit| call.now_of(h);
        let window = rule.window_ms;
        let limit = i64::from(rule.hits);
        let (mut cur, mut c, mut p, mut mark) = match self.entry(ri, key, wall_now).map(|e| &e.state) {
            Some(&State::Counter { cur, c, p, mark }) => (Some(cur), c, p, Some(mark)),
            _ => (None, 0, 0, None),
        };
        let mut changed = false;
        let mut result = None;
        for (i, h) in hits.iter().enumerate().skip(Self::start(hits, mark)) {
            if Some(h.member) == mark {
                continue;
            }
            let now = now_of(h);
            let n = now.div_euclid(window);
            let k = match cur.filter(|&k| n >= k - 1) {
                // None, or two windows or more after the hit: the clock went back.
                None => {
                    (c, p) = (0, 0);
                    n
                }
                Some(k) if n > k => {
                    p = if n == k + 1 { c } else { 0 };
                    c = 0;
                    n
                }
                Some(k) => k,
            };
            cur = Some(k);
            let elapsed = if n == k { now - k * window } else { 0 };
            let est = p * (window - elapsed) + c * window;
            if est >= limit * window {
                result = Some(Verdict::Over {
                    index: i,
                    count: clamp(est.div_euclid(window)),
                });
                break;
            }
            c += 1;
            mark = Some(h.member);
            changed = true;
        }
        if let (true, Some(cur), Some(mark)) = (changed, cur, mark) {
            self.windows.insert(
                (ri, key),
                Entry {
                    state: State::Counter { cur, c, p, mark },
                    expires_at: wall_now + 2 * window + 1000,
                },
            );
        }
        result.unwrap_or(Verdict::Under { count: clamp(c) })
    }

    /// Drops expired keys, at most once a second.
    fn sweep(&mut self, wall_now: i64) {
        if wall_now - self.last_sweep < 1000 {
            return;
        }
        self.last_sweep = wall_now;
        self.windows.retain(|_, w| w.expires_at > wall_now);
        self.fixed.retain(|_, f| f.expires_at > wall_now);
    }
}

fn clamp(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}
