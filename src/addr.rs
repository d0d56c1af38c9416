//! Addresses as fleetban names them, the ground floor every other module
//! stands on: how an address or network is written (in keys, the ban list,
//! events, output), the gate every value read back from Redis or typed by
//! an operator passes before it may become a ban, and the key a client is
//! counted and banned under.

use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Net, Ipv6Net};

/// Loopback, never counted nor banned, whatever the configuration says.
pub fn loopback() -> [IpNet; 2] {
    [
        IpNet::V4(Ipv4Net::new_assert(std::net::Ipv4Addr::new(127, 0, 0, 0), 8)),
        IpNet::V6(Ipv6Net::new_assert(std::net::Ipv6Addr::LOCALHOST, 128)),
    ]
}

/// How an address or prefix is written in keys, the ban list and output: a
/// single address without `/32` or `/128`, a network in CIDR form.
pub struct AddrText<'a>(pub &'a IpNet);

impl std::fmt::Display for AddrText<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.0.prefix_len() == self.0.max_prefix_len() {
            write!(f, "{}", self.0.addr())
        } else {
            write!(f, "{}", self.0)
        }
    }
}

/// Reads an address or network as [`AddrText`] writes it (ban list members,
/// events, records, the CLI's targets). Anything else is refused, a network
/// with host bits set included: values read from Redis never reach nft
/// unparsed. IPv4-mapped IPv6 is the IPv4 address it carries.
pub fn parse_member(s: &str) -> Option<IpNet> {
    if !s.contains('/') {
        return s.parse::<IpAddr>().ok().map(|a| IpNet::from(normalize(a)));
    }
    let n = s.parse::<IpNet>().ok()?;
    (n.trunc() == n).then_some(canonical(n))
}

/// The widest network fleetban drops, by a ban or a blocklist entry: IPv4
/// /8, IPv6 /16. A wider one (`0.0.0.0/0`, `::/0`, `224.0.0.0/3`) drops far
/// more than any rule or list means to, the operator and Redis included.
pub const WIDEST_V4: u8 = 8;
pub const WIDEST_V6: u8 = 16;

/// Whether `net` is wider than [`WIDEST_V4`] / [`WIDEST_V6`] (in its
/// canonical form: `::ffff:0.0.0.0/96` is `0.0.0.0/0`).
pub fn too_wide(net: &IpNet) -> bool {
    match canonical(*net) {
        IpNet::V4(n) => n.prefix_len() < WIDEST_V4,
        IpNet::V6(n) => n.prefix_len() < WIDEST_V6,
    }
}

/// What [`too_wide`] refuses, in words.
pub const WIDEST_TEXT: &str = "wider than /8 (IPv4) or /16 (IPv6), the widest network fleetban drops";

/// An address from its text, for tests.
/// The network a ban is counted under where networks are ranked (the
/// metric of top banned networks, notification summaries): IPv4 /24, IPv6
/// /48, or the ban's own network when wider.
pub fn ranked_network(addr: &IpNet) -> IpNet {
    let len = match addr {
        IpNet::V4(_) => 24,
        IpNet::V6(_) => 48,
    };
    IpNet::new(addr.addr(), len.min(addr.prefix_len())).map_or(*addr, |n| n.trunc())
}

#[cfg(test)]
pub(crate) fn at(s: &str) -> IpAddr {
    s.parse().unwrap()
}

/// A network (or a bare address, as its /32 or /128) from its text, for
/// tests: a typo there is the test's own bug.
#[cfg(test)]
pub(crate) fn net(s: &str) -> IpNet {
    s.parse().unwrap_or_else(|_| IpNet::from(s.parse::<IpAddr>().unwrap()))
}

