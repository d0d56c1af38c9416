//! The blocklist's nft part: one plain set per prefix length present in the
//! list, `block4_L` / `block6_L` (the network address of each /L; no
//! timeout: a blocklist holds until the file says otherwise), each matched
//! by one rule `ip saddr & MASK @block4_L` in its own base chain
//! `blocklist`, beside the ban chain `input` (whose listing and rules
//! `listing.rs` checks; it ignores these).
//!
//! Plain sets, not interval sets: nft 1.0.6 reads every element of every
//! interval set in the ruleset before any element change, so a 100k
//! interval blocklist made every later ban cost 1.2-2 s; a plain set is
//! not read (BENCHMARKS.md, "Blocklists"). A packet pays one masked lookup
//! per length present (FireHOL's level 1 has ~20).
//!
//! The first load after start (or after the table was re-created) replaces
//! everything in one transaction: the chain emptied, every set of a length
//! absent from the list (and the interval sets of earlier versions) deleted,
//! each present length's set flushed and filled, the rules added, so there
//! is no moment without the old or the new list. Later loads send only the
//! difference (sets and rules of new lengths, elements added and deleted).
//! Input is rendered from typed values only.

use std::fmt::Write;

use ipnet::IpNet;

use super::{Action, NftOptions};

/// The chain that drops blocklisted sources; runs before the ban chain.
pub(crate) const BLOCK_CHAIN: &str = "blocklist";
pub(crate) const BLOCK_PRIO: i64 = -11;
/// The interval sets of the first layout, deleted by a full load.
const LEGACY_SETS: [(&str, &str); 2] = [("block4", "ipv4_addr"), ("block6", "ipv6_addr")];

/// The set of a family (IPv6 or not) and a prefix length; the ban sets of
/// networks (`script.rs`) are named by it too.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub(crate) struct Length {
    /// IPv6 (else IPv4).
    pub v6: bool,
    /// The prefix length, at most the family's width.
    pub len: u8,
}

impl Length {
    pub(crate) fn of(net: &IpNet) -> Length {
        Length {
            v6: net.addr().is_ipv6(),
            len: net.prefix_len(),
        }
    }

    /// Every length a family can have, /1 to /32 and /1 to /128.
    fn all() -> impl Iterator<Item = Length> {
        (1..=32u8)
            .map(|len| Length { v6: false, len })
            .chain((1..=128u8).map(|len| Length { v6: true, len }))
    }

    fn set(self) -> String {
        format!("block{}_{}", if self.v6 { 6 } else { 4 }, self.len)
    }

    /// The ban set of this length: `v4n24`, `v6n56`.
    pub(crate) fn ban_set(self) -> String {
        format!("v{}n{}", if self.v6 { 6 } else { 4 }, self.len)
    }

    /// The length a ban set's name stands for (`v4n24`), if it is one.
    pub(crate) fn of_ban_set(name: &str) -> Option<Length> {
        let (v6, digits) = match name.get(..3) {
            Some("v4n") => (false, &name[3..]),
            Some("v6n") => (true, &name[3..]),
            _ => return None,
        };
        if digits.is_empty() || digits.len() > 3 || !digits.bytes().all(|b| b.is_ascii_digit()) {
            return None;
        }
        let len: u8 = digits.parse().ok()?;
        let fits = len <= if v6 { 128 } else { 32 };
        (fits && digits == len.to_string()).then_some(Length { v6, len })
    }

    pub(crate) fn ty(self) -> &'static str {
        if self.v6 {
            "ipv6_addr"
        } else {
            "ipv4_addr"
        }
    }

    /// `ip saddr & 255.255.255.0`, `ip6 saddr & ffff:ffff:ffff::`, or
    /// the bare field for a whole address.
    pub(crate) fn matcher(self) -> String {
        let (field, max) = if self.v6 { ("ip6 saddr", 128) } else { ("ip saddr", 32) };
        if self.len == max {
            return field.to_owned();
        }
        let mask = match self.v6 {
            false => {
                IpNet::V4(ipnet::Ipv4Net::new(std::net::Ipv4Addr::UNSPECIFIED, self.len).expect("a length of 0-31"))
                    .netmask()
                    .to_string()
            }
            true => {
                IpNet::V6(ipnet::Ipv6Net::new(std::net::Ipv6Addr::UNSPECIFIED, self.len).expect("a length of 0-127"))
                    .netmask()
                    .to_string()
            }
        };
        format!("{field} & {mask}")
    }
}

/// What the kernel is believed to hold of the blocklist.
#[derive(Debug, Default)]
pub struct BlockState {
    /// Elements applied, sorted; `None` until a full load succeeded (start,
    /// a failed transaction, a re-created table): the next load is full.
    held: Option<Vec<IpNet>>,
}

/// What one blocklist transaction did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct BlockApplied {
    /// The sets were replaced whole (first load).
    pub full: bool,
    pub added: usize,
    pub deleted: usize,
    /// Elements the sets hold now.
    pub total: usize,
}

