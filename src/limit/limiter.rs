//! [`Limiter`]: what the pipeline hands its hits to and gets verdicts from.
//! It owns every decision about *when* and *where* hits are judged, none
//! about *how* (that is the scripts' and [`MemoryLimiter`]'s):
//! - the pending hits per (rule, key), and which may wait: those of clients
//!   far from every limit, from the counts Redis reported here and the hot
//!   marks of the other hosts ([`FleetNews`], `pending.rs`);
//! - the backend, Redis or the embedded store;
//! - with Redis, what happens when it does not answer (`redis.on_down`:
//!   the local fallback, or retries with backoff), using the [`Health`]
//!   it shares with the ban list;
//! - the round trip that may run apart while the pipeline reads on
//!   ([`Flight`]).

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::fallback::Fallback;
use super::pending::{Batch, HoldPolicy, Pending};
use super::{LimitError, MemoryLimiter, RedisLimiter, RuleLimit, Verdict};
use crate::config::{OnDown, Scope};
use crate::detect::Hit;
use crate::store::Health;

/// What the limiter counts, read by `status` and the metrics endpoint.
pub struct LimitCounters {
    /// Redis round trips made.
    pub round_trips: AtomicU64,
    /// Batches decided by the local fallback while Redis was down.
    pub local_decisions: AtomicU64,
    /// When a Redis attempt last failed (unix ms): retrying is progress,
    /// which the watchdog must tell from a pipeline stuck in one flush.
    pub failed_at_ms: AtomicI64,
    /// Seconds per Redis round trip.
    pub roundtrip: Histogram,
    /// Hosts counted as sharing the fleet's windows.
    pub fleet_hosts: AtomicU64,
    /// (rule, client) marked hot.
    pub hot_clients: AtomicU64,
    /// The embedded windows (the store's, or the fallback's while Redis is
    /// down): bytes held, keys, the bound (`safety.max_client_state`), and
    /// the keys shed to stay within it in how many sheds.
    pub state_bytes: AtomicU64,
    pub state_keys: AtomicU64,
    pub state_max: AtomicU64,
    pub shed_keys: AtomicU64,
    pub sheds: AtomicU64,
    /// The last counts the pipeline keeps per (rule, client) to order its
    /// round trips (`daemon/order.rs`), within their share of the bound.
    pub order_bytes: AtomicU64,
    pub order_keys: AtomicU64,
}

impl Default for LimitCounters {
    fn default() -> LimitCounters {
        LimitCounters {
            round_trips: AtomicU64::new(0),
            local_decisions: AtomicU64::new(0),
            failed_at_ms: AtomicI64::new(0),
            roundtrip: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            fleet_hosts: AtomicU64::new(0),
            hot_clients: AtomicU64::new(0),
            state_bytes: AtomicU64::new(0),
            state_keys: AtomicU64::new(0),
            state_max: AtomicU64::new(0),
            shed_keys: AtomicU64::new(0),
            sheds: AtomicU64::new(0),
            order_bytes: AtomicU64::new(0),
            order_keys: AtomicU64::new(0),
        }
    }
}

enum Backend {
    Memory(MemoryLimiter),
    Redis {
        limiter: RedisLimiter,
        health: Health,
        fallback: Fallback,
    },
}

/// A client whose count under a rule reached half its limit, hot until
/// `until_ms` (unix ms): what the hosts tell each other so that none keeps
/// its hits unsent (`pending.rs`, `fleet::publish_hot`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct HotKey {
    pub rule: String,
    pub key: IpNet,
    pub until_ms: i64,
}

/// What the fleet tells the limiter (from the fleet sync).
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FleetNews {
    /// At start and every reconcile: the hosts registered, every live mark.
    Snapshot { hosts: u32, hot: Vec<HotKey> },
    /// Marks another host published.
    Hot(Vec<HotKey>),
    /// A host registered for the first time: each one's share shrinks.
    Joined,
    /// The events stream cannot be followed until the next snapshot: marks
    /// may be missed, so nothing waits.
    Lost,
}

pub struct Limiter {
    backend: Backend,
    pending: Pending,
    /// `redis.hold` in ms: how long batches far from their limit may wait
    /// at most (0 with the embedded store, which gains nothing from waiting).
    hold_ms: i64,
    /// Hosts counting `scope: fleet` windows: the registered ones, and at
    /// least `redis.fleet_size`.
    hosts: u32,
    fleet_size: u32,
    /// The limiter's monotonic clock (holds and their deadlines).
    started: Instant,
    counters: Arc<LimitCounters>,
    /// Rate limits the warning of calls Redis answered with an error.
    refused: crate::ratelog::Every,
    /// A quarter of `safety.max_client_state`, for the pipeline's counts.
    counts_bound: Option<usize>,
}

