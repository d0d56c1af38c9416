//! Counters of the running daemon, shared with the control socket. The
//! pipeline adds to them once per chunk or flush, not once per line.

use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

#[derive(Default)]
pub struct RuleCounters {
    pub name: String,
    pub hits: AtomicU64,
    pub bans: AtomicU64,
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

/// Per source: (path, offset, lines, lines/s, lag ms, bytes not yet read).
pub type SourceRow = (String, u64, u64, f64, Option<i64>, Option<u64>);

/// Timings exported as Prometheus histograms.
pub struct Timings {
    /// One limiter call (a few pipelined Redis round trips), per round trip.
    pub redis_roundtrip: prometheus_client::metrics::histogram::Histogram,
    /// One nft transaction.
    pub nft_apply: prometheus_client::metrics::histogram::Histogram,
}

impl Default for Timings {
    fn default() -> Self {
        use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
        Timings {
            redis_roundtrip: Histogram::new(exponential_buckets(0.000_1, 2.0, 16)),
            nft_apply: Histogram::new(exponential_buckets(0.001, 2.0, 14)),
        }
    }
}

#[derive(Default)]
pub struct Stats {
    pub lines: AtomicU64,
    pub unparsed: AtomicU64,
    pub skipped_long: AtomicU64,
    /// Hits older than the window at arrival (DESIGN §2): not counted.
    pub stale: AtomicU64,
    pub bans: AtomicU64,
    /// Bans the safety valve refused.
    pub refused: AtomicU64,
    pub redis_errors: AtomicU64,
    pub redis_connected: AtomicBool,
    /// Batches decided by the in-process fallback while Redis was down.
    pub local_decisions: AtomicU64,
    /// Bans decided while Redis was down, waiting to be written to the list.
    pub ban_queue: AtomicU64,
    /// Bans the full queue could not keep (enforced here, never written).
    pub ban_queue_dropped: AtomicU64,
    /// `redis:` is configured (else the embedded store is used).
    pub redis_used: AtomicBool,
    pub round_trips: AtomicU64,
    /// Hits waiting in the daemon to share a script call (`redis.hold`).
    pub held_hits: AtomicU64,
    /// Hits of the limiter round trip in flight.
    pub inflight_hits: AtomicU64,
    pub bans_active: AtomicU64,
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
    /// Safety valve: its limit per minute, and when it last refused a ban (ms).
    pub valve_limit: AtomicU64,
    pub valve_refused_at_ms: AtomicI64,
    pub timings: Timings,
    pub sources: Mutex<Vec<SourceCounters>>,
}

impl Stats {
    pub fn new(rule_names: &[String]) -> Stats {
        let stats = Stats::default();
        stats.set_rules(rule_names);
        stats
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
        let at = self.valve_refused_at_ms.load(Relaxed);
        if at != 0 && crate::now_ms() - at < 60_000 {
            "tripped"
        } else {
            "open"
        }
    }

    /// Per source: (path, offset, lines, lines/s, lag ms, bytes not yet read).
    pub fn source_rows(&self) -> Vec<SourceRow> {
        let s = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        s.iter()
            .map(|c| {
                let behind = std::fs::metadata(&c.path)
                    .ok()
                    .map(|m| m.len().saturating_sub(c.offset));
                (c.path.clone(), c.offset, c.lines, c.lines_per_s(), c.lag_ms, behind)
            })
            .collect()
    }

    pub fn to_json(&self) -> serde_json::Value {
        let sources: Vec<_> = self
            .source_rows()
            .into_iter()
            .map(|(path, offset, lines, rate, lag, behind)| {
                serde_json::json!({"path": path, "offset": offset, "lines": lines,
                    "lines_per_s": (rate * 10.0).round() / 10.0, "lag_ms": lag, "bytes_behind": behind})
            })
            .collect();
        let rules: Vec<_> = self
            .rule_counters()
            .iter()
            .map(|r| serde_json::json!({"name": r.name, "hits": r.hits.load(Relaxed), "bans": r.bans.load(Relaxed)}))
            .collect();
        serde_json::json!({
            "sources": sources,
            "rules": rules,
            "lines": self.lines.load(Relaxed),
            "unparsed": self.unparsed.load(Relaxed),
            "skipped_long": self.skipped_long.load(Relaxed),
            "stale": self.stale.load(Relaxed),
            "bans": self.bans.load(Relaxed),
            "safety_refused": self.refused.load(Relaxed),
            "safety": {
                "state": self.valve_state(),
                "max_bans_per_minute": self.valve_limit.load(Relaxed),
                "refused": self.refused.load(Relaxed),
            },
            "redis": {
                "connected": self.redis_connected.load(Relaxed),
                "used": self.redis_used.load(Relaxed),
                "errors": self.redis_errors.load(Relaxed),
                "round_trips": self.round_trips.load(Relaxed),
                "held_hits": self.held_hits.load(Relaxed),
                "inflight_hits": self.inflight_hits.load(Relaxed),
                "local_decisions": self.local_decisions.load(Relaxed),
                "queued_bans": self.ban_queue.load(Relaxed),
                "dropped_bans": self.ban_queue_dropped.load(Relaxed),
            },
            "bans_active": self.bans_active.load(Relaxed),
            "lag_ms": self.lag_ms.load(Relaxed),
            "reloads": self.reloads.load(Relaxed),
            "reload_errors": self.reload_errors.load(Relaxed),
        })
    }
}
