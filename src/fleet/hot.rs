//! Hot marks between hosts (`limit::pending` says why): a host whose round
//! trip reports a client at half a rule's limit or more tells the fleet, so
//! that no host keeps that client's hits unsent. A mark is written twice in
//! one pipeline: into `{fleetban}:hot` (a ZSET of `RULE ADDR` scored by the
//! mark's end, read by a host at every snapshot so a host that starts or
//! reconnects misses none) and as an `op=hot` entry of the `{fleetban}:marks`
//! stream (how the other hosts hear of it within a round trip), which also
//! carries the hosts' arrivals (`op=join`). One entry carries up to
//! [`PER_ENTRY`] marks; the stream keeps about [`MARKS_MAXLEN`] entries (a
//! host further behind reads the ZSET again).
//! Nothing here reaches nft: a mark only makes a host send sooner.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::addr::{parse_member, AddrText};
use crate::limit::HotKey;
use crate::store::{Conn, Keys};

/// Marks per stream entry at most.
pub const PER_ENTRY: usize = 512;
/// Entries `{fleetban}:marks` keeps, about (at most ~20 MB of marks).
pub const MARKS_MAXLEN: u64 = 1000;

/// The text of marks in a stream entry: one `RULE ADDR UNTIL_MS` per line.
pub fn encode(marks: &[HotKey]) -> String {
    let mut out = String::with_capacity(marks.len() * 40);
    for m in marks {
        use std::fmt::Write;
        let _ = writeln!(out, "{} {} {}", m.rule, AddrText(&m.key), m.until_ms);
    }
    out
}

/// The marks of a stream entry's text; lines that do not parse are
/// skipped, and counted in the second value.
pub fn decode(text: &str) -> (Vec<HotKey>, usize) {
    let mut bad = 0;
    let marks = text
        .lines()
        .filter(|l| !l.is_empty())
        .filter_map(|line| {
            let m = mark_of(line);
            bad += usize::from(m.is_none());
            m
        })
        .collect();
    (marks, bad)
}

fn mark_of(line: &str) -> Option<HotKey> {
    let mut f = line.split(' ');
    let (rule, addr, until) = (f.next()?, f.next()?, f.next()?);
    if f.next().is_some() || rule.is_empty() {
        return None;
    }
    Some(HotKey {
        rule: rule.to_owned(),
        key: parse_member(addr)?,
        until_ms: until.parse().ok()?,
    })
}

/// The live marks of `{fleetban}:hot` at `now_ms`.
pub async fn read_all(con: &mut Conn, keys: &Keys, now_ms: i64) -> redis::RedisResult<Vec<HotKey>> {
    let flat: Vec<(String, i64)> = redis::cmd("ZRANGEBYSCORE")
        .arg(keys.hot())
        .arg(format!("({now_ms}"))
        .arg("+inf")
        .arg("WITHSCORES")
        .query_async(con)
        .await?;
    Ok(flat
        .into_iter()
        .filter_map(|(member, until_ms)| {
            let (rule, addr) = member.split_once(' ')?;
            Some(HotKey {
                rule: rule.to_owned(),
                key: parse_member(addr)?,
                until_ms,
            })
        })
        .collect())
}

/// Writes the marks this host's limiter made, as they come: what queued up
/// goes in one pipeline (ZADD GT, the ended marks pruned, the stream
/// entries); on an error the same marks are retried with backoff, as the
/// limiter's own retries are.
pub struct Publisher {
    pub con: Conn,
    pub keys: Keys,
    pub host: String,
    pub marks: UnboundedReceiver<Vec<HotKey>>,
    /// Counts each failed write among the host's Redis errors (`status`).
    pub health: crate::store::Health,
}

impl Publisher {
    pub async fn run(mut self, shutdown: CancellationToken) {
        let mut todo: Vec<HotKey> = Vec::new();
        let mut backoff = Duration::from_millis(50);
        let mut failures = 0u64;
        loop {
            if todo.is_empty() {
                tokio::select! {
                    m = self.marks.recv() => match m {
                        Some(m) => todo = m,
                        None => return,
                    },
                    _ = shutdown.cancelled() => return,
                }
            }
            while let Ok(more) = self.marks.try_recv() {
                todo.extend(more);
            }
            match write(&mut self.con, &self.keys, &self.host, &todo).await {
                Ok(()) => {
                    todo.clear();
                    backoff = Duration::from_millis(50);
                    failures = 0;
                }
                Err(e) => {
                    failures += 1;
                    let errors = self.health.count_error() + 1;
                    if failures < 5 || failures.is_power_of_two() {
                        tracing::warn!(error = %e, marks = todo.len(), failures, errors,
                            "Publishing hot clients failed; retrying.");
                    }
                    tokio::select! {
                        _ = tokio::time::sleep(backoff) => {}
                        _ = shutdown.cancelled() => return,
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(2));
                }
            }
        }
    }
}

async fn write(con: &mut Conn, keys: &Keys, host: &str, marks: &[HotKey]) -> redis::RedisResult<()> {
    let mut pipe = redis::pipe();
    let zadd = pipe.cmd("ZADD").arg(keys.hot()).arg("GT");
    for m in marks {
        zadd.arg(m.until_ms).arg(format!("{} {}", m.rule, AddrText(&m.key)));
    }
    pipe.ignore();
    pipe.cmd("ZREMRANGEBYSCORE")
        .arg(keys.hot())
        .arg("-inf")
        .arg(crate::now_ms())
        .ignore();
    for some in marks.chunks(PER_ENTRY) {
        pipe.add_command(entry(keys, "hot", host).arg("marks").arg(encode(some)).to_owned())
            .ignore();
    }
    pipe.query_async(con).await
}

/// An XADD to `{fleetban}:marks` of an `op` entry from `host`, more fields
/// to follow.
fn entry(keys: &Keys, op: &str, host: &str) -> redis::Cmd {
    let mut c = redis::cmd("XADD");
    c.arg(keys.marks())
        .arg("MAXLEN")
        .arg("~")
        .arg(MARKS_MAXLEN)
        .arg("*")
        .arg("op")
        .arg(op)
        .arg("host")
        .arg(host);
    c
}

/// Announces a host registered for the first time (`op=join`): the others
/// count it at once, not at their next reconcile.
pub async fn announce_join(con: &mut Conn, keys: &Keys, host: &str) -> redis::RedisResult<()> {
    entry(keys, "join", host).query_async::<String>(con).await.map(|_| ())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn marks_survive_their_text_and_garbage_is_counted() {
        let marks = vec![
            HotKey {
                rule: "nginx-scraper".into(),
                key: "203.0.113.7/32".parse().unwrap(),
                until_ms: 1_700_000_000_000,
            },
            HotKey {
                rule: "api".into(),
                key: "2001:db8::/64".parse().unwrap(),
                until_ms: 5,
            },
        ];
        let text = encode(&marks);
        assert_eq!(decode(&text), (marks.clone(), 0));
        let noisy = format!("{text}x 1.2.3.4\nr 0.0.0.0/0x 5\nr 203.0.113.9 notanumber\na b c d\n");
        let (got, bad) = decode(&noisy);
        assert_eq!((got, bad), (marks, 4));
    }
}