/// At most one warning per minute of calls Redis answered with an error.
const REFUSED_PERIOD: Duration = Duration::from_secs(60);

/// A limiter round trip run apart (see [`Limiter::flight`]).
pub struct Flight(RedisLimiter);

/// A [`Flight`]'s answer, for [`Limiter::land`].
pub struct Landed {
    batches: Vec<Batch>,
    verdicts: Vec<Verdict>,
    result: Result<(), LimitError>,
    trips: u64,
    elapsed: Duration,
}

impl Landed {
    /// Hits it carried.
    pub fn hits(&self) -> usize {
        self.batches.iter().map(|b| b.hits.len()).sum()
    }
}

impl Flight {
    pub async fn run(mut self, batches: Vec<Batch>) -> Landed {
        let started = std::time::Instant::now();
        let mut verdicts = Vec::with_capacity(batches.len());
        let result = self.0.check(&batches, &mut verdicts).await;
        Landed {
            batches,
            verdicts,
            result,
            trips: self.0.round_trips,
            elapsed: started.elapsed(),
        }
    }
}

impl Limiter {
    /// The embedded store: decides in process, holds nothing.
    pub fn memory(rules: Vec<RuleLimit>) -> Limiter {
        Limiter::new(Backend::Memory(MemoryLimiter::new(rules)), 0, 1, &[])
    }

    /// Redis, with `on_down` deciding while `health` says it is down.
    pub fn redis(limiter: RedisLimiter, health: Health, on_down: OnDown, fleet_size: u32, hold_ms: i64) -> Limiter {
        let rules = limiter.rules().to_vec();
        let fallback = Fallback::new(on_down, rules.clone(), fleet_size);
        let backend = Backend::Redis {
            limiter,
            health,
            fallback,
        };
        let mut l = Limiter::new(backend, hold_ms, fleet_size, &rules);
        // Until the fleet's marks are read (the first snapshot), nothing waits.
        l.pending.set_blind(true);
        l
    }

    fn new(backend: Backend, hold_ms: i64, fleet_size: u32, rules: &[RuleLimit]) -> Limiter {
        let mut l = Limiter {
            backend,
            pending: Pending::default(),
            hold_ms,
            hosts: fleet_size.max(1),
            fleet_size: fleet_size.max(1),
            started: Instant::now(),
            counters: Arc::default(),
            refused: crate::ratelog::Every::default(),
            counts_bound: None,
        };
        l.pending.set_policy(l.hold_policy(rules), None);
        if let Backend::Redis { .. } = l.backend {
            l.counters.fleet_hosts.store(u64::from(l.hosts), Relaxed);
        }
        l
    }

    /// Bounds the per-client state to `max` bytes (`safety.max_client_state`):
    /// the embedded windows (the store's, or the fallback's) to 3/4 of it;
    /// the rest is the pipeline's ([`Limiter::counts_bound`]).
    pub fn with_memory_bound(mut self, max: usize) -> Limiter {
        let counters = self.counters.clone();
        counters.state_max.store(max as u64, Relaxed);
        let windows = max - max / 4;
        match &mut self.backend {
            Backend::Memory(m) => m.bound(windows, counters),
            Backend::Redis { fallback, .. } => fallback.local.bound(windows, counters),
        }
        self.counts_bound = Some(max / 4);
        self
    }

    /// The share of the bound left for the counts the pipeline keeps
    /// (`daemon/order.rs`), if bounded.
    pub fn counts_bound(&self) -> Option<usize> {
        self.counts_bound
    }

    /// When each rule's batches may wait (`pending.rs`): with Redis, within
    /// a share of half the limit per host (a prefilter's screened hits are
    /// not in the counts Redis reports); nothing with the embedded store.
    fn hold_policy(&self, rules: &[RuleLimit]) -> Vec<HoldPolicy> {
        match self.backend {
            Backend::Memory(_) => Vec::new(),
            Backend::Redis { .. } => rules
                .iter()
                .map(|l| {
                    let fleet = l.scope == Scope::Fleet;
                    let hosts = if fleet { self.hosts } else { 1 };
                    HoldPolicy::new(self.hold_ms, l.hits, 2 * l.prefilter, l.window_ms, hosts, fleet)
                })
                .collect(),
        }
    }

