//! The connection to Redis and the names of our keys (DESIGN §3).
//!
//! Every key that belongs to one address carries the address as a hash tag
//! (`{203.0.113.7}`), every fleet-wide key carries the prefix as one
//! (`{fleetban}:bans`), so that each script touches a single Cluster slot.

use std::time::Duration;

use ipnet::IpNet;

use crate::addr::AddrText;

use crate::config::RedisConfig;

mod conn;
pub use conn::Conn;

/// The stream keeps about this many events; a host further behind reconciles.
pub const STREAM_MAXLEN: u64 = 100_000;

/// Key names under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// `fleetban:win:{ADDR}:RULE`, with `:HOST` for `scope: host`.
    pub fn window(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        match host {
            None => format!("{}:win:{{{}}}:{}", self.prefix, AddrText(addr), rule),
            Some(h) => format!("{}:win:{{{}}}:{}:{}", self.prefix, AddrText(addr), rule, h),
        }
    }

    /// `fleetban:fw:{ADDR}:RULE` (`:HOST` for `scope: host`): the base of
    /// the fixed-window counters; the script appends `:N`, the window number.
    pub fn fixed(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.per_addr("fw", addr, rule, host)
    }

    /// `fleetban:tb:{ADDR}:RULE`: token bucket state (HASH).
    pub fn bucket(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.per_addr("tb", addr, rule, host)
    }

    /// `fleetban:sc:{ADDR}:RULE`: sliding counter state (HASH).
    pub fn counter(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.per_addr("sc", addr, rule, host)
    }

    fn per_addr(&self, kind: &str, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        match host {
            None => format!("{}:{kind}:{{{}}}:{}", self.prefix, AddrText(addr), rule),
            Some(h) => format!("{}:{kind}:{{{}}}:{}:{}", self.prefix, AddrText(addr), rule, h),
        }
    }

    pub fn bans(&self) -> String {
        format!("{{{}}}:bans", self.prefix)
    }

    pub fn records(&self) -> String {
        format!("{{{}}}:banrec", self.prefix)
    }

    pub fn events(&self) -> String {
        format!("{{{}}}:events", self.prefix)
    }

    /// Offence count of one address. Tagged with the prefix, not the address
    /// (a change from DESIGN's `fleetban:off:{ADDR}`): `ban.lua` reads and
    /// bumps it in the same atomic call as the ban list, which in a Cluster
    /// requires the same slot.
    pub fn offences(&self, addr: &IpNet) -> String {
        format!("{{{}}}:off:{}", self.prefix, AddrText(addr))
    }
}

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

/// A Lua script of `lua/`, called by SHA (EVALSHA) and loaded again when the
/// server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
pub struct LuaScript {
    pub name: &'static str,
    src: &'static str,
    sha: String,
}

pub static SLIDING_WINDOW: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("sliding_window", include_str!("../lua/sliding_window.lua")));
pub static FIXED_WINDOW: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("fixed_window", include_str!("../lua/fixed_window.lua")));
pub static TOKEN_BUCKET: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("token_bucket", include_str!("../lua/token_bucket.lua")));
pub static SLIDING_COUNTER: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("sliding_counter", include_str!("../lua/sliding_counter.lua")));
pub static BAN: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("ban", include_str!("../lua/ban.lua")));
pub static UNBAN: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("unban", include_str!("../lua/unban.lua")));

impl LuaScript {
    fn new(name: &'static str, src: &'static str) -> LuaScript {
        LuaScript {
            name,
            src,
            sha: redis::Script::new(src).get_hash().to_owned(),
        }
    }

    /// `EVALSHA sha numkeys keys...` ready for arguments; for pipelines.
    pub fn cmd(&self, keys: &[&str]) -> redis::Cmd {
        let mut c = redis::cmd("EVALSHA");
        c.arg(&self.sha).arg(keys.len());
        for k in keys {
            c.arg(*k);
        }
        c
    }

    pub async fn load(&self, con: &mut Conn) -> redis::RedisResult<()> {
        let _: String = redis::cmd("SCRIPT").arg("LOAD").arg(self.src).query_async(con).await?;
        Ok(())
    }

    /// Runs one prepared call, loading the script once if the server lost it.
    pub async fn run<T: redis::FromRedisValue>(&self, con: &mut Conn, cmd: &redis::Cmd) -> redis::RedisResult<T> {
        match cmd.query_async(con).await {
            Err(e) if is_noscript(&e) => {
                self.load(con).await?;
                cmd.query_async(con).await
            }
            other => other,
        }
    }
}

pub fn is_noscript(e: &redis::RedisError) -> bool {
    e.kind() == redis::ErrorKind::Server(redis::ServerErrorKind::NoScript)
}

pub fn value_is_noscript(v: &redis::Value) -> bool {
    matches!(v, redis::Value::ServerError(e) if e.kind() == Some(redis::ServerErrorKind::NoScript))
}
