//! The limiter in Redis: one EVALSHA of the rule's algorithm script
//! (`lua/`, keys and arguments from `limit::algorithm`) per rule and up to [`MAX_GROUPS_PER_CALL`] batches
//! (addresses), each batch decided in the script as if alone; all calls of a
//! flush in one pipeline (one round trip), the script loaded again and the
//! failed calls resent when the server answers NOSCRIPT.
//! Resending is safe: members and (origin, offset) are deterministic, and
//! the scripts do not count a line twice (token bucket and sliding counter:
//! only a batch resent as it was; see the scripts).
//! On a Redis Cluster a call carries batches of one rule and one address
//! bucket (a script may touch one hash slot; the bucket is the hash tag,
//! `store::Keys`), and the calls of a slice go out as one pipeline per
//! bucket, all at once: the cluster client sends each to its slot's master,
//! where the pipelines of one round trip meet on the node's one connection.
//! A call answered MOVED, ASK, TRYAGAIN or CLUSTERDOWN (a reshard, a
//! failover) did not run; it is resent after a pause, a bounded number of
//! times, and then reported as an error the limiter retries. ASK is not
//! followed: during a slot's migration the call waits for its end, because
//! the fixed-window counters are keys the scripts derive (`:N`), which the
//! importing node cannot see yet.

use ::redis::Value;

use super::algorithm::At;
use super::Batch;
use super::{LimitError, RuleLimit, Verdict};
use crate::config::{Clock, Scope};
use crate::store::{self, Keys, LuaScript};

/// Batches (rule, address) per round trip at most.
pub const MAX_CALLS_PER_TRIP: usize = 1024;
/// Hits per round trip at most (a call with more still goes alone).
pub const MAX_HITS_PER_TRIP: usize = 8192;
/// On a Cluster a round trip carries this many times the bounds above:
/// they bound what one node is asked per round trip, and a cluster has at
/// least three masters (`redis-cli --cluster create` refuses fewer), each
/// with about a third of the buckets.
pub const CLUSTER_MASTERS_AT_LEAST: usize = 3;
/// Batches (addresses) of one rule per script call at most (on a Cluster,
/// of one address bucket): the per-call cost (~3.7 µs of Redis CPU for an
/// empty EVALSHA) is paid once for all of them.
pub const MAX_GROUPS_PER_CALL: usize = 64;

