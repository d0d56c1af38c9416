//! Reading the Redis ban list: the active entries in pages of
//! `lua/bans_page.lua` (bounded replies however long the list: one reply of
//! 1,000,000 entries took longer than `redis.timeout`, so a host never
//! loaded such a list), each reply validated where it lies, and members in
//! another spelling rewritten (`lua/canon.lua`).

use ipnet::IpNet;

use super::BanListError;
use crate::addr::AddrText;
use crate::enforce::Until;
use crate::store::{Keys, BANS_PAGE};

use super::parse_until;

/// Entries per page: ~150 kB of reply and about a ms of Redis, well inside
/// `redis.timeout` on a loaded machine (1,000,000 bans: 245 pages).
pub(crate) const PAGE: usize = 4_096;

/// Tries of one page that times out (`redis.timeout`): on a busy host (the
/// start's nft load takes a core) one page of 245 missing it made the
/// start's whole read fail.
pub(super) const PAGE_TRIES: u32 = 3;

/// Where a paged read of the active list stands: a caller that handles
/// each page and lets it go (`fleetban bans` at 1,000,000) holds one page.
#[derive(Debug, Clone)]
pub struct Cursor {
    /// Entries ending at or before it are not active.
    now_ms: i64,
    /// Entries per page.
    page: usize,
    /// The member and score the previous page ended with, as Redis wrote
    /// them; None before the first page.
    last: Option<(Vec<u8>, Vec<u8>)>,
    /// The last page was read.
    done: bool,
}

impl Cursor {
    /// A read of the entries active at `now_ms`, `page` at a time.
    pub fn new(now_ms: i64, page: usize) -> Cursor {
        Cursor {
            now_ms,
            page: page.max(1),
            last: None,
            done: false,
        }
    }

    /// When the entries it reads must end after (unix ms).
    pub fn now_ms(&self) -> i64 {
        self.now_ms
    }

    /// Marks the read done; whether it was already (a list read in one
    /// page: the embedded one).
    pub(super) fn finish(&mut self) -> bool {
        std::mem::replace(&mut self.done, true)
    }

    /// The next page's entries (and members in another spelling), or None
    /// after the last.
    pub(super) async fn next(
        &mut self,
        con: &mut crate::store::Conn,
        keys: &Keys,
    ) -> Result<Option<(Vec<(IpNet, Until)>, Vec<Respelled>)>, BanListError> {
        if self.done {
            return Ok(None);
        }
        let page = self.page;
        let mut cmd = BANS_PAGE.cmd(&[&keys.bans()]);
        cmd.arg(self.now_ms);
        match &self.last {
            Some((member, score)) => cmd.arg(member.as_slice()).arg(score.as_slice()),
            None => cmd.arg("").arg(""),
        };
        cmd.arg(page);
        let raw: redis::Value = BANS_PAGE.run(con, &cmd).await?;
        let items: &[redis::Value] = match &raw {
            redis::Value::Array(items) => items,
            _ => &[],
        };
        // A page that starts again at its cursor's score (the cursor's
        // member went meanwhile) repeats what was read: skipped.
        let seen = self.last.as_ref().map_or(0, |(member, score)| {
            items
                .chunks_exact(2)
                .take_while(|p| bytes(&p[1]) == Some(score) && bytes(&p[0]).is_some_and(|m| m <= member.as_slice()))
                .count()
        });
        let full = items.len() / 2 >= page;
        if full && seen * 2 == items.len() {
            // More than a page of entries share the cursor's score and the
            // cursor went: no progress possible; the snapshot is retried.
            return Err(BanListError::Reply(
                "the ban list changed under a paged read; reading it again".to_owned(),
            ));
        }
        let found = validate(&items[seen * 2..]);
        if !full {
            self.done = true;
            return Ok(Some(found));
        }
        self.last = match items {
            [.., m, s] => match (bytes(m), bytes(s)) {
                (Some(m), Some(s)) => Some((m.to_vec(), s.to_vec())),
                _ => {
                    return Err(BanListError::Reply(
                        "a ban list page without a member or score".to_owned(),
                    ))
                }
            },
            _ => {
                self.done = true;
                None
            }
        };
        Ok(Some(found))
    }
}

/// The bytes of a member or score as the script returns them.
fn bytes(v: &redis::Value) -> Option<&[u8]> {
    match v {
        redis::Value::BulkString(b) => Some(b),
        redis::Value::SimpleString(s) => Some(s.as_bytes()),
        _ => None,
    }
}

/// The entries of a `ZRANGE ... WITHSCORES` reply, read where they lie (no
/// String per member: 100k bans are 200k strings): flat member/score pairs
/// (RESP2) or [member, score] arrays (RESP3). Members that are not an
/// address or network, and scores that are not a time, are skipped.
/// A member as found in the list and as fleetban writes it.
pub(super) type Respelled = (String, String);

