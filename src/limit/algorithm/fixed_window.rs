//! `fixed_window` (`lua/fixed_window.lua`): a counter per fixed window
//! N = floor(now / window) and client key (`tier`), each line counted once;
//! a hit is over when its window already counted `hits`.

use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use ipnet::IpNet;

use super::tier::{self, Counters, Offer};
use super::{At, Call, LimitAlgorithm, Mirror};
use crate::config::{Limit, LimitSpec};
use crate::detect::Hit;
use crate::limit::{RuleLimit, Verdict};
use crate::store::{Conn, LuaScript, StateKey};

pub struct FixedWindow;

pub static SCRIPT: LazyLock<LuaScript> = LazyLock::new(|| {
    LuaScript::new(
        "fixed_window",
        crate::store::with_tier(include_str!("../../../lua/fixed_window.lua")),
    )
});

impl LimitAlgorithm for FixedWindow {
    fn limit_of(&self, spec: &LimitSpec, limit: &mut Limit) -> Result<(), String> {
        super::no_prefilter(spec)?;
        super::hits_and_window(spec, limit)
    }

    fn state_keys(&self) -> &'static [StateKey] {
        &[tier::KEY]
    }

    fn script(&self) -> &'static LuaScript {
        &SCRIPT
    }


    fn args(&self, r: &RuleLimit, clock: u8) -> [i64; 4] {
        [r.window_ms, i64::from(r.hits), i64::from(clock), 0]
    }

    fn hit_args(&self, _: &RuleLimit, h: &Hit, c: &mut ::redis::Cmd) {
        c.arg(h.origin).arg(h.offset);
    }

    fn mirror(&self) -> Box<dyn Mirror> {
        Box::<Counters>::default()
    }

    fn peek<'a>(&'a self, con: &'a mut Conn, at: &'a At<'a>, now: i64) -> BoxFuture<'a, redis::RedisResult<u64>> {
        Box::pin(tier::count(con, at, now))
    }
}

/// One rule's counters in memory.
impl Mirror for Counters {
    fn check(&mut self, call: &Call<'_>, hits: &[Hit]) -> Verdict {
        let rule = call.rule;
        let mut count = 0;
        for (i, h) in hits.iter().enumerate() {
            let n = call.now_of(h).div_euclid(rule.window_ms);
            let (offer, c) = self.offer(call.key, n, h, rule.hits, call.wall_now, rule.window_ms);
            if let Offer::Full = offer {
                return Verdict::Over { index: i, count: c };
            }
            count = c;
        }
        Verdict::Under { count }
    }

    fn peek(&self, rule: &RuleLimit, key: &IpNet, now: i64) -> u64 {
        self.count(key, now.div_euclid(rule.window_ms.max(1)), now)
    }
}
