//! The client behind trusted proxies: nginx's realip rules with
//! `real_ip_recursive on`, applied to a logged `X-Forwarded-For` list (or
//! a PROXY protocol address) and the peer that connected (`$remote_addr`).
//!
//! Walking from the right: the peer, then the list's entries right to
//! left; the first address not in `proxies` is the client. Entries to its
//! left were written by the client and are never read, so garbage or a
//! forged victim there changes nothing. A walked entry that is not one
//! plain address (a port, brackets, `unknown`, an obfuscated form such as
//! `0x7f.1` or `010.1.1.1`) gives no address, as does a walk through more
//! than [`MAX_HOPS`] trusted entries: the line is counted as unparsed,
//! never attributed to a wrong address. When every hop is trusted, the
//! leftmost one is the address (as nginx leaves it), a proxy, which is
//! never counted.

use std::net::IpAddr;

use super::addr::parse_addr;
use crate::addr::NetSet;

/// Most entries of a list walked from the right, the client's included.
pub const MAX_HOPS: usize = 64;

/// The client of a request that `peer` made, carrying the forwarded
/// `list` (as logged: `-` or empty when there was none).
pub fn resolve(peer: IpAddr, list: &[u8], proxies: &NetSet) -> Option<IpAddr> {
    if !proxies.contains(peer) {
        return Some(peer);
    }
    let mut last = peer;
    if list == b"-" {
        return Some(last);
    }
    let mut hops = 0;
    for entry in list.rsplit(|&b| b == b',') {
        let entry = entry.trim_ascii();
        if entry.is_empty() {
            continue;
        }
        hops += 1;
        if hops > MAX_HOPS {
            return None;
        }
        let a = entry_addr(entry)?;
        if !proxies.contains(a) {
            return Some(a);
        }
        last = a;
    }
    Some(last)
}

/// One entry of a forwarded list: exactly one address, no brackets.
fn entry_addr(entry: &[u8]) -> Option<IpAddr> {
    if entry.first() == Some(&b'[') {
        return None;
    }
    parse_addr(entry)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn proxies() -> NetSet {
        NetSet::new(&["10.0.0.0/8".parse().unwrap(), "2001:db8:ff::/48".parse().unwrap()])
    }

    fn r(peer: &str, list: &str) -> Option<String> {
        resolve(peer.parse().unwrap(), list.as_bytes(), &proxies()).map(|a| a.to_string())
    }

    #[test]
    fn nginx_realip_recursive() {
        // An untrusted peer is the client, whatever it sent.
        assert_eq!(r("198.51.100.7", "192.0.2.1").as_deref(), Some("198.51.100.7"));
        // Trusted peer: the rightmost untrusted entry.
        assert_eq!(r("10.0.0.5", "192.0.2.1").as_deref(), Some("192.0.2.1"));
        assert_eq!(
            r("10.0.0.5", "192.0.2.9, 192.0.2.1, 10.1.1.1").as_deref(),
            Some("192.0.2.1")
        );
        // A forged victim and garbage to the left are never read.
        assert_eq!(r("10.0.0.5", "203.0.113.66, 192.0.2.1").as_deref(), Some("192.0.2.1"));
        assert_eq!(
            r("10.0.0.5", "unknown, <script>, 192.0.2.1").as_deref(),
            Some("192.0.2.1")
        );
        // Spaces, no spaces, empty entries.
        assert_eq!(r("10.0.0.5", "192.0.2.1,10.2.2.2").as_deref(), Some("192.0.2.1"));
        assert_eq!(r("10.0.0.5", " 192.0.2.1 ,, 10.2.2.2 ").as_deref(), Some("192.0.2.1"));
        // No list, or only proxies: the leftmost trusted hop (never counted).
        assert_eq!(r("10.0.0.5", "-").as_deref(), Some("10.0.0.5"));
        assert_eq!(r("10.0.0.5", "").as_deref(), Some("10.0.0.5"));
        assert_eq!(r("10.0.0.5", "10.9.9.9, 10.0.0.1").as_deref(), Some("10.9.9.9"));
        // IPv6 and IPv4-mapped.
        assert_eq!(r("2001:db8:ff::1", "2001:db8::7").as_deref(), Some("2001:db8::7"));
        assert_eq!(r("10.0.0.5", "::ffff:192.0.2.1").as_deref(), Some("192.0.2.1"));
        assert_eq!(r("::ffff:10.0.0.5", "192.0.2.1").as_deref(), Some("192.0.2.1"));
        assert_eq!(
            r("10.0.0.5", "::ffff:10.3.3.3, 2001:db8:ff::9").as_deref(),
            Some("10.3.3.3")
        );
    }

    #[test]
    fn malformed_walked_entries_give_no_address() {
        for list in [
            "unknown",
            "192.0.2.1:8080",
            "[2001:db8::1]",
            "[2001:db8::1]:443",
            "0x7f.1",
            "127.1",
            "010.1.1.1",
            "192.0.2.1 192.0.2.2",
            "garbage",
            "192.0.2.1, 10.0.0.1:80",
            "_hidden",
        ] {
            assert_eq!(r("10.0.0.5", list), None, "{list}");
        }
        let trusted: Vec<String> = (0..MAX_HOPS - 1)
            .map(|i| format!("10.0.{}.{}", i / 200, i % 200))
            .collect();
        let exactly = format!("192.0.2.1, {}", trusted.join(", "));
        assert_eq!(r("10.0.0.5", &exactly).as_deref(), Some("192.0.2.1"));
        let too_many = format!("192.0.2.1, 10.200.0.1, {}", trusted.join(", "));
        assert_eq!(r("10.0.0.5", &too_many), None);
        // A long client-written prefix is never walked.
        let long = format!("{}, 192.0.2.1", vec!["203.0.113.1"; 200].join(", "));
        assert_eq!(r("10.0.0.5", &long).as_deref(), Some("192.0.2.1"));
    }
}
