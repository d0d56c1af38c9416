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

#[derive(Default)]
pub struct SourceCounters {
    pub path: String,
    pub offset: u64,
    pub lines: u64,
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
    /// `redis:` is configured (else the embedded store is used).
    pub redis_used: AtomicBool,
    pub round_trips: AtomicU64,
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

    pub fn source(&self, path: &str, offset: u64, lines: u64) {
        let mut s = self.sources.lock().unwrap_or_else(|e| e.into_inner());
        match s.iter_mut().find(|c| c.path == path) {
            Some(c) => {
                c.offset = offset;
                c.lines += lines;
            }
            None => s.push(SourceCounters {
                path: path.to_owned(),
                offset,
                lines,
            }),
        }
    }

    pub fn to_json(&self) -> serde_json::Value {
        let sources: Vec<_> = self
            .sources
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .iter()
            .map(|s| serde_json::json!({"path": s.path, "offset": s.offset, "lines": s.lines}))
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
            "redis": {
                "connected": self.redis_connected.load(Relaxed),
                "errors": self.redis_errors.load(Relaxed),
                "round_trips": self.round_trips.load(Relaxed),
            },
            "bans_active": self.bans_active.load(Relaxed),
            "lag_ms": self.lag_ms.load(Relaxed),
            "reloads": self.reloads.load(Relaxed),
            "reload_errors": self.reload_errors.load(Relaxed),
        })
    }
}
