//! Reading a ban's record from Redis (docs/design.md §3, "The records"):
//! `lua/records.lua` finds each member's record where it is (compact in a
//! bucket `{prefix}:banrec:N`, or JSON in `{prefix}:banrec` as every version
//! before wrote them) and answers JSON text, which [`decode_record`] turns
//! into the ban's fields. How records are stored is `lua/record.lua`'s alone.

use ipnet::IpNet;

use super::{BanListError, BanRecord};
use crate::addr::AddrText;
use crate::enforce::Until;
use crate::store::{Keys, RECORDS};

/// Members per `lua/records.lua` call: bounded work for Redis (~1 ms).
const PER_CALL: usize = 1_000;

/// The records of `addrs` as `lua/records.lua` answers them (JSON text;
/// None where there is none), read [`PER_CALL`] at a time.
pub(crate) async fn read_records(
    con: &mut crate::store::Conn,
    keys: &Keys,
    addrs: &[IpNet],
) -> Result<Vec<Option<String>>, BanListError> {
    let mut out = Vec::with_capacity(addrs.len());
    for some in addrs.chunks(PER_CALL) {
        let mut cmd = RECORDS.cmd(&[&keys.bans(), &keys.records()]);
        for a in some {
            cmd.arg(AddrText(a).to_string());
        }
        let recs: Vec<Option<String>> = RECORDS.run(con, &cmd).await?;
        if recs.len() != some.len() {
            return Err(BanListError::Reply(format!(
                "records.lua answered {} records for {} members",
                recs.len(),
                some.len()
            )));
        }
        out.extend(recs);
    }
    Ok(out)
}

/// One record as [`read_records`] answers it (`raw`: JSON text, None when
/// the ban has none) as the fields of the ban of `addr` ending at `until`.
/// A missing or damaged record gives empty rule, reason and host and zero
/// counts: the ban itself is the list's, never lost for its record.
pub fn decode_record(addr: IpNet, until: Until, raw: Option<&str>) -> BanRecord {
    let mut r = raw
        .and_then(|s| serde_json::from_str::<RecordJson>(s).ok())
        .map(|j| j.into_record(addr))
        .unwrap_or_else(|| BanRecord {
            addr,
            rule: String::new(),
            reason: String::new(),
            host: String::new(),
            since: 0,
            until: None,
            count: 0,
            hits: 0,
        });
    r.until = super::until_ms(until);
    r
}

/// Whether `raw` is a record [`decode_record`] reads (not damaged).
pub(crate) fn is_record(raw: &str) -> bool {
    serde_json::from_str::<RecordJson>(raw).is_ok()
}

/// The rule of a record `raw` ("" when it has none or is damaged).
pub(crate) fn rule_of(raw: &str) -> String {
    serde_json::from_str::<RecordJson>(raw)
        .map(|j| j.rule)
        .unwrap_or_default()
}

/// A record as JSON (the address is the member; the end the list's score).
#[derive(serde::Deserialize)]
struct RecordJson {
    /// The rule that banned (empty for an operator's ban).
    #[serde(default)]
    rule: String,
    /// Why, as the rule or the operator said it.
    #[serde(default)]
    reason: String,
    /// The host that decided the ban.
    #[serde(default)]
    host: String,
    /// When the ban started, unix ms.
    #[serde(default)]
    since: i64,
    /// The address's ban number within `forget_after`.
    #[serde(default)]
    count: u32,
    /// Hits in the window when the limit was crossed.
    #[serde(default)]
    hits: u32,
}

impl RecordJson {
    fn into_record(self, addr: IpNet) -> BanRecord {
        BanRecord {
            addr,
            rule: self.rule,
            reason: self.reason,
            host: self.host,
            since: self.since,
            until: None,
            count: self.count,
            hits: self.hits,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_or_damaged_record_is_an_unknown_one_with_the_lists_end() {
        let addr: IpNet = "203.0.113.7/32".parse().unwrap();
        for raw in [None, Some("not json"), Some("[1,2]")] {
            let r = decode_record(addr, Until::At(5), raw);
            assert_eq!(
                (r.rule.as_str(), r.since, r.until, r.count),
                ("", 0, Some(5), 0),
                "{raw:?}"
            );
        }
        let r = decode_record(
            addr,
            Until::Permanent,
            Some(
                r#"{"rule":"scraper","reason":"101 hits within 1m","host":"web-1","since":1764700000000,"until":null,"count":2,"hits":101}"#,
            ),
        );
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
    }
}