/// The one form of a network everywhere it enters (configuration, CLI,
/// control socket, Redis members, blocklists): an IPv4-mapped IPv6 network
/// (`::ffff:10.0.0.0/104`, a prefix of 96 bits or more inside
/// `::ffff:0:0/96`) is the IPv4 network it carries (`10.0.0.0/8`), since
/// an IPv4 packet, log line or check is only ever compared in IPv4 form.
/// A wider IPv6 network (`::/0`) stays IPv6. Host bits are kept as given.
pub fn canonical(net: IpNet) -> IpNet {
    match net {
        IpNet::V6(n) if n.prefix_len() >= 96 => match n.addr().to_ipv4_mapped() {
            Some(v4) => IpNet::V4(Ipv4Net::new_assert(v4, n.prefix_len() - 96)),
            None => net,
        },
        _ => net,
    }
}

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

/// What a rule counts and bans a client as (`limit.key`): its address (an
/// IPv6 client by its `ipv6_prefix`, [`client_key`]), or the network
/// around it, which catches a pool of addresses each under the limit.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Keying {
    #[default]
    Address,
    /// `key: network`: IPv4 clients by their /`v4`, IPv6 ones by their /`v6`
    /// (never longer than the main `ipv6_prefix`: one host has a whole /64).
    Network { v4: u8, v6: u8 },
}

impl Keying {
    /// The key `a` is counted and banned under.
    pub fn key(self, a: IpAddr, v6_prefix: u8) -> IpNet {
        match self {
            Keying::Address => client_key(a, v6_prefix),
            Keying::Network { v4, v6 } => match normalize(a) {
                IpAddr::V4(a) => IpNet::V4(Ipv4Net::new(a, v4.min(32)).unwrap_or_else(|_| Ipv4Net::from(a)).trunc()),
                IpAddr::V6(a) => {
                    let bits = v6.min(v6_prefix).min(128);
                    IpNet::V6(Ipv6Net::new(a, bits).unwrap_or_else(|_| Ipv6Net::from(a)).trunc())
                }
            },
        }
    }
}

/// How many clients a ban of `net` covers: IPv4 addresses, IPv6 prefixes of
/// `v6_prefix` bits (saturating). The safety valve weighs a ban by it.
pub fn clients_covered(net: &IpNet, v6_prefix: u8) -> u64 {
    let spare = match net {
        IpNet::V4(n) => 32 - u32::from(n.prefix_len()),
        IpNet::V6(n) => u32::from(v6_prefix.min(128).saturating_sub(n.prefix_len())),
    };
    1u64.checked_shl(spare).filter(|_| spare < 64).unwrap_or(u64::MAX)
}

/// A few networks asked once per line whether they hold an address: kept
/// as (network, mask) integers per family, scanned linearly. Decides as
/// `IpNet::contains` on the [`normalize`]d address.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct NetSet {
    nets: Vec<IpNet>,
    v4: Vec<(u32, u32)>,
    v6: Vec<(u128, u128)>,
}

impl NetSet {
    pub fn new(nets: &[IpNet]) -> NetSet {
        let mut set = NetSet {
            nets: nets.iter().map(|n| canonical(n.trunc())).collect(),
            ..NetSet::default()
        };
        for n in &set.nets {
            match n {
                IpNet::V4(n) => set.v4.push((n.network().to_bits(), n.netmask().to_bits())),
                IpNet::V6(n) => set.v6.push((n.network().to_bits(), n.netmask().to_bits())),
            }
        }
        set
    }

    #[inline]
    pub fn contains(&self, a: IpAddr) -> bool {
        match normalize(a) {
            IpAddr::V4(a) => {
                let a = a.to_bits();
                self.v4.iter().any(|&(net, mask)| a & mask == net)
            }
            IpAddr::V6(a) => {
                let a = a.to_bits();
                self.v6.iter().any(|&(net, mask)| a & mask == net)
            }
        }
    }

    /// Whether a network of the set and `net` share any address.
    pub fn overlaps(&self, net: &IpNet) -> bool {
        let net = canonical(*net);
        self.nets.iter().any(|n| n.contains(&net) || net.contains(n))
    }

    pub fn nets(&self) -> &[IpNet] {
        &self.nets
    }

    pub fn is_empty(&self) -> bool {
        self.nets.is_empty()
    }
}

