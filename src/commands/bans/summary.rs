//! What `fleetban bans` says of a list too long to print on a terminal:
//! how many bans, of which kinds (IPv4 addresses, IPv6 /64s, networks by
//! length), by rule, by the host that decided them, and when they end
//! (soonest, latest, permanent); and the bans ending last themselves, kept
//! in bounded memory while the list streams past (docs/design.md §6).

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};

use ipnet::IpNet;

use fleetban::bans::BanRecord;

use crate::commands::human::{local, relative};

/// How many of the largest groups a line names before "N other".
const NAMED: usize = 6;

/// Counts over every ban that passed the filters, folded one at a time.
#[derive(Default)]
pub struct Summary {
    /// Bans counted.
    pub bans: u64,
    /// Bans per kind (family and prefix length).
    kinds: HashMap<(bool, u8), u64>,
    /// Bans per rule (`?`: no record).
    rules: HashMap<String, u64>,
    /// Bans per deciding host (`?`: no record).
    hosts: HashMap<String, u64>,
    /// The soonest and the latest end (unix ms) of bans with an end.
    ends: Option<(i64, i64)>,
    /// Bans without an end.
    permanent: u64,
}

impl Summary {
    pub fn add(&mut self, r: &BanRecord) {
        self.bans += 1;
        *self
            .kinds
            .entry((r.addr.addr().is_ipv4(), r.addr.prefix_len()))
            .or_default() += 1;
        count(&mut self.rules, &r.rule);
        count(&mut self.hosts, &r.host);
        match r.until {
            Some(t) => {
                self.ends = Some(self.ends.map_or((t, t), |(a, b)| (a.min(t), b.max(t))));
            }
            None => self.permanent += 1,
        }
    }

    /// The summary's lines, indented, for a terminal (times local).
    pub fn render(&self, now: i64) -> String {
        let mut out = String::new();
        let mut kinds: Vec<(String, u64)> = self
            .kinds
            .iter()
            .map(|(&(v4, len), &n)| (kind(v4, len, n), n))
            .collect();
        kinds.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        out += &format!(
            "  kinds:   {}\n",
            named(kinds.into_iter().map(|(k, n)| format!("{n} {k}")).collect())
        );
        out += &format!("  rules:   {}\n", by_count(&self.rules));
        out += &format!("  hosts:   {}\n", by_count(&self.hosts));
        let (soonest, latest) = self.ends.map_or((None, None), |(a, b)| (Some(a), Some(b)));
        out += &ending(soonest, latest, self.permanent, now);
        out
    }
}

/// `  ending:  soonest T (in 59m), latest T (in 2h); 3 permanent`.
pub fn ending(soonest: Option<i64>, latest: Option<i64>, permanent: u64, now: i64) -> String {
    let at = |t: i64| format!("{} ({})", local(t), relative(t, now));
    let mut s = match (soonest, latest) {
        (Some(a), Some(b)) => format!("soonest {}, latest {}", at(a), at(b)),
        _ => "never".to_owned(),
    };
    if permanent > 0 {
        s += &format!("; {permanent} permanent");
    }
    format!("  ending:  {s}\n")
}

fn count(map: &mut HashMap<String, u64>, key: &str) {
    let key = if key.is_empty() { "?" } else { key };
    match map.get_mut(key) {
        Some(n) => *n += 1,
        None => {
            map.insert(key.to_owned(), 1);
        }
    }
}

/// `nginx-scraper 500000, manual 3`: the largest first, ties by name.
fn by_count(map: &HashMap<String, u64>) -> String {
    let mut v: Vec<(&String, &u64)> = map.iter().collect();
    v.sort_by(|a, b| b.1.cmp(a.1).then_with(|| a.0.cmp(b.0)));
    named(v.into_iter().map(|(k, n)| format!("{k} {n}")).collect())
}

/// The first [`NAMED`] of `items`, then how many more.
fn named(mut items: Vec<String>) -> String {
    if items.is_empty() {
        return "-".to_owned();
    }
    let more = items.len().saturating_sub(NAMED);
    items.truncate(NAMED);
    let mut s = items.join(", ");
    if more > 0 {
        s += &format!(" and {more} other(s)");
    }
    s
}

