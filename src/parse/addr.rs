//! The client address, read from exactly one field.
//!
//! A ban is only as good as the address it names, so this is strict: the whole
//! field must be one IPv4 or IPv6 address, nothing before or after it (`-`,
//! `1.2.3.4x`, `host.example`, a port or an IPv6 zone are all rejected). IPv4
//! is parsed by hand (it is on the hot path); IPv6 goes through the standard
//! library. An IPv4-mapped IPv6 address (`::ffff:1.2.3.4`, what a dual-stack
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
    if !inner.contains(&b':') {
        return None;
    }
    let v6: Ipv6Addr = std::str::from_utf8(inner).ok()?.parse().ok()?;
    Some(IpAddr::V6(v6).to_canonical())
}

/// Dotted quad, four decimal octets without leading zeros (`010` is octal to
/// some tools and decimal to others, so it is refused, as the standard
/// library does).
fn parse_ipv4(field: &[u8]) -> Option<Ipv4Addr> {
    if !(7..=15).contains(&field.len()) {
        return None;
    }
    let mut octets = [0u8; 4];
    let mut n = 0;
    let mut value: u16 = 0;
    let mut digits = 0;
    for &b in field {
        match b {
            b'0'..=b'9' => {
                // A leading zero may only be the whole octet.
                if digits == 3 || (digits == 1 && value == 0) {
                    return None;
                }
                value = value * 10 + u16::from(b - b'0');
                digits += 1;
            }
            b'.' if digits > 0 && n < 3 => {
                octets[n] = u8::try_from(value).ok()?;
                n += 1;
                (value, digits) = (0, 0);
            }
            _ => return None,
        }
    }
    if n != 3 || digits == 0 {
        return None;
    }
    octets[3] = u8::try_from(value).ok()?;
    Some(Ipv4Addr::from(octets))
}
