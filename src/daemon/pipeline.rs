//! The ingest task: chunks of lines in, bans out. Its select loop takes
//! chunks (read into hits by `detect::Scanner`, queued in the `Limiter`),
//! the fleet's changes to the list, the control socket's ban commands and
//! reloads; after each wake-up it sends what is ready to the limiter — with
//! Redis up as a round trip in flight while the next chunks are read — has
//! `bans::Bans` apply what went over, and only then commits the offsets of
//! those lines, so a crash re-reads rather than skips. While a round trip
//! is in flight, chunks wait in the follower's bounded channel: that is
//! the backpressure. How a hit is judged, and what happens while Redis is
//! down, is the limiter's; how a ban is applied is `Bans`'. That a round
//! trip of many batches decides as `fleetban test` decides hit by hit, in
//! log order, is `order.rs`'s.

use std::cell::Cell;
use std::collections::{HashMap, HashSet, VecDeque};
use std::path::Path;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::mpsc::{Receiver, UnboundedReceiver, UnboundedSender};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use super::order::{Order, Pos, RuleOrder};
use super::ratelog::Every;
use super::sleep_until_opt;
use super::stats::{RuleCounters, Stats};
use crate::bans::{Applied, BanRequest, Bans, Mode, Unbannable};
use crate::config::BanPolicy;
use crate::control::{Request, Response};
use crate::detect::{self, Hit, Plan, Scanner, Sink};
use crate::enforce::{Change, Until};
use crate::limit::{Batch, FleetNews, HotKey, Landed, Limiter, RuleLimit, Verdict};
use crate::source::{Chunk, FileId, OffsetStore};

mod flight;
use flight::join_front;

/// Hits gathered before a flush is forced even if more chunks are waiting.
const MAX_PENDING_HITS: usize = 65_536;
/// Hits held (see `limit::Pending`) before every one is sent regardless.
const MAX_HELD_HITS: usize = 4 * MAX_PENDING_HITS;
/// Round trips in flight at most.
const MAX_IN_FLIGHT: usize = 2;
/// A second round trip starts while one is in flight only with this many
/// hits ready: below it, the next one carries them (fewer, fuller calls).
const SECOND_FLIGHT_HITS: usize = 2048;
/// No chunk for this long: the load is gone and nothing is gained by
/// keeping cold hits, which all go then (batching comes from load). The
/// tests that need hits kept on a quiet log set `FLEETBAN_IDLE_MS` (hidden).
const IDLE: Duration = Duration::from_millis(20);

fn idle() -> Duration {
    std::env::var("FLEETBAN_IDLE_MS")
        .ok()
        .and_then(|v| v.parse().ok())
        .map_or(IDLE, Duration::from_millis)
}

/// What the pipeline needs of one rule besides its filter and limit.
pub struct RuleInfo {
    pub name: String,
    pub window_ms: i64,
    pub ban: BanPolicy,
    /// The limit, for the reason of its bans (`Limit::reason`).
    pub limit: crate::config::Limit,
    /// This rule's counters in `Stats` (kept across reloads by name).
    pub counters: Arc<RuleCounters>,
    /// What keeps its batches in log order with the others' (`order.rs`).
    pub order: RuleOrder,
}

/// A new set of rules to run from now on (SIGHUP). The pipeline first
/// handles every chunk already read and flushes them under the old rules,
/// then swaps, then answers on `done`.
pub struct Reload {
    pub rules: Vec<RuleInfo>,
    pub plan: Plan,
    pub limits: Vec<RuleLimit>,
    /// What the new configuration lets no one ban.
    pub unbannable: Unbannable,
    pub done: oneshot::Sender<()>,
}

/// A control socket request about bans (`ban`, `unban`, `bans`), answered
/// by the pipeline, which owns them.
pub struct Command {
    pub request: Request,
    pub reply: oneshot::Sender<Response>,
}

/// What the pipeline listens to besides chunks.
pub struct Inputs {
    /// The fleet's changes to the list (events, reconciles).
    pub updates: UnboundedReceiver<Change>,
    pub commands: Receiver<Command>,
    pub reloads: UnboundedReceiver<Reload>,
    /// With Redis: what the fleet says of hot clients (`limit::FleetNews`).
    pub news: Option<UnboundedReceiver<FleetNews>>,
    /// With Redis: where this host's hot marks go, for the fleet.
    pub marks: Option<UnboundedSender<Vec<HotKey>>>,
}