/// `IPv4 addresses`, `IPv6 /64s`, `IPv4 /24s` (`n` only for the plural).
fn kind(v4: bool, len: u8, n: u64) -> String {
    let family = if v4 { "IPv4" } else { "IPv6" };
    let s = if n == 1 { "" } else { "s" };
    if len == if v4 { 32 } else { 128 } {
        format!("{family} address{}", if n == 1 { "" } else { "es" })
    } else {
        format!("{family} /{len}{s}")
    }
}

/// The `n` bans ending last (permanent ones first, then the latest end,
/// then address) seen so far: a heap of at most `n`, whatever the list's
/// length.
pub struct EndingLast {
    /// The bound.
    n: usize,
    /// The one ending soonest kept on top, to be pushed out.
    heap: BinaryHeap<Reverse<Keyed>>,
}

/// A record ordered by (end, permanent last; address).
struct Keyed(BanRecord);

fn key(r: &BanRecord) -> (i64, &IpNet) {
    (r.until.unwrap_or(i64::MAX), &r.addr)
}

impl PartialEq for Keyed {
    fn eq(&self, o: &Self) -> bool {
        key(&self.0) == key(&o.0)
    }
}
impl Eq for Keyed {}
impl PartialOrd for Keyed {
    fn partial_cmp(&self, o: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(o))
    }
}
impl Ord for Keyed {
    fn cmp(&self, o: &Self) -> std::cmp::Ordering {
        key(&self.0).cmp(&key(&o.0))
    }
}

impl EndingLast {
    pub fn new(n: usize) -> EndingLast {
        EndingLast {
            n,
            heap: BinaryHeap::with_capacity(n.min(1 << 16) + 1),
        }
    }

    pub fn add(&mut self, r: BanRecord) {
        if self.n == 0 {
            return;
        }
        if self.heap.len() < self.n {
            self.heap.push(Reverse(Keyed(r)));
        } else if self.heap.peek().is_some_and(|Reverse(top)| key(&r) > key(&top.0)) {
            self.heap.pop();
            self.heap.push(Reverse(Keyed(r)));
        }
    }

    pub fn into_vec(self) -> Vec<BanRecord> {
        self.heap.into_iter().map(|Reverse(k)| k.0).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(addr: &str, rule: &str, since: i64, until: Option<i64>) -> BanRecord {
        BanRecord {
            addr: addr.parse().unwrap(),
            rule: rule.into(),
            reason: String::new(),
            host: "web-1".into(),
            since,
            until,
            count: 1,
            hits: 0,
        }
    }

    #[test]
    fn the_bans_ending_last_are_kept_whatever_the_order_they_come_in() {
        let mut n = EndingLast::new(3);
        for (i, u) in [Some(5), Some(1), None, Some(9), Some(7), Some(3), Some(8)]
            .into_iter()
            .enumerate()
        {
            n.add(rec(&format!("192.0.2.{i}/32"), "r", 0, u));
        }
        let mut ends: Vec<Option<i64>> = n.into_vec().iter().map(|r| r.until).collect();
        ends.sort();
        assert_eq!(ends, vec![None, Some(8), Some(9)]);
        let mut none = EndingLast::new(0);
        none.add(rec("192.0.2.1/32", "r", 1, None));
        assert!(none.into_vec().is_empty());
    }

    #[test]
    fn the_summary_counts_kinds_rules_hosts_and_ends() {
        let mut s = Summary::default();
        s.add(&rec("192.0.2.1/32", "scraper", 1, Some(2_000)));
        s.add(&rec("192.0.2.2/32", "scraper", 1, Some(9_000)));
        s.add(&rec("2001:db8::/64", "", 1, None));
        s.add(&rec("198.51.100.0/24", "manual", 1, Some(5_000)));
        let text = s.render(0);
        assert!(
            text.contains("kinds:   2 IPv4 addresses, 1 IPv4 /24, 1 IPv6 /64\n"),
            "{text}"
        );
        assert!(text.contains("rules:   scraper 2, ? 1, manual 1\n"), "{text}");
        assert!(text.contains("hosts:   web-1 4\n"), "{text}");
        assert!(text.contains("(in 2s), latest "), "{text}");
        assert!(text.contains("(in 9s); 1 permanent\n"), "{text}");
    }
}
