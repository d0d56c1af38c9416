//! The limiter in Redis: one EVALSHA of the rule's algorithm script
//! (`lua/sliding_window.lua`, `fixed_window.lua`, `token_bucket.lua`,
//! `sliding_counter.lua`) per rule and up to [`MAX_GROUPS_PER_CALL`] batches
//! (addresses), each batch decided in the script as if alone; all calls of a
//! flush in one pipeline (one round trip), the script loaded again and the
//! failed calls resent when the server answers NOSCRIPT.
//! Resending is safe: members and (origin, offset) are deterministic, and
//! the scripts do not count a line twice (token bucket and sliding counter:
//! only a batch resent as it was; see the scripts).
//! On a Redis Cluster a call carries one batch (a script may touch one hash
//! slot, and the address is the hash tag), and the calls of a slice go out
//! concurrently instead of as one pipeline (which may not span slots).

use ::redis::Value;

use super::Batch;
use super::{LimitError, RuleLimit, Verdict};
use crate::config::{Algorithm, Clock, Scope};
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

/// Batches (rule, address) per round trip at most.
pub const MAX_CALLS_PER_TRIP: usize = 1024;
/// Hits per round trip at most (a call with more still goes alone).
pub const MAX_HITS_PER_TRIP: usize = 8192;
/// Batches (addresses) of one rule per script call at most, outside a
/// Cluster: the per-call cost (~3.7 µs of Redis CPU for an empty EVALSHA)
/// is paid once for all of them.
pub const MAX_GROUPS_PER_CALL: usize = 64;

pub struct RedisLimiter {
    con: store::Conn,
    keys: Keys,
    host: String,
    rules: Vec<RuleLimit>,
    /// Round trips made, for `status` and benchmarks.
    pub round_trips: u64,
    /// Benchmark baseline only (`run --bench-one-call-per-hit`, hidden): the
    /// seeds' textbook form, one EVALSHA per hit, each awaited before the
    /// next. Same decisions, for comparison in bench/compare.sh.
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

    pub fn rules(&self) -> &[RuleLimit] {
        &self.rules
    }

    /// A limiter for one round trip run apart (the daemon parses the next
    /// chunks meanwhile): the same connection (clones share it), keys and
    /// rules; its `round_trips` count only its own.
    pub fn for_flight(&self) -> RedisLimiter {
        RedisLimiter {
            con: self.con.clone(),
            keys: self.keys.clone(),
            host: self.host.clone(),
            rules: self.rules.clone(),
            round_trips: 0,
            one_call_per_hit: self.one_call_per_hit,
        }
    }

