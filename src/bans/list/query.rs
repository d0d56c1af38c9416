//! What the operator's commands ask of the list without holding it: the
//! active bans a page at a time with their records (`fleetban bans`, the
//! daemon's answer), its count and ends and the bans ending last (a long
//! list on a terminal), the bans over one address (`explain`, `unban`).
//! Each is a bounded number of bounded commands, or one page at a time
//! (docs/design.md §6, "`bans` and a long list").

use ipnet::IpNet;

use super::{parse_until, read, BanList, BanListError, Cursor, PAGE};
use crate::addr::AddrText;
use crate::bans::BanRecord;
use crate::enforce::Until;

impl BanList {
    /// The active bans with their records (the daemon's answer to
    /// `fleetban bans`), read a page at a time: no command grows with the
    /// list.
    pub async fn records(&mut self, now_ms: i64) -> Result<Vec<BanRecord>, BanListError> {
        let mut cursor = Cursor::new(now_ms, PAGE);
        let mut out = Vec::new();
        while let Some((_, page)) = self.records_page(&mut cursor, |_| true).await? {
            out.extend(page);
        }
        Ok(out)
    }

    /// The next page of active bans with their records, in the list's
    /// order (end, then address), or None after the last: a reader that
    /// lets each page go holds one page however long the list
    /// (`fleetban bans` at 1,000,000). Only the entries `keep` takes have
    /// their records read; the count is of every entry of the page. The
    /// embedded list is one page.
    pub async fn records_page(
        &mut self,
        cursor: &mut Cursor,
        keep: impl Fn(&IpNet) -> bool,
    ) -> Result<Option<(usize, Vec<BanRecord>)>, BanListError> {
        match self {
            BanList::Memory(m) => {
                if cursor.finish() {
                    return Ok(None);
                }
                let mut all: Vec<BanRecord> = m.active(cursor.now_ms()).cloned().collect();
                let n = all.len();
                all.retain(|r| keep(&r.addr));
                Ok(Some((n, all)))
            }
            BanList::Redis { con, keys } => {
                let Some((entries, respelled)) = cursor.next(con, keys).await? else {
                    return Ok(None);
                };
                if !respelled.is_empty() {
                    read::canonicalize(con, keys, &respelled).await?;
                }
                let n = entries.len();
                let kept: Vec<(IpNet, Until)> = entries.into_iter().filter(|(a, _)| keep(a)).collect();
                Ok(Some((n, self.records_of(kept).await?)))
            }
        }
    }

    /// How many bans are active at `now_ms`, how many of them are
    /// permanent, and the soonest and latest end of the others: four
    /// lookups of the list's order, whatever its length.
    pub async fn span(&mut self, now_ms: i64) -> Result<Span, BanListError> {
        match self {
            BanList::Memory(m) => {
                let mut s = Span::default();
                for r in m.active(now_ms) {
                    s.active += 1;
                    match r.until {
                        None => s.permanent += 1,
                        Some(t) => {
                            s.soonest = Some(s.soonest.map_or(t, |a| a.min(t)));
                            s.latest = Some(s.latest.map_or(t, |b| b.max(t)));
                        }
                    }
                }
                Ok(s)
            }
            BanList::Redis { con, keys } => {
                let after = format!("({now_ms}");
                let (active, permanent, first): (u64, u64, Vec<(String, String)>) = redis::pipe()
                    .cmd("ZCOUNT")
                    .arg(keys.bans())
                    .arg(&after)
                    .arg("+inf")
                    .cmd("ZCOUNT")
                    .arg(keys.bans())
                    .arg("+inf")
                    .arg("+inf")
                    .cmd("ZRANGEBYSCORE")
                    .arg(keys.bans())
                    .arg(&after)
                    .arg("(+inf")
                    .arg("WITHSCORES")
                    .arg("LIMIT")
                    .arg(0)
                    .arg(1)
                    .query_async(con)
                    .await?;
                // The last entry before the permanent ones, by rank.
                let rank = -(i64::try_from(permanent).unwrap_or(i64::MAX - 1)) - 1;
                let last: Vec<(String, String)> = redis::cmd("ZRANGE")
                    .arg(keys.bans())
                    .arg(rank)
                    .arg(rank)
                    .arg("WITHSCORES")
                    .query_async(con)
                    .await?;
                let end = |v: &[(String, String)]| match v.first().and_then(|(_, s)| parse_until(s)) {
                    Some(Until::At(t)) if t > now_ms => Some(t),
                    _ => None,
                };
                Ok(Span {
                    active,
                    permanent,
                    soonest: end(&first),
                    latest: end(&last),
                })
            }
        }
    }

