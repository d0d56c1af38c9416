//! Reading the kernel back: `nft -j list table inet T` parsed into the
//! elements of the four sets (`script::SETS`; the plain `v6` set's addresses
//! stand for /64s) and whether table, sets, chain and rules are as
//! configured.
//!
//! nft 1.0.6 lists an element as `"1.2.3.4"`, `{"prefix":{"addr","len"}}`,
//! `{"range":[lo,hi]}`, or any of these wrapped in
//! `{"elem":{"val":..,"timeout":s,"expires":s}}` (whole seconds, truncated).
//! The rules are recognised by their comment (`script::rule_comment`).

use std::net::IpAddr;

use serde_json::Value;

use super::cover::{span_from, Span};
use super::script::{self, Preamble};
use super::{NftOptions, Until};

/// What the kernel holds for our table.
#[derive(Debug, Default)]
pub(crate) struct KernelView {
    /// Layout work needed; `None` when table, sets, chain and rules are right.
    pub preamble: Option<Preamble>,
    /// Elements of the sets that are right (a wrong set is re-created empty).
    pub elems: Vec<(Span, Until)>,
    /// Elements in a shape we do not know; they are left alone.
    pub unknown: usize,
}

impl KernelView {
    /// The table does not exist.
    pub fn absent() -> KernelView {
        KernelView {
            preamble: Some(Preamble::create()),
            ..KernelView::default()
        }
    }
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Missing,
    Right,
    Wrong,
}

/// Parses a listing taken at `now` (unix ms).
pub(crate) fn parse(json: &[u8], opts: &NftOptions, now: i64) -> Result<KernelView, String> {
    let root: Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let items = root
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    let mut view = KernelView::default();
    let mut sets = [State::Missing; 4];
    let mut chain = State::Missing;
    let mut comments: Vec<Option<&str>> = Vec::new();
    let ours = |o: &Value| {
        o.get("table").and_then(Value::as_str) == Some(opts.table.as_str())
            && o.get("family").and_then(Value::as_str) == Some("inet")
    };
    for item in items {
        if let Some(set) = item.get("set").filter(|s| ours(s)) {
            let name = set.get("name").and_then(Value::as_str);
            let Some(index) = script::SETS.iter().position(|s| Some(s.0) == name) else {
                continue;
            };
            let (_, want_type, interval, _) = script::SETS[index];
            let state = &mut sets[index];
            *state = if set_is_right(set, want_type, interval) {
                State::Right
            } else {
                State::Wrong
            };
            if *state == State::Right {
                for e in set.get("elem").and_then(Value::as_array).into_iter().flatten() {
                    match element(e, now) {
                        // The plain `v6` set holds /64s by their network address.
                        Some((sp, u)) if index == 1 => match ipnet::IpNet::new(sp.lo, 64) {
                            Ok(n) if sp.lo == sp.hi => view.elems.push((Span::of(&n.trunc()), u)),
                            _ => view.unknown += 1,
                        },
                        Some(el) => view.elems.push(el),
                        None => view.unknown += 1,
                    }
                }
            }
        } else if let Some(c) = item.get("chain").filter(|c| ours(c)) {
            if c.get("name").and_then(Value::as_str) == Some(script::CHAIN) {
                chain = if chain_is_right(c) { State::Right } else { State::Wrong };
            }
        } else if let Some(r) = item.get("rule").filter(|r| ours(r)) {
            if r.get("chain").and_then(Value::as_str) == Some(script::CHAIN) {
                comments.push(r.get("comment").and_then(Value::as_str));
            }
        }
    }
    let want: Vec<String> = script::SETS.iter().map(|s| script::rule_comment(s.0, opts)).collect();
    let rules_right = chain == State::Right && comments.iter().copied().eq(want.iter().map(|c| Some(c.as_str())));
    let mut p = Preamble {
        delete_sets: sets.map(|s| s == State::Wrong),
        delete_chain: chain == State::Wrong,
        ..Preamble::default()
    };
    p.flush_chain_first = chain != State::Missing && (p.delete_sets.contains(&true) || p.delete_chain);
    p.rules = !rules_right || p.flush_chain_first;
    let missing = sets.contains(&State::Missing) || chain == State::Missing;
    if missing || p != Preamble::default() {
        view.preamble = Some(p);
    }
    Ok(view)
}

fn set_is_right(set: &Value, want_type: &str, interval: bool) -> bool {
    let mut flags: Vec<&str> = set
        .get("flags")
        .and_then(Value::as_array)
        .into_iter()
        .flatten()
        .filter_map(Value::as_str)
        .collect();
    flags.sort_unstable();
    let want: &[&str] = if interval {
        &["interval", "timeout"]
    } else {
        &["timeout"]
    };
    set.get("type").and_then(Value::as_str) == Some(want_type) && flags == want
}

fn chain_is_right(c: &Value) -> bool {
    let s = |k: &str| c.get(k).and_then(Value::as_str);
    s("type") == Some(script::CHAIN_TYPE)
        && s("hook") == Some(script::CHAIN_HOOK)
        && s("policy") == Some(script::CHAIN_POLICY)
        && c.get("prio").and_then(Value::as_i64) == Some(script::CHAIN_PRIO)
}

