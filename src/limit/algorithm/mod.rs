//! The limiter's algorithms, one module each (vector's one component, one
//! folder): its `limit:` parameters checked ([`LimitAlgorithm::limit_of`]),
//! its Lua script (`lua/NAME.lua`, the Redis truth), the script call's keys
//! and arguments, its embedded-store mirror of the script ([`Mirror`]), its
//! `explain` reading of the Redis state, and its kinds of key
//! ([`StateKey`], named through `store::Keys`).
//!
//! [`algorithms!`] lists them once: it makes the [`Algorithm`] of the YAML
//! (`algorithm: sliding_window`, the module's name) and the one dispatch to
//! each module. A new algorithm is its module plus one line there. The
//! layers above (`limit::redis`, `limit::memory`, `limit::peek`, `config`)
//! hold a `&dyn LimitAlgorithm` and never look at which one it is.
//! `distinct:` is the one algorithm not named by `algorithm:` ([`of`]).

use futures_util::future::BoxFuture;
use ipnet::IpNet;
use serde::Deserialize;

use super::{RuleLimit, Verdict};
use crate::config::{Distinct, Limit, LimitSpec};
use crate::detect::Hit;
use crate::store::{Conn, Keys, LuaScript, StateKey};

pub mod distinct;
pub mod tier;

/// Makes [`Algorithm`] (a variant per `algorithm:` name, the snake-case of
/// the variant and its module's name) and its dispatch to `MODULE::VARIANT`,
/// the module's [`LimitAlgorithm`].
macro_rules! algorithms {
    ($($(#[$attr:meta])* $variant:ident => $module:ident,)*) => {
        $(pub mod $module;)*

        /// `algorithm:` of a rule's `limit:`.
        #[derive(Debug, Default, Clone, Copy, PartialEq, Eq, Deserialize)]
        #[serde(rename_all = "snake_case")]
        pub enum Algorithm {
            $($(#[$attr])* $variant,)*
        }

        impl Algorithm {
            /// The name `algorithm:` takes, its module's.
            pub fn name(self) -> &'static str {
                match self {
                    $(Algorithm::$variant => stringify!($module),)*
                }
            }

            fn implementation(self) -> &'static dyn LimitAlgorithm {
                match self {
                    $(Algorithm::$variant => &$module::$variant,)*
                }
            }
        }

        /// Every algorithm, `distinct:` last.
        const ALL: &[&dyn LimitAlgorithm] = &[$(&$module::$variant,)* &distinct::Distinct];
    };
}

algorithms! {
    #[default]
    SlidingWindow => sliding_window,
    FixedWindow => fixed_window,
    TokenBucket => token_bucket,
    SlidingCounter => sliding_counter,
}

/// The algorithm of a limit: `distinct:` (a sliding window of values), or
/// the one `algorithm:` names.
pub fn of(algorithm: Algorithm, distinct: Option<Distinct>) -> &'static dyn LimitAlgorithm {
    match distinct {
        Some(_) => &distinct::Distinct,
        None => algorithm.implementation(),
    }
}

/// Every kind of key an algorithm keeps per address, once each, in the
/// order of [`ALL`] (`store::Keys::of_address`: what an unban deletes).
pub fn state_keys() -> Vec<StateKey> {
    let mut out: Vec<StateKey> = Vec::new();
    for k in ALL.iter().flat_map(|a| a.state_keys()) {
        if !out.contains(k) {
            out.push(*k);
        }
    }
    out
}

/// Where one (rule, client key)'s state lives in Redis.
pub struct At<'a> {
    pub keys: &'a Keys,
    pub rule: &'a RuleLimit,
    pub addr: &'a IpNet,
    /// This host's id for a `scope: host` rule, None for the fleet's scope.
    pub host: Option<&'a str>,
}

/// One limiter algorithm: all that differs from one to the next.
pub trait LimitAlgorithm: Sync {
    /// Fills `limit` (its other fields set) from the rule's `limit:`, or
    /// says why it cannot: each algorithm takes its own parameters and
    /// refuses the others'.
    fn limit_of(&self, spec: &LimitSpec, limit: &mut Limit) -> Result<(), String>;

    /// A warning for `check` and the daemon's start: the state of one
    /// address can outgrow Redis's compact encoding of `threshold` entries.
    fn warning(&self, _limit: &Limit, _threshold: u64) -> Option<String> {
        None
    }

