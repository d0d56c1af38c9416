//! The Prometheus endpoint (`metrics:` ADDRESS:PORT; off when absent): a
//! minimal HTTP/1.0 responder on its own task. Every scrape reads `Stats` as
//! they are (a `Collector`), so counting costs nothing extra; the two timing
//! histograms are filled where the work happens (flush, nft transaction).
//!
//! Names (docs/design.md §6): `fleetban_lines_total`, `fleetban_hits_total{rule}`,
//! `fleetban_bans_total{rule}`, `fleetban_redis_errors_total`,
//! `fleetban_redis_roundtrip_seconds`, `fleetban_nft_apply_seconds`,
//! `fleetban_sync_lag_seconds` (wall clock minus the log time of the last hit
//! read), plus `fleetban_unparsed_total`, `fleetban_stale_total`, `fleetban_future_total`,
//! `fleetban_safety_refused_total`, `fleetban_bans_active`,
//! `fleetban_redis_connected`, `fleetban_redis_state{state}` (1 for the
//! current one of embedded, connecting, connected, down),
//! `fleetban_redis_down_since_seconds` (while down); with `http:`, `fleetban_http_checks_total`,
//! `fleetban_http_denials_total`, `fleetban_http_malformed_total`,
//! `fleetban_http_connections`, `fleetban_http_evicted_total`,
//! `fleetban_http_head_timeouts_total` and
//! `fleetban_http_check_seconds` (filled by the endpoint, lock-free); per
//! rule, `fleetban_rule_lines_total{rule}` (lines it read) and
//! `fleetban_rule_unparsed_total{rule}` (of those, the ones its format
//! could not parse: `fleetban_unparsed_total` counts the lines no rule parsed).

use std::sync::atomic::AtomicU64;
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use prometheus_client::encoding::{DescriptorEncoder, EncodeMetric, NoLabelSet};
use prometheus_client::metrics::counter::ConstCounter;
use prometheus_client::metrics::gauge::ConstGauge;
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::TcpListener;
use tokio_util::sync::CancellationToken;

use super::stats::{RuleCounters, Stats};

#[derive(Debug)]
struct StatsCollector(Arc<Stats>);

impl std::fmt::Debug for Stats {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Stats")
    }
}

fn counter(e: &mut DescriptorEncoder, name: &str, help: &str, v: u64) -> std::fmt::Result {
    ConstCounter::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Counter)?)
}

fn gauge(e: &mut DescriptorEncoder, name: &str, help: &str, v: f64) -> std::fmt::Result {
    ConstGauge::new(v).encode(e.encode_descriptor(name, help, None, MetricType::Gauge)?)
}