    /// The `n` active bans ending last (permanent ones first) with their
    /// records: one `ZRANGE` by rank from the end and their records.
    pub async fn ending_last(&mut self, now_ms: i64, n: usize) -> Result<Vec<BanRecord>, BanListError> {
        if n == 0 {
            return Ok(Vec::new());
        }
        match self {
            BanList::Memory(m) => {
                let mut all: Vec<BanRecord> = m.active(now_ms).cloned().collect();
                all.sort_by_key(|r| std::cmp::Reverse((r.until.is_none(), r.until)));
                all.truncate(n);
                Ok(all)
            }
            BanList::Redis { con, keys } => {
                let raw: redis::Value = redis::cmd("ZRANGE")
                    .arg(keys.bans())
                    .arg(-i64::try_from(n).unwrap_or(i64::MAX))
                    .arg(-1)
                    .arg("WITHSCORES")
                    .query_async(con)
                    .await?;
                let items: &[redis::Value] = match &raw {
                    redis::Value::Array(items) => items,
                    _ => &[],
                };
                let (entries, _) = read::validate(items);
                let active = entries
                    .into_iter()
                    .filter(|(_, u)| match u {
                        Until::At(t) => *t > now_ms,
                        Until::Permanent => true,
                    })
                    .collect();
                self.records_of(active).await
            }
        }
    }

    /// The active bans of `net` and of every network holding it (what
    /// covers it: `fleetban explain`), found by their members (one
    /// pipelined `ZSCORE` per prefix length), never by reading the list.
    pub async fn covering(&mut self, net: &IpNet, now_ms: i64) -> Result<Vec<BanRecord>, BanListError> {
        match self {
            BanList::Memory(m) => Ok(m.active(now_ms).filter(|r| r.addr.contains(net)).cloned().collect()),
            BanList::Redis { con, keys } => {
                let wider: Vec<IpNet> = (0..=net.prefix_len())
                    .filter_map(|len| IpNet::new(net.addr(), len).ok().map(|n| n.trunc()))
                    .collect();
                let mut pipe = redis::pipe();
                for n in &wider {
                    pipe.cmd("ZSCORE").arg(keys.bans()).arg(AddrText(n).to_string());
                }
                let scores: Vec<Option<String>> = pipe.query_async(con).await?;
                let active: Vec<(IpNet, Until)> = wider
                    .into_iter()
                    .zip(scores)
                    .filter_map(|(n, s)| Some((n, parse_until(&s?)?)))
                    .filter(|(_, u)| match u {
                        Until::At(t) => *t > now_ms,
                        Until::Permanent => true,
                    })
                    .collect();
                self.records_of(active).await
            }
        }
    }

    /// The records of `entries` (compact or JSON, as `record::read_records`
    /// reads them, 4,096 a page), with the end the list holds.
    async fn records_of(&mut self, entries: Vec<(IpNet, Until)>) -> Result<Vec<BanRecord>, BanListError> {
        let BanList::Redis { con, keys } = self else {
            return Ok(Vec::new());
        };
        let mut out = Vec::with_capacity(entries.len());
        for some in entries.chunks(PAGE) {
            let addrs: Vec<IpNet> = some.iter().map(|(n, _)| *n).collect();
            let recs = super::record::read_records(con, keys, &addrs).await?;
            out.extend(
                some.iter()
                    .zip(recs)
                    .map(|((addr, until), rec)| super::RecordFields::into_record(rec, *addr, *until)),
            );
        }
        Ok(out)
    }
}

/// The list's length and ends, read without reading the list
/// ([`BanList::span`]).
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct Span {
    /// Active bans.
    pub active: u64,
    /// Active bans without an end.
    pub permanent: u64,
    /// The soonest end of an active ban (unix ms); None without one.
    pub soonest: Option<i64>,
    /// The latest end of an active ban that has one.
    pub latest: Option<i64>,
}