/// Serde as [`AddrText`] writes and [`parse_member`] reads: `#[serde(with =
/// "crate::addr::text")]` on an `IpNet` (records, the control protocol).
pub mod text {
    use ipnet::IpNet;
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(n: &IpNet, s: S) -> Result<S::Ok, S::Error> {
        s.collect_str(&super::AddrText(n))
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(d: D) -> Result<IpNet, D::Error> {
        let s = String::deserialize(d)?;
        super::parse_member(&s).ok_or_else(|| serde::de::Error::custom(format!("not an address or network: {s}")))
    }
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
    fn network_keys_and_the_clients_they_cover() {
        let net = Keying::Network { v4: 24, v6: 48 };
        assert_eq!(
            net.key("198.51.100.77".parse().unwrap(), 64).to_string(),
            "198.51.100.0/24"
        );
        assert_eq!(
            net.key("::ffff:198.51.100.77".parse().unwrap(), 64).to_string(),
            "198.51.100.0/24"
        );
        assert_eq!(
            net.key("2001:db8:1:2:3::9".parse().unwrap(), 64).to_string(),
            "2001:db8:1::/48"
        );
        // Never longer than the client's own prefix.
        let long = Keying::Network { v4: 32, v6: 96 };
        assert_eq!(
            long.key("2001:db8:1:2:3::9".parse().unwrap(), 64).to_string(),
            "2001:db8:1:2::/64"
        );
        assert_eq!(
            Keying::Address.key("198.51.100.77".parse().unwrap(), 64).to_string(),
            "198.51.100.77/32"
        );
        let covered = |s: &str| clients_covered(&s.parse().unwrap(), 64);
        assert_eq!(covered("198.51.100.0/24"), 256);
        assert_eq!(covered("198.51.100.7/32"), 1);
        assert_eq!(covered("0.0.0.0/0"), 1 << 32);
        assert_eq!(covered("2001:db8:1::/48"), 65_536);
        assert_eq!(covered("2001:db8:1:2::/64"), 1);
        assert_eq!(covered("2001:db8::9/128"), 1);
        assert_eq!(covered("::/0"), u64::MAX);
    }

    #[test]
    fn mapped_networks_are_their_ipv4_networks() {
        let c = |s: &str| canonical(s.parse().unwrap()).to_string();
        assert_eq!(c("::ffff:10.0.0.0/104"), "10.0.0.0/8");
        assert_eq!(c("::ffff:192.0.2.0/120"), "192.0.2.0/24");
        assert_eq!(c("::ffff:192.0.2.7/128"), "192.0.2.7/32");
        assert_eq!(c("::ffff:0.0.0.0/96"), "0.0.0.0/0");
        // Wider than the mapped range, or not in it: IPv6 as written.
        assert_eq!(c("::ffff:0.0.0.0/95"), "::ffff:0.0.0.0/95");
        assert_eq!(c("::/0"), "::/0");
        assert_eq!(c("64:ff9b::/96"), "64:ff9b::/96");
        assert_eq!(c("2001:db8::/32"), "2001:db8::/32");
        assert_eq!(c("192.0.2.0/24"), "192.0.2.0/24");
    }

    #[test]
    fn members_are_written_and_read_back_alike() {
        for text in ["192.0.2.1", "198.51.100.0/24", "2001:db8:1:2::/64", "2001:db8::9"] {
            let net = parse_member(text).unwrap();
            assert_eq!(AddrText(&net).to_string(), text);
        }
        assert_eq!(parse_member("::ffff:192.0.2.1"), parse_member("192.0.2.1"));
        assert_eq!(
            parse_member("::ffff:198.51.100.0/120").map(|n| n.to_string()),
            Some("198.51.100.0/24".to_owned())
        );
        for bad in ["192.0.2.1/24", "garbage; flush ruleset", "", "10.0.0.256", "1.2.3.4/33"] {
            assert_eq!(parse_member(bad), None, "{bad}");
        }
        assert_eq!(
            loopback().map(|n| n.to_string()),
            ["127.0.0.0/8".to_owned(), "::1/128".to_owned()]
        );
    }
}
