//! systemd's notify protocol: one datagram to $NOTIFY_SOCKET per state
//! change (READY=1, RELOADING=1, STOPPING=1, STATUS=..., WATCHDOG=1).
//! Nothing happens without it.
//!
//! The watchdog pings only while the pipeline makes progress: it is either
//! waiting for input or has been busy for less than the watchdog interval
//! (`Stats::busy_since_ms`; a failed Redis attempt, `LimitCounters::
//! failed_at_ms`, counts as progress too: retrying is not being stuck); and
//! while the enforcer is not stuck in nft: no call of it has been running
//! for half the interval or more (`Enforced::busy_since_ms`). A pipeline
//! stuck in one flush, or an nft that hangs, stops the pings and systemd
//! restarts the service.

use std::os::linux::net::SocketAddrExt;
use std::os::unix::net::{SocketAddr, UnixDatagram};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::enforcer::Enforced;
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

/// Whether the enforcer is idle or in an nft call begun less than `limit` ago.
pub fn enforcer_alive(enforced: &Enforced, limit: Duration, now_ms: i64) -> bool {
    let since = enforced.busy_since_ms.load(Relaxed);
    since == 0 || now_ms - since < limit.as_millis() as i64
}

/// Pings `WATCHDOG=1` every half interval while the pipeline progresses
/// and the enforcer is not stuck in nft for half the interval.
pub async fn watchdog(stats: Arc<Stats>, enforced: Arc<Enforced>, interval: Duration, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(interval / 2);
    let mut stalled = false;
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = crate::now_ms();
        let pipeline = progressing(&stats, interval, now);
        let enforcer = enforcer_alive(&enforced, interval / 2, now);
        if pipeline && enforcer {
            if stalled {
                tracing::info!("Watchdog pings resumed.");
            }
            notify("WATCHDOG=1");
            stalled = false;
        } else if !stalled {
            stalled = true;
            match pipeline {
                false => tracing::error!("Pipeline stuck in one flush; watchdog pings stopped."),
                true => tracing::error!("Enforcer stuck in an nft call; watchdog pings stopped."),
            }
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
        for (busy_for, alive, what) in [
            (None, true, "idle"),
            (Some(29_000), true, "busy 29 s"),
            (Some(31_000), false, "stuck 31 s"),
        ] {
            if let Some(ms) = busy_for {
                stats.busy_since_ms.store(now - ms, Relaxed);
            }
            assert_eq!(progressing(&stats, limit, now), alive, "{what}");
        }
        stats.limit.failed_at_ms.store(now - 1_000, Relaxed);
        assert!(progressing(&stats, limit, now), "retrying Redis");
    }

    #[test]
    fn an_nft_call_running_half_the_interval_is_stuck() {
        let e = Enforced::default();
        let half = Duration::from_secs(15);
        let now = 1_000_000_000;
        for (busy_for, alive, what) in [
            (None, true, "idle"),
            (Some(14_000), true, "in nft for 14 s"),
            (Some(16_000), false, "in nft for 16 s"),
        ] {
            if let Some(ms) = busy_for {
                e.busy_since_ms.store(now - ms, Relaxed);
            }
            assert_eq!(enforcer_alive(&e, half, now), alive, "{what}");
        }
    }
}
