//! Reading the kernel back: `nft -j list table inet T` parsed into the
//! elements of the four sets (`script::SETS`; the plain `v6` set's addresses
//! stand for /64s) and whether table, sets, chain and rules are as
//! configured.
//!
//! nft 1.0.6 lists an element as `"1.2.3.4"`, `{"prefix":{"addr","len"}}`,
//! `{"range":[lo,hi]}`, or any of these wrapped in
//! `{"elem":{"val":..,"timeout":s,"expires":s}}` (whole seconds, truncated).
//! The rules are recognised by their comment (`script::rule_comment`).

use std::borrow::Cow;
use std::collections::HashSet;
use std::fmt;
use std::net::IpAddr;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;
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

#[derive(Clone, Copy, Default, PartialEq, Eq)]
enum State {
    #[default]
    Missing,
    Right,
    Wrong,
}

/// Parses a listing taken at `now` (unix ms).
pub(crate) fn parse(json: &[u8], opts: &NftOptions, now: i64) -> Result<KernelView, String> {
    parse_typed(json, opts, now)
}

/// For `benches/listing.rs` only: (elements read, elements of unknown shape)
/// with the parser named `parser`.
#[doc(hidden)]
pub fn bench_parse(json: &[u8], opts: &NftOptions, now: i64, parser: &str) -> Result<(usize, usize), String> {
    let view = match parser {
        "value" => parse_value(json, opts, now)?,
        "nftables" => parse_nftables(json, opts, now)?,
        _ => parse_typed(json, opts, now)?,
    };
    Ok((view.elems.len(), view.unknown))
}

/// What a walk over the listing found, before the preamble is derived.
#[derive(Default)]
struct Found<'a> {
    view: KernelView,
    sets: [State; 4],
    chain: State,
    comments: Vec<Option<Cow<'a, str>>>,
}

impl<'a> Found<'a> {
    /// Notes set `index` (of `script::SETS`) as right or wrong; true if right,
    /// i.e. its elements are to be read.
    fn set(&mut self, index: usize, right: bool) -> bool {
        self.sets[index] = if right { State::Right } else { State::Wrong };
        right
    }

    /// One element of set `index`, `None` if of a shape we do not know.
    fn element(&mut self, index: usize, element: Option<(Span, Until)>) {
        match element {
            // The plain `v6` set holds /64s by their network address.
            Some((sp, u)) if index == 1 => match ipnet::IpNet::new(sp.lo, 64) {
                Ok(n) if sp.lo == sp.hi => self.view.elems.push((Span::of(&n.trunc()), u)),
                _ => self.view.unknown += 1,
            },
            Some(el) => self.view.elems.push(el),
            None => self.view.unknown += 1,
        }
    }

    fn finish(self, opts: &NftOptions) -> KernelView {
        let Found {
            mut view,
            sets,
            chain,
            comments,
        } = self;
        let want: Vec<String> = script::SETS.iter().map(|s| script::rule_comment(s.0, opts)).collect();
        let rules_right = chain == State::Right
            && comments
                .iter()
                .map(Option::as_deref)
                .eq(want.iter().map(|c| Some(c.as_str())));
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
        view
    }
}

/// An element's end, estimated from `expires` (whole seconds, rounded
/// down, so the kernel's real end is up to a second later).
fn until(now: i64, expires: Option<f64>, timeout: Option<f64>) -> Until {
    match (expires, timeout) {
        (Some(left), _) => Until::At(now + (left * 1000.0) as i64),
        // A timeout but no time left shown: about to expire.
        (None, Some(_)) => Until::At(now),
        (None, None) => Until::Permanent,
    }
}

fn prefix_span(addr: IpAddr, len: u8) -> Option<Span> {
    Some(Span::of(&ipnet::IpNet::new(addr, len).ok()?.trunc()))
}

// ---- 1. serde_json::Value (the parser before) ----

