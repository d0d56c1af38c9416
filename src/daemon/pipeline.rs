//! The ingest task: chunks of lines in, bans out. For each chunk it parses
//! every line once per format, asks each rule whether it is a hit, and queues
//! the hit under its (rule, client key). It then flushes: one limiter call
//! for everything pending (one Redis round trip), bans for the verdicts over
//! the limit, and only then the offsets of those lines are committed, so a
//! crash re-reads rather than skips. While a flush is in flight, chunks wait
//! in the follower's bounded channel: that is the backpressure.

use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::mpsc::{Receiver, UnboundedReceiver, UnboundedSender};
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::enforce::Change;
use super::stats::{RuleCounters, Stats};
use crate::bans::{BanCache, BanList, BanRequest, Mode, Outcome, SafetyValve};
use crate::config::OnDown;
use crate::config::{BanPolicy, Clock};
use crate::detect::{self, AllowList, Batch, Group, Hit, Pending, Plan};
use crate::enforce::{Element, Until};
use crate::fleet::outage::Outage;
use crate::limit::{Limiter, Verdict};
use crate::source::{Chunk, FileId, OffsetStore};

/// Hits gathered before a flush is forced even if more chunks are waiting.
const MAX_PENDING_HITS: usize = 65_536;
/// Hits held (see `detect::Pending`) before every one is sent regardless.
const MAX_HELD_HITS: usize = 4 * MAX_PENDING_HITS;

/// A limiter round trip's answer.
pub struct Landed {
    batches: Vec<Batch>,
    verdicts: Vec<Verdict>,
    result: Result<(), crate::limit::LimitError>,
    trips: u64,
    elapsed: Duration,
}

/// What the pipeline needs of one rule.
pub struct RuleInfo {
    pub name: String,
    pub window_ms: i64,
    pub clock: Clock,
    pub ban: BanPolicy,
    /// This rule's counters in `Stats` (kept across reloads by name).
    pub counters: Arc<RuleCounters>,
}

/// A new set of rules to run from now on (SIGHUP). The pipeline first
/// handles every chunk already read and flushes them under the old rules,
/// then swaps, then answers on `done`.
pub struct Reload {
    pub rules: Vec<RuleInfo>,
    pub plan: Plan,
    pub limits: Vec<crate::limit::RuleLimit>,
    pub done: tokio::sync::oneshot::Sender<()>,
}

pub struct Pipeline {
    pub host: String,
    pub rules: Vec<RuleInfo>,
    pub plan: Plan,
    /// Which groups read each file seen so far (a file matched by several
    /// rules' paths or globs is read once and fanned out to all of them).
    pub routes: std::collections::HashMap<Arc<Path>, Vec<Group>>,
    pub allow: AllowList,
    pub ipv6_prefix: u8,
    pub limiter: Limiter,
    /// Shared with the control socket (manual bans without Redis).
    pub bans: Arc<Mutex<BanList>>,
    pub valve: SafetyValve,
    /// To the enforcer task.
    pub changes: UnboundedSender<Change>,
    /// From the fleet and the control socket: keeps `cache` equal to the list.
    pub updates: UnboundedReceiver<Change>,
    pub offsets: Arc<OffsetStore>,
    pub stats: Arc<Stats>,
    pub cache: BanCache,
    pub pending: Pending,
    /// `redis.hold` in ms: how long batches far from their limits may wait
    /// (with Redis only; the embedded store gains nothing from waiting).
    pub hold_ms: i64,
    /// Chunks whose hits may be pending: (sequence number, path, file, end
    /// offset), committed once no hit of theirs is pending.
    pub uncommitted: std::collections::VecDeque<(u64, Arc<Path>, FileId, u64)>,
    /// Sequence number of the last chunk ingested.
    pub seq: u64,
    /// The pipeline's monotonic clock (holds and their deadlines).
    pub started: tokio::time::Instant,
    /// The limiter round trip in flight, if any (with Redis up: parsing the
    /// next chunks overlaps it). At most one: a flush is judged only after
    /// the bans of the one before it are known.
    pub inflight: Option<tokio::task::JoinHandle<Landed>>,
    /// With Redis: what to do while it is down (`redis.on_down`).
    pub outage: Option<Outage>,
    /// New rules from the daemon (SIGHUP).
    pub reloads: UnboundedReceiver<Reload>,
    /// At most one warning a minute about unparsed lines.
    pub unparsed_warn: super::ratelog::Every,
}

