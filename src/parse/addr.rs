//! The client address, read from exactly one field.
//!
//! A ban is only as good as the address it names, so this is strict: the whole
//! field must be one IPv4 or IPv6 address, nothing before or after it (`-`,
//! `1.2.3.4x`, `host.example`, a port or an IPv6 zone are all rejected). Both
//! are parsed by hand (this is on the hot path), accepting exactly what the
//! standard library's `Ipv4Addr`/`Ipv6Addr` parsers accept, with the same
//! value (proptests in `tests/parse.rs` and below). An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`, what a dual-stack
//! socket reports) becomes the IPv4 address it stands for, so one client is
//! counted and banned under one name.

use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// Longest text an address can take: a full IPv6 with an embedded IPv4 (45
/// bytes) inside brackets.
const MAX_LEN: usize = 47;

/// The address in `field`, or `None` unless the whole field is one address.
///
/// Brackets are accepted around IPv6 only (`[2001:db8::1]`).
pub fn parse_addr(field: &[u8]) -> Option<IpAddr> {
    if field.len() > MAX_LEN {
        return None;
    }
    if let Some(v4) = parse_ipv4(field) {
        return Some(IpAddr::V4(v4));
    }
    let inner = match field {
        [b'[', inner @ .., b']'] => inner,
        _ => field,
    };
    Some(IpAddr::V6(parse_ipv6(inner)?).to_canonical())
}

/// The dotted quad a line starts with when a space follows it: then that
/// is the whole first field, and [`parse_addr`] of it gives the same address
/// (the common case, without looking for the space first). `None` says
/// nothing: the caller takes the field and asks [`parse_addr`].
#[inline]
pub(crate) fn ipv4_field(line: &[u8]) -> Option<(Ipv4Addr, usize)> {
    match read_ipv4_prefix(line, 0)? {
        (octets, end) if line.get(end) == Some(&b' ') => Some((Ipv4Addr::from(octets), end)),
        _ => None,
    }
}

/// `Ipv6Addr::from_str`, step for step (`core::net::parser`): up to eight
/// groups of 1 to 4 hex digits, at most one `::` standing for at least one
/// zero group, and an IPv4 address in place of the last two groups (in the
/// part before `::` only when there is no `::`). Groups are read greedily and
/// never backtracked into, as there: `1:2:3:4:5:6:7:8::` is refused.
fn parse_ipv6(s: &[u8]) -> Option<Ipv6Addr> {
    // An IPv4 group needs a `.`: without one, trying it at every group is
    // wasted (and it would fail anyway).
    let dotted = s.contains(&b'.');
    let mut head = [0u16; 8];
    let (at, head_size, head_v4) = read_groups(s, 0, &mut head, dotted);
    if head_size == 8 {
        return (at == s.len()).then(|| Ipv6Addr::from(head));
    }
    if head_v4 || s.get(at..at + 2) != Some(b"::") {
        return None;
    }
    let mut tail = [0u16; 7];
    let limit = 7 - head_size;
    let (end, tail_size, _) = read_groups(s, at + 2, &mut tail[..limit], dotted);
    if end != s.len() {
        return None;
    }
    head[8 - tail_size..].copy_from_slice(&tail[..tail_size]);
    Some(Ipv6Addr::from(head))
}

/// Colon-separated groups from `at` into `groups` (an IPv4 address may take
/// the last two when at least two are left): the position after the last one
/// read, how many were filled, and whether an IPv4 address ended them. A
/// separator is only consumed with the group after it.
#[inline]
fn read_groups(s: &[u8], mut at: usize, groups: &mut [u16], dotted: bool) -> (usize, usize, bool) {
    let limit = groups.len();
    for i in 0..limit {
        let start = if i == 0 {
            at
        } else if s.get(at) == Some(&b':') {
            at + 1
        } else {
            return (at, i, false);
        };
        if dotted && i + 1 < limit {
            if let Some((v4, end)) = read_ipv4_prefix(s, start) {
                let [a, b, c, d] = v4;
                groups[i] = u16::from_be_bytes([a, b]);
                groups[i + 1] = u16::from_be_bytes([c, d]);
                return (end, i + 2, true);
            }
        }
        match read_hex_group(s, start) {
            Some((group, end)) => {
                groups[i] = group;
                at = end;
            }
            None => return (at, i, false),
        }
    }
    (at, limit, false)
}