fn parse_value(json: &[u8], opts: &NftOptions, now: i64) -> Result<KernelView, String> {
    let root: Value = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let items = root
        .get("nftables")
        .and_then(Value::as_array)
        .ok_or("no \"nftables\" array")?;
    let mut found = Found::default();
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
            if found.set(index, set_is_right(set, want_type, interval)) {
                for e in set.get("elem").and_then(Value::as_array).into_iter().flatten() {
                    found.element(index, value_element(e, now));
                }
            }
        } else if let Some(c) = item.get("chain").filter(|c| ours(c)) {
            if c.get("name").and_then(Value::as_str) == Some(script::CHAIN) {
                found.chain = if chain_is_right(c) { State::Right } else { State::Wrong };
            }
        } else if let Some(r) = item.get("rule").filter(|r| ours(r)) {
            if r.get("chain").and_then(Value::as_str) == Some(script::CHAIN) {
                found
                    .comments
                    .push(r.get("comment").and_then(Value::as_str).map(Cow::Borrowed));
            }
        }
    }
    Ok(found.finish(opts))
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

fn value_element(e: &Value, now: i64) -> Option<(Span, Until)> {
    let Some(inner) = e.get("elem") else {
        return Some((value_span(e)?, Until::Permanent));
    };
    let secs = |k: &str| inner.get(k).and_then(Value::as_f64);
    Some((
        value_span(inner.get("val")?)?,
        until(now, secs("expires"), secs("timeout")),
    ))
}

fn value_span(v: &Value) -> Option<Span> {
    let addr = |v: &Value| v.as_str()?.parse::<IpAddr>().ok();
    if let Some(a) = addr(v) {
        return span_from(a, a);
    }
    if let Some(p) = v.get("prefix") {
        let len = u8::try_from(p.get("len")?.as_u64()?).ok()?;
        return prefix_span(addr(p.get("addr")?)?, len);
    }
    let r = v.get("range")?.as_array()?;
    match r.as_slice() {
        [lo, hi] => span_from(addr(lo)?, addr(hi)?),
        _ => None,
    }
}

// ---- 2. the nftables crate's schema ----

fn parse_nftables(json: &[u8], opts: &NftOptions, now: i64) -> Result<KernelView, String> {
    use nftables::schema::{NfListObject, NfObject, Nftables, SetFlag, SetType, SetTypeValue};
    use nftables::types::{NfChainPolicy, NfChainType, NfFamily, NfHook};
    // script.rs names them as nft prints them; read those names as the crate's values.
    fn named<'de, T: Deserialize<'de>>(name: &'de str) -> Option<T> {
        T::deserialize(de::value::BorrowedStrDeserializer::<de::value::Error>::new(name)).ok()
    }
    let doc: Nftables = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let mut found = Found::default();
    let ours = |family: NfFamily, table: &str| family == NfFamily::INet && table == opts.table;
    let chain_type: Option<NfChainType> = named(script::CHAIN_TYPE);
    let hook: Option<NfHook> = named(script::CHAIN_HOOK);
    let policy: Option<NfChainPolicy> = named(script::CHAIN_POLICY);
    for object in doc.objects.iter() {
        let NfObject::ListObject(object) = object else {
            continue;
        };
        match object {
            NfListObject::Set(set) if ours(set.family, &set.table) => {
                let Some(index) = script::SETS.iter().position(|s| s.0 == set.name) else {
                    continue;
                };
                let (_, want_type, interval, _) = script::SETS[index];
                let mut want_flags = HashSet::from([SetFlag::Timeout]);
                if interval {
                    want_flags.insert(SetFlag::Interval);
                }
                let want_type: Option<SetType> = named(want_type);
                let right = want_type.is_some_and(|t| set.set_type == SetTypeValue::Single(t))
                    && set.flags.as_ref() == Some(&want_flags);
                if found.set(index, right) {
                    for e in set.elem.iter().flat_map(|e| e.iter()) {
                        found.element(index, nftables_element(e, now));
                    }
                }
            }
            NfListObject::Chain(c) if ours(c.family, &c.table) && c.name == script::CHAIN => {
                let right = c._type == chain_type
                    && c.hook == hook
                    && c.policy == policy
                    && c.prio.map(i64::from) == Some(script::CHAIN_PRIO);
                found.chain = if right { State::Right } else { State::Wrong };
            }
            NfListObject::Rule(r) if ours(r.family, &r.table) && r.chain == script::CHAIN => {
                found.comments.push(r.comment.clone());
            }
            _ => {}
        }
    }
    Ok(found.finish(opts))
}

fn nftables_element(e: &nftables::expr::Expression, now: i64) -> Option<(Span, Until)> {
    use nftables::expr::{Expression, NamedExpression};
    if let Expression::Named(NamedExpression::Elem(el)) = e {
        let secs = |s: Option<u32>| s.map(f64::from);
        return Some((nftables_span(&el.val)?, until(now, secs(el.expires), secs(el.timeout))));
    }
    Some((nftables_span(e)?, Until::Permanent))
}

