//! Reading the kernel back: `nft -j list table inet T` parsed into the
//! elements of the two fixed sets (`script::SETS`; the plain `v6` set's
//! addresses stand for /64s) and of the sets per prefix length (`v4n24`:
//! each address stands for its /24), and whether table, sets, chain and
//! rules are as configured (the old layout's interval sets are deleted).
//!
//! nft 1.0.6 lists an element as `"1.2.3.4"`, `{"prefix":{"addr","len"}}`,
//! `{"range":[lo,hi]}`, or any of these wrapped in
//! `{"elem":{"val":..,"timeout":s,"expires":s}}` (whole seconds, truncated).
//! The rules are recognised by their comment (`script::rule_comment`).
//!
//! The listing is read into typed structs of the parts we use (serde derive,
//! one visitor for the element, whose shape varies): keys and objects we do
//! not read are skipped, an element of a shape we do not know is counted,
//! a set or chain of ours with another type, flags, hook, priority or
//! policy (of any JSON type) is wrong and re-created. What is not nft's
//! shape around them (not JSON, no `nftables` array of objects, a name or
//! comment that is not a string) is an error. Not the `nftables` crate's
//! schema, nor `serde_json::Value`: parsing 100,000 elements
//! (`benches/listing.rs`, one run, medians) took 28 ms this way, 128 ms as
//! `Value` and 170 ms with the crate, whose untagged expression enums
//! buffer and retry each element.

use std::collections::BTreeSet;
use std::fmt;
use std::net::IpAddr;

use serde::de::{self, Deserializer, IgnoredAny, MapAccess, SeqAccess, Visitor};
use serde::Deserialize;

use super::block::Length;
use super::cover::{span_from, Span};
use super::script::{self, Home, Preamble};
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
    /// The sets per prefix length that are right (a wrong one is deleted).
    pub lengths: BTreeSet<Length>,
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
    let listing: Listing = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    let mut view = KernelView::default();
    let mut sets = [State::Missing; 2];
    let mut delete_sets: Vec<String> = Vec::new();
    let mut gc_sets: Vec<String> = Vec::new();
    let mut chain = State::Missing;
    let mut comments: Vec<Option<String>> = Vec::new();
    let ours = |family: &Option<String>, table: &Option<String>| {
        family.as_deref() == Some("inet") && table.as_deref() == Some(opts.table.as_str())
    };
    for object in listing.nftables {
        if let Some(set) = object.set.filter(|s| ours(&s.family, &s.table)) {
            let name = set.name.as_deref().unwrap_or_default();
            let (home, want_type) = if let Some(index) = script::SETS.iter().position(|s| s.0 == name) {
                (Home::Fixed(index), script::SETS[index].1)
            } else if let Some(l) = Length::of_ban_set(name) {
                (Home::Net(l), l.ty())
            } else {
                if script::LEGACY_SETS.contains(&name) {
                    delete_sets.push(name.to_owned());
                }
                continue;
            };
            let right = set.is_right(want_type, false);
            match home {
                Home::Fixed(i) => sets[i] = if right { State::Right } else { State::Wrong },
                Home::Net(l) if right => {
                    view.lengths.insert(l);
                }
                Home::Net(_) => {}
            }
            if right && !matches!(set.gc_interval, Some(Or::Is(s)) if s == script::GC_INTERVAL_S) {
                gc_sets.push(name.to_owned());
            }
            if !right {
                delete_sets.push(name.to_owned());
                continue;
            }
            for listed in set.elem {
                match (listed.element(now), home) {
                    (Some((sp, u)), Home::Fixed(0)) => view.elems.push((sp, u)),
                    // The other sets hold networks by their address.
                    (Some((sp, u)), _) => {
                        let len = match home {
                            Home::Net(l) => l.len,
                            Home::Fixed(_) => 64,
                        };
                        match ipnet::IpNet::new(sp.lo, len) {
                            Ok(n) if sp.lo == sp.hi && n.network() == sp.lo => view.elems.push((Span::of(&n), u)),
                            _ => view.unknown += 1,
                        }
                    }
                    (None, _) => view.unknown += 1,
                }
            }
        } else if let Some(c) = object.chain.filter(|c| ours(&c.family, &c.table)) {
            if c.name.as_deref() == Some(script::CHAIN) {
                chain = if c.is_right() { State::Right } else { State::Wrong };
            }
        } else if let Some(r) = object.rule.filter(|r| ours(&r.family, &r.table)) {
            if r.chain.as_deref() == Some(script::CHAIN) {
                comments.push(r.comment);
            }
        }
    }
    // One rule per set, in any order (the sets per length get theirs as
    // they are created).
    let mut want: Vec<Option<String>> = script::SETS
        .iter()
        .map(|s| s.0.to_owned())
        .chain(view.lengths.iter().map(|l| l.ban_set()))
        .map(|name| Some(script::rule_comment(&name, opts)))
        .collect();
    want.sort_unstable();
    comments.sort_unstable();
    let rules_right = chain == State::Right && comments == want;
    let mut p = Preamble {
        delete_sets,
        gc_sets,
        delete_chain: chain == State::Wrong,
        ..Preamble::default()
    };
    p.flush_chain_first = chain != State::Missing && (!p.delete_sets.is_empty() || p.delete_chain);
    p.rules = !rules_right || p.flush_chain_first;
    let missing = sets.contains(&State::Missing) || chain == State::Missing;
    if missing || p != Preamble::default() {
        view.preamble = Some(p);
    }
    Ok(view)
}

