//! [`Bans`]: the one place a ban is applied, whoever decided it (a rule in
//! the pipeline, an operator through the CLI or the control socket, the
//! queue of bans decided while Redis was down, `fleetban test`). Applying a
//! ban is always the same steps, in this order: the safety valve (rule bans
//! only), the list (Redis or embedded; a rule's ban that the list cannot
//! take is enforced here anyway and queued for it), this host's view of the
//! list ([`BanCache`]), the "Banned." line, and the change sent to the
//! enforcer. Lifting a ban is its mirror: windows, list, view, change.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;

mod operator;

pub use operator::Unbanned;

use super::queue::{Held, Queue, Queued};
use super::valve::Full;
use super::{BanCache, BanList, BanListError, BanRecord, BanRequest, Effect, Mode, Outcome, SafetyValve, SharedView};
use crate::addr::AddrText;
use crate::enforce::{Change, Changes, Element, Until};
use crate::store::Health;

/// How often ended bans are swept from the view at most (ms).
const SWEEP_EVERY_MS: i64 = 1_000;

/// "Banned." lines a second before the rest is summed up.
const BANNED_LINES_PER_SECOND: u32 = 5;

/// What the ban owner counts, read by `status` and the metrics endpoint.
#[derive(Default)]
pub struct BanCounters {
    /// New bans applied (written to the list, or enforced here while it
    /// could not be written).
    pub bans: AtomicU64,
    /// Rule bans the safety valve refused, and when it last refused one (ms).
    pub refused: AtomicU64,
    pub refused_at_ms: AtomicI64,
    /// Bans decided while Redis was down, waiting to be written.
    pub queued: AtomicU64,
    /// Bans a full queue could not keep (enforced here, never written).
    pub dropped: AtomicU64,
    /// Entries of this host's view of the list.
    pub active: AtomicU64,
    /// New bans per network (the dashboard's top banned networks).
    pub networks: std::sync::Mutex<super::TopNetworks>,
}

/// What came of a ban.
#[derive(Clone, Debug, PartialEq)]
pub enum Applied {
    /// A new ban: in the list, this host's view and the firewall.
    New(BanRecord),
    /// The list could not take a rule's ban: enforced here for the rule's
    /// base duration (and queued for the list, with Redis).
    Local(Element),
    /// Already banned until then: nothing new.
    Already(Until),
    /// An operator's ban of an address banned until `was`: what became of
    /// that ban (kept, extended, replaced), and its record now.
    Changed { rec: BanRecord, effect: Effect, was: Until },
    /// The safety valve refused it: not applied.
    Refused,
}

/// This host's bans: the list, the view of it, and the way to the firewall.
pub struct Bans {
    list: BanList,
    /// Names this host in records and events.
    host: String,
    /// This host's view of the list, shared with the endpoint; the ban
    /// owner is its one writer.
    cache: SharedView,
    /// When ended bans were last swept from the view (unix ms).
    swept_ms: i64,
    /// Caps new rule bans per minute (the daemon; not `test`, not the CLI).
    valve: Option<SafetyValve>,
    /// With Redis: bans decided while it is down, waiting to be written.
    queue: Option<Queue>,
    /// To the enforcer (nothing for `test` and the CLI).
    changes: Changes,
    counters: Arc<BanCounters>,
    /// Rate limits the warnings of bans Redis refused.
    refusals: Refusals,
    /// The "Banned." lines let through (a few a second), and the rest.
    lines: crate::ratelog::Burst,
    /// Webhook targets, told of each ban this host creates in the list.
    notifier: crate::notify::Notifier,
}

impl Bans {
    /// The embedded list's last save failed: tries again.
    pub fn retry_save(&mut self) {
        self.list.retry_save();
    }

    /// Bans over `list`, written as `host`'s, enforced through `changes`.
    pub fn new(list: BanList, host: &str, changes: Changes) -> Bans {
        Bans {
            list,
            host: host.to_owned(),
            cache: SharedView::default(),
            swept_ms: 0,
            valve: None,
            queue: None,
            changes,
            counters: Arc::default(),
            refusals: Refusals::default(),
            lines: crate::ratelog::Burst::new(BANNED_LINES_PER_SECOND, Duration::from_secs(1)),
            notifier: crate::notify::Notifier::default(),
        }
    }