fn nftables_span(e: &nftables::expr::Expression) -> Option<Span> {
    use nftables::expr::{Expression, NamedExpression};
    let addr = |e: &Expression| match e {
        Expression::String(s) => s.parse::<IpAddr>().ok(),
        _ => None,
    };
    match e {
        Expression::String(_) => {
            let a = addr(e)?;
            span_from(a, a)
        }
        Expression::Named(NamedExpression::Prefix(p)) => prefix_span(addr(&p.addr)?, u8::try_from(p.len).ok()?),
        Expression::Range(r) => span_from(addr(&r.range[0])?, addr(&r.range[1])?),
        _ => None,
    }
}

// ---- 3. our own typed subset ----

fn parse_typed(json: &[u8], opts: &NftOptions, now: i64) -> Result<KernelView, String> {
    let listing: Listing = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let mut found = Found::default();
    let ours = |family: &Option<String>, table: &Option<String>| {
        family.as_deref() == Some("inet") && table.as_deref() == Some(opts.table.as_str())
    };
    for object in listing.nftables {
        if let Some(set) = object.set.filter(|s| ours(&s.family, &s.table)) {
            let Some(index) = script::SETS.iter().position(|s| Some(s.0) == set.name.as_deref()) else {
                continue;
            };
            let (_, want_type, interval, _) = script::SETS[index];
            let mut flags = match set.flags {
                Some(Or::Is(flags)) => flags,
                _ => Vec::new(),
            };
            flags.sort_unstable();
            let want: &[&str] = if interval {
                &["interval", "timeout"]
            } else {
                &["timeout"]
            };
            let right = matches!(&set.set_type, Some(Or::Is(t)) if t == want_type) && flags == want;
            if found.set(index, right) {
                for listed in set.elem {
                    found.element(index, listed.element(now));
                }
            }
        } else if let Some(c) = object.chain.filter(|c| ours(&c.family, &c.table)) {
            if c.name.as_deref() == Some(script::CHAIN) {
                let right = c.chain_type.as_deref() == Some(script::CHAIN_TYPE)
                    && c.hook.as_deref() == Some(script::CHAIN_HOOK)
                    && c.policy.as_deref() == Some(script::CHAIN_POLICY)
                    && matches!(c.prio, Some(Or::Is(script::CHAIN_PRIO)));
                found.chain = if right { State::Right } else { State::Wrong };
            }
        } else if let Some(r) = object.rule.filter(|r| ours(&r.family, &r.table)) {
            if r.chain.as_deref() == Some(script::CHAIN) {
                found.comments.push(r.comment.map(Cow::Owned));
            }
        }
    }
    Ok(found.finish(opts))
}

/// `nft -j list table`: the array of objects.
#[derive(Deserialize)]
struct Listing {
    nftables: Vec<Object>,
}

/// One object of the array; the kinds we do not read (`metainfo`, `table`,
/// maps, counters...) have none of these fields.
#[derive(Deserialize)]
struct Object {
    set: Option<ListedSet>,
    chain: Option<Chain>,
    rule: Option<Rule>,
}

#[derive(Deserialize)]
struct ListedSet {
    family: Option<String>,
    table: Option<String>,
    name: Option<String>,
    /// A type's name, or a list of them for a concatenation.
    #[serde(rename = "type")]
    set_type: Option<Or<String>>,
    flags: Option<Or<Vec<String>>>,
    #[serde(default)]
    elem: Vec<Listed>,
}

#[derive(Deserialize)]
struct Chain {
    family: Option<String>,
    table: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    chain_type: Option<String>,
    hook: Option<String>,
    prio: Option<Or<i64>>,
    policy: Option<String>,
}

/// A rule: recognised by its comment (`script::rule_comment`), its
/// expressions are not read.
#[derive(Deserialize)]
struct Rule {
    family: Option<String>,
    table: Option<String>,
    chain: Option<String>,
    comment: Option<String>,
}

/// A value of the type nft prints there, or anything else (which then is
/// not what we want, rather than an error).
#[derive(Deserialize)]
#[serde(untagged)]
enum Or<T> {
    Is(T),
    Other(IgnoredAny),
}

