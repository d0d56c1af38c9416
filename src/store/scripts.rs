//! The Lua scripts of `lua/`, embedded in the binary and called by SHA.

use super::Conn;

/// A Lua script of `lua/`, called by SHA (EVALSHA) and loaded again when the
/// server answers NOSCRIPT (after a restart or SCRIPT FLUSH).
pub struct LuaScript {
    pub name: &'static str,
    src: &'static str,
    sha: String,
}

pub static SLIDING_WINDOW: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("sliding_window", include_str!("../../lua/sliding_window.lua")));
pub static FIXED_WINDOW: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("fixed_window", include_str!("../../lua/fixed_window.lua")));
pub static TOKEN_BUCKET: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("token_bucket", include_str!("../../lua/token_bucket.lua")));
pub static SLIDING_COUNTER: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("sliding_counter", include_str!("../../lua/sliding_counter.lua")));
pub static BAN: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("ban", include_str!("../../lua/ban.lua")));
pub static UNBAN: std::sync::LazyLock<LuaScript> =
    std::sync::LazyLock::new(|| LuaScript::new("unban", include_str!("../../lua/unban.lua")));

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

#[cfg(test)]
mod tests {
    /// The lines between `-- BEGIN tier` and `-- END tier` of a script.
    fn tier(src: &str) -> &str {
        let start = src.find("-- BEGIN tier").expect("a tier block");
        let end = src[start..].find("-- END tier").expect("its end") + start;
        &src[start..end]
    }

    /// The fixed-window counter is one semantics: `fixed_window.lua` and the
    /// prefilter of `sliding_window.lua` carry the same copy of its code.
    #[test]
    fn both_fixed_window_tiers_are_one_copy() {
        let fixed = tier(include_str!("../../lua/fixed_window.lua"));
        assert!(fixed.contains("local function tier_offer"));
        assert_eq!(fixed, tier(include_str!("../../lua/sliding_window.lua")));
    }
}
