//! The names of our keys (docs/design.md §3, with the changes docs/design.md §9
//! records). Every key that belongs to one address carries its address's
//! *bucket* as hash tag (`fleetban:win:{fleetban:b7.31}:203.0.113.7:RULE`),
//! every fleet-wide key the prefix (`{fleetban}:bans`), so that each script
//! touches a single Cluster slot and one script call can carry many
//! addresses of one bucket. No other module writes a key name: each limiter
//! algorithm (`limit::algorithm`) names its kinds of key ([`StateKey`]) and
//! builds them through [`Keys::state`].
//!
//! The bucket of an address is FNV-1a of its bytes modulo
//! [`ADDRESS_BUCKETS`]; bucket `i`'s tag is `{PREFIX:bI.J}`, `J` the first
//! number that puts the tag's slot in the `i`-th of [`ADDRESS_BUCKETS`]
//! equal ranges of the 16,384 slots. Both are part of the layout: every host
//! of a fleet must compute the same names.

use std::sync::Arc;

use ipnet::IpNet;

use crate::addr::AddrText;

/// The stream keeps about this many events; a host further behind reconciles.
pub const STREAM_MAXLEN: u64 = 100_000;

/// Buckets the addresses are spread over, each one hash slot. Few enough
/// that a full Cluster round trip (3,072 batches, `limit::redis`) puts ~48
/// addresses of one rule in a script call: the ~3.7 µs an EVALSHA costs
/// Redis is shared by them. Enough that slots move between masters in
/// 64ths: with the tags spread evenly over the slot space, N masters with
/// equal slot ranges hold 64/N buckets each (3 masters: 22/21/21).
/// Measured on three masters (BENCHMARKS.md, "Redis Cluster"): 7.8 µs of
/// Redis CPU per hit, within 3% of 16 buckets (which split 6/5/5, one
/// master 10% busier), 10% less than 256 (~12 addresses per call).
/// Changing it renames every per-address key.
pub const ADDRESS_BUCKETS: u16 = 64;

/// Redis Cluster's hash slots.
const SLOTS: u16 = 16_384;

/// A kind of per-address key an algorithm keeps its state in
/// (`PREFIX:KIND:{TAG}:ADDR:RULE`), named by the algorithm's module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct StateKey {
    /// `win`, `fixed`, `tb`, `sc`, ...
    pub kind: &'static str,
    /// One key per fixed window: the scripts append `:N`, the window number.
    pub per_window: bool,
}