    /// Tells `notifier`'s targets of the bans this host creates (and of
    /// operators' unbans through it).
    pub fn with_notify(mut self, notifier: crate::notify::Notifier) -> Bans {
        self.notifier = notifier;
        self
    }

    /// At most `max_per_minute` new rule bans a minute (`safety:`), a
    /// network counting the clients it covers (IPv6 ones of `v6_prefix`).
    pub fn with_valve(mut self, max_per_minute: u32, v6_prefix: u8, rules: &[String]) -> Bans {
        let mut valve = SafetyValve::new(max_per_minute, v6_prefix);
        valve.set_rules(rules);
        self.valve = Some(valve);
        self
    }

    /// With Redis: a rule's ban decided while `health` says Redis is down
    /// (or that the list refused) is queued and written when it answers.
    pub fn with_queue(mut self, health: Health) -> Bans {
        self.queue = Some(Queue::new(health));
        self
    }

    /// The host whose bans these are.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// The queued bans a reconcile must keep (for the fleet sync).
    pub fn held(&self) -> Held {
        self.queue.as_ref().map(|q| q.held.clone()).unwrap_or_default()
    }

    pub fn counters(&self) -> Arc<BanCounters> {
        self.counters.clone()
    }

    /// The embedded list had no file at start: the firewall's set may be
    /// taken as the list ([`Bans::adopt`]).
    pub fn absent_at_start(&self) -> bool {
        self.list.absent_at_start()
    }

    /// The embedded list takes the firewall's set kept at start (`elems`)
    /// as this host's bans; how many (`BanList::adopt`).
    pub fn adopt(&mut self, elems: &[Element], now_ms: i64) -> usize {
        self.list.adopt(elems, &self.host, now_ms)
    }

    /// The start's view was put in place through [`Self::view`]
    /// (`daemon::start::first_sync`): its bans are counted.
    pub fn view_built(&self) {
        self.publish_active();
    }

