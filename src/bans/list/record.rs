//! Reading bans' records from Redis (docs/design.md §3, "The records"):
//! each member's JSON record in `{prefix}:banrec` if it has one (every
//! version before issue 27 wrote them so), else its compact record in the
//! bucket `{prefix}:banrec:N`, whose (rule, host, reason) is interned in
//! `{prefix}:banrec:meta`. `lua/record.lua` writes them; the scripts read
//! one record there, and this module reads many (Lua took ~13 µs a record,
//! HMGET and this decoding ~1-2 µs). [`decode_record`] turns one record's
//! bytes into the ban's fields.

use std::collections::HashMap;

use ipnet::IpNet;

use super::{BanListError, BanRecord};
use crate::addr::AddrText;
use crate::enforce::Until;
use crate::store::Keys;

/// Members per HMGET of the JSON records, and commands per pipeline.
const PER_CALL: usize = 1_000;

/// The first byte of a compact record (`lua/record.lua`).
const COMPACT: u8 = 1;

/// A record's fields as Redis holds them (the address is the member; the
/// end the list's score).
#[derive(Debug, Clone, PartialEq, serde::Deserialize, serde::Serialize)]
pub struct RecordFields {
    /// The rule that banned (`manual` for an operator's ban).
    #[serde(default)]
    pub rule: String,
    /// Why, as the rule or the operator said it.
    #[serde(default)]
    pub reason: String,
    /// The host that decided the ban.
    #[serde(default)]
    pub host: String,
    /// When the ban started, unix ms.
    #[serde(default)]
    pub since: i64,
    /// The address's ban number within `forget_after`.
    #[serde(default)]
    pub count: u32,
    /// Hits in the window when the limit was crossed.
    #[serde(default)]
    pub hits: u32,
}

impl RecordFields {
    /// The ban of `addr` ending at `until` with these fields; without
    /// fields (no record, or a damaged one) empty rule, reason and host and
    /// zero counts: the ban is the list's, never lost for its record.
    pub fn into_record(fields: Option<RecordFields>, addr: IpNet, until: Until) -> BanRecord {
        let f = fields.unwrap_or(RecordFields {
            rule: String::new(),
            reason: String::new(),
            host: String::new(),
            since: 0,
            count: 0,
            hits: 0,
        });
        BanRecord {
            addr,
            rule: f.rule,
            reason: f.reason,
            host: f.host,
            since: f.since,
            until: super::until_ms(until),
            count: f.count,
            hits: f.hits,
        }
    }

    /// As JSON text, the form `lua/restore.lua` takes.
    pub fn to_json(&self) -> String {
        serde_json::to_string(self).unwrap_or_default()
    }
}

/// The interned (rule, host, reason) of compact records, by ID, as
/// `{prefix}:banrec:meta` holds them (`RULE\nHOST\nREASON`).
pub type Names = HashMap<u64, String>;

/// One record's bytes as Redis holds them (`raw`: a JSON record, or a
/// compact one whose triple is in `names`) as its fields; None when
/// damaged or its triple is not in `names`. `member` is the list member
/// (a compact record's reason may stand for it).
pub fn decode_record(member: &str, raw: &[u8], names: &Names) -> Option<RecordFields> {
    if raw.first() != Some(&COMPACT) {
        return serde_json::from_slice(raw).ok();
    }
    let mut rest = &raw[1..];
    let since = i64::try_from(varint(&mut rest)?).ok()?;
    let count = u32::try_from(varint(&mut rest)?).ok()?;
    let hits = u32::try_from(varint(&mut rest)?).ok()?;
    let id = varint(&mut rest)?;
    if !rest.is_empty() {
        return None;
    }
    let mut parts = names.get(&id)?.splitn(3, '\n');
    let (rule, host, reason) = (parts.next()?, parts.next()?, parts.next()?);
    let reason = reason
        .replacen('\u{1}', &hits.to_string(), 1)
        .replacen('\u{2}', member, 1);
    Some(RecordFields {
        rule: rule.to_owned(),
        reason,
        host: host.to_owned(),
        since,
        count,
        hits,
    })
}