    /// How `check` says the limit (`100 hits per 1m (sliding_window)`), its
    /// durations written by `span`; not asked of `hits: 0`, which counts
    /// nothing.
    fn describe(&self, l: &Limit, span: fn(i64) -> String) -> String {
        format!(
            "{} hits per {}{} ({})",
            l.hits,
            span(l.window_ms),
            l.prefilter.map_or(String::new(), |f| format!(", prefilter {f}")),
            l.algorithm.name()
        )
    }

    /// The kinds of key it keeps per address (in Redis and as the memory
    /// store mirrors them).
    fn state_keys(&self) -> &'static [StateKey];

    /// `lua/NAME.lua`, embedded.
    fn script(&self) -> &'static LuaScript;

    /// Pushes the script's keys for one group (one client key): by default
    /// one key of each of its kinds.
    fn keys(&self, at: &At<'_>, out: &mut Vec<String>) {
        for kind in self.state_keys() {
            out.push(at.keys.state(*kind, at.addr, &at.rule.name, at.host));
        }
    }

    /// The script's four leading arguments (the layout in `lua/`); `clock`
    /// is 1 for `clock: redis`.
    fn args(&self, rule: &RuleLimit, clock: u8) -> [i64; 4];

    /// What the script reads of one hit after its time (each script's
    /// header): by default its member.
    fn hit_args(&self, _rule: &RuleLimit, hit: &Hit, cmd: &mut ::redis::Cmd) {
        cmd.arg(hit.member);
    }

    /// An empty embedded store of one rule's state.
    fn mirror(&self) -> Box<dyn Mirror>;

    /// What the state at `at` counts at `now` against the rule's limit, as
    /// the next hit would find it (`fleetban explain`). Reads only.
    fn peek<'a>(&'a self, con: &'a mut Conn, at: &'a At<'a>, now: i64) -> BoxFuture<'a, ::redis::RedisResult<u64>>;
}

/// One rule's state in process memory, mirroring its script step for step,
/// including key expiry: a key lives as long as PEXPIRE makes it live in
/// Redis (wall-clock time, set where the script sets it).
pub trait Mirror: Expiring + Send + Sync {
    /// Decides one batch of `call`'s key, in order.
    fn check(&mut self, call: &Call<'_>, hits: &[Hit]) -> Verdict;
    /// [`LimitAlgorithm::peek`] of this store.
    fn peek(&self, rule: &RuleLimit, key: &IpNet, now: i64) -> u64;
}

/// Keys in memory that expire as their Redis keys would, and that the
/// memory bound can weigh and shed (`limit::memory`, docs/design.md §2,
/// "Memory").
pub trait Expiring {
    /// Forgets every key of `key` (an unbanned address starts afresh).
    fn forget(&mut self, key: &IpNet);
    /// Keys held, live or not yet swept.
    fn tracked_keys(&self) -> usize;
    /// Drops the keys expired at `wall_now` (and measures what the others
    /// hold on the heap).
    fn sweep(&mut self, wall_now: i64);
    /// What the keys cost in memory.
    fn size(&self) -> Size;
    /// Drops up to `max` keys whose count at `now` fills less than `below`
    /// of `rule`'s limit (0.0 empty, 1.0 at the limit), and how many it
    /// dropped. Expired keys go first, uncounted.
    fn shed(&mut self, rule: &RuleLimit, below: f64, max: usize, now: i64) -> usize;
    /// Gives the spare slots of the tables back after a shed.
    fn shrink(&mut self);
}

/// Two kinds of key of one rule (a sliding window and its prefilter's counters).
impl<A: Expiring, B: Expiring> Expiring for (A, B) {
    fn forget(&mut self, key: &IpNet) {
        self.0.forget(key);
        self.1.forget(key);
    }

    fn tracked_keys(&self) -> usize {
        self.0.tracked_keys() + self.1.tracked_keys()
    }

    fn sweep(&mut self, wall_now: i64) {
        self.0.sweep(wall_now);
        self.1.sweep(wall_now);
    }

    fn size(&self) -> Size {
        self.0.size() + self.1.size()
    }

    /// Up to `max` from each: a client's window and its counters go
    /// together, at about the same fill.
    fn shed(&mut self, rule: &RuleLimit, below: f64, max: usize, now: i64) -> usize {
        self.0
            .shed(rule, below, max, now)
            .max(self.1.shed(rule, below, max, now))
    }