impl prometheus_client::collector::Collector for StatsCollector {
    fn encode(&self, mut e: DescriptorEncoder) -> std::fmt::Result {
        let s = &self.0;
        counter(&mut e, "fleetban_lines", "Log lines read.", s.lines.load(Relaxed))?;
        counter(
            &mut e,
            "fleetban_unparsed",
            "Lines no format could parse.",
            s.unparsed.load(Relaxed),
        )?;
        counter(
            &mut e,
            "fleetban_stale",
            "Hits older than their window at arrival.",
            s.stale.load(Relaxed),
        )?;
        counter(
            &mut e,
            "fleetban_future",
            "Hits dated more than 5 s after the wall clock, counted at the wall clock.",
            s.future.load(Relaxed),
        )?;
        counter(
            &mut e,
            "fleetban_redis_errors",
            "Failed Redis operations.",
            s.redis_errors(),
        )?;
        counter(
            &mut e,
            "fleetban_safety_refused",
            "Bans the safety valve did not apply.",
            s.bans.refused.load(Relaxed),
        )?;
        gauge(
            &mut e,
            "fleetban_bans_active",
            "Bans in force on this host.",
            s.bans.active.load(Relaxed) as f64,
        )?;
        gauge(
            &mut e,
            "fleetban_redis_connected",
            "1 when the last Redis operation succeeded.",
            if s.redis_connected() { 1.0 } else { 0.0 },
        )?;
        {
            // One series per state, 1 for the current one (the usual shape
            // of an enum in Prometheus): alert on `{state="down"} == 1`.
            let now = s.redis_state();
            let mut states = e.encode_descriptor(
                "fleetban_redis_state",
                "1 for the state of Redis as this host sees it: embedded, connecting, connected or down.",
                None,
                MetricType::Gauge,
            )?;
            for state in ["embedded", "connecting", "connected", "down"] {
                let v = if state == now { 1.0 } else { 0.0 };
                ConstGauge::new(v).encode(states.encode_family(&[("state", state)])?)?;
            }
        }
        if let Some(since) = s.redis_down_since() {
            gauge(
                &mut e,
                "fleetban_redis_down_since_seconds",
                "While Redis is down: since when, in unix seconds.",
                since as f64 / 1000.0,
            )?;
        }
        gauge(
            &mut e,
            "fleetban_client_state_bytes",
            "Bytes the per-client windows in memory hold (embedded store, or the fallback while Redis is down).",
            (s.limit.state_bytes.load(Relaxed) + s.limit.order_bytes.load(Relaxed)) as f64,
        )?;
        gauge(
            &mut e,
            "fleetban_client_state_max_bytes",
            "safety.max_client_state: past it the windows farthest below their limits are shed.",
            s.limit.state_max.load(Relaxed) as f64,
        )?;
        counter(
            &mut e,
            "fleetban_client_state_shed",
            "Per-client windows shed to stay within safety.max_client_state (those clients count again from zero).",
            s.limit.shed_keys.load(Relaxed),
        )?;
        gauge(
            &mut e,
            "fleetban_sync_lag_seconds",
            "Wall clock minus the log time of the last hit read.",
            s.lag_ms.load(Relaxed) as f64 / 1000.0,
        )?;
        if let Some(h) = &s.http {
            let c = &h.counters;
            counter(
                &mut e,
                "fleetban_http_checks",
                "Checks answered at /check.",
                c.checks.load(Relaxed),
            )?;
            counter(
                &mut e,
                "fleetban_http_denials",
                "Checks answered with the deny status.",
                c.denials.load(Relaxed),
            )?;
            counter(
                &mut e,
                "fleetban_http_malformed",
                "Checks without a readable X-Client-Addr.",
                c.malformed.load(Relaxed),
            )?;
            gauge(
                &mut e,
                "fleetban_http_connections",
                "Connections open to the decision endpoint.",
                c.open.load(Relaxed) as f64,
            )?;
            counter(
                &mut e,
                "fleetban_http_evicted",
                "Connections closed to admit a new one, the table full.",
                c.evicted.load(Relaxed),
            )?;
            counter(
                &mut e,
                "fleetban_http_head_timeouts",
                "Connections closed because a request was not whole a second after its first byte.",
                c.head_timeouts.load(Relaxed),
            )?;
            let (sum, count, buckets) = c.latency.snapshot();
            e.encode_descriptor(
                "fleetban_http_check_seconds",
                "From the read that completed a check to its answer written.",
                None,
                MetricType::Histogram,
            )?
            .encode_histogram::<NoLabelSet>(sum, count, &buckets, None)?;
        }
        let rules = s.rule_counters();
        type Count = fn(&RuleCounters) -> &AtomicU64;
        let per_rule: [(&str, &str, Count); 4] = [
            ("fleetban_hits", "Hits counted per rule.", |r| &r.hits),
            ("fleetban_bans", "Bans decided per rule.", |r| &r.bans),
            ("fleetban_rule_lines", "Lines each rule read.", |r| &r.lines),
            (
                "fleetban_rule_unparsed",
                "Lines each rule read that its format could not parse.",
                |r| &r.unparsed,
            ),
        ];
        for (name, help, count) in per_rule {
            let mut family = e.encode_descriptor(name, help, None, MetricType::Counter)?;
            for r in &rules {
                let labels = [("rule", r.name.as_str())];
                ConstCounter::new(count(r).load(Relaxed)).encode(family.encode_family(&labels)?)?;
            }
        }
        Ok(())
    }
}

