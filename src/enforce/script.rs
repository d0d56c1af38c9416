//! The nft input for one transaction, rendered as text for `nft -f -`.
//!
//! Built only from typed values: the validated table name, integers, and
//! addresses through their `Display`. Text rather than nft's JSON input
//! because it loads faster (100k elements: ~0.67 s text vs ~0.86 s JSON on
//! nft 1.0.6). One element per line, so an nft error quotes one element.
//! Everything in one input is one kernel transaction: all or nothing.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write;

use ipnet::IpNet;

use super::block::Length;
use super::cover::{Plan, Span};
use super::{Action, NftOptions, Until};

/// The chain's definition, as listed back in JSON.
pub(crate) const CHAIN: &str = "input";
pub(crate) const CHAIN_TYPE: &str = "filter";
pub(crate) const CHAIN_HOOK: &str = "input";
pub(crate) const CHAIN_PRIO: i64 = -10;
pub(crate) const CHAIN_POLICY: &str = "accept";

/// The two fixed sets (docs/design.md §4; the original design had two
/// interval sets, §9: nft 1.0.6 reads every element of every interval set
/// before each change, so with 100k elements in them every later
/// transaction cost 1.2-2.4 s; plain sets cost ~10 ms). Single IPv4
/// addresses go to `v4`, IPv6 /64 prefixes (the default `ipv6_prefix`) to
/// `v6` as their network address, matched with
/// `ip6 saddr & ffff:ffff:ffff:ffff::`. (name, nft type, rule match).
pub(crate) const SETS: [(&str, &str, &str); 2] = [
    ("v4", "ipv4_addr", "ip saddr"),
    ("v6", "ipv6_addr", "ip6 saddr & ffff:ffff:ffff:ffff::"),
];

/// How often the kernel walks each of our sets to free its expired
/// elements, in seconds (`gc-interval`). The kernel's default is every
/// second, and a transaction that comes while the walk runs waits for it:
/// with a million elements in a set, one `nft add element` in six took
/// 50-120 ms (p99 114 ms), against p99 8.6 ms with this interval
/// (BENCHMARKS.md, "The kernel's walk for expired elements"). An
/// expired element matches nothing and lists as absent whether collected
/// or not, and adding its address again makes a new element: only the
/// kernel memory of up to a minute of expiries waits longer.
pub(crate) const GC_INTERVAL_S: u64 = 60;

/// The interval sets every other network went to before issue 27; a
/// listing that shows them has them deleted (their bans go to the sets
/// per length in the same transaction).
pub(crate) const LEGACY_SETS: [&str; 2] = ["v4net", "v6net"];

/// Where a ban's element goes: a fixed set (index in [`SETS`]) or the
/// plain set of its prefix length (`v4n24`, `v6n56`, created on demand,
/// holding each network's address, matched as
/// `ip saddr & 255.255.255.0 @v4n24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Home {
    Fixed(usize),
    Net(Length),
}

impl Home {
    /// The set's name.
    pub fn name(self) -> String {
        match self {
            Home::Fixed(i) => SETS[i].0.to_owned(),
            Home::Net(l) => l.ban_set(),
        }
    }
}

/// The set that holds `net`.
pub(crate) fn home_of(net: &IpNet) -> Home {
    match net {
        IpNet::V4(n) if n.prefix_len() == 32 => Home::Fixed(0),
        IpNet::V6(n) if n.prefix_len() == 64 => Home::Fixed(1),
        _ => Home::Net(Length::of(net)),
    }
}

/// The length whose set `net` goes to when `present` lacks it (a set per
/// length is created on demand); None when its set is there or fixed.
pub(crate) fn missing_length(net: &IpNet, present: &BTreeSet<Length>) -> Option<Length> {
    match home_of(net) {
        Home::Net(l) if !present.contains(&l) => Some(l),
        _ => None,
    }
}

/// The set that holds `span`; `None` for a span that is no prefix (none
/// of our sets can hold one).
pub(crate) fn home_of_span(span: &Span) -> Option<Home> {
    span.as_net().map(|n| home_of(&n))
}

