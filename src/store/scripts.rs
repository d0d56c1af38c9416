//! The Lua scripts of `lua/`, embedded in the binary and called by SHA:
//! the ban list's here, each limiter algorithm's in its module
//! (`limit::algorithm`).

use super::Conn;

/// A Lua script of `lua/`, called by SHA (EVALSHA) and loaded again when the
/// server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
pub struct LuaScript {
    pub name: &'static str,
    src: String,
    sha: String,
}

/// The line of `fixed_window.lua` and `sliding_window.lua` that stands for
/// `lua/tier.lua` (the fixed-window counter both use; a script cannot load
/// another).
const TIER_LINE: &str = "-- tier.lua: the fixed-window counter (lua/tier.lua), put here when the script is embedded\n";
const TIER: &str = include_str!("../../lua/tier.lua");

/// `src` with `lua/tier.lua` in place of its [`TIER_LINE`].
pub(crate) fn with_tier(src: &str) -> String {
    assert_eq!(src.matches(TIER_LINE).count(), 1, "one place for lua/tier.lua");
    src.replacen(TIER_LINE, TIER, 1)
}

/// The line of the scripts that read or write ban records that stands for
/// `lua/record.lua` (the records' encoding, [`RECORD_LUA`]).
const RECORD_LINE: &str = "-- record.lua: the records (lua/record.lua), put here when the script is embedded\n";

/// `lua/record.lua`: how a ban's record is stored (compact in buckets, or
/// JSON), for the scripts here and for harnesses that write records as
/// `ban.lua` does (its `rec_put`; `KEYS[2]` is `{prefix}:banrec`).
pub const RECORD_LUA: &str = include_str!("../../lua/record.lua");

/// `src` with [`RECORD_LUA`] in place of its [`RECORD_LINE`].
fn with_record(src: &str) -> String {
    assert_eq!(src.matches(RECORD_LINE).count(), 1, "one place for lua/record.lua");
    src.replacen(RECORD_LINE, RECORD_LUA, 1)
}

pub static BAN: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("ban", with_record(include_str!("../../lua/ban.lua"))));
pub static UNBAN: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("unban", with_record(include_str!("../../lua/unban.lua"))));

pub static CANON: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("canon", with_record(include_str!("../../lua/canon.lua"))));
/// `lua/bans_page.lua`: one page of the active list (`bans::list`'s read).
pub static BANS_PAGE: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("bans_page", include_str!("../../lua/bans_page.lua").to_owned()));
pub static RESTORE: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("restore", with_record(include_str!("../../lua/restore.lua"))));

/// `lua/probe.lua`: the commands fleetban needs that the user may not run
/// (`fleetban check --online`, `store::probe`).
pub static PROBE: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("probe", include_str!("../../lua/probe.lua").to_owned()));

impl LuaScript {
    pub(crate) fn new(name: &'static str, src: String) -> LuaScript {
        let sha = redis::Script::new(&src).get_hash().to_owned();
        LuaScript { name, src, sha }
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
        let _: String = redis::cmd("SCRIPT").arg("LOAD").arg(&self.src).query_async(con).await?;
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The fixed-window counter is one semantics: `fixed_window.lua` and the
    /// prefilter of `sliding_window.lua` are embedded with `lua/tier.lua`.
    #[test]
    fn both_fixed_window_tiers_are_one_copy() {
        use crate::limit::algorithm::{fixed_window, sliding_window};
        for script in [&*fixed_window::SCRIPT, &*sliding_window::SCRIPT] {
            assert_eq!(
                script.src.matches("local function tier_offer").count(),
                1,
                "{}",
                script.name
            );
            assert!(
                script.src.contains(TIER) && !script.src.contains(TIER_LINE),
                "{}",
                script.name
            );
        }
    }
}
