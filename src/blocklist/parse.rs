//! Reading a blocklist file's text into networks: FireHOL netset (one
//! address or CIDR per line, `#` comments) and Spamhaus DROP (`CIDR ; SBLnnn`,
//! `;` comments). Nothing here fails: a line that is not a network is
//! skipped and counted (the first few named), because a list maintained by
//! someone else must not stop the daemon over one bad line.
//!
//! A network written with host bits set (`10.0.0.5/24`) is normalized to its
//! network (`10.0.0.0/24`) and counted: that is what any firewall makes of
//! it, and refusing the line would let the whole range through.

use ipnet::IpNet;

/// The two formats `blocklists: [{ format: }]` names.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Format {
    /// FireHOL netset: `#` comments, one address or CIDR per line.
    Netset,
    /// Spamhaus DROP: `CIDR ; SBLnnn`, `;` comments.
    Drop,
}

/// How many garbage lines are named in the warning.
pub const NAMED_GARBAGE: usize = 5;

/// A file's text, read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parsed {
    /// Networks in file order, host bits cleared, before merging.
    pub nets: Vec<IpNet>,
    /// Comment lines.
    pub comments: usize,
    /// Empty (or whitespace-only) lines.
    pub blank: usize,
    /// Lines that are neither a comment nor a network.
    pub garbage: usize,
    /// The first [`NAMED_GARBAGE`] garbage lines: (1-based line, text capped).
    pub garbage_lines: Vec<(usize, String)>,
    /// Networks written with host bits set, normalized.
    pub host_bits: usize,
    /// Networks wider than the widest fleetban drops (`addr::too_wide`),
    /// refused: the first [`NAMED_GARBAGE`] (1-based line, network), and
    /// how many.
    pub too_wide_lines: Vec<(usize, IpNet)>,
    pub too_wide: usize,
}

/// Parses `text` in `format`.
pub fn parse(text: &str, format: Format) -> Parsed {
    let mut out = Parsed::default();
    let comment = match format {
        Format::Netset => '#',
        Format::Drop => ';',
    };
    for (i, line) in text.lines().enumerate() {
        let body = line.split(comment).next().unwrap_or("").trim();
        if body.is_empty() {
            if line.trim().is_empty() {
                out.blank += 1;
            } else {
                out.comments += 1;
            }
            continue;
        }
        match network(body) {
            Some((net, _)) if crate::addr::too_wide(&net) => {
                out.too_wide += 1;
                if out.too_wide_lines.len() < NAMED_GARBAGE {
                    out.too_wide_lines.push((i + 1, net));
                }
            }
            Some((net, had_host_bits)) => {
                out.host_bits += usize::from(had_host_bits);
                out.nets.push(net);
            }
            None => {
                out.garbage += 1;
                if out.garbage_lines.len() < NAMED_GARBAGE {
                    out.garbage_lines.push((i + 1, body.chars().take(60).collect()));
                }
            }
        }
    }
    out
}