/// Table, sets and chain work needed before the elements. Derived from a
/// listing; everything false or empty means the layout is right as it is.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Preamble {
    /// Empty the chain first: a set it references is being deleted.
    pub flush_chain_first: bool,
    /// The chain exists with another type, hook, priority or policy.
    pub delete_chain: bool,
    /// Sets to delete: ours with another type or flags (a fixed one is
    /// added back empty, one per length when a ban needs it) and the
    /// interval sets of the old layout.
    pub delete_sets: Vec<String>,
    /// Sets of ours, right but with another `gc-interval` (made by an
    /// earlier version): declared again with [`GC_INTERVAL_S`], which the
    /// kernel applies to the set as it is, elements kept.
    pub gc_sets: Vec<String>,
    /// (Re)install the rules (missing, or action/ports changed).
    pub rules: bool,
}

/// What the preamble does, for the log: `rules`, `chain flushed`,
/// `chain re-created`, `set v4 deleted`, comma-separated (or `nothing`).
impl std::fmt::Display for Preamble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.flush_chain_first {
            parts.push("chain flushed".to_owned());
        }
        if self.delete_chain {
            parts.push("chain re-created".to_owned());
        }
        for name in &self.delete_sets {
            parts.push(format!("set {name} deleted"));
        }
        for name in &self.gc_sets {
            parts.push(format!("set {name} gc-interval {GC_INTERVAL_S}s"));
        }
        if self.rules {
            parts.push("rules installed".to_owned());
        }
        match parts.is_empty() {
            true => f.write_str("nothing"),
            false => f.write_str(&parts.join(", ")),
        }
    }
}

impl Preamble {
    /// For a table that does not exist.
    pub fn create() -> Preamble {
        Preamble {
            rules: true,
            ..Preamble::default()
        }
    }
}

/// The comment that identifies a rule's configuration, so a changed action
/// or port list is noticed without parsing rule expressions.
pub(crate) fn rule_comment(set: &str, opts: &NftOptions) -> String {
    let mut c = format!("fleetban {set} {}", verdict(opts.action));
    if !opts.ports.is_empty() {
        c.push_str(" tcp ");
        let ports: Vec<String> = opts.ports.iter().map(u16::to_string).collect();
        let list = ports.join(",");
        if list.len() <= 96 {
            c.push_str(&list);
        } else {
            // nft keeps at most 128 bytes of comment: name a long list by hash.
            let hash = opts.ports.iter().fold(0xcbf2_9ce4_8422_2325u64, |h, p| {
                (h ^ u64::from(*p)).wrapping_mul(0x0100_0000_01b3)
            });
            let _ = write!(c, "{}#{hash:016x}", opts.ports.len());
        }
    }
    c
}

fn verdict(action: Action) -> &'static str {
    match action {
        Action::Drop => "drop",
        Action::Reject => "reject",
    }
}

/// Renders the preamble (if any) and the plan's element changes. `present`
/// are the sets per length the kernel holds (after the preamble's
/// deletions); a length the plan adds to and `present` lacks gets its set
/// and rule first. Returns the text and those new lengths.
pub(crate) fn render(
    opts: &NftOptions,
    preamble: Option<&Preamble>,
    plan: &Plan,
    now: i64,
    present: &BTreeSet<Length>,
) -> (String, Vec<Length>) {
    let mut out = String::with_capacity(1024 + plan.add.len() * 40 + plan.delete.len() * 24);
    let t = opts.table.as_str();
    if let Some(p) = preamble {
        // `let _ =`: writing to a String cannot fail.
        let _ = write_preamble(&mut out, opts, p, present);
    }
    let mut created: Vec<Length> = Vec::new();
    for (net, _) in &plan.add {
        if let Some(l) = missing_length(net, present) {
            if !created.contains(&l) {
                created.push(l);
            }
        }
    }
    created.sort_unstable();
    for &l in &created {
        let _ = write_set(&mut out, t, &l.ban_set(), l.ty());
        let _ = write_rule(&mut out, opts, &l.ban_set(), &l.matcher());
    }
    let mut deletes: BTreeMap<Home, Vec<&Span>> = BTreeMap::new();
    for span in &plan.delete {
        if let Some(home) = home_of_span(span) {
            deletes.entry(home).or_default().push(span);
        }
    }
    for (home, spans) in deletes {
        let mut block = Block::new("delete", t, home.name());
        for span in spans {
            let _ = write!(block.next(&mut out), "{}", span.lo);
        }
        block.close(&mut out);
    }
    let mut adds: BTreeMap<Home, Vec<(&IpNet, Until)>> = BTreeMap::new();
    for (net, until) in &plan.add {
        adds.entry(home_of(net)).or_default().push((net, *until));
    }
    for (home, elems) in adds {
        let mut block = Block::new("add", t, home.name());
        for (net, until) in elems {
            let _ = write_element(block.next(&mut out), net, until, now);
        }
        block.close(&mut out);
    }
    (out, created)
}