pub struct RedisLimiter {
    con: store::Conn,
    keys: Keys,
    host: String,
    rules: Vec<RuleLimit>,
    /// Round trips made, for `status` and benchmarks.
    pub round_trips: u64,
    /// Script calls resent because a Cluster answered MOVED, ASK, TRYAGAIN
    /// or CLUSTERDOWN (a reshard, a failover), for tests and benchmarks.
    pub redirected: u64,
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
            redirected: 0,
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
            redirected: 0,
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
        let algorithm = r.algorithm_impl();
        let mut keys: Vec<String> = Vec::with_capacity(group.len() * 2);
        for b in group {
            let at = At {
                keys: &self.keys,
                rule: r,
                addr: &b.key,
                host,
            };
            algorithm.keys(&at, &mut keys);
        }
        let keys: Vec<&str> = keys.iter().map(String::as_str).collect();
        let mut c = algorithm.script().cmd(&keys);
        for a in algorithm.args(r, clock) {
            c.arg(a);
        }
        c.arg(group.len());
        for b in group {
            c.arg(b.hits.len());
        }
        // Per hit what its script reads (see each script's header).
        for b in group {
            for h in &b.hits {
                c.arg(h.time_ms);
                algorithm.hit_args(r, h, &mut c);
            }
        }
        c
    }

    /// Appends one verdict per batch to `out`, in order, one pipelined
    /// round trip per slice of at most [`MAX_CALLS_PER_TRIP`] calls /
    /// [`MAX_HITS_PER_TRIP`] hits (x [`CLUSTER_MASTERS_AT_LEAST`] on a
    /// Cluster; a bounded request never outlives the
    /// timeout however large the backlog). On error `out` holds the verdicts
    /// of the slices that completed; the caller retries from there.
    pub async fn check(&mut self, batches: &[Batch], out: &mut Vec<Verdict>) -> Result<(), LimitError> {
        if self.one_call_per_hit {
            return self.one_by_one(batches, out).await;
        }
        let scale = if self.con.is_cluster() {
            CLUSTER_MASTERS_AT_LEAST
        } else {
            1
        };
        let mut rest = batches;
        while !rest.is_empty() {
            let mut n = 0;
            let mut hits = 0;
            while n < rest.len()
                && n < MAX_CALLS_PER_TRIP * scale
                && (n == 0 || hits + rest[n].hits.len() <= MAX_HITS_PER_TRIP * scale)
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
    /// rule together, at most [`MAX_GROUPS_PER_CALL`] per call, and on a
    /// Cluster only those of one address bucket (one slot). Each call with
    /// its rule and bucket (0 outside a Cluster).
    fn plan_calls(&self, batches: &[Batch], todo: &[usize]) -> Vec<Call> {
        let cluster = self.con.is_cluster();
        let buckets = if cluster {
            usize::from(store::ADDRESS_BUCKETS)
        } else {
            1
        };
        let mut calls: Vec<Call> = Vec::new();
        let mut open: Vec<Option<usize>> = vec![None; self.rules.len() * buckets];
        for &i in todo {
            let rule = batches[i].rule;
            let bucket = if cluster { Keys::bucket_of(&batches[i].key) } else { 0 };
            let at = rule * buckets + usize::from(bucket);
            match open[at] {
                Some(c) if calls[c].group.len() < MAX_GROUPS_PER_CALL => calls[c].group.push(i),
                _ => {
                    open[at] = Some(calls.len());
                    calls.push(Call {
                        rule,
                        bucket,
                        group: vec![i],
                    });
                }
            }
        }
        calls
    }

    /// The replies of `cmds`, in order: one pipeline, or on a Cluster one
    /// pipeline per bucket (a pipeline may not span slots), all at once, each
    /// through the connection that retries nothing: a pipeline answered
    /// with a redirect is [`Reply::Redirected`] for each of its calls.
    async fn send(&mut self, calls: &[Call], cmds: Vec<::redis::Cmd>) -> Result<Vec<Reply>, LimitError> {
        if !self.con.is_cluster() {
            let mut pipe = ::redis::pipe();
            pipe.ignore_errors();
            for c in cmds {
                pipe.add_command(c);
            }
            let values: Vec<Value> = pipe.query_async(&mut self.con).await?;
            return Ok(values.into_iter().map(Reply::of).collect());
        }
        let mut of_bucket: Vec<Vec<usize>> = vec![Vec::new(); usize::from(store::ADDRESS_BUCKETS)];
        for (i, c) in calls.iter().enumerate() {
            of_bucket[usize::from(c.bucket)].push(i);
        }
        let mut cmds: Vec<Option<::redis::Cmd>> = cmds.into_iter().map(Some).collect();
        let pipes: Vec<(Vec<usize>, ::redis::Pipeline)> = of_bucket
            .into_iter()
            .filter(|ix| !ix.is_empty())
            .map(|ix| {
                let mut pipe = ::redis::pipe();
                pipe.ignore_errors();
                for &i in &ix {
                    if let Some(c) = cmds[i].take() {
                        pipe.add_command(c);
                    }
                }
                (ix, pipe)
            })
            .collect();
        let con = &self.con;
        let answers = futures_util::future::join_all(pipes.iter().map(|(_, pipe)| con.query_once(pipe))).await;
        let mut replies: Vec<Reply> = (0..calls.len()).map(|_| Reply::Value(Value::Nil)).collect();
        for ((ix, _), answer) in pipes.iter().zip(answers) {
            match answer {
                Ok(values) if values.len() == ix.len() => {
                    for (&i, v) in ix.iter().zip(values) {
                        replies[i] = Reply::of(v);
                    }
                }
                Ok(values) => {
                    return Err(LimitError::Reply(format!(
                        "{} replies to {} calls",
                        values.len(),
                        ix.len()
                    )));
                }
                Err(e) if e.code().is_some_and(|c| REDIRECTS.contains(&c)) => {
                    for &i in ix {
                        replies[i] = Reply::Redirected(e.to_string());
                    }
                }
                Err(e) => return Err(e.into()),
            }
        }
        Ok(replies)
    }

    async fn slice(&mut self, batches: &[Batch], out: &mut Vec<Verdict>) -> Result<(), LimitError> {
        let mut got: Vec<Option<Verdict>> = vec![None; batches.len()];
        let mut todo: Vec<usize> = Vec::with_capacity(batches.len());
        for (i, b) in batches.iter().enumerate() {
            if let Some(v) = self.rules.get(b.rule).and_then(|r| super::first_match_over(r, &b.hits)) {
                got[i] = Some(v);
            } else if b.rule < self.rules.len() {
                todo.push(i);
            } else {
                got[i] = Some(Verdict::Under { count: 0 });
            }
        }
        let mut reloaded = false;
        let mut last_redirect = None;
        for pass in 0..=MAX_RESENDS {
            if todo.is_empty() {
                break;
            }
            if last_redirect.is_some() {
                // A reshard or failover in progress: give it a moment.
                let ms = (5u64 << pass.min(6)).min(250);
                tokio::time::sleep(std::time::Duration::from_millis(ms)).await;
            }
            let calls = self.plan_calls(batches, &todo);
            let cmds: Vec<::redis::Cmd> = calls
                .iter()
                .map(|c| {
                    let group: Vec<&Batch> = c.group.iter().map(|&i| &batches[i]).collect();
                    self.call(c.rule, &group)
                })
                .collect();
            let replies = self.send(&calls, cmds).await?;
            self.round_trips += 1;
            let mut again = Vec::new();
            let mut reload: Vec<&'static LuaScript> = Vec::new();
            last_redirect = None;
            for (call, reply) in calls.into_iter().zip(replies) {
                let v = match reply {
                    Reply::Redirected(e) => {
                        last_redirect = Some(e);
                        self.redirected += 1;
                        again.extend(call.group);
                        continue;
                    }
                    Reply::Value(v) => v,
                };
                if store::value_is_noscript(&v) && !reloaded {
                    let s = self.rules[call.rule].algorithm_impl().script();
                    if !reload.iter().any(|r| std::ptr::eq(*r, s)) {
                        reload.push(s);
                    }
                    again.extend(call.group);
                    continue;
                }
                for (i, verdict) in call.group.iter().zip(verdicts(v, call.group.len())?) {
                    got[*i] = Some(verdict);
                }
            }
            reloaded |= !reload.is_empty();
            for s in reload {
                s.load(&mut self.con).await?;
            }
            again.sort_unstable();
            todo = again;
        }
        if let Some(e) = last_redirect.filter(|_| !todo.is_empty()) {
            return Err(LimitError::Reply(format!(
                "{} batches still redirected after {MAX_RESENDS} resends: {e}",
                todo.len()
            )));
        }
        for v in got {
            out.push(v.ok_or_else(|| LimitError::Reply("NOSCRIPT after reloading the script".into()))?);
        }
        Ok(())
    }
}

/// Resends of a slice's calls answered MOVED, ASK, TRYAGAIN or CLUSTERDOWN
/// (the pauses between them sum to ~2 s), before the slice fails.
const MAX_RESENDS: u32 = 12;

/// One script call of a slice: its rule, its address bucket (on a
/// Cluster), and the indices of its batches.
struct Call {
    rule: usize,
    bucket: u16,
    group: Vec<usize>,
}

/// The error codes of a call that did not run on this node and may run
/// elsewhere or later.
const REDIRECTS: [&str; 4] = ["MOVED", "ASK", "TRYAGAIN", "CLUSTERDOWN"];

/// What a call got: its reply, or the redirect its pipeline was answered.
enum Reply {
    Value(Value),
    Redirected(String),
}

impl Reply {
    fn of(v: Value) -> Reply {
        match &v {
            Value::ServerError(e) if REDIRECTS.contains(&e.code()) => Reply::Redirected(format!("{e:?}")),
            _ => Reply::Value(v),
        }
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
            if let Some(v) = super::first_match_over(&self.rules[b.rule], &b.hits) {
                out.push(v);
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
                let v: Value = self.rules[b.rule]
                    .algorithm_impl()
                    .script()
                    .run(&mut self.con, &cmd)
                    .await?;
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
    if let Value::ServerError(e) = v {
        // As a Redis error: its code says whether Redis is down or refused this call.
        return Err(LimitError::Redis(e.into()));
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
