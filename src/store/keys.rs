//! The names of our keys (docs/design.md §3, with the changes ARCHITECTURE.md
//! records). Every key that belongs to one address carries the address as a
//! hash tag (`{203.0.113.7}`), every fleet-wide key the prefix
//! (`{fleetban}:bans`), so that each script touches a single Cluster slot.
//! No other module writes a key name.

use ipnet::IpNet;

use crate::addr::AddrText;

/// The stream keeps about this many events; a host further behind reconciles.
pub const STREAM_MAXLEN: u64 = 100_000;

/// Key names under one prefix.
#[derive(Clone, Debug)]
pub struct Keys {
    prefix: String,
}

impl Keys {
    pub fn new(prefix: &str) -> Keys {
        Keys {
            prefix: prefix.to_owned(),
        }
    }

    /// `fleetban:win:{ADDR}:RULE`, with `:HOST` for `scope: host`.
    pub fn window(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        match host {
            None => format!("{}:win:{{{}}}:{}", self.prefix, AddrText(addr), rule),
            Some(h) => format!("{}:win:{{{}}}:{}:{}", self.prefix, AddrText(addr), rule, h),
        }
    }

    /// `fleetban:fixed:{ADDR}:RULE` (`:HOST` for `scope: host`): the base
    /// of the fixed-window counters (HASHes: the count and the last offset
    /// counted per origin); the script appends `:N`, the window number.
    /// Before exactly-once counting they were STRINGs named `fw:`: a new
    /// name, so that the two never meet under one key.
    pub fn fixed(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.per_addr("fixed", addr, rule, host)
    }

    /// `fleetban:tb:{ADDR}:RULE`: token bucket state (HASH).
    pub fn bucket(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.per_addr("tb", addr, rule, host)
    }

    /// `fleetban:sc:{ADDR}:RULE`: sliding counter state (HASH).
    pub fn counter(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.per_addr("sc", addr, rule, host)
    }

    fn per_addr(&self, kind: &str, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        match host {
            None => format!("{}:{kind}:{{{}}}:{}", self.prefix, AddrText(addr), rule),
            Some(h) => format!("{}:{kind}:{{{}}}:{}:{}", self.prefix, AddrText(addr), rule, h),
        }
    }

    pub fn bans(&self) -> String {
        format!("{{{}}}:bans", self.prefix)
    }

    pub fn records(&self) -> String {
        format!("{{{}}}:banrec", self.prefix)
    }

    pub fn events(&self) -> String {
        format!("{{{}}}:events", self.prefix)
    }

    /// `{fleetban}:hosts`: SET of the host ids of the daemons that used this
    /// Redis (each adds its own at every reconcile), so that an unban can
    /// name the `scope: host` keys of every host without a SCAN.
    pub fn hosts(&self) -> String {
        format!("{{{}}}:hosts", self.prefix)
    }

    /// `{fleetban}:hot`: ZSET of the clients found at half a rule's limit
    /// or more (`RULE ADDR`), scored by when the mark ends (`fleet::hot`).
    pub fn hot(&self) -> String {
        format!("{{{}}}:hot", self.prefix)
    }

    /// `{fleetban}:marks`: STREAM of the hot marks and host arrivals
    /// (`fleet::hot`), apart from the ban events so that neither crowds the
    /// other out.
    pub fn marks(&self) -> String {
        format!("{{{}}}:marks", self.prefix)
    }

    /// Every key holding state of `addr` under `rules` (name, window ms):
    /// each algorithm's, in the fleet's scope and in each of `hosts`'s,
    /// fixed-window counters for the window of `now_ms` and the one before
    /// (older ones have expired). What `fleetban unban` deletes, so the
    /// address starts fresh windows on every host. All in `{ADDR}`'s slot.
    pub fn of_address<'a>(
        &self,
        addr: &IpNet,
        rules: impl IntoIterator<Item = (&'a str, i64)>,
        hosts: &[&str],
        now_ms: i64,
    ) -> Vec<String> {
        let mut out = Vec::new();
        for (rule, window_ms) in rules {
            let n = now_ms / window_ms.max(1);
            let scopes = std::iter::once(None).chain(hosts.iter().map(|h| Some(*h)));
            for host in scopes {
                let fixed = self.fixed(addr, rule, host);
                out.extend([
                    self.window(addr, rule, host),
                    self.bucket(addr, rule, host),
                    self.counter(addr, rule, host),
                    format!("{fixed}:{n}"),
                    format!("{fixed}:{}", n - 1),
                ]);
            }
        }
        out
    }

    /// Offence count of one address. Tagged with the prefix, not the address
    /// (a change from the original design's `fleetban:off:{ADDR}`, docs/design.md §9): `ban.lua` reads and
    /// bumps it in the same atomic call as the ban list, which in a Cluster
    /// requires the same slot.
    pub fn offences(&self, addr: &IpNet) -> String {
        format!("{{{}}}:off:{}", self.prefix, AddrText(addr))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_key_of_an_address_shares_its_hash_tag() {
        let keys = Keys::new("fb");
        let addr: IpNet = "192.0.2.7/32".parse().unwrap();
        let all = keys.of_address(&addr, [("scraper", 60_000)], &["web-1"], 120_000);
        assert_eq!(
            all,
            [
                "fb:win:{192.0.2.7}:scraper",
                "fb:tb:{192.0.2.7}:scraper",
                "fb:sc:{192.0.2.7}:scraper",
                "fb:fixed:{192.0.2.7}:scraper:2",
                "fb:fixed:{192.0.2.7}:scraper:1",
                "fb:win:{192.0.2.7}:scraper:web-1",
                "fb:tb:{192.0.2.7}:scraper:web-1",
                "fb:sc:{192.0.2.7}:scraper:web-1",
                "fb:fixed:{192.0.2.7}:scraper:web-1:2",
                "fb:fixed:{192.0.2.7}:scraper:web-1:1",
            ]
        );
        let two = keys.of_address(&addr, [("scraper", 60_000)], &["web-1", "web-2"], 120_000);
        assert_eq!(two.len(), 15);
        assert!(two.contains(&"fb:win:{192.0.2.7}:scraper:web-2".to_owned()), "{two:?}");
        assert!(two.iter().all(|k| k.contains("{192.0.2.7}")));
        assert_eq!(keys.bans(), "{fb}:bans");
        assert_eq!(keys.hosts(), "{fb}:hosts");
        assert_eq!(keys.offences(&addr), "{fb}:off:192.0.2.7");
    }
}
