//! The nft input for one transaction, rendered as text for `nft -f -`.
//!
//! Built only from typed values: the validated table name, integers, and
//! addresses through their `Display`. Text rather than nft's JSON input
//! because it loads faster (100k elements: ~0.67 s text vs ~0.86 s JSON on
//! nft 1.0.6). One element per line, so an nft error quotes one element.
//! Everything in one input is one kernel transaction: all or nothing.

use std::fmt::Write;

use ipnet::IpNet;

use super::cover::{Plan, Span};
use super::{Action, NftOptions, Until};

/// The chain's definition, as listed back in JSON.
pub(crate) const CHAIN: &str = "input";
pub(crate) const CHAIN_TYPE: &str = "filter";
pub(crate) const CHAIN_HOOK: &str = "input";
pub(crate) const CHAIN_PRIO: i64 = -10;
pub(crate) const CHAIN_POLICY: &str = "accept";

/// The four sets (docs/design.md §4; the original design had two interval
/// sets, §9: nft 1.0.6 reads every element of every interval set before each change, so with
/// 100k elements in them every later transaction cost 1.2-2.4 s; plain
/// sets cost ~10 ms). Single IPv4 addresses go to the plain set `v4`, IPv6
/// /64 prefixes (the default `ipv6_prefix`) to the plain set `v6` as their
/// network address, matched with `ip6 saddr & ffff:ffff:ffff:ffff::`; every
/// other prefix to the small interval sets `v4net` / `v6net`.
/// (name, nft type, interval flag, rule match).
pub(crate) const SETS: [(&str, &str, bool, &str); 4] = [
    ("v4", "ipv4_addr", false, "ip saddr"),
    ("v6", "ipv6_addr", false, "ip6 saddr & ffff:ffff:ffff:ffff::"),
    ("v4net", "ipv4_addr", true, "ip saddr"),
    ("v6net", "ipv6_addr", true, "ip6 saddr"),
];

/// Index in [`SETS`] of the set that holds `span`.
pub(crate) fn set_of(span: &Span) -> usize {
    match (span.is_v4(), span.as_net()) {
        (true, Some(n)) if n.prefix_len() == 32 => 0,
        (false, Some(n)) if n.prefix_len() == 64 => 1,
        (true, _) => 2,
        (false, _) => 3,
    }
}

/// Table, sets and chain work needed before the elements. Derived from a
/// listing; everything false means the layout is right as it is.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Preamble {
    /// Empty the chain first: a set it references is being re-created.
    pub flush_chain_first: bool,
    /// The chain exists with another type, hook, priority or policy.
    pub delete_chain: bool,
    /// Sets (by index in [`SETS`]) that exist with another type or flags.
    pub delete_sets: [bool; 4],
    /// (Re)install the two rules (missing, or action/ports changed).
    pub rules: bool,
}

/// What the preamble does, for the log: `rules`, `chain flushed`,
/// `chain re-created`, `set v4 re-created`, comma-separated (or `nothing`).
impl std::fmt::Display for Preamble {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let mut parts: Vec<String> = Vec::new();
        if self.flush_chain_first {
            parts.push("chain flushed".to_owned());
        }
        if self.delete_chain {
            parts.push("chain re-created".to_owned());
        }
        for (i, _) in self.delete_sets.iter().enumerate().filter(|(_, d)| **d) {
            parts.push(format!("set {} re-created", SETS[i].0));
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

/// Renders the preamble (if any) and the plan's element changes.
pub(crate) fn render(opts: &NftOptions, preamble: Option<Preamble>, plan: &Plan, now: i64) -> String {
    let mut out = String::with_capacity(1024 + plan.add.len() * 40 + plan.delete.len() * 24);
    let t = opts.table.as_str();
    if let Some(p) = preamble {
        // `let _ =`: writing to a String cannot fail.
        let _ = write_preamble(&mut out, opts, p);
    }
    for set in 0..SETS.len() {
        let mut block = Block::new("delete", t, set);
        for span in plan.delete.iter().filter(|s| set_of(s) == set) {
            let _ = write_span(block.next(&mut out), span, set);
        }
        block.close(&mut out);
    }
    for set in 0..SETS.len() {
        let mut block = Block::new("add", t, set);
        for (net, until) in plan.add.iter().filter(|(n, _)| set_of_net(n) == set) {
            let _ = write_element(block.next(&mut out), net, *until, now, set);
        }
        block.close(&mut out);
    }
    out
}

fn write_preamble(out: &mut String, opts: &NftOptions, p: Preamble) -> std::fmt::Result {
    let t = opts.table.as_str();
    writeln!(out, "add table inet {t}")?;
    if p.flush_chain_first {
        writeln!(out, "flush chain inet {t} {CHAIN}")?;
    }
    if p.delete_chain {
        writeln!(out, "delete chain inet {t} {CHAIN}")?;
    }
    for (i, (name, ty, interval, _)) in SETS.iter().enumerate() {
        if p.delete_sets[i] {
            writeln!(out, "delete set inet {t} {name}")?;
        }
        let flags = if *interval { "interval, timeout" } else { "timeout" };
        writeln!(out, "add set inet {t} {name} {{ type {ty}; flags {flags}; }}")?;
    }
    writeln!(
        out,
        "add chain inet {t} {CHAIN} {{ type {CHAIN_TYPE} hook {CHAIN_HOOK} priority {CHAIN_PRIO}; policy {CHAIN_POLICY}; }}"
    )?;
    if p.rules {
        // Same transaction: there is never a moment without the rules.
        writeln!(out, "flush chain inet {t} {CHAIN}")?;
        for (set, _, _, matcher) in SETS {
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
            )?;
        }
    }
    Ok(())
}

/// `VERB element inet T SET {` ... `}`, opened only if it gets an element.
struct Block<'a> {
    verb: &'static str,
    table: &'a str,
    set: usize,
    open: bool,
}