    fn rules(&self) -> &[RuleLimit] {
        match &self.backend {
            Backend::Memory(m) => m.rules(),
            Backend::Redis { limiter, .. } => limiter.rules(),
        }
    }

    /// What the fleet said: hot marks (their batches here go with the next
    /// flush), hosts joining (every share shrinks), or that marks may have
    /// been missed (nothing waits until the next snapshot).
    pub fn news(&mut self, news: FleetNews) {
        let hot = match news {
            FleetNews::Snapshot { hosts, hot } => {
                self.set_hosts(hosts);
                self.pending.set_blind(false);
                hot
            }
            FleetNews::Hot(hot) => hot,
            FleetNews::Joined => {
                self.set_hosts(self.hosts.saturating_add(1));
                return;
            }
            FleetNews::Lost => {
                self.pending.set_blind(true);
                return;
            }
        };
        let (mono, wall) = (self.mono_ms(), crate::now_ms());
        for h in hot {
            if let Some(rule) = self.rules().iter().position(|r| r.name == h.rule) {
                self.pending.mark_hot(rule, h.key, mono + (h.until_ms - wall));
            }
        }
        self.counters.hot_clients.store(self.pending.hot() as u64, Relaxed);
    }

    fn set_hosts(&mut self, hosts: u32) {
        let hosts = hosts.max(self.fleet_size);
        if hosts != self.hosts {
            self.hosts = hosts;
            self.counters.fleet_hosts.store(u64::from(hosts), Relaxed);
            let policy = self.hold_policy(self.rules());
            self.pending.set_policy(policy, None);
        }
    }

    /// The hot marks made here since the last call, for the fleet.
    pub fn take_hot(&mut self) -> Vec<HotKey> {
        let fresh = self.pending.take_fresh();
        if fresh.is_empty() {
            return Vec::new();
        }
        let (mono, wall) = (self.mono_ms(), crate::now_ms());
        let rules = self.rules();
        fresh
            .into_iter()
            .filter_map(|(rule, key, until)| {
                Some(HotKey {
                    rule: rules.get(rule)?.name.clone(),
                    key,
                    until_ms: wall + (until - mono),
                })
            })
            .collect()
    }

    pub fn counters(&self) -> Arc<LimitCounters> {
        self.counters.clone()
    }

    /// The limiter's monotonic clock in ms, for [`Limiter::push`].
    pub fn mono_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Queues a hit read from chunk `seq`, at [`Limiter::mono_ms`] `now`.
    #[inline]
    pub fn push(&mut self, rule: usize, key: IpNet, hit: Hit, seq: u64, now: i64) {
        self.pending.push(rule, key, hit, seq, now);
    }

    /// Hits waiting to be judged.
    pub fn pending_hits(&self) -> usize {
        self.pending.hits()
    }

    /// The chunk sequence number of the oldest hit still waiting: chunks
    /// from it on may not be committed yet.
    pub fn oldest_seq(&mut self) -> Option<u64> {
        self.pending.oldest_seq()
    }

    /// When the next held batch must go, if any is held.
    pub fn next_deadline(&mut self) -> Option<Instant> {
        let ms = self.pending.next_deadline()?;
        Some(self.started + Duration::from_millis(ms.max(0) as u64))
    }

    /// Idle: forgets what says nothing any more and gives back the room a
    /// burst took. True if room was given back.
    pub fn release(&mut self) -> bool {
        let now = self.mono_ms();
        self.pending.release(now)
    }

    /// The batches to judge now: every one if `all`, else the urgent ones
    /// and those whose hold is over; none of a key `busy` says is in a
    /// round trip still (they stay pending, in order).
    pub fn take(&mut self, all: bool, busy: impl Fn(&IpNet) -> bool) -> Vec<Batch> {
        let now = self.mono_ms();
        self.pending.take_ready(now, all, busy)
    }

    /// Hits [`Limiter::take`] would give now, counted up to `enough`.
    pub fn ready_hits(&self, enough: usize) -> usize {
        self.pending.ready_hits(self.mono_ms(), enough)
    }