pub struct Pipeline {
    /// Names, windows, ban policies and counters of the running rules.
    rules: Vec<RuleInfo>,
    /// The path of the first match of a `hits: 0` rule per (rule, key),
    /// until its ban names it ("first request for /.env"); at most
    /// [`FIRST_PATHS`], cleared on reload.
    first_paths: HashMap<(usize, IpNet), String>,
    /// Lines into hits.
    scanner: Scanner,
    /// Hits into verdicts (and when to send them).
    limiter: Limiter,
    /// Round trips decided in log order: the hits held back for the next
    /// one, the bans made with their place in the log.
    order: Order,
    /// The clients nearest their limits, from the verdicts (`fleetban top`).
    nearest: super::nearest::Nearest,
    /// Verdicts over the limit into bans; this host's view of the list.
    bans: Bans,
    inputs: Inputs,
    /// Where committed offsets go.
    offsets: Arc<OffsetStore>,
    stats: Arc<Stats>,
    /// Chunks whose hits may be pending: (sequence number, path, file, end
    /// offset), committed once no hit of theirs is pending.
    uncommitted: VecDeque<(u64, Arc<Path>, FileId, u64)>,
    /// Sequence number of the last chunk ingested.
    seq: u64,
    /// The limiter round trips in flight, oldest first, at most
    /// [`MAX_IN_FLIGHT`]; they land in that order. A key in one is in no
    /// other: its next hits wait for the bans of the one before.
    inflight: VecDeque<InFlight>,
    /// At most one warning a minute about unparsed lines.
    unparsed_warn: Every,
    stale_warn: Every,
    future_warn: Every,
    /// [`MAX_IN_FLIGHT`], or 1 for the benchmark's comparison.
    max_in_flight: usize,
    /// What no ban command may cover (None: unchecked, as in unit tests).
    unbannable: Option<Unbannable>,
    /// The host's never-banned set, read again every second
    /// (`set_own_addresses`), and its changes.
    own: Option<(
        Arc<crate::verdict::Own>,
        tokio::sync::watch::Receiver<Arc<crate::verdict::NeverBanned>>,
    )>,
    /// How long without a chunk counts as idle ([`IDLE`]).
    idle: Duration,
    /// When the input counts as idle if no chunk comes first.
    idle_at: Option<tokio::time::Instant>,
    /// The input went idle: everything kept goes with the next round trip.
    drain: bool,
}

/// A round trip in flight.
struct InFlight {
    handle: JoinHandle<Landed>,
    /// The keys it judges: none of them goes in another one meanwhile.
    keys: HashSet<IpNet, foldhash::fast::RandomState>,
    /// The chunk sequence number of the oldest hit pending when it left (a
    /// bound on its own oldest): chunks from it on are not committed yet.
    oldest_seq: u64,
    hits: usize,
    /// What its bans may cover, from where (`Order::risks_of`): a round
    /// trip leaving meanwhile holds back the hits they would cover.
    risks: Vec<(IpNet, Pos)>,
}

/// The daemon's sink: a hit waits in the limiter unless its client is
/// banned.
struct Ingest<'a> {
    /// The view of the list, read-locked for the chunk: no lock per hit,
    /// and nothing waits on it (the endpoint only reads; the one writer,
    /// the ban owner, runs after the scan).
    view: std::sync::RwLockReadGuard<'a, crate::bans::BanCache>,
    limiter: &'a mut Limiter,
    order: &'a mut Order,
    /// The address the scanner last asked about: it asks for each hit's
    /// address just before it gives the hit (`Scanner::scan`), and a
    /// `key: network` hit keeps it beside it (`Order::note`).
    asked: Cell<IpNet>,
    seq: u64,
    now: i64,
    first_paths: &'a mut HashMap<(usize, IpNet), String>,
}

impl Sink for Ingest<'_> {
    #[inline]
    fn is_banned(&self, key: &IpNet, time_ms: i64) -> bool {
        self.asked.set(*key);
        self.view.is_banned(key, time_ms)
    }

    #[inline]
    fn hit(&mut self, rule: usize, key: IpNet, hit: Hit) {
        if self.order.notes(rule) {
            self.order.note(rule, key, self.asked.get());
        }
        self.limiter.push(rule, key, hit, self.seq, self.now);
    }

    /// Keeps the first path only: a `hits: 0` rule bans on it.
    #[inline]
    fn first(&mut self, rule: usize, key: IpNet, path: &[u8]) {
        if self.first_paths.len() >= FIRST_PATHS {
            // Bans not decided (refused, lost): their paths go.
            self.first_paths.clear();
        }
        self.first_paths
            .entry((rule, key))
            .or_insert_with(|| crate::ratelog::cap(&String::from_utf8_lossy(path)).into_owned());
    }
}