/// Key names under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
    /// The hash tag of each bucket, braces included (`{fleetban:b7.31}`),
    /// and its slot; shared by clones.
    tags: Arc<[(String, u16)]>,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        let tags = (0..ADDRESS_BUCKETS)
            .map(|i| {
                let range = u32::from(SLOTS) / u32::from(ADDRESS_BUCKETS);
                let low = u32::from(i) * range;
                // About ADDRESS_BUCKETS tries per bucket: the slot of the
                // j-th candidate is uniform, the range 1/ADDRESS_BUCKETS wide.
                (0u32..)
                    .map(|j| format!("{{{prefix}:b{i}.{j}}}"))
                    .map(|t| {
                        let s = slot(t.as_bytes());
                        (t, s)
                    })
                    .find(|(_, s)| (low..low + range).contains(&u32::from(*s)))
                    .unwrap_or_default()
            })
            .collect();
        Keys {
            prefix: prefix.to_owned(),
            tags,
        }
    }

    /// The bucket of `addr`: FNV-1a of its family, octets and prefix length,
    /// modulo [`ADDRESS_BUCKETS`]. Stable across hosts, runs and versions.
    pub fn bucket_of(addr: &IpNet) -> u16 {
        let mut h: u32 = 0x811c_9dc5;
        let mut eat = |b: u8| h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
        match addr {
            IpNet::V4(n) => {
                eat(4);
                n.addr().octets().into_iter().for_each(&mut eat);
            }
            IpNet::V6(n) => {
                eat(6);
                n.addr().octets().into_iter().for_each(&mut eat);
            }
        }
        eat(addr.prefix_len());
        (h % u32::from(ADDRESS_BUCKETS)) as u16
    }

    /// Bucket `b`'s hash tag, braces included: a key of its slot.
    pub fn bucket_tag(&self, b: u16) -> &str {
        &self.tags[usize::from(b)].0
    }

    /// The Cluster slot of bucket `b`'s keys.
    pub fn slot_of_bucket(&self, b: u16) -> u16 {
        self.tags[usize::from(b)].1
    }

    /// `PREFIX:KIND:{TAG}:ADDR:RULE`, with `:HOST` for `scope: host`: the
    /// key of one algorithm's state for one client key and rule. The kinds
    /// are the algorithms' own (`limit::algorithm`), which name their keys
    /// through here (`Keys::window`, `Keys::bucket`, ...).
    pub fn state(&self, kind: StateKey, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        let tag = &self.tags[usize::from(Keys::bucket_of(addr))].0;
        let kind = kind.kind;
        match host {
            None => format!("{}:{kind}:{tag}:{}:{}", self.prefix, AddrText(addr), rule),
            Some(h) => format!("{}:{kind}:{tag}:{}:{}:{}", self.prefix, AddrText(addr), rule, h),
        }
    }

    /// A [`StateKey::per_window`] key of window number `n`: the base
    /// [`Keys::state`] and `:N`, as the scripts derive it (same slot: same tag).
    pub fn state_in_window(&self, kind: StateKey, addr: &IpNet, rule: &str, host: Option<&str>, n: i64) -> String {
        format!("{}:{n}", self.state(kind, addr, rule, host))
    }

    /// A SCAN pattern for every per-address key, old layout or new.
    pub(crate) fn per_addr_pattern(&self) -> String {
        format!("{}:*:{{*", glob_escape(&self.prefix))
    }

    /// True for a per-address key of the layout before buckets
    /// (`fleetban:win:{ADDR}:RULE`): its hash tag is not one of ours. The
    /// kinds are those that layout had; an algorithm added since has none.
    pub(crate) fn is_old_layout(&self, key: &str) -> bool {
        let Some(rest) = key.strip_prefix(self.prefix.as_str()).and_then(|r| r.strip_prefix(':')) else {
            return false;
        };
        let Some((kind, tagged)) = rest.split_once(':') else {
            return false;
        };
        let ours = format!("{{{}:b", self.prefix);
        matches!(kind, "win" | "fixed" | "tb" | "sc") && tagged.starts_with('{') && !tagged.starts_with(&ours)
    }

    /// The two keys `lua/probe.lua` writes and deletes (`check --online`):
    /// one of the windows' pattern (`PREFIX:*`), one of the list's
    /// (`{PREFIX}:*`), in one slot.
    pub fn probe(&self) -> [String; 2] {
        let p = &self.prefix;
        [format!("{p}:probe:{{{p}}}"), format!("{{{p}}}:probe")]
    }

    pub fn bans(&self) -> String {
        self.fleet("bans")
    }

    pub fn records(&self) -> String {
        self.fleet("banrec")
    }

    /// The fleet's epoch: a token set when the list is first seen without
    /// one and never deleted by fleetban, so a list that lost it lost its
    /// data (Redis restarted empty, FLUSHALL), not its bans to unbans.
    pub fn epoch(&self) -> String {
        self.fleet("epoch")
    }

    pub fn events(&self) -> String {
        self.fleet("events")
    }

    /// `{fleetban}:hosts`: SET of the host ids of the daemons that used this
    /// Redis (each adds its own at every reconcile), so that an unban can
    /// name the `scope: host` keys of every host without a SCAN.
    pub fn hosts(&self) -> String {
        self.fleet("hosts")
    }

    /// `{fleetban}:hot`: ZSET of the clients found at half a rule's limit
    /// or more (`RULE ADDR`), scored by when the mark ends (`fleet::hot`).
    pub fn hot(&self) -> String {
        self.fleet("hot")
    }

    /// `{fleetban}:marks`: STREAM of the hot marks and host arrivals
    /// (`fleet::hot`), apart from the ban events so that neither crowds the
    /// other out.
    pub fn marks(&self) -> String {
        self.fleet("marks")
    }

    /// Every key holding state of `addr` under `rules` (name, window ms):
    /// each of `kinds` (every algorithm's, `limit::algorithm::state_keys`),
    /// in the fleet's scope and in each of `hosts`'s, a per-window kind for
    /// the window of `now_ms` and the one before (older ones have expired).
    /// What `fleetban unban` deletes, so the address starts fresh windows on
    /// every host. All in the slot of the address's bucket.
    pub fn of_address<'a>(
        &self,
        addr: &IpNet,
        rules: impl IntoIterator<Item = (&'a str, i64)>,
        hosts: &[&str],
        now_ms: i64,
        kinds: &[StateKey],
    ) -> Vec<String> {
        let (windowed, plain): (Vec<StateKey>, Vec<StateKey>) = kinds.iter().partition(|k| k.per_window);
        let mut out = Vec::new();
        for (rule, window_ms) in rules {
            let n = now_ms / window_ms.max(1);
            let scopes = std::iter::once(None).chain(hosts.iter().map(|h| Some(*h)));
            for host in scopes {
                out.extend(plain.iter().map(|&k| self.state(k, addr, rule, host)));
                for &k in &windowed {
                    out.extend([n, n - 1].map(|n| self.state_in_window(k, addr, rule, host, n)));
                }
            }
        }
        out
    }

    /// `{PREFIX}:NAME`: a fleet-wide key, in the list's slot.
    fn fleet(&self, name: &str) -> String {
        format!("{{{}}}:{name}", self.prefix)
    }

    /// Offence count of one address. Tagged with the prefix, not the address
    /// (a change from the original design's `fleetban:off:{ADDR}`, docs/design.md §9): `ban.lua` reads and
    /// bumps it in the same atomic call as the ban list, which in a Cluster
    /// requires the same slot.
    pub fn offences(&self, addr: &IpNet) -> String {
        format!("{{{}}}:off:{}", self.prefix, AddrText(addr))
    }

    /// `{fleetban}:esc:RULE:NETWORK`: ZSET of the addresses of `net` that
    /// `rule` banned, scored by their latest ban (ms), for
    /// `escalate_network:` (`lua/ban.lua`); in the list's slot, it expires
    /// `within` after the last ban.
    pub fn escalation(&self, rule: &str, net: &IpNet) -> String {
        format!("{{{}}}:esc:{rule}:{}", self.prefix, AddrText(net))
    }
}