    /// With Redis answering: a limiter for one round trip run apart, so
    /// the next chunks are read meanwhile; its [`Landed`] goes to
    /// [`Limiter::land`]. None otherwise (the embedded store, Redis known
    /// down, the benchmark baseline): judge with [`Limiter::decide`].
    pub fn flight(&self) -> Option<Flight> {
        match &self.backend {
            Backend::Redis { limiter, health, .. } if !health.is_down() && !limiter.one_call_per_hit => {
                Some(Flight(limiter.for_flight()))
            }
            _ => None,
        }
    }

    /// Takes a [`Flight`]'s answer; what it could not decide is decided as
    /// [`Limiter::decide`] does. The batches and their verdicts, or None if
    /// asked to stop meanwhile.
    pub async fn land(&mut self, l: Landed, shutdown: &CancellationToken) -> Option<(Vec<Batch>, Vec<Verdict>)> {
        if let Backend::Redis { limiter, .. } = &mut self.backend {
            limiter.round_trips += l.trips;
        }
        let mut verdicts = l.verdicts;
        match l.result {
            Ok(()) => {
                self.observe(l.trips, l.elapsed);
                self.answered();
            }
            Err(e) => {
                if !self.decide_rest(&l.batches, &mut verdicts, shutdown, Some(e)).await {
                    return None;
                }
            }
        }
        self.learn(&l.batches, &verdicts);
        Some((l.batches, verdicts))
    }

    /// One verdict per batch, in order: Redis (or the embedded store);
    /// while Redis is down, the local fallback (`on_down: local`) or
    /// retries with backoff until it answers (`pause`). None if asked to
    /// stop meanwhile (nothing decided is lost: members and offsets make
    /// resending idempotent, docs/design.md §2; the bucket and the counter
    /// skip only a batch resent as it was).
    pub async fn decide(&mut self, batches: &[Batch], shutdown: &CancellationToken) -> Option<Vec<Verdict>> {
        let mut verdicts = Vec::with_capacity(batches.len());
        if !self.decide_rest(batches, &mut verdicts, shutdown, None).await {
            return None;
        }
        self.learn(batches, &verdicts);
        Some(verdicts)
    }

    /// Decides `batches` from `verdicts.len()` on, appending to `verdicts`.
    /// `failed`: the error a first attempt already met. False if asked to
    /// stop meanwhile.
    async fn decide_rest(
        &mut self,
        batches: &[Batch],
        verdicts: &mut Vec<Verdict>,
        shutdown: &CancellationToken,
        mut failed: Option<LimitError>,
    ) -> bool {
        let mut backoff = Duration::from_millis(50);
        while verdicts.len() < batches.len() {
            let done = verdicts.len();
            let (limiter, health, fallback) = match &mut self.backend {
                Backend::Memory(m) => {
                    let now = crate::now_ms();
                    verdicts.extend(batches[done..].iter().map(|b| m.check(b.rule, b.key, &b.hits, now)));
                    return true;
                }
                Backend::Redis {
                    limiter,
                    health,
                    fallback,
                } => (limiter, health, fallback),
            };
            // Known down in `local` mode: decide here until the retry is due.
            if failed.is_none() && fallback.mode == OnDown::Local && !health.due() {
                decide_locally(fallback, &batches[done..], verdicts, &self.counters);
                return true;
            }
            let result = match failed.take() {
                Some(e) => Err(e),
                None => {
                    let (started, trips) = (std::time::Instant::now(), limiter.round_trips);
                    let r = limiter.check(&batches[done..], verdicts).await;
                    let trips = limiter.round_trips - trips;
                    if r.is_ok() {
                        self.observe(trips, started.elapsed());
                    }
                    r
                }
            };
            let Err(e) = result else {
                self.answered();
                return true;
            };
            let Backend::Redis { health, fallback, .. } = &mut self.backend else {
                return true;
            };
            self.counters.failed_at_ms.store(crate::now_ms(), Relaxed);
            let n = health.count_error();
            let outage = !matches!(&e, LimitError::Redis(r) if !crate::store::is_outage(r));
            if !outage {
                // Redis answered with an error (OOM, a script error): this
                // call's failure, not an outage. Its batches are decided as
                // `on_down` says; the next call asks Redis again.
                if health.succeeded() {
                    tracing::info!("Redis answers again; deciding with the fleet's windows.");
                }
                if let Some(held) = self.refused.note(1, REFUSED_PERIOD) {
                    let oom = matches!(&e, LimitError::Redis(r) if crate::store::is_oom(r));
                    let error = crate::ratelog::cap_error(&e.to_string()).into_owned();
                    if oom {
                        tracing::warn!(%error, refused = held,
                            "Redis is out of memory (maxmemory reached, maxmemory-policy noeviction): window scripts refused; those hits decided as redis.on_down says. Raise maxmemory or free memory.");
                    } else {
                        tracing::warn!(%error, refused = held,
                            "Redis refused a window script call (an error, not an outage); those hits decided as redis.on_down says.");
                    }
                }
            }
            let started = outage && health.failed();
            if fallback.mode == OnDown::Local {
                if started {
                    tracing::warn!(error = %e, errors = n + 1, "Redis unreachable; limiting locally (limits / fleet_size) until it answers.");
                }
                decide_locally(fallback, &batches[verdicts.len()..], verdicts, &self.counters);
                return true;
            }
            if n < 5 || n.is_power_of_two() {
                tracing::warn!(error = %e, errors = n + 1, "Limiter unreachable; hits kept, retrying.");
            }
            tokio::select! {
                _ = tokio::time::sleep(backoff) => {}
                _ = shutdown.cancelled() => return false,
            }
            backoff = (backoff * 2).min(Duration::from_secs(2));
        }
        true
    }