fn write_preamble(out: &mut String, opts: &NftOptions, p: &Preamble, present: &BTreeSet<Length>) -> std::fmt::Result {
    let t = opts.table.as_str();
    writeln!(out, "add table inet {t}")?;
    if p.flush_chain_first {
        writeln!(out, "flush chain inet {t} {CHAIN}")?;
    }
    if p.delete_chain {
        writeln!(out, "delete chain inet {t} {CHAIN}")?;
    }
    for name in &p.delete_sets {
        writeln!(out, "delete set inet {t} {name}")?;
    }
    for (name, ty, _) in SETS {
        write_set(out, t, name, ty)?;
    }
    for name in &p.gc_sets {
        if let Some(l) = Length::of_ban_set(name) {
            write_set(out, t, name, l.ty())?;
        }
    }
    writeln!(
        out,
        "add chain inet {t} {CHAIN} {{ type {CHAIN_TYPE} hook {CHAIN_HOOK} priority {CHAIN_PRIO}; policy {CHAIN_POLICY}; }}"
    )?;
    if p.rules {
        // Same transaction: there is never a moment without the rules.
        writeln!(out, "flush chain inet {t} {CHAIN}")?;
        for (set, _, matcher) in SETS {
            write_rule(out, opts, set, matcher)?;
        }
        for l in present {
            write_rule(out, opts, &l.ban_set(), &l.matcher())?;
        }
    }
    Ok(())
}

/// Declares one of our sets (or declares it again: the kernel keeps its
/// elements and takes the `gc-interval`).
fn write_set(out: &mut String, t: &str, name: &str, ty: &str) -> std::fmt::Result {
    writeln!(
        out,
        "add set inet {t} {name} {{ type {ty}; flags timeout; gc-interval {GC_INTERVAL_S}s; }}"
    )
}

/// The rule dropping (or rejecting) the sources `matcher` finds in `set`.
fn write_rule(out: &mut String, opts: &NftOptions, set: &str, matcher: &str) -> std::fmt::Result {
    let t = opts.table.as_str();
    write!(out, "add rule inet {t} {CHAIN} ")?;
    if !opts.ports.is_empty() {
        out.push_str("tcp dport { ");
        for (i, port) in opts.ports.iter().enumerate() {
            if i > 0 {
                out.push_str(", ");
            }
            write!(out, "{port}")?;
        }
        out.push_str(" } ");
    }
    writeln!(
        out,
        "{matcher} @{set} counter {} comment \"{}\"",
        verdict(opts.action),
        rule_comment(set, opts)
    )
}

/// `VERB element inet T SET {` ... `}`, opened only if it gets an element.
struct Block<'a> {
    verb: &'static str,
    table: &'a str,
    set: String,
    open: bool,
}

impl<'a> Block<'a> {
    fn new(verb: &'static str, table: &'a str, set: String) -> Self {
        Block {
            verb,
            table,
            set,
            open: false,
        }
    }