    fn shrink(&mut self) {
        self.0.shrink();
        self.1.shrink();
    }
}

/// What keys in memory cost: `held` now (every bucket of their tables,
/// empty ones included, and what their states hold on the heap), and
/// `packed`, the same keys at the tables' average load (7/8 full, as
/// hashbrown fills them before it doubles, down to 7/16 after): a table
/// shrunk to fit holds less than twice its `packed` share.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Size {
    pub keys: usize,
    pub held: usize,
    pub packed: usize,
}

impl std::ops::Add for Size {
    type Output = Size;
    fn add(self, o: Size) -> Size {
        Size {
            keys: self.keys + o.keys,
            held: self.held + o.held,
            packed: self.packed + o.packed,
        }
    }
}

impl std::iter::Sum for Size {
    fn sum<I: Iterator<Item = Size>>(it: I) -> Size {
        it.fold(Size::default(), |a, b| a + b)
    }
}

/// Bytes the allocator adds to each block it hands out (glibc's malloc: a
/// 16-byte header, rounded to 16).
const BLOCK_OVERHEAD: usize = 16;

/// The size of a table of `T` entries: `keys` of them in a table of
/// `capacity` (hashbrown's: 7/8 of its buckets, each bucket a slot and a
/// control byte), plus `heap` held by its states.
pub(super) fn table_size<T>(keys: usize, capacity: usize, heap: usize) -> Size {
    let bucket = std::mem::size_of::<T>() + 1;
    let held = match capacity {
        0 => 0,
        c => (c * 8).div_ceil(7) * bucket + BLOCK_OVERHEAD,
    };
    Size {
        keys,
        held: held + heap,
        packed: (keys * 8).div_ceil(7) * bucket + heap,
    }
}

/// The heap block of a `Vec` of `capacity` `T`s.
pub(super) fn vec_bytes<T>(capacity: usize) -> usize {
    match capacity {
        0 => 0,
        n => n * std::mem::size_of::<T>() + BLOCK_OVERHEAD,
    }
}

/// One key's state, weighed for the memory bound: what it holds on the
/// heap, and how near its rule's limit its count is (the bound sheds the
/// least full first).
pub trait Weigh {
    /// Heap bytes beyond its slot, allocator overhead included.
    fn heap(&self) -> usize {
        0
    }
    /// Its count at `now` as a fraction of `rule`'s limit (0.0 empty, 1.0
    /// at the limit).
    fn fill(&self, rule: &RuleLimit, now: i64) -> f64;
}

/// `n` of a limit of `of`, as [`Weigh::fill`] gives it.
pub(super) fn fraction(n: u64, of: u32) -> f64 {
    n as f64 / f64::from(of.max(1))
}

/// One batch to decide in memory: its rule, its client key, and the wall
/// clock (key expiry, and `now` for `clock: redis`).
pub struct Call<'a> {
    pub rule: &'a RuleLimit,
    pub key: IpNet,
    pub wall_now: i64,
}

impl Call<'_> {
    /// The time a hit is judged at, as the scripts take it.
    pub fn now_of(&self, h: &Hit) -> i64 {
        if self.rule.clock == crate::config::Clock::Redis {
            self.wall_now
        } else {
            h.time_ms
        }
    }
}

type Map<K, V> = std::collections::HashMap<K, V, foldhash::fast::RandomState>;

/// One key's state in memory and when it expires (wall-clock ms, PEXPIRE).
struct Entry<S> {
    state: S,
    expires_at: i64,
}

/// The keys of one kind of one rule in memory, by client key.
pub struct Keyed<S> {
    map: Map<IpNet, Entry<S>>,
    /// What the states held on the heap at the last sweep or shed, and
    /// the keys there were then: keys added since are weighed at their
    /// average.
    heap: usize,
    heap_keys: usize,
}

impl<S> Default for Keyed<S> {
    fn default() -> Self {
        Keyed {
            map: Map::default(),
            heap: 0,
            heap_keys: 0,
        }
    }
}

impl<S> Keyed<S> {
    /// The state of `key` if it lives at `now`.
    pub fn live(&self, key: &IpNet, now: i64) -> Option<&S> {
        self.map.get(key).filter(|e| e.expires_at > now).map(|e| &e.state)
    }

    /// Sets `key`'s state, expiring at `expires_at`.
    pub fn insert(&mut self, key: IpNet, state: S, expires_at: i64) {
        self.map.insert(key, Entry { state, expires_at });
    }