/// Whether `nft -j list chains inet` shows our table's chain `input`.
pub(crate) fn has_chain(json: &[u8], opts: &NftOptions) -> Result<bool, String> {
    let listing: Listing = serde_json::from_slice(json).map_err(|e| e.to_string())?;
    Ok(listing.nftables.into_iter().filter_map(|o| o.chain).any(|c| {
        c.family.as_deref() == Some("inet")
            && c.table.as_deref() == Some(opts.table.as_str())
            && c.name.as_deref() == Some(script::CHAIN)
    }))
}

/// For `benches/listing.rs` only: (elements read, elements of unknown shape).
#[doc(hidden)]
pub fn bench_parse(json: &[u8], opts: &NftOptions, now: i64) -> Result<(usize, usize), String> {
    parse(json, opts, now).map(|view| (view.elems.len(), view.unknown))
}

/// `nft -j list table`: an array of objects.
#[derive(Deserialize)]
struct Listing {
    nftables: Vec<Object>,
}

/// One object of the array; those we do not read (`metainfo`, `table`,
/// maps, counters, ...) have none of these keys.
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
    /// A type's name, or a list of names for a concatenation.
    #[serde(rename = "type")]
    set_type: Option<Or<String>>,
    flags: Option<Or<Vec<String>>>,
    /// Seconds; absent: the kernel's default (every second).
    #[serde(rename = "gc-interval")]
    gc_interval: Option<Or<u64>>,
    #[serde(default)]
    elem: Vec<Listed>,
}

impl ListedSet {
    fn is_right(&self, want_type: &str, interval: bool) -> bool {
        let mut flags: Vec<&str> = match &self.flags {
            Some(Or::Is(flags)) => flags.iter().map(String::as_str).collect(),
            _ => Vec::new(),
        };
        flags.sort_unstable();
        let want: &[&str] = if interval {
            &["interval", "timeout"]
        } else {
            &["timeout"]
        };
        is(&self.set_type, want_type) && flags == want
    }
}

#[derive(Deserialize)]
struct Chain {
    family: Option<String>,
    table: Option<String>,
    name: Option<String>,
    #[serde(rename = "type")]
    chain_type: Option<Or<String>>,
    hook: Option<Or<String>>,
    prio: Option<Or<i64>>,
    policy: Option<Or<String>>,
}

impl Chain {
    fn is_right(&self) -> bool {
        is(&self.chain_type, script::CHAIN_TYPE)
            && is(&self.hook, script::CHAIN_HOOK)
            && is(&self.policy, script::CHAIN_POLICY)
            && matches!(self.prio, Some(Or::Is(script::CHAIN_PRIO)))
    }
}