/// At most this many paths wait for their `hits: 0` ban.
const FIRST_PATHS: usize = 4096;

impl Pipeline {
    pub fn new(
        rules: Vec<RuleInfo>,
        scanner: Scanner,
        limiter: Limiter,
        bans: Bans,
        inputs: Inputs,
        offsets: Arc<OffsetStore>,
        stats: Arc<Stats>,
    ) -> Pipeline {
        let mut order = Order::new(&rules);
        if let Some(max) = limiter.counts_bound() {
            order.bound(max, limiter.counters());
        }
        Pipeline {
            order,
            nearest: Default::default(),
            rules,
            scanner,
            limiter,
            bans,
            inputs,
            offsets,
            stats,
            uncommitted: VecDeque::new(),
            seq: 0,
            inflight: VecDeque::new(),
            unparsed_warn: Every::default(),
            stale_warn: Every::default(),
            future_warn: Every::default(),
            max_in_flight: MAX_IN_FLIGHT,
            unbannable: None,
            own: None,
            idle: idle(),
            idle_at: None,
            first_paths: HashMap::new(),
            drain: false,
        }
    }

    /// The host's addresses, read again every second: an address it takes
    /// later (DHCP, a VIP) is never counted from then on.
    pub fn set_own_addresses(&mut self, own: Arc<crate::verdict::Own>) {
        let rx = own.subscribe();
        self.own = Some((own, rx));
    }

    /// What no ban command may cover (`bans::Unbannable`).
    pub fn set_unbannable(&mut self, u: Unbannable) {
        self.unbannable = Some(u);
    }

    /// Round trips in flight at most (the benchmark's one-flight baseline).
    pub fn set_max_in_flight(&mut self, n: usize) {
        self.max_in_flight = n.max(1);
    }