/// A set element: an address, `{"prefix": {"addr", "len"}}`, `{"range":
/// [lo, hi]}`, or one of these as `val` of `{"elem": {"val", "timeout",
/// "expires"}}` (whole seconds). Any other shape has no span.
#[derive(Default)]
struct Listed {
    span: Option<Span>,
    timeout: Option<f64>,
    expires: Option<f64>,
}

impl Listed {
    fn element(self, now: i64) -> Option<(Span, Until)> {
        Some((self.span?, until(now, self.expires, self.timeout)))
    }
}

impl<'de> Deserialize<'de> for Listed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListedVisitor { elem: true })
    }
}

/// `val` of an `elem`: an address, a prefix or a range, not another `elem`.
#[derive(Default)]
struct Key(Option<Span>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListedVisitor { elem: false }).map(|l| Key(l.span))
    }
}

/// The one key of an element object.
#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "lowercase")]
enum Tag {
    Elem,
    Prefix,
    Range,
    #[serde(other)]
    Other,
}

#[derive(Deserialize)]
struct Elem {
    #[serde(default)]
    val: Key,
    timeout: Option<f64>,
    expires: Option<f64>,
}

#[derive(Deserialize)]
struct Prefix {
    addr: Addr,
    len: u8,
}

/// An address as listed (`None` if it does not parse).
struct Addr(Option<IpAddr>);

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct V;
        impl Visitor<'_> for V {
            type Value = Addr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Addr, E> {
                Ok(Addr(v.parse().ok()))
            }
        }
        d.deserialize_str(V)
    }
}

struct ListedVisitor {
    /// Whether `{"elem": ..}` is a shape we know here.
    elem: bool,
}

impl<'de> Visitor<'de> for ListedVisitor {
    type Value = Listed;

    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str("a set element")
    }

    fn visit_str<E: de::Error>(self, v: &str) -> Result<Listed, E> {
        let span = v.parse().ok().and_then(|a| span_from(a, a));
        Ok(Listed {
            span,
            ..Listed::default()
        })
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Listed, A::Error> {
        let mut listed = Listed::default();
        while let Some(tag) = map.next_key::<Tag>()? {
            match tag {
                Tag::Elem if self.elem => {
                    let e: Elem = map.next_value()?;
                    listed = Listed {
                        span: e.val.0,
                        timeout: e.timeout,
                        expires: e.expires,
                    };
                }
                Tag::Prefix => {
                    let p: Prefix = map.next_value()?;
                    listed.span = p.addr.0.and_then(|a| prefix_span(a, p.len));
                }
                Tag::Range => {
                    let (lo, hi): (Addr, Addr) = map.next_value()?;
                    listed.span = lo.0.zip(hi.0).and_then(|(lo, hi)| span_from(lo, hi));
                }
                _ => {
                    map.next_value::<IgnoredAny>()?;
                }
            }
        }
        Ok(listed)
    }

    // Any other JSON value is a shape we do not know.
    fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Listed, A::Error> {
        while seq.next_element::<IgnoredAny>()?.is_some() {}
        Ok(Listed::default())
    }
    fn visit_u64<E: de::Error>(self, _: u64) -> Result<Listed, E> {
        Ok(Listed::default())
    }
    fn visit_i64<E: de::Error>(self, _: i64) -> Result<Listed, E> {
        Ok(Listed::default())
    }
    fn visit_f64<E: de::Error>(self, _: f64) -> Result<Listed, E> {
        Ok(Listed::default())
    }
    fn visit_bool<E: de::Error>(self, _: bool) -> Result<Listed, E> {
        Ok(Listed::default())
    }
    fn visit_unit<E: de::Error>(self) -> Result<Listed, E> {
        Ok(Listed::default())
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
    fn the_three_parsers_agree() {
        let bad = LISTING.replacen(r#""flags": ["timeout"]"#, r#""flags": ["interval", "timeout"]"#, 1);
        for doc in [LISTING, &bad] {
            for opts in [
                NftOptions::default(),
                NftOptions {
                    action: Action::Reject,
                    ..NftOptions::default()
                },
            ] {
                let views: Vec<String> = [parse_value, parse_nftables, parse_typed]
                    .iter()
                    .map(|f| {
                        let v = f(doc.as_bytes(), &opts, 7).unwrap();
                        format!("{:?} {} {:?}", v.preamble, v.unknown, v.elems)
                    })
                    .collect();
                assert_eq!(views[0], views[1], "nftables");
                assert_eq!(views[0], views[2], "typed");
            }
        }
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
