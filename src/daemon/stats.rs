//! Counters of the running daemon, shared with the control socket. The
//! pipeline adds to them once per chunk or flush, not once per line.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};

use crate::bans::BanCounters;
use crate::control::{ClientStateStatus, HttpStatus, RedisStatus, RuleStatus, SafetyStatus, SourceStatus, Status};
use crate::http::HttpCounters;
use crate::limit::LimitCounters;
use crate::store::Health;

#[derive(Default)]
pub struct RuleCounters {
    pub name: String,
    pub hits: AtomicU64,
    pub bans: AtomicU64,
    /// Lines this rule read, and of those the ones its format could not
    /// parse (whatever other rules reading the same log parsed).
    pub lines: AtomicU64,
    pub unparsed: AtomicU64,
}

pub struct SourceCounters {
    pub path: String,
    pub offset: u64,
    pub lines: u64,
    /// Wall clock minus the log time of the last hit of this source.
    pub lag_ms: Option<i64>,
    /// Lines per second over the last completed interval of >= 1 s.
    pub rate: f64,
    rate_start: std::time::Instant,
    rate_lines: u64,
}

impl SourceCounters {
    /// Lines per second: the last measured rate, decaying once lines stop.
    fn lines_per_s(&self) -> f64 {
        let elapsed = self.rate_start.elapsed().as_secs_f64();
        if elapsed >= 2.0 {
            self.rate_lines as f64 / elapsed
        } else {
            self.rate
        }
    }
}

/// The daemon's counters, shared with the control socket, the metrics
/// endpoint and systemd's STATUS=. What the limiter, the ban owner and the
/// Redis connection count is theirs (`limit`, `bans`, `store::Health`),
/// read here.
pub struct Stats {
    pub lines: AtomicU64,
    pub unparsed: AtomicU64,
    pub skipped_long: AtomicU64,
    /// Hits older than the window at arrival (docs/design.md §2): not counted.
    pub stale: AtomicU64,
    /// Hits dated more than a few seconds after the wall clock, counted at
    /// the wall clock (docs/design.md §2).
    pub future: AtomicU64,
    /// Hits waiting in the daemon to share a script call (`redis.hold`).
    pub held_hits: AtomicU64,
    /// Hits of the limiter round trip in flight.
    pub inflight_hits: AtomicU64,
    /// Wall clock minus the log time of the last hit processed.
    pub lag_ms: AtomicI64,
    /// When the pipeline started the work it is doing now (ms), 0 while it
    /// waits for input: the watchdog pings only while this is recent.
    pub busy_since_ms: AtomicI64,
    /// Reloads applied / refused (bad config).
    pub reloads: AtomicU64,
    pub reload_errors: AtomicU64,
    /// Per rule of the running config; the pipeline holds the same `Arc`s.
    pub rules: Mutex<Vec<Arc<RuleCounters>>>,
    /// `safety.max_bans_per_minute`.
    pub valve_limit: u64,
    pub sources: Mutex<Vec<SourceCounters>>,
    /// The configured logs (paths and globs): `status` lists each, also
    /// one that is missing or unreadable and so has no counters.
    pub log_patterns: Mutex<Vec<String>>,
    /// The running follower, for where a file nothing was read from yet
    /// starts (its end, at first sight).
    pub follower: Mutex<Option<crate::source::WakeHandle>>,
    pub limit: Arc<LimitCounters>,
    pub bans: Arc<BanCounters>,
    /// With Redis: whether it answers.
    pub health: Option<Health>,
    /// `redis.on_down`, for `status` (`with_on_down`).
    pub on_down: crate::config::OnDown,
    /// One nft transaction, in seconds.
    pub nft_apply: Histogram,
    /// With `http:`: the decision endpoint's counters, counted by it.
    pub http: Option<HttpStats>,
}

/// The decision endpoint as `Stats` knows it.
pub struct HttpStats {
    /// `unix:PATH` or `ADDRESS:PORT`.
    pub listen: String,
    pub counters: Arc<HttpCounters>,
}

impl Stats {
    pub fn new(
        rule_names: &[String],
        valve_limit: u32,
        limit: Arc<LimitCounters>,
        bans: Arc<BanCounters>,
        health: Option<Health>,
    ) -> Stats {
        let stats = Stats {
            lines: AtomicU64::new(0),
            unparsed: AtomicU64::new(0),
            skipped_long: AtomicU64::new(0),
            stale: AtomicU64::new(0),
            future: AtomicU64::new(0),
            held_hits: AtomicU64::new(0),
            inflight_hits: AtomicU64::new(0),
            lag_ms: AtomicI64::new(0),
            busy_since_ms: AtomicI64::new(0),
            reloads: AtomicU64::new(0),
            reload_errors: AtomicU64::new(0),
            rules: Mutex::default(),
            valve_limit: u64::from(valve_limit),
            sources: Mutex::default(),
            log_patterns: Mutex::default(),
            follower: Mutex::default(),
            limit,
            bans,
            health,
            on_down: crate::config::OnDown::default(),
            nft_apply: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
            http: None,
        };
        stats.set_rules(rule_names);
        stats
    }