    pub async fn run(mut self, mut chunks: Receiver<Chunk>, shutdown: CancellationToken) {
        let mut last_save = tokio::time::Instant::now();
        let (mut updates_open, mut commands_open, mut reloads_open) = (true, true, true);
        let mut news_open = self.inputs.news.is_some();
        loop {
            let retry = self.bans.next_attempt();
            let held = self.limiter.next_deadline();
            // While a round trip is in flight, chunks are parsed into pending
            // hits, up to a bound: then the follower's channel fills (backpressure).
            let accepting = self.inflight.is_empty() || self.limiter.pending_hits() < MAX_HELD_HITS;
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => break,
                landed = join_front(&mut self.inflight) => {
                    self.inflight.pop_front();
                    if !self.land(landed, &shutdown).await {
                        break;
                    }
                }
                _ = sleep_until_opt(retry) => {}
                _ = sleep_until_opt(held) => {}
                _ = sleep_until_opt(self.idle_at) => {
                    // Chunks waiting (backpressure) are load, not idleness.
                    if chunks.is_empty() {
                        self.idle_at = None;
                        self.drain = true;
                    } else {
                        self.idle_at = Some(tokio::time::Instant::now() + self.idle);
                    }
                }
                u = self.inputs.updates.recv(), if updates_open => match u {
                    Some(u) => self.update(u),
                    None => updates_open = false,
                },
                n = recv_opt(&mut self.inputs.news), if news_open => match n {
                    Some(n) => self.limiter.news(n),
                    None => news_open = false,
                },
                c = self.inputs.commands.recv(), if commands_open => match c {
                    Some(c) => self.command(c).await,
                    None => commands_open = false,
                },
                r = self.inputs.reloads.recv(), if reloads_open => match r {
                    Some(r) => {
                        if !self.reload(r, &mut chunks, &shutdown).await {
                            break;
                        }
                        continue;
                    }
                    None => reloads_open = false,
                },
                c = chunks.recv(), if accepting => match c {
                    Some(c) => {
                        self.idle_at = Some(tokio::time::Instant::now() + self.idle);
                        self.ingest(&c);
                        while self.limiter.pending_hits() < MAX_PENDING_HITS {
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
                    if self.inflight.is_empty() && self.limiter.release() {
                        super::trim_heap();
                    }
                }
            }
            self.stats.busy_since_ms.store(crate::now_ms(), Relaxed);
            while let Ok(u) = self.inputs.updates.try_recv() {
                self.update(u);
            }
            if let Some(news) = &mut self.inputs.news {
                while let Ok(n) = news.try_recv() {
                    self.limiter.news(n);
                }
            }
            if self.inflight.is_empty() {
                self.bans.recover().await;
                if !self.launch_or_flush(&shutdown).await {
                    break;
                }
            } else if self.inflight.len() < self.max_in_flight
                && self.limiter.ready_hits(SECOND_FLIGHT_HITS) >= SECOND_FLIGHT_HITS
            {
                self.launch();
            }
            let held = self.limiter.pending_hits() + self.order.held();
            self.stats.held_hits.store(held as u64, Relaxed);
            if last_save.elapsed() >= Duration::from_secs(1) {
                self.every_second();
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
        self.nearest.clear();
        self.first_paths.clear();
        self.order.set_rules(&self.rules);
        self.scanner.set_plan(r.plan);
        self.limiter.set_rules(r.limits);
        self.unbannable = Some(r.unbannable);
        let _ = r.done.send(());
        true
    }

    fn save_offsets(&mut self) {
        self.offsets.save_or_warn();
        self.bans.retry_save();
    }

    /// Once a second: the saves, and the host's addresses read again (the
    /// enforcer reads them too: whoever reads a change publishes it).
    fn every_second(&mut self) {
        self.save_offsets();
        self.bans.flush_log();
        self.order.prune(self.limiter.mono_ms());
        let names: Vec<(String, i64)> = self.rules.iter().map(|r| (r.name.clone(), r.window_ms)).collect();
        let near = self.nearest.report(&names, crate::now_ms());
        *self.stats.nearest.lock().unwrap_or_else(|e| e.into_inner()) = near;
        if let Some((own, rx)) = self.own.as_mut() {
            own.refresh();
            if rx.has_changed().unwrap_or(false) {
                self.scanner.set_allow(rx.borrow_and_update().clone());
            }
        }
    }

    /// The fleet changed the list: this host's view follows, and an
    /// unbanned address starts fresh windows.
    fn update(&mut self, change: Change) {
        self.bans.observe(&change);
        if let Change::Remove(nets) = &change {
            for n in nets {
                self.limiter.forget(n);
            }
        }
    }

    /// A ban command from the control socket (`control::command`).
    async fn command(&mut self, c: Command) {
        let windows: Vec<(&str, i64)> = self.rules.iter().map(|r| (r.name.as_str(), r.window_ms)).collect();
        let answer = super::control::command(
            &mut self.bans,
            &mut self.limiter,
            &windows,
            self.unbannable.as_ref(),
            c.request,
        )
        .await;
        let _ = c.reply.send(answer);
    }

    /// Turns the lines of one chunk into pending hits. The hot path: no
    /// allocation per line, no lock, no I/O.
    fn ingest(&mut self, chunk: &Chunk) {
        let origin = detect::origin_seed(
            self.bans.host(),
            &[chunk.file.dev, chunk.file.ino, chunk.file.fingerprint],
        );
        let wall = crate::now_ms();
        self.seq += 1;
        let mut sink = Ingest {
            view: self.bans.view_read(),
            now: self.limiter.mono_ms(),
            limiter: &mut self.limiter,
            order: &mut self.order,
            asked: Cell::new(IpNet::V4(Default::default())),
            seq: self.seq,
            first_paths: &mut self.first_paths,
        };
        let seen = self.scanner.scan(chunk, origin, wall, &mut sink);
        // Hits per rule, published once per chunk: no atomic per hit.
        for (rule, count) in self.rules.iter().zip(self.scanner.take_counts()) {
            if count.hits > 0 {
                rule.counters.hits.fetch_add(count.hits, Relaxed);
            }
            if count.lines > 0 {
                rule.counters.lines.fetch_add(count.lines, Relaxed);
                rule.counters.unparsed.fetch_add(count.unparsed, Relaxed);
            }
        }
        self.stats.lines.fetch_add(seen.lines, Relaxed);
        self.stats.unparsed.fetch_add(seen.unparsed, Relaxed);
        if seen.unparsed > 0 {
            if let Some(n) = self.unparsed_warn.note(seen.unparsed, Duration::from_secs(60)) {
                tracing::warn!(path = %chunk.path.display(), unparsed = n,
                    "Lines no rule's format could parse (counted and skipped; at most one warning a minute).");
            }
        }
        self.stats.stale.fetch_add(seen.stale, Relaxed);
        self.stats.future.fetch_add(seen.future, Relaxed);
        if seen.stale > 0 {
            if let Some(n) = self.stale_warn.note(seen.stale, Duration::from_secs(60)) {
                tracing::warn!(path = %chunk.path.display(), stale = n,
                    "Hits older than their rule's window when read: not counted (a log read late, or its clock behind; at most one warning a minute).");
            }
        }
        if seen.future > 0 {
            if let Some(n) = self.future_warn.note(seen.future, Duration::from_secs(60)) {
                tracing::warn!(path = %chunk.path.display(), future = n,
                    "Lines dated more than 5 s after this host's clock: counted at the time they were read (at most one warning a minute).");
            }
        }
        self.stats.skipped_long.fetch_add(chunk.skipped_long, Relaxed);
        if let Some(t) = seen.last_time {
            self.stats.lag_ms.store((wall - t).max(0), Relaxed);
        }
        self.stats.source(
            &chunk.path.to_string_lossy(),
            chunk.end(),
            seen.lines,
            seen.last_time.map(|t| (wall - t).max(0)),
        );
        self.uncommitted
            .push_back((self.seq, chunk.path.clone(), chunk.file, chunk.end()));
    }

    /// Tells the fleet of the clients found hot, bans what went over,
    /// commits the offsets of chunks with nothing pending.
    async fn apply(&mut self, batches: &[Batch], verdicts: Vec<Verdict>) {
        if let Some(marks) = &self.inputs.marks {
            let hot = self.limiter.take_hot();
            if !hot.is_empty() {
                let _ = marks.send(hot);
            }
        }
        self.order.learn(batches, &verdicts, self.limiter.mono_ms());
        let now = crate::now_ms();
        for (b, v) in batches.iter().zip(&verdicts) {
            let limit = self.rules.get(b.rule).map_or(0, |r| r.order.limit);
            match *v {
                Verdict::Under { count } => self.nearest.under(b.rule, b.key, count, limit, now),
                Verdict::Over { .. } => self.nearest.banned(b.rule, &b.key),
            }
        }
        // In log order: a ban decides what the next ones count (escalation).
        for (i, index, count) in self.order.sort(batches, &verdicts) {
            let b = &batches[i];
            self.ban(b.rule, b.key, b.hits[index], count + 1).await;
        }
        self.commit();
    }

    /// Commits the offsets of the chunks older than every hit pending or in
    /// a round trip.
    fn commit(&mut self) {
        let flying = self.inflight.iter().map(|f| f.oldest_seq).min();
        let oldest = self.oldest_seq().unwrap_or(u64::MAX).min(flying.unwrap_or(u64::MAX));
        while let Some((seq, path, file, end)) = self.uncommitted.front() {
            if *seq >= oldest {
                break;
            }
            self.offsets.commit(path, *file, *end);
            self.uncommitted.pop_front();
        }
    }

    /// A rule's verdict over the limit at `hit`, `hits` in its window. The
    /// ban is dated at the hit's time, as `fleetban test` dates it
    /// (docs/design.md §2): its end, its escalation, the safety valve's
    /// minute all count from there.
    async fn ban(&mut self, rule: usize, key: IpNet, hit: Hit, hits: u32) {
        let at_ms = hit.time_ms;
        let info = &self.rules[rule];
        let req = BanRequest {
            addr: key,
            rule: info.name.clone(),
            reason: match self.first_paths.remove(&(rule, key)) {
                Some(path) => format!("first request for {path}"),
                None => info.limit.reason(hits),
            },
            host: self.bans.host().to_owned(),
            hits,
            mode: Mode::Auto(info.ban),
        };
        let counters = info.counters.clone();
        let network = self.order.escalation(rule, &key);
        let before = network.and_then(|n| self.bans.until(&n));
        let now = self.limiter.mono_ms();
        let until = match self.bans.ban(req, at_ms, at_ms).await {
            Ok(Applied::New(rec)) => rec.until(),
            Ok(Applied::Local(e)) => e.until,
            _ => return,
        };
        counters.bans.fetch_add(1, Relaxed);
        self.order.made(key, rule, &hit, until, now);
        if let Some(n) = network {
            // Escalated with it: the network's ban has the same place.
            if let Some(u) = self.bans.until(&n).filter(|u| Some(*u) != before) {
                self.order.made(n, rule, &hit, u, now);
            }
        }
    }
}

/// The next message of an optional channel; never, if there is none.
async fn recv_opt<T>(rx: &mut Option<UnboundedReceiver<T>>) -> Option<T> {
    match rx {
        Some(rx) => rx.recv().await,
        None => std::future::pending().await,
    }
}
