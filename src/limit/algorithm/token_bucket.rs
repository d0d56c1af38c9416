//! `token_bucket` (`lua/token_bucket.lua`, GCRA): `burst` tokens, one back
//! every `interval_us`; per client key one HASH, t = the theoretical arrival
//! time in µs (when the bucket is full again), m = the member of the last
//! hit counted.

use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use ipnet::IpNet;

use super::{At, Call, Keyed, LimitAlgorithm, Mirror};
use crate::config::{Limit, LimitSpec};
use crate::detect::Hit;
use crate::limit::{RuleLimit, Verdict};
use crate::store::{Conn, Keys, LuaScript, StateKey};

pub struct TokenBucket;

/// `PREFIX:tb:{TAG}:ADDR:RULE`: the bucket's HASH.
pub const KEY: StateKey = StateKey {
    kind: "tb",
    per_window: false,
};

pub static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("token_bucket", include_str!("../../../lua/token_bucket.lua").to_owned()));

impl Keys {
    /// `fleetban:tb:{TAG}:ADDR:RULE`: token bucket state (HASH).
    pub fn bucket(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.state(KEY, addr, rule, host)
    }
}

impl LimitAlgorithm for TokenBucket {
    fn limit_of(&self, l: &LimitSpec, limit: &mut Limit) -> Result<(), String> {
        super::no_prefilter(l)?;
        if l.hits.is_some() || l.window.is_some() {
            return Err("`token_bucket` takes `burst` and `rate`, not `hits` and `window`: e.g. `{ algorithm: token_bucket, burst: 20, rate: 5/s }`".into());
        }
        let (Some(burst), Some(rate)) = (l.burst, l.rate) else {
            return Err(
                "`token_bucket` needs `burst` and `rate`: e.g. `{ algorithm: token_bucket, burst: 20, rate: 5/s }`"
                    .into(),
            );
        };
        if burst.0 == 0 {
            // Its window is the time the bucket takes to fill: none, and a
            // hit older than its window at arrival is stale in `run`.
            return Err(
                "`token_bucket` needs `burst` of at least 1: an empty bucket has no time span to \
                        judge a hit in; to ban on the first match write `{ hits: 0, window: 60s }`"
                    .into(),
            );
        }
        let interval_us = (1e6 / rate.0).round();
        if !(1.0..=86_400e6).contains(&interval_us) {
            return Err("`rate` must be between 1/d and 1000000/s".into());
        }
        // Times are µs in Lua doubles (exact up to 2^53); a full bucket spans
        // burst x interval.
        if f64::from(burst.0) * interval_us >= (1u64 << 50) as f64 {
            return Err("`token_bucket` needs burst / rate below ~35 years: lower `burst` or raise `rate`".into());
        }
        limit.hits = burst.0;
        limit.interval_us = interval_us as i64;
        limit.window_ms = ((i64::from(burst.0) * limit.interval_us + 999) / 1000).max(1);
        Ok(())
    }

    fn describe(&self, l: &Limit, span: fn(i64) -> String) -> String {
        format!(
            "burst {}, one token every {} ({})",
            l.hits,
            match l.interval_us % 1000 {
                0 => span(l.interval_us / 1000),
                _ => format!("{}µs", l.interval_us),
            },
            l.algorithm.name()
        )
    }

    fn state_keys(&self) -> &'static [StateKey] {
        &[KEY]
    }

    fn script(&self) -> &'static LuaScript {
        &SCRIPT
    }


    fn args(&self, r: &RuleLimit, clock: u8) -> [i64; 4] {
        [r.interval_us, i64::from(r.hits), i64::from(clock), r.window_ms + 1000]
    }


    fn mirror(&self) -> Box<dyn Mirror> {
        Box::<Keyed<State>>::default()
    }

    fn peek<'a>(&'a self, con: &'a mut Conn, at: &'a At<'a>, now: i64) -> BoxFuture<'a, redis::RedisResult<u64>> {
        Box::pin(async move {
            let t: Option<String> = redis::cmd("HGET")
                .arg(at.keys.bucket(at.addr, &at.rule.name, at.host))
                .arg("t")
                .query_async(con)
                .await?;
            let tat = t.and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0) as i64;
            Ok(in_use(at.rule, tat, now))
        })
    }
}

/// The tokens in use at `now` (ms) of a bucket whose arrival time is `tat` (µs).
fn in_use(rule: &RuleLimit, tat: i64, now: i64) -> u64 {
    let d = tat - now.saturating_mul(1000);
    let interval = rule.interval_us.max(1);
    if d <= 0 {
        0
    } else {
        ((d + interval - 1) / interval) as u64
    }
}

/// The bucket's HASH: t (µs), m.
struct State {
    tat: i64,
    mark: u64,
}

impl super::Weigh for State {
    fn fill(&self, rule: &RuleLimit, now: i64) -> f64 {
        super::fraction(in_use(rule, self.tat, now), rule.hits)
    }
}

/// One rule's buckets in memory.
impl Mirror for Keyed<State> {
    fn check(&mut self, call: &Call<'_>, hits: &[Hit]) -> Verdict {
        let (rule, key, wall_now) = (call.rule, call.key, call.wall_now);
        let interval = rule.interval_us.max(1);
        let burst = i64::from(rule.hits);
        let (mut tat, mut mark) = match self.live(&key, wall_now) {
            Some(s) => (Some(s.tat), Some(s.mark)),
            None => (None, None),
        };
        let in_use = |t: i64, now: i64| (t - now).div_euclid(interval) + i64::from((t - now).rem_euclid(interval) > 0);
        let mut result = None;
        let mut last_now = None;
        for (i, h) in hits.iter().enumerate().skip(super::start(hits, mark)) {
            if Some(h.member) == mark {
                continue;
            }
            let now = call.now_of(h) * 1000;
            // More than twice the fill time ahead: the clock went back.
            let t = tat
                .filter(|&t| t - now <= 2 * burst * interval)
                .map_or(now, |t| t.max(now));
            if t + interval - now > burst * interval {
                result = Some(Verdict::Over {
                    index: i,
                    count: super::clamp(in_use(t, now)),
                });
                break;
            }
            tat = Some(t + interval);
            mark = Some(h.member);
            last_now = Some(now);
        }
        if let (Some(_), Some(tat), Some(mark)) = (last_now, tat, mark) {
            self.insert(key, State { tat, mark }, wall_now + rule.window_ms + 1000);
        }
        result.unwrap_or_else(|| Verdict::Under {
            count: match (last_now, tat) {
                (Some(now), Some(t)) => super::clamp(in_use(t, now)),
                _ => 0,
            },
        })
    }

    fn peek(&self, rule: &RuleLimit, key: &IpNet, now: i64) -> u64 {
        self.live(key, now).map_or(0, |s| in_use(rule, s.tat, now))
    }
}