/// A rule, known by its comment; its expressions are not read.
#[derive(Deserialize)]
struct Rule {
    family: Option<String>,
    table: Option<String>,
    chain: Option<String>,
    comment: Option<String>,
}

/// A value of the type nft prints there, or anything else: then it is not
/// what we want, rather than an error.
#[derive(Deserialize)]
#[serde(untagged)]
enum Or<T> {
    Is(T),
    Other(IgnoredAny),
}

/// Whether a listed name is `want`.
fn is(name: &Option<Or<String>>, want: &str) -> bool {
    matches!(name, Some(Or::Is(n)) if n == want)
}

/// A set element as listed, its addresses and seconds; an element of a
/// shape we do not know has no span.
#[derive(Default)]
struct Listed {
    span: Option<Span>,
    timeout: Option<f64>,
    expires: Option<f64>,
}

impl Listed {
    /// The element and its end, estimated from `expires` (whole seconds,
    /// rounded down, so the kernel's real end is up to a second later).
    fn element(self, now: i64) -> Option<(Span, Until)> {
        let until = match (self.expires, self.timeout) {
            (Some(left), _) => Until::At(now + (left * 1000.0) as i64),
            // A timeout but no time left shown: about to expire.
            (None, Some(_)) => Until::At(now),
            (None, None) => Until::Permanent,
        };
        Some((self.span?, until))
    }
}

impl<'de> Deserialize<'de> for Listed {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListedVisitor { elem: true })
    }
}

/// `val` of an `elem`: an address, a prefix or a range (not another `elem`).
#[derive(Default)]
struct Key(Option<Span>);

impl<'de> Deserialize<'de> for Key {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(ListedVisitor { elem: false }).map(|l| Key(l.span))
    }
}

/// The key of an element object.
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

/// An address as listed (`None` if it does not parse as one).
struct Addr(Option<IpAddr>);

impl<'de> Deserialize<'de> for Addr {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct AddrVisitor;
        impl Visitor<'_> for AddrVisitor {
            type Value = Addr;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("an address")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Addr, E> {
                Ok(Addr(v.parse().ok()))
            }
        }
        d.deserialize_str(AddrVisitor)
    }
}

