//! What the windows in Redis hold of one client key now, read without
//! changing them (`fleetban explain`): each rule's algorithm reads its own
//! keys as its script keeps them (`limit::algorithm`, `peek`). The same
//! reading of the embedded store is `MemoryLimiter::peek`.

use ipnet::IpNet;

use super::algorithm::At;
use super::RuleLimit;
use crate::config::Scope;
use crate::store::{Conn, Keys};

/// Each rule's count of `key` at `now` (ms), against its `hits`; the
/// `scope: host` windows are `host`'s.
pub async fn redis_counts(
    con: &mut Conn,
    keys: &Keys,
    rules: &[RuleLimit],
    host: &str,
    key: &IpNet,
    now: i64,
) -> redis::RedisResult<Vec<u64>> {
    let mut out = Vec::with_capacity(rules.len());
    for rule in rules {
        let at = At {
            keys,
            rule,
            addr: key,
            host: (rule.scope == Scope::Host).then_some(host),
        };
        out.push(rule.algorithm_impl().peek(con, &at, now).await?);
    }
    Ok(out)
}