/// One network (`a.b.c.d`, `a.b.c.d/n`, IPv6 alike), and whether host bits
/// were set.
fn network(s: &str) -> Option<(IpNet, bool)> {
    if s.contains(char::is_whitespace) {
        return None;
    }
    let net = match s.parse::<IpNet>() {
        Ok(n) => n,
        Err(_) => IpNet::from(s.parse::<std::net::IpAddr>().ok()?),
    };
    let trunc = net.trunc();
    // An IPv4-mapped spelling is the IPv4 network (`addr::canonical`).
    Some((crate::addr::canonical(trunc), trunc != net))
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    #[test]
    fn netset_with_comments_garbage_ipv6_host_bits() {
        let text = "# FireHOL\n#\n\n1.2.3.4\n10.0.0.5/24 # note\n  2001:db8::/32\nnot-an-ip\n1.2.3.0/33\n\
                    10.0.0.0/24\n 1.2.3.4 5.6.7.8\n2001:db8::1\n";
        let p = parse(text, Format::Netset);
        let want: Vec<IpNet> = [
            "1.2.3.4/32",
            "10.0.0.0/24",
            "2001:db8::/32",
            "10.0.0.0/24",
            "2001:db8::1/128",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        assert_eq!(p.nets, want);
        assert_eq!((p.comments, p.blank, p.garbage, p.host_bits), (2, 1, 3, 1));
        assert_eq!(
            p.garbage_lines,
            vec![
                (7, "not-an-ip".to_owned()),
                (8, "1.2.3.0/33".to_owned()),
                (10, "1.2.3.4 5.6.7.8".to_owned())
            ]
        );
    }

    #[test]
    fn drop_format() {
        let text = "; Spamhaus DROP List 2026/12/01\n; Expires: ...\n1.10.16.0/20 ; SBL256894\n\
                    2.56.192.0/22 ; SBL459831\n# not ours\n2a06:e480::/29 ; SBL301771\n";
        let p = parse(text, Format::Drop);
        assert_eq!(p.nets.len(), 3);
        assert_eq!(p.nets[0], "1.10.16.0/20".parse::<IpNet>().unwrap());
        assert_eq!(p.nets[2], "2a06:e480::/29".parse::<IpNet>().unwrap());
        assert_eq!((p.comments, p.garbage), (2, 1));
        assert_eq!(p.garbage_lines, vec![(5, "# not ours".to_owned())]);
    }

    fn arb_net() -> impl Strategy<Value = IpNet> {
        prop_oneof![
            (any::<u32>(), 8u8..=32).prop_map(|(a, l)| IpNet::new(std::net::Ipv4Addr::from(a).into(), l).unwrap()),
            (any::<u128>(), 16u8..=128).prop_map(|(a, l)| IpNet::new(std::net::Ipv6Addr::from(a).into(), l).unwrap()),
        ]
    }

    #[derive(Clone, Debug)]
    enum Line {
        Net(IpNet, bool),
        Comment(String),
        Blank,
        Garbage(String),
    }

    fn arb_line() -> impl Strategy<Value = Line> {
        prop_oneof![
            4 => (arb_net(), any::<bool>()).prop_map(|(n, bare)| Line::Net(n, bare)),
            1 => "[a-z ]{0,12}".prop_map(Line::Comment),
            1 => Just(Line::Blank),
            1 => "[g-z][a-z0-9./]{0,10}".prop_map(Line::Garbage),
        ]
    }

    proptest! {
        /// A generated file in either format gives back exactly its
        /// networks (host bits cleared) and exact counts.
        #[test]
        fn generated_files_read_back(lines in prop::collection::vec(arb_line(), 0..60), drop in any::<bool>()) {
            let (format, c) = if drop { (Format::Drop, ';') } else { (Format::Netset, '#') };
            let mut text = String::new();
            let (mut nets, mut comments, mut blank, mut garbage, mut host_bits) = (vec![], 0, 0, 0, 0);
            for l in &lines {
                match l {
                    Line::Net(n, bare) => {
                        // Host bits: the generated address is written as is.
                        if *bare && n.prefix_len() == n.max_prefix_len() {
                            text.push_str(&n.addr().to_string());
                        } else {
                            text.push_str(&n.to_string());
                        }
                        if drop { text.push_str(" ; SBL1"); }
                        text.push('\n');
                        host_bits += usize::from(n.trunc() != *n);
                        nets.push(n.trunc());
                    }
                    Line::Comment(s) => { text.push(c); text.push_str(s); text.push('\n'); comments += 1; }
                    Line::Blank => { text.push_str("  \n"); blank += 1; }
                    Line::Garbage(s) => { text.push_str(s); text.push('\n'); garbage += 1; }
                }
            }
            let p = parse(&text, format);
            prop_assert_eq!(p.nets, nets);
            prop_assert_eq!((p.comments, p.blank, p.garbage, p.host_bits), (comments, blank, garbage, host_bits));
            prop_assert_eq!(p.garbage_lines.len(), garbage.min(NAMED_GARBAGE));
        }
    }
}