/// Reads one element without buffering it: a string is an address, an
/// object is known by its key, anything else has no span.
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
        Ok(Listed {
            span: v.parse().ok().and_then(|a| span_from(a, a)),
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
                    listed.span = p
                        .addr
                        .0
                        .and_then(|a| ipnet::IpNet::new(a, p.len).ok())
                        .map(|net| Span::of(&net.trunc()));
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
        "flags": ["timeout"], "gc-interval": 60, "elem": [
          {"elem": {"val": "1.2.3.4", "timeout": 5, "expires": 4}}, "5.5.5.5"]}},
      {"set": {"family": "inet", "name": "v6", "table": "fleetban", "type": "ipv6_addr", "handle": 3,
        "flags": ["timeout"], "gc-interval": 60, "elem": [{"elem": {"val": "2001:db8::", "timeout": 60, "expires": 59}}]}},
      {"set": {"family": "inet", "name": "v4n16", "table": "fleetban", "type": "ipv4_addr", "handle": 4,
        "flags": ["timeout"], "gc-interval": 60, "elem": [
          {"elem": {"val": "10.0.0.0", "timeout": 10, "expires": 9}}, "10.1.0.0",
          {"concat": [1, 2]}, "10.2.0.1"]}},
      {"set": {"family": "inet", "name": "v4n31", "table": "fleetban", "type": "ipv4_addr", "handle": 5,
        "flags": ["timeout"], "gc-interval": 60, "elem": ["30.0.0.0"]}},
      {"set": {"family": "inet", "name": "v6n48", "table": "fleetban", "type": "ipv6_addr", "handle": 6,
        "flags": ["timeout"], "gc-interval": 60, "elem": ["2001:db8:1::"]}},
      {"chain": {"family": "inet", "table": "fleetban", "name": "input", "handle": 1, "type": "filter", "hook": "input", "prio": -10, "policy": "accept"}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 6, "comment": "fleetban v4 drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 7, "comment": "fleetban v6 drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 8, "comment": "fleetban v6n48 drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 9, "comment": "fleetban v4n16 drop", "expr": []}},
      {"rule": {"family": "inet", "table": "fleetban", "chain": "input", "handle": 10, "comment": "fleetban v4n31 drop", "expr": []}}]}"#;

    #[test]
    fn sets_without_our_gc_interval_are_declared_again_with_their_elements() {
        let earlier = LISTING.replacen(r#""gc-interval": 60, "#, "", 1).replacen(
            r#""handle": 4,
        "flags": ["timeout"], "gc-interval": 60,"#,
            r#""handle": 4,
        "flags": ["timeout"], "gc-interval": 1,"#,
            1,
        );
        let view = parse(earlier.as_bytes(), &NftOptions::default(), 0).unwrap();
        let p = view.preamble.expect("a preamble");
        assert_eq!(p.gc_sets, ["v4", "v4n16"]);
        assert!(!p.rules && p.delete_sets.is_empty() && !p.flush_chain_first, "{p}");
        assert_eq!(p.to_string(), "set v4 gc-interval 60s, set v4n16 gc-interval 60s");
        let whole = parse(LISTING.as_bytes(), &NftOptions::default(), 0).unwrap();
        assert_eq!(view.elems.len(), whole.elems.len());
    }

    #[test]
    fn parses_every_element_shape() {
        let view = parse(LISTING.as_bytes(), &NftOptions::default(), 0).unwrap();
        assert_eq!(view.preamble, None);
        // The concat, and an address with host bits in the /16 set.
        assert_eq!(view.unknown, 2);
        let got: Vec<(String, Until)> = view.elems.iter().map(|(s, u)| (s.to_string(), *u)).collect();
        assert_eq!(
            got,
            [
                ("1.2.3.4".to_string(), Until::At(4_000)),
                ("5.5.5.5".to_string(), Until::Permanent),
                ("2001:db8::/64".to_string(), Until::At(59_000)),
                ("10.0.0.0/16".to_string(), Until::At(9_000)),
                ("10.1.0.0/16".to_string(), Until::Permanent),
                ("30.0.0.0/31".to_string(), Until::Permanent),
                ("2001:db8:1::/48".to_string(), Until::Permanent),
            ]
        );
    }

    /// LISTING with the elements of `v4` replaced by `elems`.
    fn with_v4_elems(elems: &str) -> String {
        let start = LISTING.find(r#"{"elem": {"val": "1.2.3.4""#).unwrap();
        let end = LISTING.find(r#""5.5.5.5""#).unwrap() + r#""5.5.5.5""#.len();
        format!("{}{elems}{}", &LISTING[..start], &LISTING[end..])
    }

    #[test]
    fn elements_of_unknown_shape_are_counted_not_errors() {
        let odd = [
            "42",
            "true",
            "null",
            "[1, 2]",
            r#""not an address""#,
            r#"{"concat": ["1.2.3.4", 80]}"#,
            r#"{"elem": {"timeout": 5, "expires": 4}}"#,
            r#"{"elem": {"val": {"elem": {"val": "1.2.3.4"}}, "timeout": 5}}"#,
            r#"{"elem": {"val": 7, "timeout": 5}}"#,
            r#"{"range": ["1.2.3.9", "1.2.3.1"]}"#,
            r#"{"range": ["1.2.3.4", "2001:db8::1"]}"#,
            r#"{"prefix": {"addr": "x", "len": 8}}"#,
            r#"{"prefix": {"addr": "1.2.3.0", "len": 40}}"#,
            r#"{"counter": {"packets": 0, "bytes": 0}}"#,
        ];
        let elems = format!(r#"{}, "9.9.9.9""#, odd.join(", "));
        let view = parse(with_v4_elems(&elems).as_bytes(), &NftOptions::default(), 0).unwrap();
        assert_eq!(view.preamble, None);
        // LISTING's own unknown ones (in v4n16) and these.
        assert_eq!(view.unknown, 2 + odd.len());
        assert_eq!(view.elems[0].0.to_string(), "9.9.9.9");
        assert_eq!(view.elems.len(), 1 + 5, "9.9.9.9 and the other sets' elements");
        // An IPv4 address in the IPv6 /64 set is not one of ours either.
        let v6 = LISTING.replacen(r#""val": "2001:db8::""#, r#""val": "1.2.3.4""#, 1);
        assert_eq!(parse(v6.as_bytes(), &NftOptions::default(), 0).unwrap().unknown, 3);
    }

    #[test]
    fn objects_we_do_not_read_are_skipped() {
        let others = r#"{"set": {"family": "inet", "name": "mine", "table": "fleetban", "type": ["ipv4_addr", "inet_service"], "handle": 20, "flags": ["timeout"], "elem": [{"concat": ["1.2.3.4", 80]}]}},
          {"set": {"family": "inet", "name": "v4", "table": "other", "type": "ipv6_addr", "handle": 21, "elem": ["2001:db8::"]}},
          {"set": {"family": "ip", "name": "v4", "table": "fleetban", "type": "ipv4_addr", "handle": 22, "flags": "constant"}},
          {"map": {"family": "inet", "name": "m", "table": "fleetban", "type": "ipv4_addr", "map": "verdict", "handle": 23, "elem": [["1.2.3.4", {"drop": null}]]}},
          {"counter": {"family": "inet", "name": "c", "table": "fleetban", "handle": 24, "packets": 0, "bytes": 0}},
          {"chain": {"family": "inet", "table": "fleetban", "name": "mine", "handle": 25}},
          {"rule": {"family": "inet", "table": "fleetban", "chain": "mine", "handle": 26, "expr": [{"accept": null}]}},
          {"chain": {"family": "inet", "table": "fleetban", "name": "input","#;
        let doc = LISTING.replacen(
            r#"{"chain": {"family": "inet", "table": "fleetban", "name": "input","#,
            others,
            1,
        );
        let view = parse(doc.as_bytes(), &NftOptions::default(), 0).unwrap();
        assert_eq!(view.preamble, None);
        assert_eq!((view.elems.len(), view.unknown), (7, 2));
    }

    #[test]
    fn sets_and_chain_of_other_types_are_recreated() {
        let opts = NftOptions::default();
        // A concatenation, flags as one string, the priority as a name.
        for (from, to, sets, chain) in [
            (
                r#""type": "ipv4_addr", "handle": 2"#,
                r#""type": ["ipv4_addr", "inet_service"], "handle": 2"#,
                vec!["v4"],
                false,
            ),
            (r#""flags": ["timeout"]"#, r#""flags": "timeout""#, vec!["v4"], false),
            (r#""prio": -10"#, r#""prio": "filter""#, vec![], true),
            (r#""hook": "input""#, r#""hook": "forward""#, vec![], true),
            (r#""policy": "accept""#, r#""policy": 1"#, vec![], true),
        ] {
            let doc = LISTING.replacen(from, to, 1);
            assert_ne!(doc, LISTING, "{from}");
            let p = parse(doc.as_bytes(), &opts, 0).unwrap().preamble.unwrap();
            assert_eq!(
                (
                    p.delete_sets.iter().map(String::as_str).collect::<Vec<_>>(),
                    p.delete_chain
                ),
                (sets, chain),
                "{to}"
            );
            assert!(p.flush_chain_first && p.rules, "{to}");
        }
        // The table without our sets and chain: all created.
        let empty = r#"{"nftables": [{"table": {"family": "inet", "name": "fleetban", "handle": 1}}]}"#;
        let view = parse(empty.as_bytes(), &opts, 0).unwrap();
        assert_eq!(view.preamble, Some(Preamble::create()));
    }

    #[test]
    fn the_chain_listing_says_whether_the_table_is_there() {
        let opts = NftOptions::default();
        let chains = r#"{"nftables": [{"metainfo": {"version": "1.0.6"}},
          {"chain": {"family": "inet", "table": "other", "name": "input", "handle": 1}},
          {"chain": {"family": "inet", "table": "fleetban", "name": "blocklist", "handle": 2}}"#;
        let without = format!("{chains}]}}");
        assert_eq!(has_chain(without.as_bytes(), &opts), Ok(false));
        let with = format!(
            r#"{chains}, {{"chain": {{"family": "inet", "table": "fleetban", "name": "input", "handle": 3}}}}]}}"#
        );
        assert_eq!(has_chain(with.as_bytes(), &opts), Ok(true));
        assert_eq!(has_chain(br#"{"nftables": []}"#, &opts), Ok(false));
        assert!(has_chain(b"no", &opts).is_err());
    }

    #[test]
    fn what_is_not_a_listing_is_an_error() {
        for doc in [
            "",
            "not json",
            "[]",
            r#"{"x": 1}"#,
            r#"{"nftables": 5}"#,
            r#"{"nftables": ["set"]}"#,
        ] {
            assert!(parse(doc.as_bytes(), &NftOptions::default(), 0).is_err(), "{doc}");
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
        // The original layout (docs/design.md §9: v4 an interval set) is re-created.
        let bad = LISTING.replacen(r#""flags": ["timeout"]"#, r#""flags": ["interval", "timeout"]"#, 1);
        let view = parse(bad.as_bytes(), &NftOptions::default(), 0).unwrap();
        let p = view.preamble.unwrap();
        assert!(p.delete_sets == ["v4"] && p.flush_chain_first && p.rules);
        assert_eq!(view.elems.len(), 5, "the other sets' elements are kept");
    }

    #[test]
    fn sets_per_length_are_read_and_the_old_layout_deleted() {
        let opts = NftOptions::default();
        let view = parse(LISTING.as_bytes(), &opts, 0).unwrap();
        let names: Vec<String> = view.lengths.iter().map(|l| l.ban_set()).collect();
        assert_eq!(names, ["v4n16", "v4n31", "v6n48"]);
        // A set per length of the wrong kind: deleted, its elements not read
        // (the plan puts them back into a new one).
        let bad = LISTING.replacen(
            r#""name": "v4n31", "table": "fleetban", "type": "ipv4_addr", "handle": 5,
        "flags": ["timeout"]"#,
            r#""name": "v4n31", "table": "fleetban", "type": "ipv4_addr", "handle": 5,
        "flags": ["interval", "timeout"]"#,
            1,
        );
        assert_ne!(bad, LISTING);
        let view = parse(bad.as_bytes(), &opts, 0).unwrap();
        let p = view.preamble.unwrap();
        assert!(p.delete_sets == ["v4n31"] && p.flush_chain_first && p.rules, "{p}");
        assert!(!view.elems.iter().any(|(s, _)| s.to_string() == "30.0.0.0/31"));
        assert_eq!(view.lengths.len(), 2);
        // The interval sets of the old layout: deleted, their elements not read.
        let old = LISTING.replacen(
            r#"{"chain": {"family": "inet", "table": "fleetban", "name": "input","#,
            r#"{"set": {"family": "inet", "name": "v4net", "table": "fleetban", "type": "ipv4_addr", "handle": 30,
              "flags": ["interval", "timeout"], "elem": [{"prefix": {"addr": "40.0.0.0", "len": 8}}]}},
            {"chain": {"family": "inet", "table": "fleetban", "name": "input","#,
            1,
        );
        let view = parse(old.as_bytes(), &opts, 0).unwrap();
        let p = view.preamble.unwrap();
        assert!(p.delete_sets == ["v4net"] && p.flush_chain_first && p.rules, "{p}");
        assert_eq!(view.elems.len(), 7);
        // A set per length without its rule, or a rule without its set.
        for (from, to) in [
            (r#""comment": "fleetban v4n31 drop""#, r#""comment": "something else""#),
            (r#""name": "v4n31""#, r#""name": "other""#),
        ] {
            let doc = LISTING.replacen(from, to, 1);
            let p = parse(doc.as_bytes(), &opts, 0).unwrap().preamble.unwrap();
            assert!(p.rules && p.delete_sets.is_empty(), "{to}: {p}");
        }
    }
}
