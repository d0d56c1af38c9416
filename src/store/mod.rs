//! Everything about talking to Redis that is not a semantics of its own:
//! the connection ([`Conn`], `conn.rs`), whether Redis answers as this host
//! sees it ([`Health`], `health.rs`), the key names (`keys.rs`) and the
//! embedded Lua scripts (`scripts.rs`), and whether the user may run what
//! fleetban sends (`probe.rs`, `check --online`). What the scripts decide belongs to
//! `limit` and `bans`.

use std::time::Duration;

use crate::config::RedisConfig;

mod conn;
mod health;
mod keys;
mod probe;
mod scripts;

pub use conn::Conn;
pub use health::{heartbeat, is_oom, is_outage, Health};
pub use keys::{slot, Keys, StateKey, ADDRESS_BUCKETS, STREAM_MAXLEN};
pub use probe::{probe, Probe};
pub(crate) use scripts::with_tier;
pub use scripts::{
    is_noscript, value_is_noscript, LuaScript, BAN, BANS_PAGE, CANON, PROBE, RECORD_LUA, RESTORE, UNBAN,
};

/// Connects now (fails if Redis does not answer); every command times out
/// after `response_timeout` so a slow Redis is treated as a down one.
pub async fn connect(cfg: &RedisConfig, response_timeout: Option<Duration>) -> redis::RedisResult<Conn> {
    Conn::connect(cfg, response_timeout).await
}

/// As [`connect`], without waiting for the first connection: a Redis that is
/// down at start costs the daemon nothing but errors (handled by
/// `redis.on_down`) until it answers. Fails only on a bad configuration.
pub fn connect_lazy(cfg: &RedisConfig, response_timeout: Option<Duration>) -> redis::RedisResult<Conn> {
    Conn::lazy(cfg, response_timeout)
}

/// The server's `zset-max-listpack-entries` (`zset-max-ziplist-entries`
/// before Redis 7), or None when the server refuses CONFIG (managed services
/// often rename or forbid it) or answers something else.
pub async fn listpack_threshold(con: &mut Conn) -> Option<u64> {
    for name in ["zset-max-listpack-entries", "zset-max-ziplist-entries"] {
        let reply: redis::RedisResult<Vec<String>> = redis::cmd("CONFIG").arg("GET").arg(name).query_async(con).await;
        match reply {
            Ok(v) => {
                if let Some(n) = v.get(1).and_then(|s| s.parse().ok()) {
                    return Some(n);
                }
            }
            Err(e) => {
                tracing::debug!(error = %e, "CONFIG GET refused.");
                return None;
            }
        }
    }
    None
}

/// Logs one warning if [`old_layout_key`] finds a key of the layout before
/// buckets (docs/design.md §3). Those keys are ignored: windows start afresh
/// under the new names, and the old ones expire with their windows.
pub async fn warn_old_layout(con: &mut Conn, keys: &Keys) {
    if let Some(old) = old_layout_key(con, keys).await {
        tracing::warn!(
            key = %old,
            "Per-address keys of the layout before buckets found: they are ignored (windows start afresh) and expire with their windows."
        );
    }
}

/// A per-address key of the layout before buckets (`fleetban:win:{ADDR}:RULE`)
/// among the first keys a bounded SCAN sees: at most 10 steps of 100 (on a
/// Cluster, of one node), a sample, enough for a layout in use. None also
/// when SCAN is refused (the shipped ACL user may not SCAN).
pub async fn old_layout_key(con: &mut Conn, keys: &Keys) -> Option<String> {
    let pattern = keys.per_addr_pattern();
    let mut cursor: u64 = 0;
    for _ in 0..10 {
        let reply: redis::RedisResult<(u64, Vec<String>)> = redis::cmd("SCAN")
            .arg(cursor)
            .arg("MATCH")
            .arg(&pattern)
            .arg("COUNT")
            .arg(100)
            .query_async(con)
            .await;
        match reply {
            Ok((next, found)) => {
                if let Some(old) = found.into_iter().find(|k| keys.is_old_layout(k)) {
                    return Some(old);
                }
                if next == 0 {
                    return None;
                }
                cursor = next;
            }
            Err(e) => {
                tracing::debug!(error = %e, "SCAN for old-layout keys refused.");
                return None;
            }
        }
    }
    None
}
