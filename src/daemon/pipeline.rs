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

use super::enforcer::Change;
use super::stats::Stats;
use crate::bans::{BanCache, BanList, BanRequest, Mode, Outcome, SafetyValve, Until};
use crate::config::{BanPolicy, Clock};
use crate::detect::{self, AllowList, Group, Hit, Pending, Plan};
use crate::enforce::Element;
use crate::limit::{Limiter, Verdict};
use crate::source::{Chunk, FileId, OffsetStore};

/// Hits gathered before a flush is forced even if more chunks are waiting.
const MAX_PENDING_HITS: usize = 65_536;

/// What the pipeline needs of one rule.
pub struct RuleInfo {
    pub name: String,
    pub window_ms: i64,
    pub clock: Clock,
    pub ban: BanPolicy,
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
    /// Chunks whose hits are pending: (path, file, end offset) to commit after the flush.
    pub uncommitted: Vec<(Arc<Path>, FileId, u64)>,
}

impl Pipeline {
    pub async fn run(mut self, mut chunks: Receiver<Chunk>, shutdown: CancellationToken) {
        let mut last_save = tokio::time::Instant::now();
        loop {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                u = self.updates.recv() => match u {
                    Some(u) => self.update(u),
                    None => continue,
                },
                c = chunks.recv() => match c {
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
                // Idle: offsets committed by the last flush still get saved.
                _ = tokio::time::sleep(Duration::from_secs(1)) => {}
            }
            while let Ok(u) = self.updates.try_recv() {
                self.update(u);
            }
            if !self.flush(&shutdown).await {
                break;
            }
            if last_save.elapsed() >= Duration::from_secs(1) {
                self.save_offsets();
                last_save = tokio::time::Instant::now();
            }
        }
        // Hits already read are committed before stopping; offsets saved.
        while let Ok(c) = chunks.try_recv() {
            self.ingest(&c);
        }
        let last = CancellationToken::new();
        let _ = tokio::time::timeout(Duration::from_secs(2), self.flush(&last)).await;
        self.save_offsets();
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
            Change::Remove(nets) => nets.iter().for_each(|n| self.cache.remove(n)),
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
        let plan = &self.plan;
        let groups = self
            .routes
            .entry(chunk.path.clone())
            .or_insert_with(|| plan.groups_for(&chunk.path));
        let (mut lines, mut unparsed, mut stale) = (0u64, 0u64, 0u64);
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
                let key = detect::client_key(req.addr, self.ipv6_prefix);
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
                    self.stats.rules[ri].hits.fetch_add(1, Relaxed);
                    self.pending.push(
                        ri,
                        key,
                        Hit {
                            time_ms: time,
                            member: detect::member(origin, offset),
                        },
                    );
                }
            }
            if !parsed {
                unparsed += 1;
            }
        }
        self.stats.lines.fetch_add(lines, Relaxed);
        self.stats.unparsed.fetch_add(unparsed, Relaxed);
        self.stats.stale.fetch_add(stale, Relaxed);
        self.stats.skipped_long.fetch_add(chunk.skipped_long, Relaxed);
        if let Some(t) = last_time {
            self.stats.lag_ms.store((wall - t).max(0), Relaxed);
        }
        self.stats.source(&chunk.path.to_string_lossy(), chunk.end(), lines);
        self.uncommitted.push((chunk.path.clone(), chunk.file, chunk.end()));
    }

    /// Sends everything pending to the limiter, bans what went over, commits
    /// offsets. Retries while Redis is unreachable; false if asked to stop
    /// meanwhile (nothing committed: those lines are read again next start).
    async fn flush(&mut self, shutdown: &CancellationToken) -> bool {
        if self.pending.is_empty() {
            self.commit();
            return true;
        }
        let batches = self.pending.take();
        let mut backoff = Duration::from_millis(50);
        let mut verdicts = Vec::with_capacity(batches.len());
        loop {
            let done = verdicts.len();
            match self.limiter.check(&batches[done..], &mut verdicts).await {
                Ok(()) => {
                    self.stats.redis_connected.store(true, Relaxed);
                    break;
                }
                Err(e) => {
                    let n = self.stats.redis_errors.fetch_add(1, Relaxed);
                    self.stats.redis_connected.store(false, Relaxed);
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
        if let Limiter::Redis(r) = &self.limiter {
            self.stats.round_trips.store(r.round_trips, Relaxed);
        }
        for (b, v) in batches.iter().zip(verdicts) {
            if let Verdict::Over { index, count } = v {
                self.ban(b.rule, b.key, b.hits[index].time_ms, count + 1).await;
            }
        }
        self.commit();
        true
    }

    fn commit(&mut self) {
        for (path, file, end) in self.uncommitted.drain(..) {
            self.offsets.commit(&path, file, end);
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
        let outcome = self.bans.lock().await.ban(&req, now).await;
        let until = match outcome {
            Ok(Outcome::Banned(rec)) => {
                self.stats.bans.fetch_add(1, Relaxed);
                self.stats.rules[rule].bans.fetch_add(1, Relaxed);
                tracing::info!(rule = %info.name, addr = %crate::store::AddrText(&key), hits,
                    at = %crate::rfc3339(at_ms), until = %rec.until.map_or("forever".into(), crate::rfc3339),
                    count = rec.count, "Banned.");
                rec.until()
            }
            Ok(Outcome::AlreadyBanned(u)) => u,
            Err(e) => {
                // The list is unreachable: enforce here at once for the base duration.
                self.stats.redis_errors.fetch_add(1, Relaxed);
                tracing::warn!(rule = %info.name, addr = %key, error = %e, "Ban list unreachable; banning locally.");
                Until::At(now + info.ban.duration_ms)
            }
        };
        self.cache.insert(key, until);
        self.stats.bans_active.store(self.cache.len() as u64, Relaxed);
        let _ = self.changes.send(Change::Add(vec![Element { net: key, until }]));
    }
}