    /// The view read-locked, for a scan of many hits (the pipeline holds
    /// it for a chunk rather than locking per hit).
    pub fn view_read(&self) -> std::sync::RwLockReadGuard<'_, BanCache> {
        self.cache.read()
    }

    /// The view of the list, to share with readers (the endpoint).
    pub fn view(&self) -> SharedView {
        self.cache.clone()
    }

    /// Whether the client `key` is banned at `at_ms` (asked per hit).
    #[inline]
    pub fn is_banned(&self, key: &IpNet, at_ms: i64) -> bool {
        self.cache.read().is_banned(key, at_ms)
    }

    /// When the last ban covering `key` ends, if it has one.
    pub fn until(&self, key: &IpNet) -> Option<Until> {
        self.cache.read().until(key)
    }

    /// Applies `req` at `now_ms`; `at_ms` is when its limit was crossed
    /// (the hit's time) or when the operator asked. A rule's ban
    /// (`Mode::Auto`) of a client already banned here is `Already`; it goes
    /// through the valve, and when the list cannot take it, it is enforced
    /// here anyway (`Local`). An operator's ban never shortens an active
    /// one unless it replaces it (`Changed`); with Redis down it is
    /// enforced here and queued (`Local`), and fails only without a queue.
    pub async fn ban(&mut self, req: BanRequest, at_ms: i64, now_ms: i64) -> Result<Applied, BanListError> {
        let Mode::Auto(policy) = req.mode else {
            return self.manual(req, at_ms, now_ms).await;
        };
        if let Some(u) = self.cache.read().until(&req.addr).filter(|u| *u > Until::At(now_ms)) {
            return Ok(Applied::Already(u));
        }
        if !self.admit(&req, now_ms) {
            return Ok(Applied::Refused);
        }
        // The network it may escalate to weighs its clients too: without
        // room for it in the valve, this ban does not escalate.
        let req = self.escalation_within_valve(req, now_ms);
        // Known down: straight to the local ban and the queue, no timeout paid.
        let outcome = match self.known_down() {
            true => Err(BanListError::Down),
            false => self.list.ban_escalating(&req, now_ms).await,
        };
        match outcome {
            Ok((Outcome::Banned(rec), network)) => {
                let applied = self.banned(rec, at_ms, now_ms);
                if let Some(net) = network {
                    // Decided with the address's ban (`escalate_network:`),
                    // room checked in the valve: counted there, enforced at
                    // once here, the other hosts through its event.
                    if let Some(v) = &mut self.valve {
                        let _ = v.admit(&req.rule, &net.addr, now_ms);
                    }
                    self.banned(net, at_ms, now_ms);
                }
                Ok(applied)
            }
            Ok((Outcome::AlreadyBanned(until), _)) => {
                self.enforce(req.addr, until);
                Ok(Applied::Already(until))
            }
            Ok((Outcome::Changed { rec, .. }, _)) => {
                // Not for a rule's ban (ban.lua answers those 0 or 1).
                let until = rec.until();
                self.enforce(req.addr, until);
                Ok(Applied::Already(until))
            }
            Err(e) => {
                // The list could not take it: enforce here at once for the
                // base duration; written to the list when it can.
                self.counters.bans.fetch_add(1, Relaxed);
                let until = Until::At(now_ms + policy.duration_ms);
                let rec = req.record(
                    now_ms,
                    match until {
                        Until::At(t) => Some(t),
                        Until::Permanent => None,
                    },
                    1,
                );
                let mut queued = false;
                if let Some(q) = &mut self.queue {
                    if e.is_outage() {
                        if !matches!(e, BanListError::Down) {
                            q.health.count_error();
                            q.health.failed();
                        }
                    } else {
                        // Redis answered with an error: this ban's failure,
                        // not an outage; the limiter keeps deciding with Redis.
                        q.health.count_error();
                        q.refused();
                        self.refusals.refused(&e, q.len() + 1);
                    }
                    queued = q.push(req, now_ms, until);
                    if !queued {
                        self.counters.dropped.fetch_add(1, Relaxed);
                    }
                    self.counters.queued.store(q.len() as u64, Relaxed);
                }
                // A queued ban is told once it is written (`recover`), by
                // the host whose write creates it; one never written, now.
                if !queued {
                    self.notify(&rec, at_ms);
                }
                let list = match (&e, queued) {
                    (BanListError::Down, true) => "Redis down; queued".to_owned(),
                    (_, true) => format!("queued: {}", crate::ratelog::cap_error(&e.to_string())),
                    (_, false) => format!("not written: {}", crate::ratelog::cap_error(&e.to_string())),
                };
                self.log_banned(&rec, at_ms, now_ms, Some(&list));
                self.enforce(rec.addr, until);
                Ok(Applied::Local(Element { net: rec.addr, until }))
            }
        }
    }

    /// [`Bans::ban`] for an embedded list, without a runtime: `fleetban
    /// test` applies each decision before it reads the next hit. None for
    /// a Redis list, or when the ban is not new; with the ban of the
    /// address's network it triggered, if any (`escalate_network:`).
    pub fn ban_embedded(&mut self, req: &BanRequest, now_ms: i64) -> Option<(BanRecord, Option<BanRecord>)> {
        let BanList::Memory(m) = &mut self.list else {
            return None;
        };
        match m.ban_escalating(req, now_ms) {
            (Outcome::Banned(rec), network) => {
                self.enforce(rec.addr, rec.until());
                if let Some(net) = &network {
                    self.enforce(net.addr, net.until());
                }
                Some((rec, network))
            }
            (Outcome::AlreadyBanned(_) | Outcome::Changed { .. }, _) => None,
        }
    }

    /// `req` without its network escalation when the valve has no room
    /// for the network's clients this minute (said in a warning).
    fn escalation_within_valve(&mut self, mut req: BanRequest, now_ms: i64) -> BanRequest {
        let (Some(valve), Mode::Auto(p)) = (&mut self.valve, &mut req.mode) else {
            return req;
        };
        let Some(net) = p.network.and_then(|e| super::escalate::network_of(&req.addr, &e)) else {
            return req;
        };
        if valve.fits(&req.rule, &net, now_ms).is_err() {
            tracing::warn!(rule = %req.rule, addr = %AddrText(&net), clients = valve.weight_of(&net),
                max_bans_per_minute = valve.max(), used_by_rule = valve.used_by(&req.rule),
                "Safety valve: no room this minute for the network this ban may escalate to; not escalated.");
            p.network = None;
        }
        req
    }

    /// The valve: true if one more rule ban may be applied now. A refusal
    /// is loud: counted (`status`, `fleetban_safety_refused_total`), warned (the first ten, then
    /// at powers of two), and the valve's state in `status` is `tripped`.
    fn admit(&mut self, req: &BanRequest, now_ms: i64) -> bool {
        let Some(valve) = &mut self.valve else { return true };
        let Err(full) = valve.admit(&req.rule, &req.addr, now_ms) else {
            return true;
        };
        let n = self.counters.refused.fetch_add(1, Relaxed);
        self.counters.refused_at_ms.store(now_ms, Relaxed);
        if valve.too_wide(&req.addr) {
            tracing::warn!(rule = %req.rule, addr = %AddrText(&req.addr), clients = valve.weight_of(&req.addr),
                max_bans_per_minute = valve.max(), refused = n + 1,
                "Safety valve: this network covers more clients than `safety.max_bans_per_minute` allows in a minute; ban not applied (raise it, or count a longer prefix).");
        } else if n < 10 || n.is_power_of_two() {
            match full {
                Full::Budget => tracing::warn!(rule = %req.rule, addr = %AddrText(&req.addr), refused = n + 1,
                    used_by_rule = valve.used_by(&req.rule), max_bans_per_minute = valve.max(),
                    "Safety valve: too many bans this minute; ban not applied."),
                Full::Reserved => tracing::warn!(rule = %req.rule, addr = %AddrText(&req.addr), refused = n + 1,
                    used_by_rule = valve.used_by(&req.rule), max_bans_per_minute = valve.max(),
                    reserved_per_rule = valve.reserve(),
                    "Safety valve: this rule used its share of the minute's bans; the rest is kept for the other rules; ban not applied."),
            }
        }
        false
    }

    /// A new ban in the list: logged, counted, enforced.
    fn banned(&mut self, rec: BanRecord, at_ms: i64, now_ms: i64) -> Applied {
        self.counters.bans.fetch_add(1, Relaxed);
        self.counters
            .networks
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .add(&rec.addr);
        self.log_banned(&rec, at_ms, now_ms, None);
        self.notify(&rec, at_ms);
        self.enforce(rec.addr, rec.until());
        Applied::New(rec)
    }

    /// The summary of the "Banned." lines a busy second held back, once
    /// it is over (the pipeline calls it every second).
    pub fn flush_log(&mut self) {
        if let Some((count, by)) = self.lines.summary() {
            tracing::info!(count, by = %by,
                "More bans decided here than 5 a second; summed up (by RULE: count).");
        }
    }

    fn notify(&self, rec: &BanRecord, at_ms: i64) {
        tell(&self.notifier, rec, at_ms);
    }
}

