//! The limiter in Redis: one EVALSHA of the rule's algorithm script
//! (`lua/sliding_window.lua`, `fixed_window.lua`, `token_bucket.lua`,
//! `sliding_counter.lua`) per batch, all batches of a flush in one pipeline (one round trip), the script
//! loaded again and the failed calls resent when the server answers NOSCRIPT.
//! Resending is safe: members are deterministic, and the scripts do not
//! count a member twice (fixed-window counters excepted; see the scripts).
//! On a Redis Cluster the calls of a slice go out concurrently, one per key,
//! instead of as one pipeline (which may not span slots).

use ::redis::Value;

use super::{LimitError, RuleLimit, Verdict};
use crate::config::{Algorithm, Clock, Scope};
use crate::detect::Batch;
use crate::store::{self, Keys, LuaScript, FIXED_WINDOW, SLIDING_COUNTER, SLIDING_WINDOW, TOKEN_BUCKET};

/// The script of an algorithm.
fn script(a: Algorithm) -> &'static LuaScript {
    match a {
        Algorithm::SlidingWindow => &SLIDING_WINDOW,
        Algorithm::FixedWindow => &FIXED_WINDOW,
        Algorithm::TokenBucket => &TOKEN_BUCKET,
        Algorithm::SlidingCounter => &SLIDING_COUNTER,
    }
}

/// Script calls per round trip at most.
pub const MAX_CALLS_PER_TRIP: usize = 1024;
/// Hits per round trip at most (a call with more still goes alone).
pub const MAX_HITS_PER_TRIP: usize = 8192;

pub struct RedisLimiter {
    con: store::Conn,
    keys: Keys,
    host: String,
    rules: Vec<RuleLimit>,
    /// Round trips made, for `status` and benchmarks.
    pub round_trips: u64,
    /// Benchmark baseline only (`run --bench-one-call-per-hit`, hidden): the
    /// seeds' textbook form, one EVALSHA per hit, each awaited before the
    /// next. Same decisions, for comparison in scripts/bench-compare.sh.
    pub one_call_per_hit: bool,
}