impl<'a> Block<'a> {
    fn new(verb: &'static str, table: &'a str, set: usize) -> Self {
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
            let set = SETS[self.set].0;
            let _ = writeln!(out, "{} element inet {} {set} {{", self.verb, self.table);
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

/// A span to delete; in the plain sets an element is an address (for `v6`,
/// the /64's network address).
fn write_span(out: &mut String, span: &Span, set: usize) -> std::fmt::Result {
    if set < 2 {
        write!(out, "{}", span.lo)
    } else {
        write!(out, "{span}")
    }
}

/// [`set_of`] for a net (a prefix: no span arithmetic needed).
fn set_of_net(net: &IpNet) -> usize {
    match net {
        IpNet::V4(n) if n.prefix_len() == 32 => 0,
        IpNet::V6(n) if n.prefix_len() == 64 => 1,
        IpNet::V4(_) => 2,
        IpNet::V6(_) => 3,
    }
}

/// One element of `set`. IPv4 addresses and the timeout's digits are
/// written by hand: `Display` cost ~20 ms for a 100k-element start.
fn write_element(out: &mut String, net: &IpNet, until: Until, now: i64, set: usize) -> std::fmt::Result {
    match net {
        IpNet::V4(n) if set == 0 => push_v4(out, n.addr()),
        _ if set == 1 || net.prefix_len() == net.max_prefix_len() => write!(out, "{}", net.addr())?,
        _ => write!(out, "{net}")?,
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
            write_element(&mut out, &net, Until::At(ms as i64 + 5), 5, set_of_net(&net)).unwrap();
            let want = if ms == 0 {
                format!("{a} timeout 1ms")
            } else {
                format!("{a} timeout {ms}ms")
            };
            assert_eq!(out, want);
            assert_eq!(set_of_net(&net), set_of(&Span::of(&net)));
        }
        for n in [
            "10.0.0.0/8",
            "2001:db8::/64",
            "2001:db8::/48",
            "2001:db8::1/128",
            "0.0.0.0/0",
        ] {
            let net: IpNet = n.parse().unwrap();
            assert_eq!(set_of_net(&net), set_of(&Span::of(&net)), "{n}");
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
        let text = render(&NftOptions::default(), None, &plan, now);
        assert_eq!(
            text,
            "delete element inet fleetban v4 {\n10.0.0.5\n}\n\
             add element inet fleetban v4 {\n192.0.2.1\n}\n\
             add element inet fleetban v6 {\n2001:db8:: timeout 30d7ms\n}\n\
             add element inet fleetban v4net {\n10.0.0.0/24 timeout 3600000ms\n}\n"
        );
    }

    #[test]
    fn renders_rules_for_action_and_ports() {
        let text = render(
            &opts(Action::Reject, vec![80, 443]),
            Some(Preamble::create()),
            &Plan::default(),
            0,
        );
        assert!(text.starts_with("add table inet fleetban\n"), "{text}");
        assert!(text.contains(
            "add rule inet fleetban input tcp dport { 80, 443 } ip saddr @v4 counter reject comment \"fleetban v4 reject tcp 80,443\"\n"
        ));
        assert!(text.contains(
            "ip6 saddr & ffff:ffff:ffff:ffff:: @v6 counter reject comment \"fleetban v6 reject tcp 80,443\""
        ));
        assert!(text.contains("ip saddr @v4net counter reject comment \"fleetban v4net reject tcp 80,443\""));
        assert!(text.contains("ip6 saddr @v6net counter reject comment \"fleetban v6net reject tcp 80,443\""));
        assert!(text.contains("add set inet fleetban v4 { type ipv4_addr; flags timeout; }\n"));
        assert!(text.contains("add set inet fleetban v6net { type ipv6_addr; flags interval, timeout; }\n"));
        let text = render(
            &opts(Action::Drop, vec![]),
            Some(Preamble::create()),
            &Plan::default(),
            0,
        );
        assert!(text.contains("add rule inet fleetban input ip saddr @v4 counter drop comment \"fleetban v4 drop\"\n"));
    }

    #[test]
    fn long_port_lists_get_a_short_comment() {
        let c = rule_comment("v4", &opts(Action::Drop, (1000..1100).collect()));
        assert!(c.len() < 128 && c.starts_with("fleetban v4 drop tcp 100#"), "{c}");
    }
}
