//! Everything about talking to Redis that is not a semantics of its own:
//! the connection ([`Conn`], `conn.rs`), whether Redis answers as this host
//! sees it ([`Health`], `health.rs`), the key names (`keys.rs`) and the
//! embedded Lua scripts (`scripts.rs`). What the scripts decide belongs to
//! `limit` and `bans`.

use std::time::Duration;

use crate::config::RedisConfig;

mod conn;
mod health;
mod keys;
mod scripts;

pub use conn::Conn;
pub use health::Health;
pub use keys::{Keys, STREAM_MAXLEN};
pub use scripts::{
    is_noscript, value_is_noscript, LuaScript, BAN, FIXED_WINDOW, SLIDING_COUNTER, SLIDING_WINDOW, TOKEN_BUCKET, UNBAN,
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