/// The next varint of `b` (7 bits a byte, least significant first, as
/// `lua/record.lua` writes them), `b` moved past it.
fn varint(b: &mut &[u8]) -> Option<u64> {
    let mut n: u64 = 0;
    for (i, &byte) in b.iter().enumerate().take(9) {
        n |= u64::from(byte & 0x7f) << (7 * i);
        if byte < 0x80 {
            *b = &b[i + 1..];
            return Some(n);
        }
    }
    None
}

/// The bucket number (0..4095) and the field of `member`'s compact record:
/// the first 12 bits of SHA-1(member), then the next 48 bits, as
/// `lua/record.lua`'s `rec_slot` takes them from `redis.sha1hex`.
pub(crate) fn slot(member: &str) -> (u16, [u8; 6]) {
    let d = sha1_smol::Sha1::from(member).digest().bytes();
    let bucket = (u16::from(d[0]) << 4) | u16::from(d[1] >> 4);
    let mut field = [0u8; 6];
    for (j, f) in field.iter_mut().enumerate() {
        *f = (d[1 + j] << 4) | (d[2 + j] >> 4);
    }
    (bucket, field)
}

/// The records of `addrs` (None where there is none or it is damaged):
/// the JSON ones by HMGET, [`PER_CALL`] at a time, then the compact ones
/// by one HMGET per bucket, pipelined, then their triples.
pub(crate) async fn read_records(
    con: &mut crate::store::Conn,
    keys: &Keys,
    addrs: &[IpNet],
) -> Result<Vec<Option<RecordFields>>, BanListError> {
    let members: Vec<String> = addrs.iter().map(|a| AddrText(a).to_string()).collect();
    let mut raw: Vec<Option<Vec<u8>>> = Vec::with_capacity(members.len());
    for some in members.chunks(PER_CALL) {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(keys.records()).arg(some);
        let got: Vec<Option<Vec<u8>>> = cmd.query_async(con).await?;
        if got.len() != some.len() {
            return Err(BanListError::Reply(format!(
                "HMGET answered {} of {}",
                got.len(),
                some.len()
            )));
        }
        raw.extend(got);
    }
    // The rest by bucket.
    let mut by_bucket: HashMap<u16, Vec<Wanted>> = HashMap::new();
    for (i, m) in members.iter().enumerate() {
        if raw[i].is_none() {
            let (bucket, field) = slot(m);
            by_bucket.entry(bucket).or_default().push((i, field));
        }
    }
    let buckets: Vec<(u16, Vec<Wanted>)> = by_bucket.into_iter().collect();
    for some in buckets.chunks(PER_CALL) {
        let mut pipe = redis::pipe();
        for (bucket, wanted) in some {
            let cmd = pipe.cmd("HMGET").arg(format!("{}:{bucket}", keys.records()));
            for (_, field) in wanted {
                cmd.arg(&field[..]);
            }
        }
        let got: Vec<Vec<Option<Vec<u8>>>> = pipe.query_async(con).await?;
        if got.len() != some.len() {
            return Err(BanListError::Reply(format!(
                "{} replies to {} HMGET",
                got.len(),
                some.len()
            )));
        }
        for ((_, wanted), values) in some.iter().zip(got) {
            for (&(i, _), v) in wanted.iter().zip(values) {
                raw[i] = v;
            }
        }
    }
    let names = read_names(con, keys, &raw).await?;
    Ok(members
        .iter()
        .zip(raw)
        .map(|(m, r)| r.and_then(|r| decode_record(m, &r, &names)))
        .collect())
}

/// A compact record to read: its member's index in the addresses asked
/// for, and its field in the bucket.
type Wanted = (usize, [u8; 6]);

/// The triples the compact records among `raw` name, read by HMGET of
/// their `#ID` fields.
async fn read_names(con: &mut crate::store::Conn, keys: &Keys, raw: &[Option<Vec<u8>>]) -> Result<Names, BanListError> {
    let mut ids: Vec<u64> = raw
        .iter()
        .flatten()
        .filter(|r| r.first() == Some(&COMPACT))
        .filter_map(|r| name_id(r))
        .collect();
    ids.sort_unstable();
    ids.dedup();
    let mut names = Names::new();
    for some in ids.chunks(PER_CALL) {
        let mut cmd = redis::cmd("HMGET");
        cmd.arg(format!("{}:meta", keys.records()));
        for id in some {
            cmd.arg(format!("#{id}"));
        }
        let got: Vec<Option<String>> = cmd.query_async(con).await?;
        names.extend(some.iter().zip(got).filter_map(|(id, t)| Some((*id, t?))));
    }
    Ok(names)
}

