//! From parsed requests to hits: which requests count for which rule, under
//! which client key, batched per (rule, key) for the limiter.
//!
//! `filter` holds the compiled `match:`/`ignore:` conditions (`literal`: the
//! exact literal tests that replace their regexes when they have that shape), `allow` the
//! networks that are never counted nor banned, `plan` which rules read which
//! log (each log is parsed once per distinct format, whatever the number of
//! rules), and `batch` the pending hits. Nothing here talks to Redis.

mod allow;
mod batch;
mod filter;
mod literal;
mod plan;

pub use allow::AllowList;
pub use batch::{Batch, Hit, HoldPolicy, Pending};
pub use filter::RuleFilter;
pub use plan::{Group, Plan};

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// IPv4-mapped IPv6 (`::ffff:a.b.c.d`) is the IPv4 address it carries.
pub fn normalize(a: IpAddr) -> IpAddr {
    match a {
        IpAddr::V6(v6) => match v6.to_ipv4_mapped() {
            Some(v4) => IpAddr::V4(v4),
            None => IpAddr::V6(v6),
        },
        v4 => v4,
    }
}

/// The key a client is counted and banned under: the address itself for
/// IPv4, its prefix of `v6_prefix` bits for IPv6 (one host has a whole /64).
pub fn client_key(a: IpAddr, v6_prefix: u8) -> IpNet {
    match normalize(a) {
        IpAddr::V4(v4) => IpNet::V4(Ipv4Net::from(v4)),
        IpAddr::V6(v6) => {
            let net = Ipv6Net::new(v6, v6_prefix.min(128)).unwrap_or_else(|_| Ipv6Net::from(v6));
            IpNet::V6(net.trunc())
        }
    }
}

/// A deterministic member for one hit, from where its line was read: the
/// same line read again after a crash gives the same member, which the
/// window then recognises instead of counting twice. `origin` identifies the
/// file on this host ([`origin_seed`]), `offset` is the line's byte offset.
/// Kept below 2^63 so that Redis stores it as an integer in a listpack.
pub fn member(origin: u64, offset: u64) -> u64 {
    splitmix(origin ^ splitmix(offset)) & (i64::MAX as u64)
}

/// Seed for [`member`] from the host and the file identity.
pub fn origin_seed(host: &str, parts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    for p in parts {
        h = splitmix(h ^ *p);
    }
    h
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys() {
        assert_eq!(
            client_key("::ffff:1.2.3.4".parse().unwrap(), 64).to_string(),
            "1.2.3.4/32"
        );
        assert_eq!(
            client_key("2001:db8:1:2:3::9".parse().unwrap(), 64).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            client_key("2001:db8::9".parse().unwrap(), 128).to_string(),
            "2001:db8::9/128"
        );
    }

    #[test]
    fn members_are_stable_and_distinct() {
        let o = origin_seed("web-01", &[1, 2, 3]);
        assert_eq!(member(o, 10), member(o, 10));
        assert_ne!(member(o, 10), member(o, 11));
        assert_ne!(member(o, 10), member(origin_seed("web-02", &[1, 2, 3]), 10));
        assert!(member(o, 10) <= i64::MAX as u64);
    }
}