/// One listed element and its end, estimated from `expires` (whole seconds,
/// rounded down, so the kernel's real end is up to a second later).
fn element(e: &Value, now: i64) -> Option<(Span, Until)> {
    let Some(inner) = e.get("elem") else {
        return Some((span(e)?, Until::Permanent));
    };
    let secs = |k: &str| inner.get(k).and_then(Value::as_f64);
    let until = match (secs("expires"), secs("timeout")) {
        (Some(left), _) => Until::At(now + (left * 1000.0) as i64),
        // A timeout but no time left shown: about to expire.
        (None, Some(_)) => Until::At(now),
        (None, None) => Until::Permanent,
    };
    Some((span(inner.get("val")?)?, until))
}

fn span(v: &Value) -> Option<Span> {
    let addr = |v: &Value| v.as_str()?.parse::<IpAddr>().ok();
    if let Some(a) = addr(v) {
        return span_from(a, a);
    }
    if let Some(p) = v.get("prefix") {
        let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
        let net = ipnet::IpNet::new(addr(p.get("addr")?)?, len).ok()?.trunc();
        return Some(Span::of(&net));
    }
    let r = v.get("range")?.as_array()?;
    match r.as_slice() {
        [lo, hi] => span_from(addr(lo)?, addr(hi)?),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Action;

    const LISTING: &str = r#"{"nftables": [{"metainfo": {"version": "1.0.6", "json_schema_version": 1}},
      {"table": {"family": "inet", "name": "fleetban", "handle": 1}},
      {"set": {"family": "inet", "name": "v4", "table": "fleetban", "type": "ipv4_addr", "handle": 2,
        "flags": ["timeout"], "elem": [
          {"elem": {"val": "1.2.3.4", "timeout": 5, "expires": 4}}, "5.5.5.5"]}},
      {"set": {"family": "inet", "name": "v6", "table": "fleetban", "type": "ipv6_addr", "handle": 3,
        "flags": ["timeout"], "elem": [{"elem": {"val": "2001:db8::", "timeout": 60, "expires": 59}}]}},
      {"set": {"family": "inet", "name": "v4net", "table": "fleetban", "type": "ipv4_addr", "handle": 4,
        "flags": ["interval", "timeout"], "elem": [
          {"elem": {"val": {"prefix": {"addr": "10.0.0.0", "len": 16}}, "timeout": 10, "expires": 9}},
          {"elem": {"val": {"range": ["20.0.0.1", "20.0.0.5"]}, "timeout": 100, "expires": 99}},
          {"prefix": {"addr": "30.0.0.0", "len": 31}}, {"concat": [1, 2]}]}},
      {"set": {"family": "inet", "name": "v6net", "table": "fleetban", "type": "ipv6_addr", "handle": 5,
        "flags": ["interval", "timeout"], "elem": [{"prefix": {"addr": "2001:db8:1::", "len": 48}}]}},
      {"chain": {"family": "inet", "table": "fleetban", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 6, "comment": "fleetban v4 drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 7, "comment": "fleetban v6 drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 8, "comment": "fleetban v4net drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 9, "comment": "fleetban v6net drop", "expr": []}}]}"#;

    #[test]
    fn parses_every_element_shape() {
        let view = parse(LISTING.as_bytes(), &NftOptions::default(), 0).unwrap();
        assert_eq!(view.preamble, None);
        assert_eq!(view.unknown, 1);
        let got: Vec<(String, Until)> = view.elems.iter().map(|(s, u)| (s.to_string(), *u)).collect();
        assert_eq!(
            got,
            [
                ("1.2.3.4".to_string(), Until::At(4_000)),
                ("5.5.5.5".to_string(), Until::Permanent),
                ("2001:db8::/64".to_string(), Until::At(59_000)),
                ("10.0.0.0/16".to_string(), Until::At(9_000)),
                ("20.0.0.1-20.0.0.5".to_string(), Until::At(99_000)),
                ("30.0.0.0/31".to_string(), Until::Permanent),
                ("2001:db8:1::/48".to_string(), Until::Permanent),
            ]
        );
    }

    #[test]
    fn notices_changed_rules_and_wrong_sets() {
        let opts = NftOptions {
            action: Action::Reject,
            ..NftOptions::default()
        };
        let view = parse(LISTING.as_bytes(), &opts, 0).unwrap();
        assert_eq!(
            view.preamble,
            Some(Preamble {
                rules: true,
                ..Preamble::default()
            })
        );
        // The layout of DESIGN §4 (v4 an interval set) is re-created.
        let bad = LISTING.replacen(r#""flags": ["timeout"]"#, r#""flags": ["interval", "timeout"]"#, 1);
        let view = parse(bad.as_bytes(), &NftOptions::default(), 0).unwrap();
        let p = view.preamble.unwrap();
        assert!(p.delete_sets == [true, false, false, false] && p.flush_chain_first && p.rules);
        assert_eq!(view.elems.len(), 5, "the other sets' elements are kept");
    }
}