/// The triple ID a compact record ends with.
fn name_id(raw: &[u8]) -> Option<u64> {
    let mut rest = raw.get(1..)?;
    for _ in 0..3 {
        varint(&mut rest)?;
    }
    varint(&mut rest)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn compact(since: u64, count: u64, hits: u64, id: u64) -> Vec<u8> {
        let mut out = vec![COMPACT];
        for mut n in [since, count, hits, id] {
            loop {
                let b = (n % 128) as u8;
                n /= 128;
                if n == 0 {
                    out.push(b);
                    break;
                }
                out.push(b | 0x80);
            }
        }
        out
    }

    #[test]
    fn a_compact_record_is_decoded_with_its_interned_triple() {
        let names = Names::from([(3, "scraper\nweb-1\n\u{1} hits of \u{2} within 1m".to_owned())]);
        let raw = compact(1_764_700_000_000, 2, 101, 3);
        let f = decode_record("198.51.100.0/24", &raw, &names).expect("decoded");
        assert_eq!(
            f,
            RecordFields {
                rule: "scraper".into(),
                reason: "101 hits of 198.51.100.0/24 within 1m".into(),
                host: "web-1".into(),
                since: 1_764_700_000_000,
                count: 2,
                hits: 101,
            }
        );
        assert_eq!(name_id(&raw), Some(3));
    }

    #[test]
    fn a_damaged_or_unknown_record_is_none_never_a_panic() {
        let names = Names::from([(1, "r\nh\n".to_owned())]);
        for raw in [
            &b"not json"[..],
            &b"[1,2]"[..],
            &[COMPACT][..],
            &[COMPACT, 0x80][..],
            &[COMPACT, 1, 1, 1][..],
            &[COMPACT, 1, 1, 1, 9][..],
            &[COMPACT, 1, 1, 1, 1, 0][..],
            &[
                COMPACT, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x7f, 1, 1, 1,
            ][..],
        ] {
            assert_eq!(decode_record("203.0.113.7", raw, &names), None, "{raw:?}");
        }
        let f = decode_record("203.0.113.7", &[COMPACT, 1, 1, 1, 1], &names).expect("decoded");
        assert_eq!((f.rule.as_str(), f.host.as_str(), f.reason.as_str()), ("r", "h", ""));
    }

    #[test]
    fn a_json_record_is_read_as_every_version_wrote_it() {
        let raw = br#"{"rule":"scraper","reason":"101 hits within 1m","host":"web-1","since":1764700000000,"until":null,"count":2,"hits":101}"#;
        let f = decode_record("203.0.113.7", raw, &Names::new()).expect("decoded");
        let r = RecordFields::into_record(Some(f), "203.0.113.7/32".parse().unwrap(), Until::Permanent);
        assert_eq!(
            (
                r.rule.as_str(),
                r.reason.as_str(),
                r.host.as_str(),
                r.since,
                r.until,
                r.count,
                r.hits
            ),
            (
                "scraper",
                "101 hits within 1m",
                "web-1",
                1_764_700_000_000,
                None,
                2,
                101
            )
        );
        let unknown = RecordFields::into_record(None, "203.0.113.7/32".parse().unwrap(), Until::At(5));
        assert_eq!((unknown.rule.as_str(), unknown.until, unknown.count), ("", Some(5), 0));
    }

    #[test]
    fn the_slot_is_the_one_lua_takes_from_sha1hex() {
        // lua/record.lua: bucket = the first 3 hex digits of sha1hex,
        // field = the bytes of the next 12.
        let hex = sha1_smol::Sha1::from("203.0.113.7").digest().to_string();
        let (bucket, field) = slot("203.0.113.7");
        assert_eq!(u32::from(bucket), u32::from_str_radix(&hex[0..3], 16).unwrap());
        let want: Vec<u8> = (3..15)
            .step_by(2)
            .map(|i| u8::from_str_radix(&hex[i..i + 2], 16).unwrap())
            .collect();
        assert_eq!(field.to_vec(), want);
    }
}