    /// The state of `key`, an empty one when it expired, with its expiry
    /// for the caller to move when it adds.
    pub fn fresh(&mut self, key: IpNet, wall_now: i64) -> (&mut i64, &mut S)
    where
        S: Default,
    {
        let Entry { state, expires_at } = self.map.entry(key).or_insert(Entry {
            state: S::default(),
            expires_at: 0,
        });
        if *expires_at <= wall_now {
            *state = S::default();
        }
        (expires_at, state)
    }
}

impl<S: Weigh> Expiring for Keyed<S> {
    fn forget(&mut self, key: &IpNet) {
        self.map.remove(key);
    }

    fn tracked_keys(&self) -> usize {
        self.map.len()
    }

    fn sweep(&mut self, wall_now: i64) {
        let mut heap = 0;
        self.map.retain(|_, e| {
            let live = e.expires_at > wall_now;
            if live {
                heap += e.state.heap();
            }
            live
        });
        (self.heap, self.heap_keys) = (heap, self.map.len());
    }

    fn size(&self) -> Size {
        let keys = self.map.len();
        let added = keys.saturating_sub(self.heap_keys);
        let heap = self.heap + added * self.heap.checked_div(self.heap_keys).unwrap_or(0);
        table_size::<(IpNet, Entry<S>)>(keys, self.map.capacity(), heap)
    }

    fn shed(&mut self, rule: &RuleLimit, below: f64, max: usize, now: i64) -> usize {
        let (mut shed, mut heap) = (0, 0);
        self.map.retain(|_, e| {
            if e.expires_at <= now {
                return false;
            }
            if shed < max && e.state.fill(rule, now) < below {
                shed += 1;
                return false;
            }
            heap += e.state.heap();
            true
        });
        (self.heap, self.heap_keys) = (heap, self.map.len());
        shed
    }

    fn shrink(&mut self) {
        self.map.shrink_to_fit();
    }
}

/// `limit_of`'s refusal of `prefilter` by every algorithm but the sliding window.
fn no_prefilter(spec: &LimitSpec) -> Result<(), String> {
    match spec.prefilter {
        Some(_) => Err(format!(
            "`prefilter` applies to `sliding_window` only, not to `{}`",
            spec.algorithm.name()
        )),
        None => Ok(()),
    }
}

/// `hits` and `window` into `limit`, for every algorithm that takes them
/// (all but `token_bucket`).
fn hits_and_window(spec: &LimitSpec, limit: &mut Limit) -> Result<(), String> {
    let algo = spec.algorithm.name();
    if spec.burst.is_some() || spec.rate.is_some() {
        return Err(format!(
            "`burst` and `rate` apply to `token_bucket` only; `{algo}` takes `hits` and `window`"
        ));
    }
    let (Some(hits), Some(window)) = (spec.hits, spec.window) else {
        return Err(format!(
            "`{algo}` needs `hits` and `window`: e.g. `{{ hits: 100, window: 60s }}`"
        ));
    };
    if window.as_ms() < 1 {
        return Err("`window` must be at least 1ms".into());
    }
    limit.hits = hits.0;
    limit.window_ms = window.as_ms();
    Ok(())
}

/// A count as a verdict's `u32`.
fn clamp(n: i64) -> u32 {
    u32::try_from(n.max(0)).unwrap_or(u32::MAX)
}

/// Where a batch starts for a script that marks the last hit it counted
/// (token bucket, sliding counter): after the hit carrying `mark`.
fn start(hits: &[Hit], mark: Option<u64>) -> usize {
    mark.and_then(|m| hits.iter().position(|h| h.member == m))
        .map_or(0, |p| p + 1)
}

/// A HASH field as a whole number (`HGET`/`HMGET` replies), None if absent.
fn number(v: Option<&Option<String>>) -> Option<i64> {
    v.cloned()
        .flatten()
        .and_then(|s| s.parse::<f64>().ok())
        .map(|f| f as i64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_algorithm_is_named_as_the_yaml_names_it() {
        for name in ["sliding_window", "fixed_window", "token_bucket", "sliding_counter"] {
            let a: Algorithm = serde_saphyr::from_str(name).expect(name);
            assert_eq!(a.name(), name);
        }
        assert_eq!(Algorithm::default(), Algorithm::SlidingWindow);
    }

    #[test]
    fn state_keys_name_each_kind_once() {
        let kinds: Vec<&str> = state_keys().iter().map(|k| k.kind).collect();
        assert_eq!(kinds, ["win", "fixed", "tb", "sc"]);
    }
}
