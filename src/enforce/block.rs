//! The blocklist's nft part: two interval sets `block4`/`block6` (no
//! timeout: a blocklist holds until the file says otherwise) and their own
//! base chain `blocklist` in the same table, beside the ban chain `input`
//! (whose listing and rules `listing.rs` checks; it ignores these).
//!
//! The first load after start (or after the table was re-created) replaces
//! both sets whole: sets, chain, rules, `flush set` and every element in one
//! transaction, so there is no moment without the old or the new list. Later
//! loads send only the difference (a set that loses elements is re-filled
//! whole, see [`render_diff`]). Input is rendered from typed values only.

use std::fmt::Write;

use ipnet::IpNet;

use super::{Action, NftOptions};

/// The chain that drops blocklisted sources; runs before the ban chain.
pub(crate) const BLOCK_CHAIN: &str = "blocklist";
pub(crate) const BLOCK_PRIO: i64 = -11;
/// (name, nft type, rule match).
pub(crate) const BLOCK_SETS: [(&str, &str, &str); 2] = [
    ("block4", "ipv4_addr", "ip saddr"),
    ("block6", "ipv6_addr", "ip6 saddr"),
];

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
                let text = (!add.is_empty() || !del.is_empty()).then(|| render_diff(opts, nets, &add, &del));
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

/// Sets, chain and rules (idempotent `add`s), both sets flushed, every element.
pub(crate) fn render_full(opts: &NftOptions, nets: &[IpNet]) -> String {
    let mut out = String::with_capacity(1024 + nets.len() * 22);
    let t = opts.table.as_str();
    // `let _ =`: writing to a String cannot fail.
    let _ = writeln!(out, "add table inet {t}");
    for (name, ty, _) in BLOCK_SETS {
        let _ = writeln!(out, "add set inet {t} {name} {{ type {ty}; flags interval; }}");
        let _ = writeln!(out, "flush set inet {t} {name}");
    }
    let _ = writeln!(
        out,
        "add chain inet {t} {BLOCK_CHAIN} {{ type filter hook input priority {BLOCK_PRIO}; policy accept; }}"
    );
    let _ = writeln!(out, "flush chain inet {t} {BLOCK_CHAIN}");
    for (name, _, matcher) in BLOCK_SETS {
        let _ = write!(out, "add rule inet {t} {BLOCK_CHAIN} ");
        if !opts.ports.is_empty() {
            let ports: Vec<String> = opts.ports.iter().map(u16::to_string).collect();
            let _ = write!(out, "tcp dport {{ {} }} ", ports.join(", "));
        }
        let verdict = match opts.action {
            Action::Drop => "drop",
            Action::Reject => "reject",
        };
        let _ = writeln!(
            out,
            "{matcher} @{name} counter {verdict} comment \"fleetban {name} {verdict}\""
        );
    }
    elements(&mut out, "add", t, nets);
    out
}

/// A refresh. Additions go as they are; but a set that loses any element
/// is flushed and re-filled whole in the same transaction (never empty in
/// between): nft 1.0.6 spends ~0.2-2 s of CPU per element deleted from a
/// 100k-element interval set (1,000 deletions: over 100 s), while a whole
/// re-fill costs ~1.2 s (BENCHMARKS.md, "Blocklists").
pub(crate) fn render_diff(opts: &NftOptions, all: &[IpNet], add: &[IpNet], del: &[IpNet]) -> String {
    let mut out = String::with_capacity(64 + add.len() * 22);
    let t = opts.table.as_str();
    let of = |n: &IpNet, i: usize| usize::from(n.addr().is_ipv6()) == i;
    for (i, (name, _, _)) in BLOCK_SETS.iter().enumerate() {
        if del.iter().any(|n| of(n, i)) {
            let _ = writeln!(out, "flush set inet {t} {name}");
            let whole: Vec<IpNet> = all.iter().filter(|n| of(n, i)).copied().collect();
            elements(&mut out, "add", t, &whole);
        } else {
            let added: Vec<IpNet> = add.iter().filter(|n| of(n, i)).copied().collect();
            elements(&mut out, "add", t, &added);
        }
    }
    out
}

/// Text that removes the chain and sets, whether they exist or not (the
/// `add`s make the `delete`s always valid): the config lists no file.
pub(crate) fn render_remove(opts: &NftOptions) -> String {
    let t = opts.table.as_str();
    let mut out =
        format!("add table inet {t}\nadd chain inet {t} {BLOCK_CHAIN}\ndelete chain inet {t} {BLOCK_CHAIN}\n");
    for (name, ty, _) in BLOCK_SETS {
        let _ = writeln!(out, "add set inet {t} {name} {{ type {ty}; flags interval; }}");
        let _ = writeln!(out, "delete set inet {t} {name}");
    }
    out
}

fn elements(out: &mut String, verb: &str, table: &str, nets: &[IpNet]) {
    for (i, (name, _, _)) in BLOCK_SETS.iter().enumerate() {
        let mut open = false;
        for net in nets.iter().filter(|n| usize::from(n.addr().is_ipv6()) == i) {
            if open {
                out.push_str(",\n");
            } else {
                let _ = writeln!(out, "{verb} element inet {table} {name} {{");
                open = true;
            }
            let _ = match net.prefix_len() == net.max_prefix_len() {
                true => write!(out, "{}", net.addr()),
                false => write!(out, "{net}"),
            };
        }
        if open {
            out.push_str("\n}\n");
        }
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
        assert!(text.contains(
            "add set inet fleetban block4 { type ipv4_addr; flags interval; }\nflush set inet fleetban block4\n"
        ));
        assert!(text.contains(
            "add rule inet fleetban blocklist ip saddr @block4 counter drop comment \"fleetban block4 drop\"\n"
        ));
        assert!(text.ends_with(
            "add element inet fleetban block4 {\n10.0.0.0/24,\n192.0.2.1\n}\nadd element inet fleetban block6 {\n2001:db8::/32\n}\n"
        ));
        st.commit(&first);
        assert_eq!(st.plan(&opts, &first).0, None);
        let second = nets(&["10.0.0.0/24", "198.51.100.0/24", "2001:db8::/32"]);
        let (text, a) = st.plan(&opts, &second);
        assert_eq!((a.full, a.added, a.deleted, a.total), (false, 1, 1, 3));
        assert_eq!(
            text.unwrap(),
            "flush set inet fleetban block4\nadd element inet fleetban block4 {\n10.0.0.0/24,\n198.51.100.0/24\n}\n"
        );
        st.commit(&second);
        let third = nets(&["10.0.0.0/24", "198.51.100.0/24", "2001:db8::/32", "2001:db8:1::/48"]);
        let (text, a) = st.plan(&opts, &third);
        assert_eq!((a.added, a.deleted), (1, 0));
        assert_eq!(
            text.unwrap(),
            "add element inet fleetban block6 {\n2001:db8:1::/48\n}\n"
        );
        st.commit(&second);
        assert_eq!(st.covering(&"198.51.100.7/32".parse().unwrap()), Some(second[1]));
        st.forget();
        assert!(st.plan(&opts, &second).1.full);
    }
}