/// The targets hear of `rec`: only ever from the host whose write created
/// it (ban.lua answers "banned" to that one write alone), so the fleet
/// tells each ban once.
fn tell(notifier: &crate::notify::Notifier, rec: &BanRecord, at_ms: i64) {
    if !notifier.is_on() {
        return;
    }
    notifier.ban(crate::notify::BanEvent {
        addr: rec.addr,
        rule: rec.rule.clone(),
        reason: rec.reason.clone(),
        host: rec.host.clone(),
        hits: rec.hits,
        at_ms,
        until_ms: rec.until,
        network: false,
    });
}

impl Bans {
    /// The "Banned." line of every new ban (a few a second, then a
    /// summary); `local`: why the list does not have it (yet).
    fn log_banned(&mut self, rec: &BanRecord, at_ms: i64, now_ms: i64, local: Option<&str>) {
        if !self.lines.admit(&rec.rule) {
            return;
        }
        let by = if rec.rule == "manual" { "operator" } else { "rule" };
        let duration = rec.until.map_or("permanent".into(), |u| {
            crate::duration_text((u - now_ms).max(0) / 1000 * 1000)
        });
        let until = rec.until.map_or("forever".into(), crate::rfc3339);
        match local {
            None => {
                tracing::info!(rule = %rec.rule, addr = %AddrText(&rec.addr), hits = rec.hits, duration = %duration,
                at = %crate::rfc3339(at_ms), until = %until, count = rec.count, reason = %rec.reason,
                host = %self.host, decided_by = %by, "Banned.")
            }
            Some(list) => {
                tracing::info!(rule = %rec.rule, addr = %AddrText(&rec.addr), hits = rec.hits, duration = %duration,
                at = %crate::rfc3339(at_ms), until = %until, count = rec.count, reason = %rec.reason,
                host = %self.host, decided_by = %by, decided = "locally", list = %list, "Banned.")
            }
        }
    }

    /// This host's view and the firewall take `net` until `until`.
    fn enforce(&mut self, net: IpNet, until: Until) {
        self.cache.write().insert(net, until);
        self.publish_active();
        self.changes.send(Change::Add(vec![Element { net, until }]));
    }

