//! What the windows in Redis hold of one client key now, read without
//! changing them (`fleetban explain`), under the limiter's own key names
//! (`store::Keys`) and as its scripts keep them: a sliding window's ZSET
//! (`ZCOUNT` over (now - window, now]; with a prefilter, its first tier's
//! fixed-window count until that is full), a fixed window's HASH count, a
//! sliding counter's estimate, a token bucket's tokens in use. The same
//! reading of the embedded store is `MemoryLimiter::peek`.

use ipnet::IpNet;

use super::RuleLimit;
use crate::config::{Algorithm, Scope};
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
    for r in rules {
        let host = (r.scope == Scope::Host).then_some(host);
        let w = r.window_ms.max(1);
        let fixed_key = format!("{}:{}", keys.fixed(key, &r.name, host), now.div_euclid(w));
        let count = match r.algorithm {
            Algorithm::FixedWindow => fixed(con, &fixed_key).await?,
            Algorithm::SlidingWindow => {
                let members: u64 = redis::cmd("ZCOUNT")
                    .arg(keys.window(key, &r.name, host))
                    .arg(format!("({}", now - w))
                    .arg(now)
                    .query_async(con)
                    .await?;
                let pre = u64::from(r.prefilter);
                match pre {
                    0 => members,
                    _ => match fixed(con, &fixed_key).await? {
                        f if f < pre => f,
                        _ => pre + members,
                    },
                }
            }
            Algorithm::TokenBucket => {
                let t: Option<String> = redis::cmd("HGET")
                    .arg(keys.bucket(key, &r.name, host))
                    .arg("t")
                    .query_async(con)
                    .await?;
                let tat = t.and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0) as i64;
                let d = tat - now.saturating_mul(1000);
                let interval = r.interval_us.max(1);
                if d <= 0 {
                    0
                } else {
                    ((d + interval - 1) / interval) as u64
                }
            }
            Algorithm::SlidingCounter => {
                let v: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(keys.counter(key, &r.name, host))
                    .arg("n")
                    .arg("c")
                    .arg("p")
                    .query_async(con)
                    .await?;
                let num = |i: usize| {
                    v.get(i)
                        .cloned()
                        .flatten()
                        .and_then(|s| s.parse::<f64>().ok())
                        .map(|f| f as i64)
                };
                match num(0) {
                    Some(cur) => estimate(cur, num(1).unwrap_or(0), num(2).unwrap_or(0), now, w),
                    None => 0,
                }
            }
        };
        out.push(count);
    }
    Ok(out)
}

/// A fixed-window counter's count (`lua/tier.lua`'s field `c`).
async fn fixed(con: &mut Conn, key: &str) -> redis::RedisResult<u64> {
    let c: Option<u64> = redis::cmd("HGET").arg(key).arg("c").query_async(con).await?;
    Ok(c.unwrap_or(0))
}

/// A sliding counter's estimate at `now` from its window number `cur`, its
/// count `c` and the previous window's `p` (`lua/sliding_counter.lua`).
pub fn estimate(cur: i64, c: i64, p: i64, now: i64, window_ms: i64) -> u64 {
    let w = window_ms.max(1);
    let n = now.div_euclid(w);
    let (c, p) = match n - cur {
        0 => (c, p),
        1 => (0, c),
        _ => (0, 0),
    };
    ((p * (w - (now - n * w)) + c * w) / w).max(0) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sliding_counter_weighs_the_previous_window_by_its_overlap() {
        // Window 0..1000 held 10, window 1000..2000 holds 4; at 1250 the
        // previous one overlaps 750 ms: 10 x 0.75 + 4.
        assert_eq!(estimate(1, 4, 10, 1250, 1000), 11);
        // A window later, the 4 are the previous window's.
        assert_eq!(estimate(1, 4, 10, 2500, 1000), 2);
        assert_eq!(estimate(1, 4, 10, 3500, 1000), 0);
    }
}