/// Members found in another spelling than [`AddrText`]'s (`::ffff:a.b.c.d`,
/// upper case, zeros written out) are returned beside, as (found, written):
/// enforced as the address they name, and rewritten (`canonicalize`).
pub(super) fn validate(items: &[redis::Value]) -> (Vec<(IpNet, Until)>, Vec<Respelled>) {
    use redis::Value;
    let nested = items.iter().all(|i| matches!(i, Value::Array(_)));
    let mut out = Vec::with_capacity(if nested { items.len() } else { items.len() / 2 });
    let mut bad = 0usize;
    let mut respelled = Vec::new();
    // Each member as fleetban writes it, in one buffer: a String is made
    // only for a member found in another spelling.
    let mut written = String::new();
    let mut entry = |m: &Value, score: &Value| match (member_of(m), until_of(score)) {
        (Some(n), Some(u)) => {
            use std::fmt::Write;
            written.clear();
            let _ = write!(written, "{}", AddrText(&n));
            let found = match m {
                Value::BulkString(b) => std::str::from_utf8(b).unwrap_or_default(),
                Value::SimpleString(s) => s.as_str(),
                _ => "",
            };
            if found != written {
                respelled.push((found.to_owned(), written.clone()));
            }
            out.push((n, u));
        }
        _ => {
            bad += 1;
            if bad <= 3 {
                let member = match m {
                    redis::Value::BulkString(b) => String::from_utf8_lossy(b),
                    redis::Value::SimpleString(s) => s.as_str().into(),
                    other => format!("{other:?}").into(),
                };
                tracing::warn!(member = %crate::ratelog::cap(&member).escape_debug(), "Ban list entry is not an address; skipped.");
            }
        }
    };
    if nested {
        for i in items {
            match i {
                Value::Array(pair) if pair.len() == 2 => entry(&pair[0], &pair[1]),
                _ => entry(i, &Value::Nil),
            }
        }
    } else {
        for pair in items.chunks(2) {
            entry(&pair[0], pair.get(1).unwrap_or(&Value::Nil));
        }
    }
    if bad > 3 {
        tracing::warn!(count = bad, "Ban list entries that are not addresses were skipped.");
    }
    (out, respelled)
}

/// Rewrites `respelled` members (found, written) as fleetban writes them
/// (`lua/canon.lua`): then `unban` in any spelling finds them.
pub(super) async fn canonicalize(
    con: &mut crate::store::Conn,
    keys: &Keys,
    respelled: &[Respelled],
) -> Result<(), BanListError> {
    let mut cmd = crate::store::CANON.cmd(&[&keys.bans(), &keys.records()]);
    for (found, written) in respelled {
        cmd.arg(found).arg(written);
    }
    let n: i64 = crate::store::CANON.run(con, &cmd).await?;
    if n > 0 {
        let first = &respelled[0];
        tracing::warn!(count = n, first = %crate::ratelog::cap(&first.0).escape_debug(), as_ = %first.1,
            "Ban list members in another spelling rewritten as fleetban writes them.");
    }
    Ok(())
}

fn member_of(v: &redis::Value) -> Option<IpNet> {
    match v {
        redis::Value::BulkString(b) => crate::addr::parse_member(std::str::from_utf8(b).ok()?),
        redis::Value::SimpleString(s) => crate::addr::parse_member(s),
        _ => None,
    }
}

fn until_of(v: &redis::Value) -> Option<Until> {
    match v {
        redis::Value::BulkString(b) => parse_until(std::str::from_utf8(b).ok()?),
        redis::Value::SimpleString(s) => parse_until(s),
        redis::Value::Double(f) if *f == f64::INFINITY => Some(Until::Permanent),
        redis::Value::Double(f) if f.is_finite() => Some(Until::At(*f as i64)),
        redis::Value::Int(i) => Some(Until::At(*i)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use redis::Value;

    fn items(v: &Value) -> &[Value] {
        match v {
            Value::Array(items) => items,
            _ => &[],
        }
    }

    fn bulk(s: &[u8]) -> Value {
        Value::BulkString(s.to_vec())
    }

    #[test]
    fn a_zrange_reply_keeps_only_addresses_with_a_time() {
        let v4: IpNet = "192.0.2.1/32".parse().unwrap();
        let v6: IpNet = "2001:db8:1:2::/64".parse().unwrap();
        let want = vec![(v4, Until::At(1_700_000_000_123)), (v6, Until::Permanent)];
        // RESP2: flat member/score pairs, with garbage members among them.
        let flat = Value::Array(vec![
            bulk(b"garbage; flush ruleset"),
            bulk(b"5"),
            bulk(b"192.0.2.1"),
            bulk(b"1700000000123"),
            bulk(b"192.0.2.1/24"),
            bulk(b"5"),
            bulk(b"\xff\xfe"),
            bulk(b"5"),
            bulk(b"2001:db8:1:2::/64"),
            bulk(b"inf"),
            bulk(b"10.0.0.1"),
            bulk(b"soon"),
            bulk(b"10.0.0.2"),
        ]);
        assert_eq!(validate(items(&flat)), (want.clone(), vec![]));
        // RESP3: [member, score] pairs with double scores.
        let nested = Value::Array(vec![
            Value::Array(vec![bulk(b"192.0.2.1"), Value::Double(1_700_000_000_123.0)]),
            Value::Array(vec![bulk(b"not an address"), Value::Double(5.0)]),
            Value::Array(vec![bulk(b"10.0.0.3"), Value::Double(f64::NAN)]),
            Value::Array(vec![bulk(b"2001:db8:1:2::/64"), Value::Double(f64::INFINITY)]),
            Value::Array(vec![bulk(b"10.0.0.4")]),
        ]);
        assert_eq!(validate(items(&nested)), (want.clone(), vec![]));
        assert!(validate(items(&Value::Nil)).0.is_empty());
        assert!(validate(&[]).0.is_empty());
        // Another spelling: enforced as the address, returned to rewrite.
        let respelled = Value::Array(vec![
            bulk(b"::ffff:192.0.2.1"),
            bulk(b"1700000000123"),
            bulk(b"2001:DB8:1:2:0::/64"),
            bulk(b"inf"),
        ]);
        assert_eq!(
            validate(items(&respelled)),
            (
                want,
                vec![
                    ("::ffff:192.0.2.1".to_owned(), "192.0.2.1".to_owned()),
                    ("2001:DB8:1:2:0::/64".to_owned(), "2001:db8:1:2::/64".to_owned())
                ]
            )
        );
    }
}