    /// With the decision endpoint listening at `listen`, counting in `counters`.
    pub fn with_http(self, listen: String, counters: Arc<HttpCounters>) -> Stats {
        Stats {
            http: Some(HttpStats { listen, counters }),
            ..self
        }
    }

    /// With Redis: what the limiter does while it is down (`status`).
    pub fn with_on_down(self, on_down: crate::config::OnDown) -> Stats {
        Stats { on_down, ..self }
    }

    /// Counters of nothing (tests).
    pub fn detached() -> Stats {
        Stats::new(&[], 0, Arc::default(), Arc::default(), None)
    }

    /// Redis answered the last time it was asked (false without Redis).
    pub fn redis_connected(&self) -> bool {
        self.health.as_ref().is_some_and(Health::is_connected)
    }

    /// `embedded`, `connecting`, `connected` or `down` (docs/design.md §6,
    /// `status --json`; the metric `fleetban_redis_state`).
    pub fn redis_state(&self) -> &'static str {
        match &self.health {
            None => "embedded",
            Some(h) if h.is_down() => "down",
            Some(h) if h.is_connected() => "connected",
            Some(_) => "connecting",
        }
    }

    /// Since when Redis is down (unix ms), while it is.
    pub fn redis_down_since(&self) -> Option<i64> {
        self.health.as_ref().and_then(Health::down_since)
    }

    pub fn redis_errors(&self) -> u64 {
        self.health.as_ref().map_or(0, Health::errors)
    }

    /// The counters of `rule_names`, in order: a rule that keeps its name
    /// (reload) keeps its counters.
    pub fn set_rules(&self, rule_names: &[String]) -> Vec<Arc<RuleCounters>> {
        let mut rules = self.rules.lock().unwrap_or_else(|e| e.into_inner());
        let new: Vec<Arc<RuleCounters>> = rule_names
            .iter()
            .map(|n| match rules.iter().find(|r| &r.name == n) {
                Some(r) => r.clone(),
                None => Arc::new(RuleCounters {
                    name: n.clone(),
                    ..Default::default()
                }),
            })
            .collect();
        *rules = new.clone();
        new
    }

    pub fn rule_counters(&self) -> Vec<Arc<RuleCounters>> {
        self.rules.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    pub fn source(&self, path: &str, offset: u64, lines: u64, lag_ms: Option<i64>) {
        let mut s = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let c = match s.iter().position(|c| c.path == path) {
            Some(i) => &mut s[i],
            None => {
                s.push(SourceCounters {
                    path: path.to_owned(),
                    offset,
                    lines: 0,
                    lag_ms: None,
                    rate: 0.0,
                    rate_start: std::time::Instant::now(),
                    rate_lines: 0,
                });
                let last = s.len() - 1;
                &mut s[last]
            }
        };
        c.offset = offset;
        c.lines += lines;
        c.rate_lines += lines;
        if lag_ms.is_some() {
            c.lag_ms = lag_ms;
        }
        let elapsed = c.rate_start.elapsed().as_secs_f64();
        if elapsed >= 1.0 {
            c.rate = c.rate_lines as f64 / elapsed;
            c.rate_lines = 0;
            c.rate_start = std::time::Instant::now();
        }
    }

    /// `open`, or `tripped` when it refused a ban within the last minute.
    pub fn valve_state(&self) -> &'static str {
        let at = self.bans.refused_at_ms.load(Relaxed);
        if at != 0 && crate::now_ms() - at < 60_000 {
            "tripped"
        } else {
            "open"
        }
    }

    /// The configured logs and their follower, for [`Stats::source_rows`]
    /// (start and reload).
    pub fn set_logs(&self, patterns: Vec<String>, follower: crate::source::WakeHandle) {
        *self.log_patterns.lock().unwrap_or_else(|e| e.into_inner()) = patterns;
        *self.follower.lock().unwrap_or_else(|e| e.into_inner()) = Some(follower);
    }

    /// Per source: its path, position, lines, rate, lag and bytes not yet
    /// read, and its state now; in the configuration's order, every
    /// configured log included (a missing one, a glob matching nothing),
    /// then files read earlier that no pattern names now.
    pub fn source_rows(&self) -> Vec<SourceStatus> {
        let patterns = self.log_patterns.lock().unwrap_or_else(|e| e.into_inner()).clone();
        let s = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        let row = |c: &SourceCounters, file: crate::source::LogFile| SourceStatus {
            path: c.path.clone(),
            offset: c.offset,
            lines: c.lines,
            lines_per_s: (c.lines_per_s() * 10.0).round() / 10.0,
            lag_ms: c.lag_ms,
            bytes_behind: std::fs::metadata(&c.path)
                .ok()
                .map(|m| m.len().saturating_sub(c.offset)),
            state: file.state().to_owned(),
            error: file.problem(),
        };
        let followed = self
            .follower
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .as_ref()
            .map(crate::source::WakeHandle::stats)
            .unwrap_or_default();
        // Nothing read from it yet: where the follower starts it.
        let start = |path: &str| {
            followed
                .iter()
                .find(|f| f.lines == 0 && f.file.is_some() && f.path.as_os_str() == path)
                .map(|f| f.offset)
        };
        let mut rows: Vec<SourceStatus> = Vec::new();
        for file in patterns.iter().flat_map(|p| crate::source::inspect(p)) {
            let path = file.path();
            if rows.iter().any(|r| r.path == path) {
                continue;
            }
            rows.push(match s.iter().find(|c| c.path == path) {
                Some(c) => row(c, file),
                None => {
                    let offset = start(&path);
                    SourceStatus {
                        offset: offset.unwrap_or(0),
                        bytes_behind: offset
                            .and_then(|o| std::fs::metadata(&path).ok().map(|m| m.len().saturating_sub(o))),
                        state: file.state().to_owned(),
                        error: file.problem(),
                        path,
                        ..SourceStatus::default()
                    }
                }
            });
        }
        for c in s.iter() {
            if !rows.iter().any(|r| r.path == c.path) {
                rows.push(row(c, crate::source::inspect_path(std::path::Path::new(&c.path))));
            }
        }
        rows
    }

    /// What `fleetban status` shows.
    pub fn report(&self) -> Status {
        let refused = self.bans.refused.load(Relaxed);
        Status {
            sources: self.source_rows(),
            rules: self
                .rule_counters()
                .iter()
                .map(|r| RuleStatus {
                    name: r.name.clone(),
                    hits: r.hits.load(Relaxed),
                    bans: r.bans.load(Relaxed),
                    lines: r.lines.load(Relaxed),
                    unparsed: r.unparsed.load(Relaxed),
                })
                .collect(),
            lines: self.lines.load(Relaxed),
            unparsed: self.unparsed.load(Relaxed),
            skipped_long: self.skipped_long.load(Relaxed),
            stale: self.stale.load(Relaxed),
            future: self.future.load(Relaxed),
            bans: self.bans.bans.load(Relaxed),
            safety_refused: refused,
            safety: SafetyStatus {
                state: self.valve_state().to_owned(),
                max_bans_per_minute: self.valve_limit,
                refused,
            },
            redis: RedisStatus {
                state: self.redis_state().to_owned(),
                down_since: self.redis_down_since().map(crate::rfc3339),
                on_down: self.health.as_ref().map(|_| {
                    match self.on_down {
                        crate::config::OnDown::Local => "local",
                        crate::config::OnDown::Pause => "pause",
                    }
                    .to_owned()
                }),
                connected: self.redis_connected(),
                used: self.health.is_some(),
                errors: self.redis_errors(),
                round_trips: self.limit.round_trips.load(Relaxed),
                held_hits: self.held_hits.load(Relaxed),
                inflight_hits: self.inflight_hits.load(Relaxed),
                local_decisions: self.limit.local_decisions.load(Relaxed),
                fleet_hosts: self.limit.fleet_hosts.load(Relaxed),
                hot_clients: self.limit.hot_clients.load(Relaxed),
                queued_bans: self.bans.queued.load(Relaxed),
                dropped_bans: self.bans.dropped.load(Relaxed),
            },
            bans_active: self.bans.active.load(Relaxed),
            lag_ms: self.lag_ms.load(Relaxed),
            reloads: self.reloads.load(Relaxed),
            reload_errors: self.reload_errors.load(Relaxed),
            http: self.http.as_ref().map(|h| HttpStatus {
                listen: h.listen.clone(),
                checks: h.counters.checks.load(Relaxed),
                denials: h.counters.denials.load(Relaxed),
                malformed: h.counters.malformed.load(Relaxed),
                p50_us: micros(h.counters.latency.quantile(0.5)),
                p99_us: micros(h.counters.latency.quantile(0.99)),
                connections: h.counters.open.load(Relaxed),
                evicted: h.counters.evicted.load(Relaxed),
                head_timeouts: h.counters.head_timeouts.load(Relaxed),
            }),
            // Filled by the control socket from the enforcer's report.
            firewall: Default::default(),
            blocklists: Vec::new(),
            client_state: ClientStateStatus {
                bytes: self.limit.state_bytes.load(Relaxed) + self.limit.order_bytes.load(Relaxed),
                keys: self.limit.state_keys.load(Relaxed) + self.limit.order_keys.load(Relaxed),
                max: self.limit.state_max.load(Relaxed),
                shed_keys: self.limit.shed_keys.load(Relaxed),
                sheds: self.limit.sheds.load(Relaxed),
            },
        }
    }
}

/// A latency bound in seconds as whole microseconds; None when unknown or
/// past the last bucket.
fn micros(seconds: Option<f64>) -> Option<u64> {
    seconds.filter(|s| s.is_finite()).map(|s| (s * 1e6).round() as u64)
}
