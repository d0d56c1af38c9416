//! The decision endpoint (`http:`, docs/design.md §5 and §6): nginx's
//! `auth_request` asks `GET /check` with `X-Client-Addr: ADDR`, and gets
//! 204 when no ban in force covers ADDR, `deny_status` (with `Retry-After`)
//! when one does.
//!
//! bytes -> head (`request.rs`) -> answer from [`Decisions`]
//! (`decisions.rs`: this host's view of the list, kept by [`follow`] from
//! the enforcer's stream of changes) -> bytes (`server.rs`: connections
//! with keepalive and pipelining, on what `listen.rs` binds: the unix
//! socket with its owner and mode, or loopback TCP; `table.rs`: at most so
//! many open, a new one taking the place of the one quiet the longest).
//! No Redis command per check: answers come from memory only.

mod decisions;
mod listen;
mod request;
mod server;
mod table;

pub use decisions::{follow, Decisions};
pub use listen::{bind, Listener};
pub use request::MAX_HEAD;
pub use server::{serve, Endpoint, PERMANENT_RETRY_AFTER_S};

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::time::Duration;

/// What the endpoint counts; the daemon's `Stats` reads it for `status`
/// and the metrics. Atomics only: a check takes no lock to be counted.
#[derive(Default)]
pub struct HttpCounters {
    /// `GET /check` requests answered.
    pub checks: AtomicU64,
    /// Checks answered `deny_status`.
    pub denials: AtomicU64,
    /// Checks without a readable `X-Client-Addr` (answered 204).
    pub malformed: AtomicU64,
    /// From the read that completed a check to its answer written.
    pub latency: Latency,
    /// Connections open now.
    pub open: AtomicU64,
    /// Connections closed to make room for a new one (the table full: the
    /// one quiet the longest goes).
    pub evicted: AtomicU64,
    /// Connections closed because a request's head (and body) did not
    /// arrive whole within a second of its first byte.
    pub head_timeouts: AtomicU64,
}

/// Upper bounds of [`Latency`]'s buckets, in seconds: 10 µs doubling to
/// ~20 ms, then +Inf.
const BOUNDS: [f64; 12] = [
    0.000_01, 0.000_02, 0.000_04, 0.000_08, 0.000_16, 0.000_32, 0.000_64, 0.001_28, 0.002_56, 0.005_12, 0.010_24,
    0.020_48,
];

/// A latency histogram of atomic buckets (prometheus-client's `Histogram`
/// takes a mutex per observation).
#[derive(Default)]
pub struct Latency {
    /// Per bucket (the last one is +Inf), not cumulative.
    buckets: [AtomicU64; BOUNDS.len() + 1],
    sum_ns: AtomicU64,
}

impl Latency {
    pub fn observe(&self, d: Duration) {
        let s = d.as_secs_f64();
        let i = BOUNDS.iter().position(|&b| s <= b).unwrap_or(BOUNDS.len());
        self.buckets[i].fetch_add(1, Relaxed);
        self.sum_ns
            .fetch_add(u64::try_from(d.as_nanos()).unwrap_or(u64::MAX), Relaxed);
    }

    /// The upper bound in seconds of the bucket holding the `q` quantile
    /// (0 < q <= 1) of every check so far; None before the first check,
    /// infinite past the last bound.
    pub fn quantile(&self, q: f64) -> Option<f64> {
        let (_, count, buckets) = self.snapshot();
        if count == 0 {
            return None;
        }
        let rank = (q * count as f64).ceil().max(1.0) as u64;
        let mut seen = 0;
        buckets.into_iter().find_map(|(bound, n)| {
            seen += n;
            (seen >= rank).then_some(bound)
        })
    }

    /// (sum in seconds, count, (upper bound, count) per bucket, not
    /// cumulative), as prometheus-client encodes a histogram.
    pub fn snapshot(&self) -> (f64, u64, Vec<(f64, u64)>) {
        let buckets: Vec<(f64, u64)> = BOUNDS
            .iter()
            .copied()
            .chain([f64::INFINITY])
            .zip(&self.buckets)
            .map(|(b, c)| (b, c.load(Relaxed)))
            .collect();
        let count = buckets.iter().map(|(_, c)| c).sum();
        (self.sum_ns.load(Relaxed) as f64 / 1e9, count, buckets)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn latency_buckets() {
        let l = Latency::default();
        l.observe(Duration::from_micros(5));
        l.observe(Duration::from_micros(15));
        l.observe(Duration::from_secs(1));
        let (sum, count, buckets) = l.snapshot();
        assert_eq!(count, 3);
        assert!((sum - 1.000_02).abs() < 1e-9);
        assert_eq!(buckets[0], (0.000_01, 1));
        assert_eq!(buckets[1], (0.000_02, 1));
        assert_eq!(buckets[BOUNDS.len()], (f64::INFINITY, 1));
        assert_eq!(l.quantile(0.33), Some(0.000_01));
        assert_eq!(l.quantile(0.5), Some(0.000_02));
        assert_eq!(l.quantile(0.99), Some(f64::INFINITY));
        assert_eq!(Latency::default().quantile(0.99), None);
        for _ in 0..200 {
            l.observe(Duration::from_micros(30));
        }
        assert_eq!(l.quantile(0.99), Some(0.000_04));
    }
}
