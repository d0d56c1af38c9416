//! `distinct: FIELD` (`lua/distinct.lua`): a sliding window of the values a
//! client sent (`path`, `user_agent`, ...), each hit's member the value's
//! hash ([`crate::detect::value_member`]), kept in the sliding window's
//! ZSET (`sliding_window::KEY`, score = the latest time the value was seen).
//! A value present is not counted again; one not present is judged on the
//! members dated at or before the hit.

use std::sync::LazyLock;

use futures_util::future::BoxFuture;
use ipnet::IpNet;

use super::sliding_window::{self, Members};
use super::{At, Call, Keyed, LimitAlgorithm, Mirror};
use crate::config::{Limit, LimitSpec};
use crate::detect::Hit;
use crate::limit::{zset_member, RuleLimit, Verdict};
use crate::store::{Conn, LuaScript, StateKey};

pub struct Distinct;

/// The largest `hits` of a `distinct:` limit. Values are counted by 32-bit
/// hashes, and two values sharing one count once: among k values the chance
/// of any such pair is at most k(k-1)/2^33, 1.2e-4 at 1,000 (docs/design.md
/// §2, "Distinct values"), beyond which the count stops being exact in
/// practice; a client's window also holds up to `hits` members.
pub const MAX_DISTINCT_HITS: u32 = 1000;

/// `lua/distinct.lua`: a sliding window of distinct values (`distinct:`).
pub static SCRIPT: LazyLock<LuaScript> =
    LazyLock::new(|| LuaScript::new("distinct", include_str!("../../../lua/distinct.lua").to_owned()));

impl LimitAlgorithm for Distinct {
    /// A sliding window (whose members are the values), with `hits` and
    /// `window`, no prefilter, and few enough values to count exactly.
    fn limit_of(&self, l: &LimitSpec, limit: &mut Limit) -> Result<(), String> {
        let Some(d) = l.distinct else {
            return Err("`distinct` needs a field".into());
        };
        let field = d.name();
        if l.algorithm != crate::config::Algorithm::SlidingWindow {
            return Err(format!(
                "`distinct: {field}` counts the values seen within the last `window`, a sliding window: \
                 remove `algorithm: {}`",
                l.algorithm.name()
            ));
        }
        if l.prefilter.is_some() {
            return Err(format!(
                "`distinct: {field}` cannot take `prefilter`: its fixed windows count requests, not \
                 distinct values, and would let a client repeat one page to fill them; remove `prefilter`"
            ));
        }
        match l.hits {
            Some(h) if h.0 == 0 => {
                return Err(format!(
                "`hits: 0` bans on the first match whatever its {field}: remove `distinct` (or count at least 1 value)"
            ))
            }
            Some(h) if h.0 > MAX_DISTINCT_HITS => {
                return Err(format!(
                    "`distinct: {field}` counts at most {MAX_DISTINCT_HITS} values (`hits: {}`): values are \
                     counted by 32-bit hashes, exact in practice up to that (two values share a hash with \
                     probability below 1.2e-4), and each client's window holds up to `hits` of them",
                    h.0
                ))
            }
            _ => {}
        }
        super::hits_and_window(l, limit)?;
        limit.distinct = Some(d);
        Ok(())
    }

    fn warning(&self, l: &Limit, threshold: u64) -> Option<String> {
        let members = u64::from(l.hits);
        let name = l.distinct.map_or("", |d| d.name());
        (members > threshold).then(|| {
            format!(
                "distinct {name} holds up to {members} values per address, more than zset-max-listpack-entries \
                 ({threshold}): each address past it costs ~3x the memory; consider `hits` of {threshold} or fewer",
            )
        })
    }

    fn describe(&self, l: &Limit, span: fn(i64) -> String) -> String {
        format!(
            "{} distinct values per {} ({}, a sliding window of values)",
            l.hits,
            span(l.window_ms),
            l.algorithm_name()
        )
    }

    fn state_keys(&self) -> &'static [StateKey] {
        &[sliding_window::KEY]
    }

    fn script(&self) -> &'static LuaScript {
        &SCRIPT
    }

    /// The sliding window's, with `prefilter` 0 as the config requires.
    fn args(&self, r: &RuleLimit, clock: u8) -> [i64; 4] {
        [r.window_ms, i64::from(r.hits), i64::from(clock), i64::from(r.prefilter)]
    }

    fn hit_args(&self, r: &RuleLimit, h: &Hit, c: &mut ::redis::Cmd) {
        c.arg(zset_member(h.member, r.hits));
    }

    fn mirror(&self) -> Box<dyn Mirror> {
        Box::<Keyed<Members>>::default()
    }

    fn peek<'a>(&'a self, con: &'a mut Conn, at: &'a At<'a>, now: i64) -> BoxFuture<'a, redis::RedisResult<u64>> {
        Box::pin(sliding_window::members(con, at, now))
    }
}

/// One rule's windows of values in memory: (score = latest time seen,
/// value hash).
impl Mirror for Keyed<Members> {
    /// The script's steps for one group.
    fn check(&mut self, call: &Call<'_>, hits: &[Hit]) -> Verdict {
        let (rule, wall_now) = (call.rule, call.wall_now);
        let (window_ms, limit) = (rule.window_ms, rule.hits as usize);
        let (expires_at, members) = self.fresh(call.key, wall_now);
        let mut added = false;
        let mut over = None;
        for (i, hit) in hits.iter().enumerate() {
            let now = call.now_of(hit);
            // The script's two sweeps, which its bookkeeping only skips when
            // they would remove nothing.
            members.retain(|&(score, _)| score > now - window_ms && score <= now + window_ms);
            let member = zset_member(hit.member, rule.hits);
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

    fn peek(&self, rule: &RuleLimit, key: &IpNet, now: i64) -> u64 {
        sliding_window::within(self.live(key, now), now, rule.window_ms.max(1))
    }
}
