//! `sliding_window` (`lua/sliding_window.lua`): a ZSET of the hits of the
//! last `window` per client key (score = hit time, member = the hit's
//! folded member, [`crate::limit::zset_member`]), exact. With `prefilter`,
//! two tiers: the first floor(fraction x hits) hits of each fixed window are
//! only counted (`tier`), and the exact window is consulted after them.

use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use ipnet::IpNet;

use super::tier::{self, Counters, Offer};
use super::{At, Call, Keyed, LimitAlgorithm, Mirror};
use crate::config::{Limit, LimitSpec};
use crate::detect::Hit;
use crate::limit::{zset_member, RuleLimit, Verdict};
use crate::store::{Conn, Keys, LuaScript, StateKey};

pub struct SlidingWindow;

/// `PREFIX:win:{TAG}:ADDR:RULE`: the window's ZSET (also `distinct`'s).
pub const KEY: StateKey = StateKey {
    kind: "win",
    per_window: false,
};

pub static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "sliding_window",
        crate::store::with_tier(include_str!("../../../lua/sliding_window.lua")),
    )
});

impl Keys {
    /// `fleetban:win:{TAG}:ADDR:RULE`, with `:HOST` for `scope: host`.
    pub fn window(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.state(KEY, addr, rule, host)
    }
}

impl LimitAlgorithm for SlidingWindow {
    fn limit_of(&self, spec: &LimitSpec, limit: &mut Limit) -> Result<(), String> {
        super::hits_and_window(spec, limit)?;
        if limit.hits == 0 && spec.prefilter.is_some() {
            return Err("`hits: 0` bans on the first match, with no count to screen: remove `prefilter`".into());
        }
        limit.prefilter = spec.prefilter.map(|f| f.0);
        Ok(())
    }

    /// Past `zset-max-listpack-entries` (128 by default) every member of the
    /// ZSET costs about three times as much.
    fn warning(&self, l: &Limit, threshold: u64) -> Option<String> {
        let pre = l.prefilter.map_or(0, |f| RuleLimit::threshold(f, l.hits));
        let members = u64::from(l.hits - pre);
        (members > threshold).then(|| {
            format!(
                "sliding_window holds up to {members} hits per address, more than zset-max-listpack-entries ({threshold}): \
                 each address past it costs ~3x the memory; consider {} or `algorithm: sliding_counter`",
                if l.prefilter.is_some() { "a higher `prefilter`" } else { "`prefilter: 0.8`" }
            )
        })
    }

    fn state_keys(&self) -> &'static [StateKey] {
        &[KEY, tier::KEY]
    }

    fn script(&self) -> &'static LuaScript {
        &SCRIPT
    }

    fn keys(&self, at: &At<'_>, out: &mut Vec<String>) {
        out.push(at.keys.window(at.addr, &at.rule.name, at.host));
        out.push(at.keys.fixed(at.addr, &at.rule.name, at.host));
    }

    fn args(&self, r: &RuleLimit, clock: u8) -> [i64; 4] {
        [r.window_ms, i64::from(r.hits), i64::from(clock), i64::from(r.prefilter)]
    }

    fn hit_args(&self, r: &RuleLimit, h: &Hit, c: &mut ::redis::Cmd) {
        c.arg(zset_member(h.member, r.hits));
        if r.prefilter > 0 {
            c.arg(h.origin).arg(h.offset);
        }
    }

    fn mirror(&self) -> Box<dyn Mirror> {
        Box::<(Keyed<Members>, Counters)>::default()
    }

    fn peek<'a>(&'a self, con: &'a mut Conn, at: &'a At<'a>, now: i64) -> BoxFuture<'a, redis::RedisResult<u64>> {
        Box::pin(async move {
            let members = members(con, at, now).await?;
            let pre = u64::from(at.rule.prefilter);
            Ok(match pre {
                0 => members,
                _ => match tier::count(con, at, now).await? {
                    f if f < pre => f,
                    _ => pre + members,
                },
            })
        })
    }
}

/// The members of the ZSET at `at` within (now - window, now].
pub(super) async fn members(con: &mut Conn, at: &At<'_>, now: i64) -> redis::RedisResult<u64> {
    redis::cmd("ZCOUNT")
        .arg(at.keys.window(at.addr, &at.rule.name, at.host))
        .arg(format!("({}", now - at.rule.window_ms.max(1)))
        .arg(now)
        .query_async(con)
        .await
}

/// A window's ZSET in memory: (score = hit time ms, folded member), in
/// insertion order.
pub(super) type Members = Vec<(i64, i32)>;

/// A window weighs its members against the rule's `hits` (`distinct`'s
/// too: its members are values); with a prefilter, a window that holds any
/// comes after the prefilter's full count.
impl super::Weigh for Members {
    fn heap(&self) -> usize {
        super::vec_bytes::<(i64, i32)>(self.capacity())
    }

    fn fill(&self, rule: &RuleLimit, _now: i64) -> f64 {
        match self.len() as u64 {
            0 => 0.0,
            n => super::fraction(n + u64::from(rule.prefilter), rule.hits),
        }
    }
}

/// The members of a live window within (now - window, now].
pub(super) fn within(members: Option<&Members>, now: i64, window_ms: i64) -> u64 {
    members.map_or(0, |m| m.iter().filter(|(t, _)| *t > now - window_ms && *t <= now).count() as u64)
}

/// One rule's windows and prefilter counters in memory.
impl Mirror for (Keyed<Members>, Counters) {
    /// The script's steps for one group, with its entry looked up once per
    /// batch, not per hit.
    fn check(&mut self, call: &Call<'_>, hits: &[Hit]) -> Verdict {
        let (rule, key, wall_now) = (call.rule, call.key, call.wall_now);
        let (window_ms, limit, pre) = (rule.window_ms, rule.hits as usize, rule.prefilter);
        let (windows, fixed) = self;
        let (expires_at, members) = windows.fresh(key, wall_now);
        let mut swept: Option<i64> = None;
        let mut low: Option<i64> = None;
        let mut added = false;
        let mut over = None;
        for (i, hit) in hits.iter().enumerate() {
            let now = call.now_of(hit);
            // Two tiers: the first `pre` hits of each fixed window are only
            // counted; a line that counter counted before is skipped.
            if pre > 0 {
                let n = now.div_euclid(window_ms);
                if !matches!(fixed.offer(key, n, hit, pre, wall_now, window_ms).0, Offer::Full) {
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
            let member = zset_member(hit.member, rule.hits);
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

    fn peek(&self, rule: &RuleLimit, key: &IpNet, now: i64) -> u64 {
        let w = rule.window_ms.max(1);
        let (windows, fixed) = self;
        let members = within(windows.live(key, now), now, w);
        let pre = u64::from(rule.prefilter);
        match pre {
            0 => members,
            _ => match fixed.count(key, now.div_euclid(w), now) {
                f if f < pre => f,
                _ => pre + members,
            },
        }
    }
}