    /// Starts the next element's line and hands back the output.
    fn next<'o>(&mut self, out: &'o mut String) -> &'o mut String {
        if self.open {
            out.push_str(",\n");
        } else {
            let _ = writeln!(out, "{} element inet {} {} {{", self.verb, self.table, self.set);
            self.open = true;
        }
        out
    }

    fn close(self, out: &mut String) {
        if self.open {
            out.push_str("\n}\n");
        }
    }
}

/// One element: every set is plain and holds an address (a network's
/// address in `v6` and the sets per length). IPv4 addresses and the
/// timeout's digits are written by hand: `Display` cost ~20 ms for a
/// 100k-element start.
fn write_element(out: &mut String, net: &IpNet, until: Until, now: i64) -> std::fmt::Result {
    match net.network() {
        std::net::IpAddr::V4(a) => push_v4(out, a),
        a => write!(out, "{a}")?,
    }
    if let Until::At(t) = until {
        write_timeout(out, (t - now).max(1))?;
    }
    Ok(())
}

/// ` timeout Nms`. nft 1.0.6 rejects a number of 9 or more digits in a time
/// ("value too large"), so from ~27.7 hours on the days go separately.
fn write_timeout(out: &mut String, ms: i64) -> std::fmt::Result {
    const DAY: i64 = 86_400_000;
    if (0..100_000_000).contains(&ms) {
        out.push_str(" timeout ");
        push_u64(out, ms as u64);
        out.push_str("ms");
        Ok(())
    } else {
        write!(out, " timeout {}d{}ms", ms / DAY, ms % DAY)
    }
}

fn push_v4(out: &mut String, a: std::net::Ipv4Addr) {
    for (i, o) in a.octets().into_iter().enumerate() {
        if i > 0 {
            out.push('.');
        }
        push_u64(out, u64::from(o));
    }
}