    fn publish_active(&self) {
        self.counters.active.store(self.cache.read().len() as u64, Relaxed);
    }

    /// A change to the list made elsewhere (the fleet's events and
    /// reconciles): this host's view follows it.
    pub fn observe(&mut self, change: &Change) {
        match change {
            Change::Add(elems) => {
                let mut view = self.cache.write();
                for e in elems {
                    view.insert(e.net, e.until);
                }
            }
            Change::Remove(nets) => {
                let mut view = self.cache.write();
                for n in nets {
                    view.remove(n);
                }
            }
            // Built beside the view, swapped in, the old one dropped
            // outside the lock: readers never wait for a large rebuild.
            Change::Replace(elems) => drop(self.cache.swap(BanCache::built(elems.iter().map(|e| (e.net, e.until))))),
        }
        self.sweep(crate::now_ms());
        self.publish_active();
    }

    /// Forgets the bans that ended, at most every [`SWEEP_EVERY_MS`]
    /// (they deny nothing meanwhile: lookups compare their end with the
    /// time asked; with a million bans a sweep walks them all).
    pub fn sweep(&mut self, now_ms: i64) {
        if now_ms - self.swept_ms >= SWEEP_EVERY_MS {
            self.swept_ms = now_ms;
            self.cache.write().expire(now_ms);
            self.publish_active();
        }
    }

    /// The bans this host enforces (`fleetban bans` while Redis, which
    /// keeps the records, is down), and which of them are queued: those
    /// decided meanwhile, not in Redis yet, with their records from the
    /// queue; the others with only the address and the end known (no rule,
    /// host, reason; `since` 0).
    pub fn enforced_here(&self, now_ms: i64) -> (Vec<BanRecord>, Vec<IpNet>) {
        let mut queued: std::collections::HashMap<IpNet, BanRecord> = self
            .queue
            .as_ref()
            .map(|q| q.records().into_iter().map(|r| (r.addr, r)).collect())
            .unwrap_or_default();
        let mut waiting = Vec::new();
        let entries = self.cache.read().entries();
        let recs = entries
            .into_iter()
            .filter_map(|(addr, until)| {
                let until = match until {
                    Until::At(t) if t <= now_ms => return None,
                    Until::At(t) => Some(t),
                    Until::Permanent => None,
                };
                if let Some(rec) = queued.remove(&addr) {
                    waiting.push(addr);
                    return Some(BanRecord { until, ..rec });
                }
                Some(BanRecord {
                    addr,
                    rule: String::new(),
                    reason: String::new(),
                    host: String::new(),
                    since: 0,
                    until,
                    count: 0,
                    hits: 0,
                })
            })
            .collect();
        (recs, waiting)
    }

    /// The active bans with their records (`fleetban bans`).
    pub async fn records(&mut self, now_ms: i64) -> Result<Vec<BanRecord>, BanListError> {
        self.list.records(now_ms).await
    }

    /// The active bans that cover `net` or lie inside it, `net`'s own
    /// among them (`fleetban unban`'s wider and narrower bans): the wider
    /// looked up ([`BanList::covering`]), the narrower read from the pages
    /// of the list with only their own records; an address has none.
    pub async fn overlapping(&mut self, net: &IpNet, now_ms: i64) -> Result<Vec<BanRecord>, BanListError> {
        let mut out = self.list.covering(net, now_ms).await?;
        if net.prefix_len() < net.max_prefix_len() {
            let mut cursor = super::Cursor::new(now_ms, super::list::PAGE);
            while let Some((_, page)) = self
                .list
                .records_page(&mut cursor, |a| a != net && net.contains(a))
                .await?
            {
                out.extend(page);
            }
        }
        Ok(out)
    }

    /// When [`Bans::recover`] has work: while Redis is down, or bans wait.
    pub fn next_attempt(&self) -> Option<tokio::time::Instant> {
        self.queue.as_ref().and_then(Queue::next_attempt)
    }