/// 1 to 4 hex digits (either case) at `at`; more digits is no group at all.
#[inline]
fn read_hex_group(s: &[u8], at: usize) -> Option<(u16, usize)> {
    let mut value: u16 = 0;
    let mut n = 0;
    while let Some(digit) = s.get(at + n).and_then(|&b| hex_digit(b)) {
        if n == 4 {
            return None;
        }
        value = value << 4 | u16::from(digit);
        n += 1;
    }
    (n > 0).then_some((value, at + n))
}

#[inline]
fn hex_digit(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

/// A dotted quad at `at` (octets as in [`parse_ipv4`]), and where it ends;
/// what follows is the caller's business.
///
/// Each octet is read as the standard library reads it: all the digits there
/// are, 1 to 3 of them, no leading zero unless it is the only digit, at most
/// 255. A quad and the byte after it lie within 16 bytes, so those are
/// copied into an array first (padded with a byte that is neither a digit nor
/// a dot, as the end of the text is): no bounds to check per byte.
#[inline]
fn read_ipv4_prefix(s: &[u8], at: usize) -> Option<([u8; 4], usize)> {
    let rest = s.get(at..)?;
    let buf: [u8; 16] = match rest.get(..16) {
        Some(head) => head.try_into().ok()?,
        None => {
            let mut buf = [b' '; 16];
            buf[..rest.len()].copy_from_slice(rest);
            buf
        }
    };
    let digit = |i: usize| buf[i & 15].wrapping_sub(b'0');
    let mut octets = [0u8; 4];
    let mut i = 0;
    for (k, octet) in octets.iter_mut().enumerate() {
        if k > 0 {
            if buf[i & 15] != b'.' {
                return None;
            }
            i += 1;
        }
        // Here i <= 12: three octets of at most 3 digits and their dots.
        let d0 = digit(i);
        if d0 > 9 {
            return None;
        }
        let d1 = digit(i + 1);
        if d1 > 9 {
            *octet = d0;
            i += 1;
            continue;
        }
        if d0 == 0 {
            return None;
        }
        let d2 = digit(i + 2);
        if d2 > 9 {
            *octet = d0 * 10 + d1;
            i += 2;
            continue;
        }
        if digit(i + 3) <= 9 {
            return None;
        }
        *octet = u8::try_from(u16::from(d0) * 100 + u16::from(d1) * 10 + u16::from(d2)).ok()?;
        i += 3;
    }
    Some((octets, at + i))
}

/// Dotted quad, four decimal octets without leading zeros (`010` is octal to
/// some tools and decimal to others, so it is refused, as the standard
/// library does).
fn parse_ipv4(field: &[u8]) -> Option<Ipv4Addr> {
    if !(7..=15).contains(&field.len()) {
        return None;
    }
    match read_ipv4_prefix(field, 0)? {
        (octets, end) if end == field.len() => Some(Ipv4Addr::from(octets)),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    /// What the standard library makes of `text` as an IPv6 address.
    fn std_v6(text: &[u8]) -> Option<Ipv6Addr> {
        std::str::from_utf8(text).ok()?.parse().ok()
    }

    /// `parse_addr` as it was before the hand-written IPv6 parser.
    fn std_addr(field: &[u8]) -> Option<IpAddr> {
        if field.len() > MAX_LEN {
            return None;
        }
        if let Some(v4) = std::str::from_utf8(field).ok().and_then(|t| t.parse::<Ipv4Addr>().ok()) {
            return Some(IpAddr::V4(v4));
        }
        let inner = match field {
            [b'[', inner @ .., b']'] => inner,
            _ => field,
        };
        Some(IpAddr::V6(std_v6(inner)?).to_canonical())
    }

    #[test]
    fn spot_checks_against_the_standard_library() {
        for text in [
            "::",
            "::1",
            "1::",
            "1:2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7::",
            "::2:3:4:5:6:7:8",
            "1:2:3:4:5:6:7:8::",
            "::1:2:3:4:5:6:7:8",
            "1::2::3",
            ":::",
            ":1::",
            "1:::2",
            "::ffff:1.2.3.4",
            "::FFFF:1.2.3.4",
            "64:ff9b::192.0.2.33",
            "1:2:3:4:5:6:1.2.3.4",
            "1:2:3:4:5:6:7:1.2.3.4",
            "1.2.3.4::",
            "::1.2.3.4:5",
            "::1.2.3",
            "::1.2.3.04",
            "::1.2.3.256",
            "::1.2.3.4a",
            "::1.2.3.4.5",
            "::1234.2.3.4",
            "2001:DB8::aBcD",
            "2001:db8::12345",
            "02001:db8::1",
            "0000:0000:0000:0000:0000:0000:0000:0001",
            "fe80::1%eth0",
            "fe80::1%1",
            "[::1]",
            "::1 ",
            "",
            ":",
            "g::1",
            "1:2:3:4:5:6:7:8:9",
            "::0.0.0.0",
            "1:2:3:4:5::1.2.3.4",
            "1:2:3:4:5:6::1.2.3.4",
        ] {
            assert_eq!(parse_ipv6(text.as_bytes()), std_v6(text.as_bytes()), "{text:?}");
            assert_eq!(parse_addr(text.as_bytes()), std_addr(text.as_bytes()), "{text:?}");
        }
        assert_eq!(
            parse_addr(b"::ffff:1.2.3.4"),
            Some(IpAddr::V4(Ipv4Addr::new(1, 2, 3, 4)))
        );
    }

    #[test]
    fn ipv4_spot_checks_against_the_standard_library() {
        for text in [
            "0.0.0.0",
            "255.255.255.255",
            "255.255.255.2551",
            "255.255.255.256",
            "1.2.3.4",
            "1.2.3.04",
            "01.2.3.4",
            "1.2.3",
            "1.2.3.4.",
            "1.2.3.4.5",
            "1..2.3",
            "100.200.10.1",
            "1000.2.3.4",
            "1.2.3.-4",
            " 1.2.3.4",
        ] {
            let std = text.parse::<Ipv4Addr>().ok();
            assert_eq!(parse_ipv4(text.as_bytes()), std, "{text:?}");
            let line = format!("{text} - - [");
            match ipv4_field(line.as_bytes()) {
                Some((v4, end)) => assert_eq!((Some(v4), end), (std, text.len()), "{text:?}"),
                None => assert_eq!(std, None, "{text:?}"),
            }
        }
    }

    /// A valid address written one of the ways the standard library reads
    /// (random case, `::` somewhere, an IPv4 tail), then mutated.
    fn written() -> impl Strategy<Value = Vec<u8>> {
        (
            prop::array::uniform8(prop_oneof![Just(0u16), Just(0xffff), any::<u16>()]),
            0usize..9,
            0usize..9,
            any::<bool>(),
            any::<bool>(),
            any::<bool>(),
        )
            .prop_map(|(groups, from, len, upper, v4, pad)| {
                let hex: Vec<String> = groups
                    .iter()
                    .map(|g| match (upper, pad) {
                        (true, true) => format!("{g:04X}"),
                        (true, false) => format!("{g:X}"),
                        (false, true) => format!("{g:04x}"),
                        (false, false) => format!("{g:x}"),
                    })
                    .collect();
                let mut parts = hex.clone();
                if v4 {
                    let [a, b] = groups[6].to_be_bytes();
                    let [c, d] = groups[7].to_be_bytes();
                    parts.truncate(6);
                    parts.push(format!("{a}.{b}.{c}.{d}"));
                }
                let n = parts.len();
                let from = from.min(n);
                let to = (from + len).min(n);
                if to > from {
                    format!("{}::{}", parts[..from].join(":"), parts[to..].join(":"))
                } else {
                    parts.join(":")
                }
                .into_bytes()
            })
    }

    #[derive(Clone, Debug)]
    enum Edit {
        Insert(usize, u8),
        Delete(usize),
        Replace(usize, u8),
    }

    fn edit() -> impl Strategy<Value = Edit> {
        let byte = prop::sample::select(b"0123456789abcdefABCDEFgG:.%[] \xff".to_vec());
        prop_oneof![
            (any::<usize>(), byte.clone()).prop_map(|(i, b)| Edit::Insert(i, b)),
            any::<usize>().prop_map(Edit::Delete),
            (any::<usize>(), byte).prop_map(|(i, b)| Edit::Replace(i, b)),
        ]
    }

    fn apply(mut text: Vec<u8>, edits: &[Edit]) -> Vec<u8> {
        for e in edits {
            let n = text.len();
            match *e {
                Edit::Insert(i, b) => text.insert(i % (n + 1), b),
                Edit::Delete(i) if n > 0 => {
                    text.remove(i % n);
                }
                Edit::Replace(i, b) if n > 0 => text[i % n] = b,
                _ => {}
            }
        }
        text
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        #[test]
        fn written_addresses_parse_as_the_standard_library_reads_them(text in written()) {
            prop_assert!(std_v6(&text).is_some(), "{}", String::from_utf8_lossy(&text));
            prop_assert_eq!(parse_ipv6(&text), std_v6(&text));
            prop_assert_eq!(parse_addr(&text), std_addr(&text));
        }

        #[test]
        fn mutated_addresses_agree_with_the_standard_library(
            text in written(),
            edits in prop::collection::vec(edit(), 1..4),
        ) {
            let text = apply(text, &edits);
            prop_assert_eq!(parse_ipv6(&text), std_v6(&text), "{}", String::from_utf8_lossy(&text));
            prop_assert_eq!(parse_addr(&text), std_addr(&text), "{}", String::from_utf8_lossy(&text));
            let bracketed = [&b"["[..], &text, b"]"].concat();
            prop_assert_eq!(parse_addr(&bracketed), std_addr(&bracketed));
        }

        #[test]
        fn ipv4_agrees_with_the_standard_library(
            text in prop_oneof!["[0-9]{0,4}(\\.[0-9]{0,4}){0,4}", "[0-9.]{0,16}", "[0-9.x: ]{0,16}"],
        ) {
            let std = text.parse::<Ipv4Addr>().ok();
            prop_assert_eq!(parse_ipv4(text.as_bytes()), std, "{}", text);
            let ip = text.parse::<IpAddr>().ok().map(|a| a.to_canonical());
            prop_assert_eq!(parse_addr(text.as_bytes()), ip, "{}", text);
        }

        /// The shortcut for a line starting with a dotted quad gives what
        /// the first field through `parse_addr` gives, whenever it answers.
        #[test]
        fn ipv4_field_is_the_first_field(
            text in prop_oneof!["[0-9]{0,4}(\\.[0-9]{0,4}){0,4}[ :x.]?", "[0-9.: ]{0,20}"],
            rest in "[ -~]{0,10}",
        ) {
            let line = format!("{text} {rest}");
            let line = line.as_bytes();
            let space = line.iter().position(|&b| b == b' ').unwrap();
            let field = parse_addr(&line[..space]);
            match ipv4_field(line) {
                Some((v4, end)) => {
                    prop_assert_eq!(end, space);
                    prop_assert_eq!(field, Some(IpAddr::V4(v4)));
                }
                None => prop_assert!(!matches!(field, Some(IpAddr::V4(_))) || text.contains(':'), "{}", text),
            }
        }

        #[test]
        fn random_texts_agree_with_the_standard_library(
            text in prop::collection::vec(
                prop::sample::select(b"0123456789abcdefABCDEF::::....%g".to_vec()), 0..48),
        ) {
            prop_assert_eq!(parse_ipv6(&text), std_v6(&text), "{}", String::from_utf8_lossy(&text));
            prop_assert_eq!(parse_addr(&text), std_addr(&text), "{}", String::from_utf8_lossy(&text));
        }
    }
}