/// The text exposition of `stats`.
pub fn render(stats: &Arc<Stats>) -> String {
    let mut registry = Registry::default();
    registry.register_collector(Box::new(StatsCollector(stats.clone())));
    registry.register(
        "fleetban_redis_roundtrip_seconds",
        "Redis round trips of the limiter.",
        stats.limit.roundtrip.clone(),
    );
    registry.register(
        "fleetban_nft_apply_seconds",
        "nft transactions.",
        stats.nft_apply.clone(),
    );
    let mut out = String::new();
    if prometheus_client::encoding::text::encode(&mut out, &registry).is_err() {
        out.clear();
    }
    out
}

pub async fn serve(listener: TcpListener, stats: Arc<Stats>, shutdown: CancellationToken) {
    loop {
        let (mut sock, _) = tokio::select! {
            _ = shutdown.cancelled() => return,
            a = listener.accept() => match a {
                Ok(a) => a,
                Err(e) => {
                    tracing::warn!(error = %e, "Metrics endpoint: accept failed.");
                    tokio::time::sleep(std::time::Duration::from_millis(100)).await;
                    continue;
                }
            },
        };
        let stats = stats.clone();
        tokio::spawn(async move {
            // Read the request head (bounded in size and time), answer, close.
            let mut buf = [0u8; 2048];
            let mut n = 0;
            let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(2);
            while n < buf.len() && !buf[..n].windows(4).any(|w| w == b"\r\n\r\n") {
                match tokio::time::timeout_at(deadline, sock.read(&mut buf[n..])).await {
                    Ok(Ok(0)) | Ok(Err(_)) | Err(_) => break,
                    Ok(Ok(k)) => n += k,
                }
            }
            let head = String::from_utf8_lossy(&buf[..n]);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if path == "/metrics" || path.starts_with("/metrics?") {
                ("200 OK", render(&stats))
            } else {
                ("404 Not Found", "try /metrics\n".to_owned())
            };
            let resp = format!(
                "HTTP/1.0 {status}\r\nContent-Type: application/openmetrics-text; version=1.0.0; charset=utf-8\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
            let _ = sock.write_all(resp.as_bytes()).await;
            let _ = sock.shutdown().await;
        });
    }
}

#[cfg(test)]
mod tests {
    use std::sync::atomic::Ordering::Relaxed;
    use std::sync::Arc;

    use super::{render, Stats};
    use crate::http::HttpCounters;

    #[test]
    fn each_rule_s_lines_and_unparsed_lines_beside_the_total() {
        let stats = Stats::detached();
        let rules = stats.set_rules(&["plain".into(), "limit-req".into()]);
        stats.unparsed.store(1, Relaxed);
        for (r, (lines, unparsed)) in rules.iter().zip([(8, 1), (8, 8)]) {
            r.lines.store(lines, Relaxed);
            r.unparsed.store(unparsed, Relaxed);
        }
        let text = render(&Arc::new(stats));
        for line in [
            "fleetban_unparsed_total 1",
            "fleetban_rule_lines_total{rule=\"plain\"} 8",
            "fleetban_rule_unparsed_total{rule=\"plain\"} 1",
            "fleetban_rule_unparsed_total{rule=\"limit-req\"} 8",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }

    #[test]
    fn the_endpoint_s_counters_and_histogram_only_with_http() {
        assert!(!render(&Arc::new(Stats::detached())).contains("fleetban_http"));
        let counters = Arc::new(HttpCounters::default());
        counters.checks.store(5, Relaxed);
        counters.denials.store(2, Relaxed);
        counters.malformed.store(1, Relaxed);
        counters.open.store(7, Relaxed);
        counters.evicted.store(3, Relaxed);
        counters.head_timeouts.store(4, Relaxed);
        counters.latency.observe(std::time::Duration::from_micros(30));
        let text = render(&Arc::new(Stats::detached().with_http("unix:/x".into(), counters)));
        for line in [
            "fleetban_http_checks_total 5",
            "fleetban_http_denials_total 2",
            "fleetban_http_malformed_total 1",
            "fleetban_http_connections 7.0",
            "fleetban_http_evicted_total 3",
            "fleetban_http_head_timeouts_total 4",
            "fleetban_http_check_seconds_count 1",
            "fleetban_http_check_seconds_bucket{le=\"0.00004\"} 1",
            "fleetban_http_check_seconds_bucket{le=\"0.00002\"} 0",
        ] {
            assert!(text.lines().any(|l| l == line), "{line} in\n{text}");
        }
    }
}