/// The Cluster hash slot of `key` (CRC16/XMODEM of its hash tag, or of the
/// whole key without one, modulo 16,384), as the server computes it.
pub fn slot(key: &[u8]) -> u16 {
    let tagged = key
        .iter()
        .position(|&b| b == b'{')
        .and_then(|open| {
            let inner = &key[open + 1..];
            inner.iter().position(|&b| b == b'}').map(|close| &inner[..close])
        })
        .filter(|t| !t.is_empty())
        .unwrap_or(key);
    let mut crc: u16 = 0;
    for &b in tagged {
        crc ^= u16::from(b) << 8;
        for _ in 0..8 {
            crc = if crc & 0x8000 != 0 {
                (crc << 1) ^ 0x1021
            } else {
                crc << 1
            };
        }
    }
    crc % SLOTS
}

/// `s` with SCAN's glob characters escaped.
fn glob_escape(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for c in s.chars() {
        if matches!(c, '*' | '?' | '[' | ']' | '\\') {
            out.push('\\');
        }
        out.push(c);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn every_key_of_an_address_shares_its_bucket_tag() {
        let keys = Keys::new("fb");
        let addr = net("192.0.2.7/32");
        let b = Keys::bucket_of(&addr);
        let tag = keys.tags[usize::from(b)].0.clone();
        let kinds = crate::limit::algorithm::state_keys();
        let all = keys.of_address(&addr, [("scraper", 60_000)], &["web-1"], 120_000, &kinds);
        let expect: Vec<String> = [
            "win:T:192.0.2.7:scraper",
            "tb:T:192.0.2.7:scraper",
            "sc:T:192.0.2.7:scraper",
            "fixed:T:192.0.2.7:scraper:2",
            "fixed:T:192.0.2.7:scraper:1",
            "win:T:192.0.2.7:scraper:web-1",
            "tb:T:192.0.2.7:scraper:web-1",
            "sc:T:192.0.2.7:scraper:web-1",
            "fixed:T:192.0.2.7:scraper:web-1:2",
            "fixed:T:192.0.2.7:scraper:web-1:1",
        ]
        .iter()
        .map(|k| format!("fb:{}", k.replace('T', &tag)))
        .collect();
        assert_eq!(all, expect);
        assert!(tag.starts_with(&format!("{{fb:b{b}.")), "{tag}");
        let two = keys.of_address(&addr, [("scraper", 60_000)], &["web-1", "web-2"], 120_000, &kinds);
        assert_eq!(two.len(), 15);
        assert!(
            two.contains(&format!("fb:win:{tag}:192.0.2.7:scraper:web-2")),
            "{two:?}"
        );
        let s = keys.slot_of_bucket(b);
        assert!(two.iter().all(|k| slot(k.as_bytes()) == s), "{two:?}");
        assert_eq!(
            keys.fixed(&addr, "scraper", Some("web-1")),
            format!("fb:fixed:{tag}:192.0.2.7:scraper:web-1")
        );
        assert_eq!(keys.bans(), "{fb}:bans");
        assert_eq!(keys.hosts(), "{fb}:hosts");
        assert_eq!(keys.offences(&addr), "{fb}:off:192.0.2.7");
        let net: IpNet = "192.0.2.0/24".parse().unwrap();
        assert_eq!(keys.escalation("scan", &net), "{fb}:esc:scan:192.0.2.0/24");
    }

    #[test]
    fn buckets_are_stable_per_address_and_spread() {
        // Pinned: a change renames every per-address key of a running fleet.
        assert_eq!(
            Keys::bucket_of(&net("203.0.113.7/32")),
            Keys::bucket_of(&net("203.0.113.7/32"))
        );
        let pinned: Vec<u16> = [
            "203.0.113.7/32",
            "192.0.2.1/32",
            "2001:db8::/64",
            "2001:db8:0:1::/64",
            "10.0.0.0/8",
        ]
        .iter()
        .map(|a| Keys::bucket_of(&net(a)))
        .collect();
        assert_eq!(pinned, [PINNED[0], PINNED[1], PINNED[2], PINNED[3], PINNED[4]]);
        // The prefix length is part of the address: a /64 and a /128 differ.
        let v6: Vec<u16> = (0..64u16)
            .map(|i| Keys::bucket_of(&net(&format!("2001:db8::{i:x}/128"))))
            .collect();
        assert!(v6.iter().any(|b| *b != v6[0]));
        // 6,400 consecutive IPv4 addresses: every bucket used, none more than
        // twice its share.
        let mut count = [0u32; ADDRESS_BUCKETS as usize];
        for i in 0..6400u32 {
            let a = IpNet::from(std::net::IpAddr::from((0x0a00_0000 + i).to_be_bytes()));
            count[usize::from(Keys::bucket_of(&a))] += 1;
        }
        assert!(count.iter().all(|&c| (50..=200).contains(&c)), "{count:?}");
    }

    const PINNED: [u16; 5] = [12, 26, 57, 48, 51];

    #[test]
    fn bucket_tags_cover_the_slot_space_evenly() {
        let keys = Keys::new("fleetban");
        // Pinned (independently computed): part of the layout.
        assert_eq!(keys.tags[0], ("{fleetban:b0.51}".to_owned(), 90));
        assert_eq!(keys.tags[12], ("{fleetban:b12.53}".to_owned(), 3114));
        assert_eq!(keys.tags[63], ("{fleetban:b63.108}".to_owned(), 16272));
        let range = SLOTS / ADDRESS_BUCKETS;
        for b in 0..ADDRESS_BUCKETS {
            let (tag, s) = &keys.tags[usize::from(b)];
            assert_eq!(slot(tag.as_bytes()), *s);
            assert_eq!(s / range, b, "{tag} in slot {s}");
        }
        // Masters with equal ranges (redis-cli --cluster create) get equal shares.
        let third = |s: u16| usize::from(s) * 3 / usize::from(SLOTS);
        let mut per = [0; 3];
        (0..ADDRESS_BUCKETS).for_each(|b| per[third(keys.slot_of_bucket(b))] += 1);
        assert!(per.iter().all(|&n| (21..=22).contains(&n)), "{per:?}");
    }

    #[test]
    fn slot_is_redis_clusters() {
        // CLUSTER KEYSLOT's answers.
        assert_eq!(slot(b"foo"), 12182);
        assert_eq!(slot(b"123456789"), 12739);
        assert_eq!(slot(b"{user1000}.following"), slot(b"user1000"));
        assert_eq!(slot(b"foo{}{bar}"), slot(b"foo{}{bar}"));
        assert_ne!(slot(b"foo{}{bar}"), slot(b"bar"));
        assert_eq!(slot(b"{fleetban}:bans"), slot(b"fleetban"));
    }

    #[test]
    fn old_layout_keys_are_told_apart() {
        let keys = Keys::new("fleetban");
        let addr = net("2001:db8::/64");
        assert!(!keys.is_old_layout(&keys.window(&addr, "r", None)));
        assert!(!keys.is_old_layout(&format!("{}:3", keys.fixed(&addr, "r", Some("h")))));
        assert!(keys.is_old_layout("fleetban:win:{203.0.113.7}:scraper"));
        assert!(keys.is_old_layout("fleetban:fixed:{2001:db8::/64}:scraper:123"));
        assert!(keys.is_old_layout("fleetban:tb:{fe80::1}:r"));
        assert!(!keys.is_old_layout("{fleetban}:bans"));
        assert!(!keys.is_old_layout("other:win:{203.0.113.7}:scraper"));
        assert_eq!(keys.per_addr_pattern(), "fleetban:*:{*");
        assert_eq!(Keys::new("a*b").per_addr_pattern(), "a\\*b:*:{*");
    }
}