fn push_u64(out: &mut String, mut n: u64) {
    let mut buf = [0u8; 20];
    let mut i = buf.len();
    loop {
        i -= 1;
        buf[i] = b'0' + (n % 10) as u8;
        n /= 10;
        if n == 0 {
            break;
        }
    }
    // Only ASCII digits were written.
    out.push_str(std::str::from_utf8(&buf[i..]).unwrap_or_default());
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hand_written_numbers_match_display() {
        let mut seed = 0x2545_f491_4f6c_dd1du64;
        for i in 0..20_000u64 {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            let a = std::net::Ipv4Addr::from((seed >> 16) as u32);
            let ms = [i, seed % 100_000_000, 99_999_999, 0][(i % 4) as usize];
            let mut out = String::new();
            push_v4(&mut out, a);
            push_u64(&mut out, ms);
            assert_eq!(out, format!("{a}{ms}"));
            let net = IpNet::from(std::net::IpAddr::V4(a));
            let mut out = String::new();
            write_element(&mut out, &net, Until::At(ms as i64 + 5), 5).unwrap();
            let want = if ms == 0 {
                format!("{a} timeout 1ms")
            } else {
                format!("{a} timeout {ms}ms")
            };
            assert_eq!(out, want);
            assert_eq!(Some(home_of(&net)), home_of_span(&Span::of(&net)));
        }
        for n in [
            "10.0.0.0/8",
            "2001:db8::/64",
            "2001:db8::/48",
            "2001:db8::1/128",
            "0.0.0.0/0",
        ] {
            let net: IpNet = n.parse().unwrap();
            assert_eq!(Some(home_of(&net)), home_of_span(&Span::of(&net)), "{n}");
        }
    }

    fn opts(action: Action, ports: Vec<u16>) -> NftOptions {
        NftOptions {
            action,
            ports,
            ..NftOptions::default()
        }
    }

    #[test]
    fn renders_elements_with_remaining_timeouts() {
        let now = 1_000_000;
        let plan = Plan {
            delete: vec![Span::of(&"10.0.0.5/32".parse().unwrap())],
            add: vec![
                ("10.0.0.0/24".parse().unwrap(), Until::At(now + 3_600_000)),
                ("2001:db8::/64".parse().unwrap(), Until::At(now + 30 * 86_400_000 + 7)),
                ("192.0.2.1/32".parse().unwrap(), Until::Permanent),
            ],
            ..Plan::default()
        };
        let (text, created) = render(&NftOptions::default(), None, &plan, now, &BTreeSet::new());
        assert_eq!(
            text,
            "add set inet fleetban v4n24 { type ipv4_addr; flags timeout; gc-interval 60s; }\n\
             add rule inet fleetban input ip saddr & 255.255.255.0 @v4n24 counter drop comment \"fleetban v4n24 drop\"\n\
             delete element inet fleetban v4 {\n10.0.0.5\n}\n\
             add element inet fleetban v4 {\n192.0.2.1\n}\n\
             add element inet fleetban v6 {\n2001:db8:: timeout 30d7ms\n}\n\
             add element inet fleetban v4n24 {\n10.0.0.0 timeout 3600000ms\n}\n"
        );
        assert_eq!(created, [Length { v6: false, len: 24 }]);
        // A length the kernel has: no set, no rule.
        let (text, created) = render(&NftOptions::default(), None, &plan, now, &created.into_iter().collect());
        assert!(
            !text.contains("add set") && !text.contains("add rule") && created.is_empty(),
            "{text}"
        );
    }

    #[test]
    fn renders_rules_for_action_and_ports() {
        let present: BTreeSet<Length> = [Length { v6: false, len: 16 }, Length { v6: true, len: 48 }].into();
        let (text, _) = render(
            &opts(Action::Reject, vec![80, 443]),
            Some(&Preamble::create()),
            &Plan::default(),
            0,
            &present,
        );
        assert!(text.starts_with("add table inet fleetban\n"), "{text}");
        assert!(text.contains(
            "add rule inet fleetban input tcp dport { 80, 443 } ip saddr @v4 counter reject comment \"fleetban v4 reject tcp 80,443\"\n"
        ));
        assert!(text.contains(
            "ip6 saddr & ffff:ffff:ffff:ffff:: @v6 counter reject comment \"fleetban v6 reject tcp 80,443\""
        ));
        assert!(
            text.contains("ip saddr & 255.255.0.0 @v4n16 counter reject comment \"fleetban v4n16 reject tcp 80,443\"")
        );
        assert!(text.contains(
            "ip6 saddr & ffff:ffff:ffff:: @v6n48 counter reject comment \"fleetban v6n48 reject tcp 80,443\""
        ));
        assert!(text.contains("add set inet fleetban v4 { type ipv4_addr; flags timeout; gc-interval 60s; }\n"));
        assert!(!text.contains("flags interval"), "{text}");
        let (text, _) = render(
            &opts(Action::Drop, vec![]),
            Some(&Preamble::create()),
            &Plan::default(),
            0,
            &BTreeSet::new(),
        );
        assert!(text.contains("add rule inet fleetban input ip saddr @v4 counter drop comment \"fleetban v4 drop\"\n"));
    }

    #[test]
    fn long_port_lists_get_a_short_comment() {
        let c = rule_comment("v4", &opts(Action::Drop, (1000..1100).collect()));
        assert!(c.len() < 128 && c.starts_with("fleetban v4 drop tcp 100#"), "{c}");
    }

    #[test]
    fn every_length_has_a_set_of_its_own() {
        for (fam, max) in [("10.0.0.0", 32u8), ("2001:db8::", 128)] {
            for len in 0..=max {
                let net: IpNet = format!("{fam}/{len}").parse().unwrap();
                let home = home_of(&net);
                let name = home.name();
                match (len, max) {
                    (32, 32) => assert_eq!(name, "v4"),
                    (64, 128) => assert_eq!(name, "v6"),
                    _ => {
                        assert_eq!(home, Home::Net(Length::of(&net)));
                        assert_eq!(Length::of_ban_set(&name), Some(Length::of(&net)), "{name}");
                    }
                }
            }
        }
        for bad in ["v4n33", "v6n129", "v4n", "v4n024", "v4net", "v6n+1", "v4n2a"] {
            assert_eq!(Length::of_ban_set(bad), None, "{bad}");
        }
    }
}