    /// One script call deciding `group`, batches of one rule (each a
    /// different key): every key, the rule's four leading arguments, the
    /// number of groups and of hits in each, then the hits group after group
    /// (the layout in `lua/`).
    fn call(&self, rule: usize, group: &[&Batch]) -> ::redis::Cmd {
        let r = &self.rules[rule];
        let host = (r.scope == Scope::Host).then_some(self.host.as_str());
        let clock = u8::from(r.clock == Clock::Redis);
        let mut keys: Vec<String> = Vec::with_capacity(group.len() * 2);
        for b in group {
            match r.algorithm {
                Algorithm::SlidingWindow => {
                    keys.push(self.keys.window(&b.key, &r.name, host));
                    keys.push(self.keys.fixed(&b.key, &r.name, host));
                }
                Algorithm::FixedWindow => keys.push(self.keys.fixed(&b.key, &r.name, host)),
                Algorithm::TokenBucket => keys.push(self.keys.bucket(&b.key, &r.name, host)),
                Algorithm::SlidingCounter => keys.push(self.keys.counter(&b.key, &r.name, host)),
            }
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut c = script(r.algorithm).cmd(&keys);
        match r.algorithm {
            Algorithm::SlidingWindow => c.arg(r.window_ms).arg(r.hits).arg(clock).arg(r.prefilter),
            Algorithm::TokenBucket => c.arg(r.interval_us).arg(r.hits).arg(clock).arg(r.window_ms + 1000),
            Algorithm::FixedWindow | Algorithm::SlidingCounter => c.arg(r.window_ms).arg(r.hits).arg(clock).arg(0),
        };
        c.arg(group.len());
        for b in group {
            c.arg(b.hits.len());
        }
        // Per hit what its script reads (see each script's header).
        for b in group {
            for h in &b.hits {
                c.arg(h.time_ms);
                match r.algorithm {
                    Algorithm::SlidingWindow if r.prefilter > 0 => {
                        c.arg(super::zset_member(h.member, r.hits)).arg(h.origin).arg(h.offset)
                    }
                    Algorithm::SlidingWindow => c.arg(super::zset_member(h.member, r.hits)),
                    Algorithm::FixedWindow => c.arg(h.origin).arg(h.offset),
                    Algorithm::TokenBucket | Algorithm::SlidingCounter => c.arg(h.member),
                };
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

    /// The script calls for `todo` (indices into `batches`): batches of one
    /// rule together, at most [`MAX_GROUPS_PER_CALL`] per call and one on a
    /// Cluster (a script there touches one slot: one address).
    fn plan_calls(&self, batches: &[Batch], todo: &[usize]) -> Vec<(usize, Vec<usize>)> {
        let per_call = if self.con.is_cluster() { 1 } else { MAX_GROUPS_PER_CALL };
        let mut calls: Vec<(usize, Vec<usize>)> = Vec::new();
        let mut open: Vec<Option<usize>> = vec![None; self.rules.len()];
        for &i in todo {
            let rule = batches[i].rule;
            match open[rule] {
                Some(c) if calls[c].1.len() < per_call => calls[c].1.push(i),
                _ => {
                    open[rule] = Some(calls.len());
                    calls.push((rule, vec![i]));
                }
            }
        }
        calls
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
            let calls = self.plan_calls(batches, &todo);
            let cmds: Vec<::redis::Cmd> = calls
                .iter()
                .map(|(rule, group)| {
                    let group: Vec<&Batch> = group.iter().map(|&i| &batches[i]).collect();
                    self.call(*rule, &group)
                })
                .collect();
            let replies: Vec<Value> = if self.con.is_cluster() {
                // A Cluster refuses pipelines across slots: one call per
                // key, all at once (the client pipelines them per node).
                let sent = cmds.iter().map(|c| {
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
                for c in cmds {
                    pipe.add_command(c);
                }
                pipe.query_async(&mut self.con).await?
            };
            self.round_trips += 1;
            let mut again = Vec::new();
            let mut reload: Vec<&'static LuaScript> = Vec::new();
            for ((rule, group), v) in calls.into_iter().zip(replies) {
                if store::value_is_noscript(&v) && pass == 0 {
                    let s = script(self.rules[rule].algorithm);
                    if !reload.iter().any(|r| std::ptr::eq(*r, s)) {
                        reload.push(s);
                    }
                    again.extend(group);
                    continue;
                }
                for (i, verdict) in group.iter().zip(verdicts(v, group.len())?) {
                    got[*i] = Some(verdict);
                }
            }
            for s in reload {
                s.load(&mut self.con).await?;
            }
            again.sort_unstable();
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
                let cmd = self.call(b.rule, &[&one]);
                let v: Value = script(self.rules[b.rule].algorithm).run(&mut self.con, &cmd).await?;
                self.round_trips += 1;
                match verdicts(v, 1)?[0] {
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

/// The verdicts of one call of `groups` groups: the flat `{i, n, ...}` reply.
fn verdicts(v: Value, groups: usize) -> Result<Vec<Verdict>, LimitError> {
    if let Value::ServerError(e) = &v {
        return Err(LimitError::Reply(e.to_string()));
    }
    let flat: Vec<i64> =
        ::redis::FromRedisValue::from_redis_value(v.clone()).map_err(|_| LimitError::Reply(format!("{v:?}")))?;
    if flat.len() != 2 * groups {
        return Err(LimitError::Reply(format!(
            "{} values for {groups} groups: {v:?}",
            flat.len()
        )));
    }
    Ok(flat
        .chunks_exact(2)
        .map(|p| {
            let count = u32::try_from(p[1]).unwrap_or(u32::MAX);
            if p[0] > 0 {
                Verdict::Over {
                    index: (p[0] - 1) as usize,
                    count,
                }
            } else {
                Verdict::Under { count }
            }
        })
        .collect())
}