impl BlockState {
    /// The transaction that turns the kernel's sets into `nets` (sorted,
    /// non-overlapping: `blocklist::subtract`'s output), or `None` if
    /// nothing changes; call [`BlockState::commit`] once it ran.
    pub(crate) fn plan(&self, opts: &NftOptions, nets: &[IpNet]) -> (Option<String>, BlockApplied) {
        match &self.held {
            None => {
                let text = render_full(opts, nets);
                let a = BlockApplied {
                    full: true,
                    added: nets.len(),
                    deleted: 0,
                    total: nets.len(),
                };
                (Some(text), a)
            }
            Some(old) => {
                let (add, del) = crate::blocklist::diff(old, nets);
                let a = BlockApplied {
                    full: false,
                    added: add.len(),
                    deleted: del.len(),
                    total: nets.len(),
                };
                let text = (!add.is_empty() || !del.is_empty()).then(|| render_diff(opts, old, &add, &del));
                (text, a)
            }
        }
    }

    pub(crate) fn commit(&mut self, nets: &[IpNet]) {
        self.held = Some(nets.to_vec());
    }

    /// The kernel's sets are unknown: the next load replaces them whole.
    pub(crate) fn forget(&mut self) {
        self.held = None;
    }

    /// Elements believed in the kernel.
    pub fn len(&self) -> usize {
        self.held.as_ref().map_or(0, Vec::len)
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The blocklisted network holding `addr`, if any.
    pub fn covering(&self, net: &IpNet) -> Option<IpNet> {
        let held = self.held.as_ref()?;
        held.iter().find(|n| n.contains(net)).copied()
    }
}

/// The lengths `nets` holds, sorted.
fn lengths(nets: &[IpNet]) -> Vec<Length> {
    let mut out: Vec<Length> = nets.iter().map(Length::of).collect();
    out.sort_unstable();
    out.dedup();
    out
}

fn add_set(out: &mut String, t: &str, l: Length) {
    let _ = writeln!(out, "add set inet {t} {} {{ type {}; }}", l.set(), l.ty());
}

/// The rule dropping (or rejecting) the sources of length `l`'s set.
fn add_rule(out: &mut String, opts: &NftOptions, l: Length) {
    let t = opts.table.as_str();
    let _ = write!(out, "add rule inet {t} {BLOCK_CHAIN} ");
    if !opts.ports.is_empty() {
        let ports: Vec<String> = opts.ports.iter().map(u16::to_string).collect();
        let _ = write!(out, "tcp dport {{ {} }} ", ports.join(", "));
    }
    let verdict = match opts.action {
        Action::Drop => "drop",
        Action::Reject => "reject",
    };
    let name = l.set();
    let _ = writeln!(
        out,
        "{} @{name} counter {verdict} comment \"fleetban {name} {verdict}\"",
        l.matcher()
    );
}

/// Empties the chain and deletes every blocklist set but those of `keep`
/// (each `add` first, so that every `delete` is valid).
fn clear(out: &mut String, t: &str, keep: &[Length]) {
    let _ = writeln!(out, "add table inet {t}");
    let _ = writeln!(
        out,
        "add chain inet {t} {BLOCK_CHAIN} {{ type filter hook input priority {BLOCK_PRIO}; policy accept; }}"
    );
    let _ = writeln!(out, "flush chain inet {t} {BLOCK_CHAIN}");
    for (name, ty) in LEGACY_SETS {
        let _ = writeln!(out, "add set inet {t} {name} {{ type {ty}; flags interval; }}");
        let _ = writeln!(out, "delete set inet {t} {name}");
    }
    for l in Length::all().filter(|l| !keep.contains(l)) {
        add_set(out, t, l);
        let _ = writeln!(out, "delete set inet {t} {}", l.set());
    }
}

/// Chain and rules, every set of a length present flushed and filled, the
/// others deleted.
pub(crate) fn render_full(opts: &NftOptions, nets: &[IpNet]) -> String {
    let mut out = String::with_capacity(16 * 1024 + nets.len() * 18);
    let t = opts.table.as_str();
    let present = lengths(nets);
    // `let _ =`: writing to a String cannot fail.
    clear(&mut out, t, &present);
    for &l in &present {
        add_set(&mut out, t, l);
        let _ = writeln!(out, "flush set inet {t} {}", l.set());
    }
    for &l in &present {
        add_rule(&mut out, opts, l);
    }
    elements(&mut out, "add", t, nets);
    out
}

/// A refresh: sets and rules for lengths `old` did not have, then the
/// deletions and additions (plain sets delete an element in ~ms).
pub(crate) fn render_diff(opts: &NftOptions, old: &[IpNet], add: &[IpNet], del: &[IpNet]) -> String {
    let mut out = String::with_capacity(64 + (add.len() + del.len()) * 18);
    let t = opts.table.as_str();
    let had = lengths(old);
    for l in lengths(add).into_iter().filter(|l| !had.contains(l)) {
        add_set(&mut out, t, l);
        add_rule(&mut out, opts, l);
    }
    elements(&mut out, "delete", t, del);
    elements(&mut out, "add", t, add);
    out
}

/// Text that removes the chain and every blocklist set, whether they exist
/// or not: the config lists no file.
pub(crate) fn render_remove(opts: &NftOptions) -> String {
    let t = opts.table.as_str();
    let mut out = String::with_capacity(16 * 1024);
    clear(&mut out, t, &[]);
    let _ = writeln!(out, "delete chain inet {t} {BLOCK_CHAIN}");
    out
}

/// `VERB element` of each set, its network addresses one per line.
fn elements(out: &mut String, verb: &str, table: &str, nets: &[IpNet]) {
    let mut sorted: Vec<&IpNet> = nets.iter().collect();
    sorted.sort_by_key(|n| Length::of(n));
    for group in sorted.chunk_by(|a, b| Length::of(a) == Length::of(b)) {
        let _ = writeln!(out, "{verb} element inet {table} {} {{", Length::of(group[0]).set());
        for (i, net) in group.iter().enumerate() {
            let _ = write!(out, "{}{}", if i > 0 { ",\n" } else { "" }, net.network());
        }
        out.push_str("\n}\n");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn nets(s: &[&str]) -> Vec<IpNet> {
        s.iter().map(|x| x.parse().unwrap()).collect()
    }

    #[test]
    fn full_then_difference() {
        let opts = NftOptions::default();
        let mut st = BlockState::default();
        let first = nets(&["10.0.0.0/24", "192.0.2.1/32", "2001:db8::/32"]);
        let (text, a) = st.plan(&opts, &first);
        let text = text.unwrap();
        assert!(a.full && a.added == 3);
        // The interval sets of the first layout and absent lengths go.
        assert!(text.contains(
            "add set inet fleetban block4 { type ipv4_addr; flags interval; }\ndelete set inet fleetban block4\n"
        ));
        assert!(
            text.contains("add set inet fleetban block4_16 { type ipv4_addr; }\ndelete set inet fleetban block4_16\n")
        );
        assert!(!text.contains("delete set inet fleetban block4_24\n"));
        assert!(
            text.contains("add set inet fleetban block4_24 { type ipv4_addr; }\nflush set inet fleetban block4_24\n")
        );
        for rule in [
            "ip saddr & 255.255.255.0 @block4_24 counter drop comment \"fleetban block4_24 drop\"",
            "ip saddr @block4_32 counter drop comment \"fleetban block4_32 drop\"",
            "ip6 saddr & ffff:ffff:: @block6_32 counter drop comment \"fleetban block6_32 drop\"",
        ] {
            assert!(
                text.contains(&format!("add rule inet fleetban blocklist {rule}\n")),
                "{rule}"
            );
        }
        // The chain is emptied before any set it references is deleted.
        assert!(text.find("flush chain").unwrap() < text.find("delete set").unwrap());
        assert!(text.ends_with(
            "add element inet fleetban block4_24 {\n10.0.0.0\n}\nadd element inet fleetban block4_32 {\n192.0.2.1\n}\nadd element inet fleetban block6_32 {\n2001:db8::\n}\n"
        ));
        st.commit(&first);
        assert_eq!(st.plan(&opts, &first).0, None);
        let second = nets(&["10.0.0.0/24", "198.51.100.0/24", "2001:db8::/32"]);
        let (text, a) = st.plan(&opts, &second);
        assert_eq!((a.full, a.added, a.deleted, a.total), (false, 1, 1, 3));
        assert_eq!(
            text.unwrap(),
            "delete element inet fleetban block4_32 {\n192.0.2.1\n}\nadd element inet fleetban block4_24 {\n198.51.100.0\n}\n"
        );
        st.commit(&second);
        // A new length brings its set and rule.
        let third = nets(&["10.0.0.0/24", "198.51.100.0/24", "2001:db8::/32", "2001:db8:1::/48"]);
        let (text, a) = st.plan(&opts, &third);
        assert_eq!((a.added, a.deleted), (1, 0));
        assert_eq!(
            text.unwrap(),
            "add set inet fleetban block6_48 { type ipv6_addr; }\nadd rule inet fleetban blocklist ip6 saddr & ffff:ffff:ffff:: @block6_48 counter drop comment \"fleetban block6_48 drop\"\nadd element inet fleetban block6_48 {\n2001:db8:1::\n}\n"
        );
        st.commit(&second);
        assert_eq!(st.covering(&"198.51.100.7/32".parse().unwrap()), Some(second[1]));
        st.forget();
        assert!(st.plan(&opts, &second).1.full);
    }

    #[test]
    fn removal_deletes_the_chain_and_every_set() {
        let text = render_remove(&NftOptions::default());
        assert!(text.contains("delete set inet fleetban block4_32\n"));
        assert!(text.contains("delete set inet fleetban block6_128\n"));
        assert!(text.contains("delete set inet fleetban block6\n"));
        assert!(text.ends_with("delete chain inet fleetban blocklist\n"));
    }
}