    /// Redis answered: the outage, if any, is over.
    fn answered(&mut self) {
        if let Backend::Redis { health, .. } = &self.backend {
            if health.succeeded() {
                tracing::info!("Redis answers again; deciding with the fleet's windows.");
            }
        }
    }

    fn observe(&self, trips: u64, elapsed: Duration) {
        if trips > 0 {
            let per_trip = elapsed.as_secs_f64() / trips as f64;
            (0..trips).for_each(|_| self.counters.roundtrip.observe(per_trip));
        }
    }

    /// What each verdict says of its (rule, key): how close it is to its
    /// limit, which decides whether its next hits may wait. Publishes the
    /// round trips made so far.
    fn learn(&mut self, batches: &[Batch], verdicts: &[Verdict]) {
        if let Backend::Redis { limiter, .. } = &self.backend {
            self.counters.round_trips.store(limiter.round_trips, Relaxed);
        }
        let now = self.mono_ms();
        for (b, v) in batches.iter().zip(verdicts) {
            let count = match v {
                Verdict::Over { .. } => None,
                Verdict::Under { count } => Some(*count),
            };
            self.pending.learn(b.rule, b.key, count, now);
        }
        self.counters.hot_clients.store(self.pending.hot() as u64, Relaxed);
    }

    /// New rules (SIGHUP), with nothing pending: windows are kept by rule
    /// name, the fallback's too.
    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        let policy = self.hold_policy(&rules);
        let remap: Vec<Option<usize>> = self
            .rules()
            .iter()
            .map(|old| rules.iter().position(|r| r.name == old.name))
            .collect();
        self.pending.set_policy(policy, Some(&remap));
        match &mut self.backend {
            Backend::Memory(m) => m.set_rules(rules),
            Backend::Redis { limiter, fallback, .. } => {
                fallback.set_rules(rules.clone());
                limiter.set_rules(rules);
            }
        }
    }

    /// What the embedded store counts of `key` under each rule at `now`
    /// (`MemoryLimiter::peek`); None with Redis (read there instead).
    pub fn peek(&self, key: &IpNet, now: i64) -> Option<Vec<(RuleLimit, u64)>> {
        match &self.backend {
            Backend::Memory(m) => Some(
                m.rules()
                    .iter()
                    .enumerate()
                    .map(|(i, r)| (r.clone(), m.peek(i, key, now)))
                    .collect(),
            ),
            Backend::Redis { .. } => None,
        }
    }

    /// An unbanned address starts fresh windows: the embedded store's and
    /// the fallback's are forgotten here (in Redis `fleetban unban` deleted
    /// them before the event).
    pub fn forget(&mut self, key: &IpNet) {
        match &mut self.backend {
            Backend::Memory(m) => m.forget(key),
            Backend::Redis { fallback, .. } => fallback.local.forget(key),
        }
    }
}

/// Decides `batches` with the in-process fallback, appending to `out`.
fn decide_locally(f: &mut Fallback, batches: &[Batch], out: &mut Vec<Verdict>, counters: &LimitCounters) {
    let now = crate::now_ms();
    out.extend(batches.iter().map(|b| f.local.check(b.rule, b.key, &b.hits, now)));
    counters.local_decisions.fetch_add(batches.len() as u64, Relaxed);
}
