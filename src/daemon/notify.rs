//! systemd's notify protocol: one datagram to $NOTIFY_SOCKET per state
//! change (READY=1, RELOADING=1, STOPPING=1, STATUS=..., WATCHDOG=1).
//! Nothing happens without it.
//!
//! The watchdog pings only while the pipeline makes progress: it is either
//! waiting for input or has been busy for less than the watchdog interval
//! (`Stats::busy_since_ms`; a failed Redis attempt, `LimitCounters::
//! failed_at_ms`, counts as progress too: retrying is not being stuck). A
//! pipeline stuck in one flush stops the pings and systemd restarts the
//! service.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::stats::Stats;

pub fn notify(state: &str) {
    let Some(path) = std::env::var_os("NOTIFY_SOCKET") else {
        return;
    };
    let Ok(sock) = UnixDatagram::unbound() else { return };
    let bytes = path.as_encoded_bytes();
    let addr = match bytes.strip_prefix(b"@") {
        Some(name) => SocketAddr::from_abstract_name(name),
        None => SocketAddr::from_pathname(std::path::Path::new(&path)),
    };
    if let Ok(addr) = addr {
        let _ = sock.send_to_addr(state.as_bytes(), &addr);
    }
}

/// `CLOCK_MONOTONIC` in µs, as systemd wants it with `RELOADING=1`.
pub fn monotonic_usec() -> u64 {
    let mut ts = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_gettime only writes the timespec we pass.
    unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut ts) };
    ts.tv_sec as u64 * 1_000_000 + ts.tv_nsec as u64 / 1_000
}

/// `WatchdogSec=` of the unit, when systemd asked for pings (and for this
/// process: `WATCHDOG_PID` absent or ours).
pub fn watchdog_interval() -> Option<Duration> {
    std::env::var_os("NOTIFY_SOCKET")?;
    let usec: u64 = std::env::var("WATCHDOG_USEC").ok()?.parse().ok()?;
    if let Ok(pid) = std::env::var("WATCHDOG_PID") {
        if pid.parse::<u32>().ok() != Some(std::process::id()) {
            return None;
        }
    }
    (usec > 0).then(|| Duration::from_micros(usec))
}

/// Whether the pipeline is waiting for input or busy for less than `limit`.
pub fn progressing(stats: &Stats, limit: Duration, now_ms: i64) -> bool {
    let since = stats.busy_since_ms.load(Relaxed);
    let progress = since.max(stats.limit.failed_at_ms.load(Relaxed));
    since == 0 || now_ms - progress < limit.as_millis() as i64
}

/// Pings `WATCHDOG=1` every half interval while the pipeline progresses.
pub async fn watchdog(stats: Arc<Stats>, interval: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(interval / 2);
    let mut stalled = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        if progressing(&stats, interval, crate::now_ms()) {
            notify("WATCHDOG=1");
            stalled = false;
        } else if !stalled {
            stalled = true;
            tracing::error!("Pipeline stuck in one flush; watchdog pings stopped.");
        }
    }
}

/// `STATUS=` every few seconds: what `systemctl status` shows.
pub async fn status_updates(stats: Arc<Stats>, shutdown: CancellationToken) {
    if std::env::var_os("NOTIFY_SOCKET").is_none() {
        return;
    }
    let mut tick = tokio::time::interval(Duration::from_secs(5));
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => notify(&format!("STATUS={}", summary(&stats))),
        }
    }
}

/// One line: lines read, bans active and made, Redis, lag.
pub fn summary(stats: &Stats) -> String {
    let redis = match (stats.health.is_some(), stats.redis_connected()) {
        (false, _) => "not used",
        (true, true) => "up",
        (true, false) => "DOWN",
    };
    format!(
        "{} lines, {} bans active, {} made, {} refused by safety valve, redis {}, lag {} ms",
        stats.lines.load(Relaxed),
        stats.bans.active.load(Relaxed),
        stats.bans.bans.load(Relaxed),
        stats.bans.refused.load(Relaxed),
        redis,
        stats.lag_ms.load(Relaxed),
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pings_only_while_idle_or_busy_for_less_than_the_interval() {
        let stats = Stats::detached();
        let limit = Duration::from_secs(30);
        let now = 1_000_000_000;
        assert!(progressing(&stats, limit, now), "idle");
        stats.busy_since_ms.store(now - 29_000, Relaxed);
        assert!(progressing(&stats, limit, now), "busy 29 s");
        stats.busy_since_ms.store(now - 31_000, Relaxed);
        assert!(!progressing(&stats, limit, now), "stuck 31 s");
        stats.limit.failed_at_ms.store(now - 1_000, Relaxed);
        assert!(progressing(&stats, limit, now), "retrying Redis");
    }
}
