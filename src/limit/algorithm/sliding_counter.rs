//! `sliding_counter` (`lua/sliding_counter.lua`): two fixed windows weighed
//! by their overlap with the last `window`, O(1) state whatever the limit;
//! per client key one HASH, n = the current window number, c = its count,
//! p = the previous window's, m = the member of the last hit counted.

use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use ipnet::IpNet;

use super::{At, Call, Keyed, LimitAlgorithm, Mirror};
use crate::config::{Limit, LimitSpec};
use crate::detect::Hit;
use crate::limit::{RuleLimit, Verdict};
use crate::store::{Conn, Keys, LuaScript, StateKey};

pub struct SlidingCounter;

/// `PREFIX:sc:{TAG}:ADDR:RULE`: the counter's HASH.
pub const KEY: StateKey = StateKey {
    kind: "sc",
    per_window: false,
};

pub static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "sliding_counter",
        include_str!("../../../lua/sliding_counter.lua").to_owned(),
    )
});

impl Keys {
    /// `fleetban:sc:{TAG}:ADDR:RULE`: sliding counter state (HASH).
    pub fn counter(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.state(KEY, addr, rule, host)
    }
}

impl LimitAlgorithm for SlidingCounter {
    fn limit_of(&self, spec: &LimitSpec, limit: &mut Limit) -> Result<(), String> {
        super::no_prefilter(spec)?;
        super::hits_and_window(spec, limit)?;
        // The sliding counter weighs counts by time in exact integers; Lua's
        // numbers are doubles, exact up to 2^53, and the estimate reaches 2 x hits x window.
        if (i128::from(limit.hits) * i128::from(limit.window_ms)) >= 1 << 52 {
            return Err("`sliding_counter` needs hits x window (in ms) below 2^52: lower `hits` or `window`".into());
        }
        Ok(())
    }

    fn state_keys(&self) -> &'static [StateKey] {
        &[KEY]
    }

    fn script(&self) -> &'static LuaScript {
        &SCRIPT
    }


    fn args(&self, r: &RuleLimit, clock: u8) -> [i64; 4] {
        [r.window_ms, i64::from(r.hits), i64::from(clock), 0]
    }


    fn mirror(&self) -> Box<dyn Mirror> {
        Box::<Keyed<State>>::default()
    }

    fn peek<'a>(&'a self, con: &'a mut Conn, at: &'a At<'a>, now: i64) -> BoxFuture<'a, redis::RedisResult<u64>> {
        Box::pin(async move {
            let v: Vec<Option<String>> = redis::cmd("HMGET")
                .arg(at.keys.counter(at.addr, &at.rule.name, at.host))
                .arg("n")
                .arg("c")
                .arg("p")
                .query_async(con)
                .await?;
            let num = |i: usize| super::number(v.get(i));
            Ok(match num(0) {
                Some(cur) => estimate(cur, num(1).unwrap_or(0), num(2).unwrap_or(0), now, at.rule.window_ms),
                None => 0,
            })
        })
    }
}

/// A sliding counter's estimate at `now` from its window number `cur`, its
/// count `c` and the previous window's `p` (`lua/sliding_counter.lua`).
pub fn estimate(cur: i64, c: i64, p: i64, now: i64, window_ms: i64) -> u64 {
    let w = window_ms.max(1);
    let n = now.div_euclid(w);
    let (c, p) = match n - cur {
        0 => (c, p),
        1 => (0, c),
        _ => (0, 0),
    };
    ((p * (w - (now - n * w)) + c * w) / w).max(0) as u64
}

/// The counter's HASH: n, c, p, m.
struct State {
    cur: i64,
    c: i64,
    p: i64,
    mark: u64,
}

impl super::Weigh for State {
    fn fill(&self, rule: &RuleLimit, now: i64) -> f64 {
        super::fraction(estimate(self.cur, self.c, self.p, now, rule.window_ms), rule.hits)
    }
}

/// One rule's counters in memory.
impl Mirror for Keyed<State> {
    fn check(&mut self, call: &Call<'_>, hits: &[Hit]) -> Verdict {
        let (rule, key, wall_now) = (call.rule, call.key, call.wall_now);
        let window = rule.window_ms;
        let limit = i64::from(rule.hits);
        let (mut cur, mut c, mut p, mut mark) = match self.live(&key, wall_now) {
            Some(s) => (Some(s.cur), s.c, s.p, Some(s.mark)),
            None => (None, 0, 0, None),
        };
        let mut changed = false;
        let mut result = None;
        for (i, h) in hits.iter().enumerate().skip(super::start(hits, mark)) {
            if Some(h.member) == mark {
                continue;
            }
            let now = call.now_of(h);
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
                    count: super::clamp(est.div_euclid(window)),
                });
                break;
            }
            c += 1;
            mark = Some(h.member);
            changed = true;
        }
        if let (true, Some(cur), Some(mark)) = (changed, cur, mark) {
            self.insert(key, State { cur, c, p, mark }, wall_now + 2 * window + 1000);
        }
        result.unwrap_or(Verdict::Under { count: super::clamp(c) })
    }

    fn peek(&self, rule: &RuleLimit, key: &IpNet, now: i64) -> u64 {
        self
            .live(key, now)
            .map_or(0, |s| estimate(s.cur, s.c, s.p, now, rule.window_ms))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_counter_weighs_the_previous_window_by_its_overlap() {
        // Window 0..1000 held 10, window 1000..2000 holds 4; at 1250 the
        // previous one overlaps 750 ms: 10 x 0.75 + 4.
        assert_eq!(estimate(1, 4, 10, 1250, 1000), 11);
        // A window later, the 4 are the previous window's.
        assert_eq!(estimate(1, 4, 10, 2500, 1000), 2);
        assert_eq!(estimate(1, 4, 10, 3500, 1000), 0);
    }
}