impl Pipeline {
    pub async fn run(mut self, mut chunks: Receiver<Chunk>, shutdown: CancellationToken) {
        let mut last_save = tokio::time::Instant::now();
        loop {
            let retry = self.outage.as_ref().and_then(Outage::next_attempt);
            let held = self
                .pending
                .next_deadline()
                .map(|ms| self.started + Duration::from_millis(ms.max(0) as u64));
            // While a round trip is in flight, chunks are parsed into pending
            // hits, up to a bound: then the follower's channel fills (backpressure).
            let accepting = self.inflight.is_none() || self.pending.hits() < MAX_HELD_HITS;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                landed = join_opt(&mut self.inflight) => {
                    self.inflight = None;
                    if !self.land(landed, &shutdown).await {
                        break;
                    }
                }
                _ = sleep_until_opt(retry) => {}
                _ = sleep_until_opt(held) => {}
                u = self.updates.recv() => match u {
                    Some(u) => self.update(u),
                    None => continue,
                },
                r = self.reloads.recv() => match r {
                    Some(r) => {
                        if !self.reload(r, &mut chunks, &shutdown).await {
                            break;
                        }
                        continue;
                    }
                    None => continue,
                },
                c = chunks.recv(), if accepting => match c {
                    Some(c) => {
                        self.ingest(&c);
                        while self.pending.hits() < MAX_PENDING_HITS {
                            match chunks.try_recv() {
                                Ok(c) => self.ingest(&c),
                                Err(_) => break,
                            }
                        }
                    }
                    None => break,
                },
                // Idle: offsets committed by the last flush still get saved,
                // and a burst's tables are given back.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {
                    if self.inflight.is_none() && self.pending.release(self.mono_ms()) {
                        super::trim_heap();
                    }
                }
            }
            self.stats.busy_since_ms.store(crate::now_ms(), Relaxed);
            while let Ok(u) = self.updates.try_recv() {
                self.update(u);
            }
            if self.inflight.is_none() {
                self.recover().await;
                if !self.launch_or_flush(&shutdown).await {
                    break;
                }
            }
            self.stats.held_hits.store(self.pending.hits() as u64, Relaxed);
            if last_save.elapsed() >= Duration::from_secs(1) {
                self.save_offsets();
                last_save = tokio::time::Instant::now();
            }
            self.stats.busy_since_ms.store(0, Relaxed);
        }
        // Hits already read are committed before stopping; offsets saved.
        let last = CancellationToken::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.land_inflight(&last)).await;
        while let Ok(c) = chunks.try_recv() {
            self.ingest(&c);
        }
        let _ = tokio::time::timeout(Duration::from_secs(2), self.flush(&last, true)).await;
        self.save_offsets();
    }

    /// While down, or with bans waiting: when due, tries Redis again and
    /// writes the queued bans (each with the time it was decided).
    async fn recover(&mut self) {
        let Some(o) = &mut self.outage else { return };
        if !o.due() || (!o.is_down() && o.queued() == 0) {
            return;
        }
        let mut list = self.bans.lock().await;
        if o.is_down() {
            let ping: Result<String, _> = match &mut *list {
                BanList::Redis { con, .. } => redis::cmd("PING").query_async(con).await,
                BanList::Memory(_) => return,
            };
            if ping.is_err() {
                o.failed();
                return;
            }
            o.succeeded();
            self.stats.redis_connected.store(true, Relaxed);
            tracing::info!(
                queued = o.queued(),
                "Redis answers again; deciding with the fleet's windows."
            );
        }
        let now = crate::now_ms();
        while let Some((req, at, until)) = o.front() {
            if matches!(until, Until::At(t) if *t <= now) {
                o.pop();
                continue;
            }
            match list.ban(req, *at).await {
                Ok(out) => {
                    let until = match out {
                        Outcome::Banned(rec) => rec.until(),
                        Outcome::AlreadyBanned(u) => u,
                    };
                    let net = req.addr;
                    o.pop();
                    self.cache.insert(net, until);
                    let _ = self.changes.send(Change::Add(vec![Element { net, until }]));
                }
                Err(e) => {
                    tracing::warn!(error = %e, queued = o.queued(), "Writing queued bans failed; retrying.");
                    o.failed();
                    self.stats.redis_connected.store(false, Relaxed);
                    break;
                }
            }
        }
        self.stats.ban_queue.store(o.queued() as u64, Relaxed);
    }

    /// Applies a [`Reload`]: what was read under the old rules is counted
    /// under them; windows live on in the limiter by rule name. False if
    /// asked to stop meanwhile.
    async fn reload(&mut self, r: Reload, chunks: &mut Receiver<Chunk>, shutdown: &CancellationToken) -> bool {
        if !self.land_inflight(shutdown).await {
            return false;
        }
        while let Ok(c) = chunks.try_recv() {
            self.ingest(&c);
        }
        if !self.flush(shutdown, true).await {
            return false;
        }
        self.save_offsets();
        self.rules = r.rules;
        self.plan = r.plan;
        self.routes.clear();
        self.pending
            .set_policy(hold_policy(&self.limiter, &r.limits, self.hold_ms));
        if let Some(o) = &mut self.outage {
            o.set_rules(r.limits.clone());
        }
        self.limiter.set_rules(r.limits);
        let _ = r.done.send(());
        true
    }

    fn save_offsets(&self) {
        if let Err(e) = self.offsets.save() {
            tracing::warn!(error = %e, "Saving log offsets failed.");
        }
    }

    fn update(&mut self, change: Change) {
        match change {
            Change::Add(elems) => {
                for e in elems {
                    self.cache.insert(e.net, e.until);
                }
            }
            Change::Remove(nets) => {
                for n in &nets {
                    self.cache.remove(n);
                    // An unban: the address starts a fresh window (in Redis
                    // `fleetban unban` deleted the windows before the event).
                    if let Limiter::Memory(m) = &mut self.limiter {
                        m.forget(n);
                    }
                    if let Some(o) = &mut self.outage {
                        o.local.forget(n);
                    }
                }
            }
            Change::Replace(elems) => self.cache.replace(elems.into_iter().map(|e| (e.net, e.until))),
        }
        self.cache.expire(crate::now_ms());
        self.stats.bans_active.store(self.cache.len() as u64, Relaxed);
    }

    /// Turns the lines of one chunk into pending hits. The hot path: no
    /// allocation per line, no lock, no I/O.
    fn ingest(&mut self, chunk: &Chunk) {
        let origin = detect::origin_seed(&self.host, &[chunk.file.dev, chunk.file.ino, chunk.file.fingerprint]);
        let wall = crate::now_ms();
        let mono = self.mono_ms();
        self.seq += 1;
        let seq = self.seq;
        let plan = &self.plan;
        let groups = self
            .routes
            .entry(chunk.path.clone())
            .or_insert_with(|| plan.groups_for(&chunk.path));
        let (mut lines, mut unparsed, mut stale) = (0u64, 0u64, 0u64);
        // Hits per rule, published once per chunk: no atomic per hit.
        let mut hits = vec![0u64; self.rules.len()];
        let mut last_time = None;
        for (offset, line) in chunk.lines() {
            if line.is_empty() {
                continue;
            }
            lines += 1;
            let mut parsed = false;
            for g in groups.iter() {
                let Some(req) = g.parser.parse(line) else { continue };
                parsed = true;
                if self.allow.contains(req.addr) {
                    continue;
                }
                let key = crate::addr::client_key(req.addr, self.ipv6_prefix);
                for &ri in &g.rules {
                    if !self.plan.filters[ri].accepts(&req) {
                        continue;
                    }
                    let rule = &self.rules[ri];
                    let time = match (rule.clock, req.time_ms) {
                        (Clock::Log, Some(t)) => t,
                        _ => wall,
                    };
                    last_time = Some(time);
                    if time <= wall - rule.window_ms {
                        stale += 1;
                        continue;
                    }
                    if self.cache.is_banned(&key, time) {
                        continue;
                    }
                    hits[ri] += 1;
                    self.pending.push(
                        ri,
                        key,
                        Hit {
                            time_ms: time,
                            member: detect::member(origin, offset),
                        },
                        seq,
                        mono,
                    );
                }
            }
            if !parsed {
                unparsed += 1;
            }
        }
        for (rule, n) in self.rules.iter().zip(hits) {
            if n > 0 {
                rule.counters.hits.fetch_add(n, Relaxed);
            }
        }
        self.stats.lines.fetch_add(lines, Relaxed);
        self.stats.unparsed.fetch_add(unparsed, Relaxed);
        if unparsed > 0 {
            if let Some(n) = self.unparsed_warn.note(unparsed, Duration::from_secs(60)) {
                tracing::warn!(path = %chunk.path.display(), unparsed = n,
                    "Lines no rule's format could parse (counted and skipped; at most one warning a minute).");
            }
        }
        self.stats.stale.fetch_add(stale, Relaxed);
        self.stats.skipped_long.fetch_add(chunk.skipped_long, Relaxed);
        if let Some(t) = last_time {
            self.stats.lag_ms.store((wall - t).max(0), Relaxed);
        }
        self.stats.source(
            &chunk.path.to_string_lossy(),
            chunk.end(),
            lines,
            last_time.map(|t| (wall - t).max(0)),
        );
        self.uncommitted
            .push_back((seq, chunk.path.clone(), chunk.file, chunk.end()));
    }

    fn mono_ms(&self) -> i64 {
        i64::try_from(self.started.elapsed().as_millis()).unwrap_or(i64::MAX)
    }

    /// Sends what is ready (everything if `all`; see `detect::Pending` for
    /// what may wait) to the limiter, bans what went over, commits the
    /// offsets of chunks with nothing pending. Retries while Redis is
    /// unreachable; false if asked to stop meanwhile (nothing committed:
    /// those lines are read again next start).
    async fn flush(&mut self, shutdown: &CancellationToken, all: bool) -> bool {
        let Some(batches) = self.ready(all) else {
            self.commit();
            return true;
        };
        let mut verdicts = Vec::with_capacity(batches.len());
        if !self.decide(&batches, &mut verdicts, shutdown, None).await {
            return false;
        }
        self.apply(&batches, verdicts).await;
        true
    }

    /// With Redis up: takes what is ready and starts its round trip without
    /// waiting for it, so that the next chunks are parsed while Redis works
    /// ([`Pipeline::land`] takes the answer). Otherwise a plain flush.
    async fn launch_or_flush(&mut self, shutdown: &CancellationToken) -> bool {
        let redis_up = self.outage.as_ref().is_none_or(|o| !o.is_down());
        let Limiter::Redis(r) = &self.limiter else {
            return self.flush(shutdown, false).await;
        };
        // The benchmark baseline is the textbook form: nothing overlaps.
        if !redis_up || r.one_call_per_hit {
            return self.flush(shutdown, false).await;
        }
        let mut lim = r.for_flight();
        let Some(batches) = self.ready(false) else {
            self.commit();
            return true;
        };
        let hits: usize = batches.iter().map(|b| b.hits.len()).sum();
        self.stats.inflight_hits.store(hits as u64, Relaxed);
        self.inflight = Some(tokio::spawn(async move {
            let started = std::time::Instant::now();
            let mut verdicts = Vec::with_capacity(batches.len());
            let result = lim.check(&batches, &mut verdicts).await;
            Landed {
                batches,
                verdicts,
                result,
                trips: lim.round_trips,
                elapsed: started.elapsed(),
            }
        }));
        true
    }

    /// The answer of the round trip in flight: bans and commits as a flush
    /// does; on error, decides the rest as a flush does (retries, outage
    /// fallback). False if asked to stop meanwhile.
    async fn land(&mut self, landed: Result<Landed, tokio::task::JoinError>, shutdown: &CancellationToken) -> bool {
        let l = match landed {
            Ok(l) => l,
            Err(e) => {
                // Only a panic gets here; those lines stay uncommitted.
                tracing::error!(error = %e, "A limiter round trip failed; its hits are read again at the next start.");
                return true;
            }
        };
        if let Limiter::Redis(r) = &mut self.limiter {
            r.round_trips += l.trips;
        }
        self.stats.inflight_hits.store(0, Relaxed);
        let mut verdicts = l.verdicts;
        match l.result {
            Ok(()) => {
                self.observe_round_trips(l.trips, l.elapsed);
                self.redis_answered();
            }
            Err(e) => {
                if !self.decide(&l.batches, &mut verdicts, shutdown, Some(e)).await {
                    return false;
                }
            }
        }
        self.apply(&l.batches, verdicts).await;
        true
    }

    /// Waits for the round trip in flight, if any, and applies its answer.
    async fn land_inflight(&mut self, shutdown: &CancellationToken) -> bool {
        match self.inflight.take() {
            Some(h) => {
                let landed = h.await;
                self.land(landed, shutdown).await
            }
            None => true,
        }
    }

    /// The batches to send now (all of them if `all`), without the hits of
    /// addresses banned since they were read; None if there are none.
    fn ready(&mut self, all: bool) -> Option<Vec<Batch>> {
        if self.pending.is_empty() {
            return None;
        }
        let mut batches = if all || self.pending.hits() >= MAX_HELD_HITS {
            self.pending.take()
        } else {
            self.pending.take_ready(self.mono_ms())
        };
        // A hit that waited may belong to an address banned meanwhile (by
        // another rule, or by the fleet): not counted, as at ingest.
        for b in &mut batches {
            if let Some(until) = self.cache.until(&b.key) {
                b.hits.retain(|h| until <= Until::At(h.time_ms));
            }
        }
        batches.retain(|b| !b.hits.is_empty());
        (!batches.is_empty()).then_some(batches)
    }

    fn observe_round_trips(&self, trips: u64, elapsed: Duration) {
        if trips > 0 {
            let per_trip = elapsed.as_secs_f64() / trips as f64;
            (0..trips).for_each(|_| self.stats.timings.redis_roundtrip.observe(per_trip));
        }
    }

    fn redis_answered(&mut self) {
        // The embedded limiter is no Redis: `redis.connected` stays false.
        self.stats
            .redis_connected
            .store(matches!(self.limiter, Limiter::Redis(_)), Relaxed);
        if let Some(o) = &mut self.outage {
            if o.succeeded() {
                tracing::info!(
                    queued = o.queued(),
                    "Redis answers again; deciding with the fleet's windows."
                );
            }
        }
    }

    /// Decides `batches` from `verdicts.len()` on, appending to `verdicts`:
    /// the limiter, retried while it is unreachable, or the outage fallback.
    /// `failed`: the error a first attempt already met. False if asked to
    /// stop meanwhile.
    async fn decide(
        &mut self,
        batches: &[Batch],
        verdicts: &mut Vec<Verdict>,
        shutdown: &CancellationToken,
        mut failed: Option<crate::limit::LimitError>,
    ) -> bool {
        let mut backoff = Duration::from_millis(50);
        loop {
            let done = verdicts.len();
            if done == batches.len() {
                break;
            }
            // Known down in `local` mode: decide here until the retry is due.
            if failed.is_none() {
                if let Some(o) = self.outage.as_mut().filter(|o| o.mode == OnDown::Local && !o.due()) {
                    decide_locally(o, &batches[done..], verdicts, &self.stats);
                    break;
                }
            }
            let result = match failed.take() {
                Some(e) => Err(e),
                None => {
                    let (started, trips) = (std::time::Instant::now(), self.round_trips());
                    let r = self.limiter.check(&batches[done..], verdicts).await;
                    if r.is_ok() {
                        self.observe_round_trips(self.round_trips().saturating_sub(trips), started.elapsed());
                    }
                    r
                }
            };
            match result {
                Ok(()) => {
                    self.redis_answered();
                    break;
                }
                Err(e) => {
                    self.stats.busy_since_ms.store(crate::now_ms(), Relaxed);
                    let n = self.stats.redis_errors.fetch_add(1, Relaxed);
                    self.stats.redis_connected.store(false, Relaxed);
                    if let Some(o) = self.outage.as_mut().filter(|o| o.mode == OnDown::Local) {
                        if o.failed() {
                            tracing::warn!(error = %e, "Redis unreachable; limiting locally (limits / fleet_size) until it answers.");
                        }
                        let done = verdicts.len();
                        decide_locally(o, &batches[done..], verdicts, &self.stats);
                        break;
                    }
                    if let Some(o) = &mut self.outage {
                        o.failed();
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
            }
        }
        true
    }

    /// Bans what went over, remembers the counts of the rest (for holding),
    /// commits the offsets of chunks with nothing pending.
    async fn apply(&mut self, batches: &[Batch], verdicts: Vec<Verdict>) {
        if let Limiter::Redis(r) = &self.limiter {
            self.stats.round_trips.store(r.round_trips, Relaxed);
        }
        let mono = self.mono_ms();
        for (b, v) in batches.iter().zip(verdicts) {
            match v {
                Verdict::Over { index, count } => {
                    self.pending.learn(b.rule, b.key, None, mono);
                    self.ban(b.rule, b.key, b.hits[index].time_ms, count + 1).await;
                }
                Verdict::Under { count } => self.pending.learn(b.rule, b.key, Some(count), mono),
            }
        }
        self.commit();
    }

    fn round_trips(&self) -> u64 {
        match &self.limiter {
            Limiter::Redis(r) => r.round_trips,
            Limiter::Memory(_) => 0,
        }
    }

    /// Commits the offsets of the chunks older than every pending hit.
    fn commit(&mut self) {
        let oldest = self.pending.oldest_seq().unwrap_or(u64::MAX);
        while let Some((seq, path, file, end)) = self.uncommitted.front() {
            if *seq >= oldest {
                break;
            }
            self.offsets.commit(path, *file, *end);
            self.uncommitted.pop_front();
        }
    }

    async fn ban(&mut self, rule: usize, key: IpNet, at_ms: i64, hits: u32) {
        let now = crate::now_ms();
        if self.cache.is_banned(&key, now) {
            return;
        }
        let info = &self.rules[rule];
        if !self.valve.admit(now) {
            let n = self.stats.refused.fetch_add(1, Relaxed);
            self.stats.valve_refused_at_ms.store(now, Relaxed);
            if n < 10 || n.is_power_of_two() {
                tracing::warn!(rule = %info.name, addr = %key, refused = n + 1,
                    "Safety valve: too many bans this minute; ban not applied.");
            }
            return;
        }
        let req = BanRequest {
            addr: key,
            rule: info.name.clone(),
            reason: format!(
                "{hits} hits within {}",
                humantime::format_duration(Duration::from_millis(info.window_ms as u64))
            ),
            host: self.host.clone(),
            hits,
            mode: Mode::Auto(info.ban),
        };
        // Known down: straight to the local ban and the queue, no timeout paid.
        let outcome = match &self.outage {
            Some(o) if o.is_down() && !o.due() => Err(crate::bans::BanListError::Reply("Redis is down".into())),
            _ => self.bans.lock().await.ban(&req, now).await,
        };
        let until = match outcome {
            Ok(Outcome::Banned(rec)) => {
                self.stats.bans.fetch_add(1, Relaxed);
                info.counters.bans.fetch_add(1, Relaxed);
                let duration = rec.until.map_or("permanent".into(), |u| {
                    humantime::format_duration(Duration::from_secs(((u - now).max(0) / 1000) as u64)).to_string()
                });
                tracing::info!(rule = %info.name, addr = %crate::addr::AddrText(&key), hits, duration = %duration,
                    at = %crate::rfc3339(at_ms), until = %rec.until.map_or("forever".into(), crate::rfc3339),
                    count = rec.count, "Banned.");
                rec.until()
            }
            Ok(Outcome::AlreadyBanned(u)) => u,
            Err(e) => {
                // The list is unreachable: enforce here at once for the base
                // duration; written to the list when Redis answers again.
                self.stats.redis_errors.fetch_add(1, Relaxed);
                self.stats.bans.fetch_add(1, Relaxed);
                info.counters.bans.fetch_add(1, Relaxed);
                tracing::warn!(rule = %info.name, addr = %key, error = %e, "Ban list unreachable; banning locally.");
                let until = Until::At(now + info.ban.duration_ms);
                if let Some(o) = &mut self.outage {
                    o.failed();
                    let dropped = o.dropped;
                    o.queue(req, now, until);
                    if o.dropped > dropped {
                        self.stats.ban_queue_dropped.fetch_add(1, Relaxed);
                    }
                    self.stats.ban_queue.store(o.queued() as u64, Relaxed);
                }
                until
            }
        };
        self.cache.insert(key, until);
        self.stats.bans_active.store(self.cache.len() as u64, Relaxed);
        let _ = self.changes.send(Change::Add(vec![Element { net: key, until }]));
    }
}

/// How long each rule's batches may wait: `hold_ms` with Redis, nothing
/// with the embedded store (no per-call cost to spread).
pub fn hold_policy(limiter: &Limiter, limits: &[crate::limit::RuleLimit], hold_ms: i64) -> Vec<detect::HoldPolicy> {
    match limiter {
        Limiter::Memory(_) => Vec::new(),
        Limiter::Redis(_) => limits
            .iter()
            .map(|l| detect::HoldPolicy::new(hold_ms, l.hits, 2 * l.prefilter, l.window_ms))
            .collect(),
    }
}

/// Decides `batches` with the in-process fallback, appending to `out`.
fn decide_locally(o: &mut Outage, batches: &[crate::detect::Batch], out: &mut Vec<Verdict>, stats: &Stats) {
    let now = crate::now_ms();
    out.extend(batches.iter().map(|b| o.local.check(b.rule, b.key, &b.hits, now)));
    stats.local_decisions.fetch_add(batches.len() as u64, Relaxed);
}

/// The answer of the round trip in flight; never, if none is.
async fn join_opt(h: &mut Option<tokio::task::JoinHandle<Landed>>) -> Result<Landed, tokio::task::JoinError> {
    match h {
        Some(h) => h.await,
        None => std::future::pending().await,
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