    /// While Redis is down, or bans decided meanwhile wait: when due, asks
    /// Redis whether it answers again, then writes the queued bans, oldest
    /// first, each with the time it was decided (its end does not move).
    pub async fn recover(&mut self) {
        let Some(q) = &mut self.queue else { return };
        if !q.due() || (!q.health.is_down() && q.len() == 0) {
            return;
        }
        if q.health.is_down() {
            if self.list.ping().await.is_err() {
                q.health.failed();
                return;
            }
            if q.health.succeeded() {
                tracing::info!(
                    queued = q.len(),
                    "Redis answers again; deciding with the fleet's windows."
                );
            }
        }
        let now = crate::now_ms();
        while let Some(item) = q.front() {
            let (req, at, until) = match item {
                Queued::Ban(req, at, until) => (req, at, until),
                Queued::Unban(net, rules) => {
                    let net = *net;
                    let rules: Vec<(&str, i64)> = rules.iter().map(|(n, w)| (n.as_str(), *w)).collect();
                    let written = match self.list.forget_windows(&net, &rules, &self.host, now).await {
                        Ok(()) => self.list.unban(&net, &self.host).await.map(|_| ()),
                        Err(e) => Err(e),
                    };
                    match written {
                        Ok(()) => {
                            q.pop();
                            q.written();
                            tracing::info!(addr = %AddrText(&net), "Queued unban written.");
                            continue;
                        }
                        Err(e) => {
                            write_failed(q, &mut self.refusals, &e);
                            break;
                        }
                    }
                }
            };
            if matches!(until, Until::At(t) if *t <= now) {
                q.pop();
                continue;
            }
            match self.list.ban_escalating(req, *at).await {
                Ok((out, network)) => {
                    let until = match out {
                        Outcome::Banned(rec) => {
                            tell(&self.notifier, &rec, *at);
                            rec.until()
                        }
                        Outcome::Changed { rec, .. } => rec.until(),
                        Outcome::AlreadyBanned(u) => u,
                    };
                    let mut elems = vec![Element { net: req.addr, until }];
                    if let Some(n) = network {
                        tracing::info!(rule = %n.rule, addr = %AddrText(&n.addr), reason = %n.reason,
                            until = %n.until.map_or("forever".into(), crate::rfc3339), host = %n.host,
                            decided_by = %"rule", "Banned.");
                        tell(&self.notifier, &n, *at);
                        elems.push(Element {
                            net: n.addr,
                            until: n.until(),
                        });
                    }
                    q.pop();
                    q.written();
                    self.refusals.over(q.len());
                    let mut view = self.cache.write();
                    for e in &elems {
                        view.insert(e.net, e.until);
                    }
                    drop(view);
                    self.changes.send(Change::Add(elems));
                }
                Err(e) => {
                    write_failed(q, &mut self.refusals, &e);
                    break;
                }
            }
        }
        self.counters.queued.store(q.len() as u64, Relaxed);
        self.publish_active();
    }
}

/// The warnings of bans Redis refused (answered with an error): one per
/// minute at most, with how many were refused meanwhile, and one line when
/// a refused ban is written at last.
#[derive(Default)]
struct Refusals {
    every: crate::ratelog::Every,
    /// Refusals since the last write that went through.
    open: u64,
}

impl Refusals {
    const PERIOD: Duration = Duration::from_secs(60);

    fn refused(&mut self, e: &BanListError, queued: usize) {
        self.open += 1;
        let Some(n) = self.every.note(1, Self::PERIOD) else {
            return;
        };
        if e.is_oom() {
            tracing::warn!(error = %crate::ratelog::cap_error(&e.to_string()), refused = n, queued,
                "Redis is out of memory (maxmemory reached, maxmemory-policy noeviction): the ban list refuses writes; bans enforced here and queued, retried with backoff. Raise maxmemory or free memory.");
        } else {
            tracing::warn!(error = %crate::ratelog::cap_error(&e.to_string()), refused = n, queued,
                "Redis refused a ban (an error, not an outage); enforced here and queued, retried with backoff.");
        }
    }

    fn over(&mut self, queued: usize) {
        if self.open > 0 {
            tracing::info!(refused = self.open, queued, "The ban list takes bans again.");
            self.open = 0;
            self.every = crate::ratelog::Every::default();
        }
    }
}

/// A queued ban or unban Redis did not take: an outage waits for Redis to
/// answer; a refusal (a script error, OOM) is retried with the queue's
/// backoff and warned about by `refusals`.
fn write_failed(q: &mut Queue, refusals: &mut Refusals, e: &BanListError) {
    q.health.count_error();
    if e.is_outage() {
        tracing::warn!(error = %e, queued = q.len(), "Writing queued bans failed; retrying when Redis answers.");
        q.health.failed();
    } else {
        q.refused();
        refusals.refused(e, q.len());
    }
}