impl RedisLimiter {
    pub fn new(con: store::Conn, keys: Keys, host: &str, rules: Vec<RuleLimit>) -> RedisLimiter {
        RedisLimiter {
            con,
            keys,
            host: host.to_owned(),
            rules,
            round_trips: 0,
            one_call_per_hit: false,
        }
    }

    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        self.rules = rules;
    }

    fn call(&self, b: &Batch) -> ::redis::Cmd {
        let rule = &self.rules[b.rule];
        let host = (rule.scope == Scope::Host).then_some(self.host.as_str());
        let clock = u8::from(rule.clock == Clock::Redis);
        // Every script takes the same four leading arguments; see `lua/`.
        let mut c = match rule.algorithm {
            Algorithm::SlidingWindow => {
                let win = self.keys.window(&b.key, &rule.name, host);
                let fw = self.keys.fixed(&b.key, &rule.name, host);
                let mut c = SLIDING_WINDOW.cmd(&[&win, &fw]);
                c.arg(rule.window_ms).arg(rule.hits).arg(clock).arg(rule.prefilter);
                c
            }
            Algorithm::FixedWindow => {
                let mut c = FIXED_WINDOW.cmd(&[&self.keys.fixed(&b.key, &rule.name, host)]);
                c.arg(rule.window_ms).arg(rule.hits).arg(clock).arg(0);
                c
            }
            Algorithm::TokenBucket => {
                let mut c = TOKEN_BUCKET.cmd(&[&self.keys.bucket(&b.key, &rule.name, host)]);
                c.arg(rule.interval_us)
                    .arg(rule.hits)
                    .arg(clock)
                    .arg(rule.window_ms + 1000);
                c
            }
            Algorithm::SlidingCounter => {
                let mut c = SLIDING_COUNTER.cmd(&[&self.keys.counter(&b.key, &rule.name, host)]);
                c.arg(rule.window_ms).arg(rule.hits).arg(clock).arg(0);
                c
            }
        };
        if rule.algorithm == Algorithm::SlidingWindow {
            for h in &b.hits {
                c.arg(h.time_ms).arg(super::zset_member(h.member, rule.hits));
            }
        } else {
            for h in &b.hits {
                c.arg(h.time_ms).arg(h.member);
            }
        }
        c
    }

    /// Appends one verdict per batch to `out`, in order, one pipelined
    /// round trip per slice of at most [`MAX_CALLS_PER_TRIP`] calls /
    /// [`MAX_HITS_PER_TRIP`] hits (a bounded request never outlives the
    /// timeout however large the backlog). On error `out` holds the verdicts
    /// of the slices that completed; the caller retries from there.
    pub async fn check(&mut self, batches: &[Batch], out: &mut Vec<Verdict>) -> Result<(), LimitError> {
        if self.one_call_per_hit {
            return self.one_by_one(batches, out).await;
        }
        let mut rest = batches;
        while !rest.is_empty() {
            let mut n = 0;
            let mut hits = 0;
            while n < rest.len() && n < MAX_CALLS_PER_TRIP && (n == 0 || hits + rest[n].hits.len() <= MAX_HITS_PER_TRIP)
            {
                hits += rest[n].hits.len();
                n += 1;
            }
            let (slice, tail) = rest.split_at(n);
            self.slice(slice, out).await?;
            rest = tail;
        }
        Ok(())
    }

    async fn slice(&mut self, batches: &[Batch], out: &mut Vec<Verdict>) -> Result<(), LimitError> {
        let mut got: Vec<Option<Verdict>> = vec![None; batches.len()];
        let mut todo: Vec<usize> = Vec::with_capacity(batches.len());
        for (i, b) in batches.iter().enumerate() {
            if b.rule < self.rules.len() {
                todo.push(i);
            } else {
                got[i] = Some(Verdict::Under { count: 0 });
            }
        }
        // At most two passes: the second only after a NOSCRIPT and a reload.
        for pass in 0..2 {
            if todo.is_empty() {
                break;
            }
            let replies: Vec<Value> = if self.con.is_cluster() {
                // A Cluster refuses pipelines across slots: one call per
                // key, all at once (the client pipelines them per node).
                let calls: Vec<::redis::Cmd> = todo.iter().map(|&i| self.call(&batches[i])).collect();
                let sent = calls.iter().map(|c| {
                    let mut con = self.con.clone();
                    async move { ::redis::aio::ConnectionLike::req_packed_command(&mut con, c).await }
                });
                futures_util::future::join_all(sent)
                    .await
                    .into_iter()
                    .collect::<Result<_, _>>()?
            } else {
                let mut pipe = ::redis::pipe();
                pipe.ignore_errors();
                for &i in &todo {
                    pipe.add_command(self.call(&batches[i]));
                }
                pipe.query_async(&mut self.con).await?
            };
            self.round_trips += 1;
            let mut again = Vec::new();
            let mut reload: Vec<&'static LuaScript> = Vec::new();
            for (&i, v) in todo.iter().zip(replies) {
                if store::value_is_noscript(&v) && pass == 0 {
                    let s = script(self.rules[batches[i].rule].algorithm);
                    if !reload.iter().any(|r| std::ptr::eq(*r, s)) {
                        reload.push(s);
                    }
                    again.push(i);
                    continue;
                }
                got[i] = Some(verdict(v)?);
            }
            for s in reload {
                s.load(&mut self.con).await?;
            }
            todo = again;
        }
        for v in got {
            out.push(v.ok_or_else(|| LimitError::Reply("NOSCRIPT after reloading the script".into()))?);
        }
        Ok(())
    }
}

impl RedisLimiter {
    /// The benchmark baseline: every hit its own script call and round trip.
    /// A batch stops at its first hit over the limit, as the script does.
    async fn one_by_one(&mut self, batches: &[Batch], out: &mut Vec<Verdict>) -> Result<(), LimitError> {
        for b in batches {
            if b.rule >= self.rules.len() {
                out.push(Verdict::Under { count: 0 });
                continue;
            }
            let mut verdict_of_batch = Verdict::Under { count: 0 };
            for (j, h) in b.hits.iter().enumerate() {
                let one = Batch {
                    rule: b.rule,
                    key: b.key,
                    hits: vec![*h],
                };
                let cmd = self.call(&one);
                let v: Value = script(self.rules[b.rule].algorithm).run(&mut self.con, &cmd).await?;
                self.round_trips += 1;
                match verdict(v)? {
                    Verdict::Over { count, .. } => {
                        verdict_of_batch = Verdict::Over { index: j, count };
                        break;
                    }
                    under => verdict_of_batch = under,
                }
            }
            out.push(verdict_of_batch);
        }
        Ok(())
    }
}

fn verdict(v: Value) -> Result<Verdict, LimitError> {
    if let Value::ServerError(e) = &v {
        return Err(LimitError::Reply(e.to_string()));
    }
    let (index, count): (i64, i64) =
        ::redis::FromRedisValue::from_redis_value(v.clone()).map_err(|_| LimitError::Reply(format!("{v:?}")))?;
    let count = u32::try_from(count).unwrap_or(u32::MAX);
    Ok(if index > 0 {
        Verdict::Over {
            index: (index - 1) as usize,
            count,
        }
    } else {
        Verdict::Under { count }
    })
}
