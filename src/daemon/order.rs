//! Log order for the daemon's batches: what makes `run` decide as `test`
//! does (docs/design.md §2, "In log order"). `fleetban test` judges one hit
//! at a time and bans before it reads the next; the daemon sends a round
//! trip of many (rule, key) batches at once. Within a batch the script
//! keeps log order; across batches only a ban can matter, a ban of one
//! batch covering the address of a hit of another (another rule's batch of
//! the same address, a neighbour inside an `escalate_network` network, a
//! `key: network` window holding the address). So:
//!
//! - every hit has a place in the log ([`Pos`]: its file, in the order the
//!   files were first read, its byte offset, its rule);
//! - a batch *may* cross its limit only past its room, the hits it
//!   certainly still fits from the count its last verdict reported (0 when
//!   unknown); the first hit past that room is where its ban may come;
//! - a hit of another batch after that place, whose address that ban would
//!   cover, waits with the rest of its batch for the next round trip
//!   ([`Order::cut`]), when the ban is known; the earliest possible ban is
//!   never held back, so every round trip decides something;
//! - a hit that waited is dropped only by a ban dated before it in the
//!   log: the bans this pipeline made keep their place ([`Order::spares`]).
//!
//! Bans come out of a round trip in log order ([`Order::sort`]). Nothing
//! here runs per line; the cut runs per round trip and only when the rules
//! can make one batch's ban cover another's hits (several rules, or
//! `escalate_network`). The waiting tails are bounded by the round trip
//! they were cut from.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;

use ipnet::IpNet;

use super::pipeline::RuleInfo;
use crate::detect::Hit;
use crate::enforce::Until;
use crate::limit::{Batch, Verdict};

type Map<K, V> = HashMap<K, V, foldhash::fast::RandomState>;

/// A hit's place in the log: files in the order first read, then byte
/// offset, then rule (the rules of one line are judged in rule order).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct Pos {
    file: u32,
    offset: u64,
    rule: u32,
}

/// A ban this pipeline made from a verdict, at its place in the log.
struct Made {
    cover: IpNet,
    at: Pos,
    until: Until,
    /// When it was made (the limiter's monotonic ms): forgotten a minute later.
    made_ms: i64,
}

/// The tail of a batch held back for the next round trip.
struct Tail {
    batch: Batch,
    /// For a `key: network` rule, each hit's address; empty otherwise.
    addrs: Vec<IpNet>,
    /// A bound on the chunk sequence number of its oldest hit.
    seq: u64,
}

/// What a rule's batches need here.
#[derive(Clone, Copy, Debug)]
pub struct RuleOrder {
    /// The limit (`hits`; a bucket's burst).
    pub limit: u32,
    /// Hits a reported count may leave out (a prefilter's screened ones),
    /// plus one where the count is an estimate (`sliding_counter`).
    pub unseen: u32,
    /// Counts networks: its hits' addresses are kept beside them.
    pub network: bool,
    /// The network its bans may escalate to, as a prefix length per family.
    pub escalates: Option<(u8, u8)>,
    pub window_ms: i64,
}

impl RuleOrder {
    pub fn of(r: &crate::config::Rule) -> RuleOrder {
        let prefilter = r
            .limit
            .prefilter
            .map_or(0, |f| crate::limit::RuleLimit::threshold(f, r.limit.hits));
        let estimate = u32::from(r.limit.algorithm == crate::config::Algorithm::SlidingCounter);
        RuleOrder {
            limit: r.limit.hits,
            unseen: 2 * prefilter + estimate,
            network: r.limit.keying != crate::addr::Keying::Address,
            escalates: r.ban.network.map(|e| (e.ipv4_prefix, e.ipv6_prefix)),
            window_ms: r.limit.window_ms,
        }
    }

    /// What a ban of `key` by this rule may cover: the key, or the network
    /// it escalates to.
    fn cover(&self, key: &IpNet) -> IpNet {
        let Some((v4, v6)) = self.escalates else { return *key };
        let len = match key {
            IpNet::V4(_) => v4,
            IpNet::V6(_) => v6,
        };
        if key.prefix_len() <= len {
            return *key;
        }
        IpNet::new(key.network(), len).map_or(*key, |n| n.trunc())
    }
}

#[derive(Default)]
pub struct Order {
    rules: Vec<RuleOrder>,
    /// Whether one batch's ban can cover another batch's hits.
    crossed: bool,
    /// Each file's rank, in the order first read (by origin; one entry per
    /// file identity read since start, kept: a rank must not change while
    /// a hit or a ban made holds it).
    files: Map<u64, u32>,
    /// The last count each (rule, key) reported, and when (monotonic ms).
    counts: Map<(usize, IpNet), (u32, i64)>,
    /// The addresses of the pending hits of `key: network` rules, in order.
    addrs: Map<(usize, IpNet), VecDeque<IpNet>>,
    tails: Vec<Tail>,
    made: Vec<Made>,
    /// Bytes `counts` may hold (its share of `safety.max_client_state`),
    /// and where what it holds and sheds is reported.
    bound: Option<(usize, std::sync::Arc<crate::limit::LimitCounters>)>,
}

/// One entry of [`Order::counts`] in its table.
type CountEntry = ((usize, IpNet), (u32, i64));

impl Order {
    pub fn new(rules: &[RuleInfo]) -> Order {
        let mut o = Order::default();
        o.set_rules(rules);
        o
    }

    /// New rules (a reload, with nothing pending): counts are forgotten
    /// (the rule indexes changed).
    pub fn set_rules(&mut self, rules: &[RuleInfo]) {
        self.rules = rules.iter().map(|r| r.order).collect();
        self.crossed = self.rules.len() > 1 || self.rules.iter().any(|r| r.escalates.is_some());
        self.counts.clear();
        self.addrs.clear();
    }

    /// A hit's place.
    fn pos(&mut self, rule: usize, hit: &Hit) -> Pos {
        let next = self.files.len() as u32;
        let file = *self.files.entry(hit.origin).or_insert(next);
        Pos {
            file,
            offset: hit.offset,
            rule: rule as u32,
        }
    }

    /// Whether `rule` counts networks (its hits' addresses are noted).
    #[inline]
    pub fn notes(&self, rule: usize) -> bool {
        self.rules.get(rule).is_some_and(|r| r.network)
    }

    /// The address of a `key: network` rule's pending hit, in order.
    #[inline]
    pub fn note(&mut self, rule: usize, key: IpNet, addr: IpNet) {
        self.addrs.entry((rule, key)).or_default().push_back(addr);
    }

    /// Hits held back for the next round trip.
    pub fn held(&self) -> usize {
        self.tails.iter().map(|t| t.batch.hits.len()).sum()
    }

    /// The chunk sequence number of the oldest hit held back.
    pub fn oldest_seq(&self) -> Option<u64> {
        self.tails.iter().map(|t| t.seq).min()
    }

    /// The batches of a round trip: the tails held back (but those of keys
    /// `busy` in a round trip still) before the hits taken since, each
    /// batch's addresses beside it. `seq`: a bound on the oldest hit taken.
    pub fn gather(&mut self, taken: Vec<Batch>, busy: impl Fn(&IpNet) -> bool) -> Trip {
        let mut trip = Trip {
            batches: Vec::with_capacity(taken.len() + self.tails.len()),
            addrs: Vec::with_capacity(taken.len() + self.tails.len()),
            seq: self.oldest_seq(),
        };
        let mut waiting = Vec::new();
        let mut tails: Map<(usize, IpNet), usize> = Map::default();
        for t in std::mem::take(&mut self.tails) {
            if busy(&t.batch.key) {
                waiting.push(t);
                continue;
            }
            tails.insert((t.batch.rule, t.batch.key), trip.batches.len());
            trip.batches.push(t.batch);
            trip.addrs.push(t.addrs);
        }
        self.tails = waiting;
        for b in taken {
            let addrs = if self.notes(b.rule) {
                let q = self.addrs.entry((b.rule, b.key)).or_default();
                // Each pending hit of the rule noted its address; should one
                // be missing, the network stands for it (waits longer).
                let mut a: Vec<IpNet> = q.drain(..b.hits.len().min(q.len())).collect();
                a.resize(b.hits.len(), b.key);
                if q.is_empty() {
                    self.addrs.remove(&(b.rule, b.key));
                }
                a
            } else {
                Vec::new()
            };
            match tails.get(&(b.rule, b.key)) {
                Some(&i) => {
                    trip.batches[i].hits.extend(b.hits);
                    trip.addrs[i].extend(addrs);
                }
                None => {
                    trip.batches.push(b);
                    trip.addrs.push(addrs);
                }
            }
        }
        trip
    }

    /// Whether a ban of this pipeline dated after the hit at `at` covers
    /// `addr` at `time_ms` and none dated before it does: the hit was read
    /// before that ban, and counts.
    pub fn spares(&mut self, addr: &IpNet, rule: usize, hit: &Hit) -> bool {
        if self.made.is_empty() {
            return false;
        }
        let at = self.pos(rule, hit);
        let t = Until::At(hit.time_ms);
        let mut after = false;
        for m in &self.made {
            if t < m.until && m.cover.contains(addr) {
                if m.at < at {
                    return false;
                }
                after = true;
            }
        }
        after
    }

    /// Holds back, from `trip`, every hit that a possible ban of another of
    /// its batches (or of `out`: batches of round trips in flight, from
    /// their first hit) would cover, with the rest of its batch. The tails
    /// wait in `self` for the next round trip.
    pub fn cut(&mut self, trip: &mut Trip, out: &[(IpNet, Pos)]) {
        if !self.crossed {
            return;
        }
        // Where each batch's ban may come: the first hit past its room.
        let mut risks: Vec<(IpNet, Pos, usize)> = out.iter().map(|&(c, p)| (c, p, usize::MAX)).collect();
        for (i, b) in trip.batches.iter().enumerate() {
            let room = self.room(b.rule, &b.key);
            if let Some(h) = b.hits.get(room) {
                let rule = &self.rules[b.rule];
                let cover = rule.cover(&b.key);
                let at = self.pos(b.rule, h);
                risks.push((cover, at, i));
            }
        }
        if risks.is_empty() {
            return;
        }
        let index = Risks::new(risks);
        let seq = trip.seq;
        for i in 0..trip.batches.len() {
            let b = &trip.batches[i];
            let (rule, key) = (b.rule, b.key);
            let mut cut = None;
            for (j, h) in b.hits.iter().enumerate() {
                let addr = trip.addrs[i].get(j).copied().unwrap_or(key);
                let at = self.pos(rule, h);
                if index.earliest_other(&addr, i).is_some_and(|p| p < at) {
                    cut = Some(j);
                    break;
                }
            }
            let Some(j) = cut else { continue };
            let b = &mut trip.batches[i];
            let hits = b.hits.split_off(j);
            let addrs = if trip.addrs[i].len() > j {
                trip.addrs[i].split_off(j)
            } else {
                Vec::new()
            };
            self.tails.push(Tail {
                batch: Batch { rule, key, hits },
                addrs,
                seq: seq.unwrap_or(0),
            });
        }
        trip.retain_nonempty();
    }

    /// The covers a round trip leaving now may ban, from its batches' first
    /// hits (for the round trips launched while it is out).
    pub fn risks_of(&mut self, batches: &[Batch]) -> Vec<(IpNet, Pos)> {
        if !self.crossed {
            return Vec::new();
        }
        let mut out = Vec::with_capacity(batches.len());
        for b in batches {
            if let Some(h) = b.hits.first() {
                let cover = self.rules[b.rule].cover(&b.key);
                out.push((cover, self.pos(b.rule, h)));
            }
        }
        out
    }

    /// Hits a batch of (rule, key) certainly fits: its limit less the count
    /// it last reported; none when unknown.
    fn room(&self, rule: usize, key: &IpNet) -> usize {
        let Some(r) = self.rules.get(rule) else { return 0 };
        match self.counts.get(&(rule, *key)) {
            Some(&(count, _)) => r.limit.saturating_sub(count.saturating_add(r.unseen)) as usize,
            None => 0,
        }
    }

    /// The verdicts over the limit in log order: (batch, hit index, count).
    pub fn sort(&mut self, batches: &[Batch], verdicts: &[Verdict]) -> Vec<(usize, usize, u32)> {
        let mut over: Vec<(Pos, usize, usize, u32)> = Vec::new();
        for (i, (b, v)) in batches.iter().zip(verdicts).enumerate() {
            if let Verdict::Over { index, count } = *v {
                if let Some(h) = b.hits.get(index) {
                    over.push((self.pos(b.rule, h), i, index, count));
                }
            }
        }
        over.sort_unstable_by_key(|o| o.0);
        over.into_iter().map(|(_, i, index, count)| (i, index, count)).collect()
    }

    /// What the verdicts say of each (rule, key)'s room, at `now_ms`.
    pub fn learn(&mut self, batches: &[Batch], verdicts: &[Verdict], now_ms: i64) {
        if !self.crossed {
            return;
        }
        for (b, v) in batches.iter().zip(verdicts) {
            match v {
                Verdict::Under { count } => {
                    self.counts.insert((b.rule, b.key), (*count, now_ms));
                }
                Verdict::Over { .. } => {
                    self.counts.remove(&(b.rule, b.key));
                }
            }
        }
        self.keep_within(now_ms);
    }

    /// A ban made for the hit of `rule` at `hit`, covering `cover` until `until`.
    pub fn made(&mut self, cover: IpNet, rule: usize, hit: &Hit, until: Until, now_ms: i64) {
        let at = self.pos(rule, hit);
        self.made.push(Made {
            cover,
            at,
            until,
            made_ms: now_ms,
        });
    }

    /// The network `rule`'s ban of `key` may escalate to, if any.
    pub fn escalation(&self, rule: usize, key: &IpNet) -> Option<IpNet> {
        let r = self.rules.get(rule)?;
        r.escalates?;
        Some(r.cover(key)).filter(|n| n != key)
    }

    /// Once a second: counts older than two windows and bans made more
    /// than a minute ago are forgotten (a count forgotten only makes the
    /// next round trip wait more).
    pub fn prune(&mut self, now_ms: i64) {
        let rules = &self.rules;
        self.counts.retain(|&(rule, _), &mut (_, at)| {
            rules
                .get(rule)
                .is_some_and(|r| now_ms - at < 2 * r.window_ms.max(1_000))
        });
        self.made.retain(|m| now_ms - m.made_ms < 60_000);
        self.keep_within(now_ms);
    }

    /// Bounds the counts to `max` bytes, reporting into `counters`.
    pub fn bound(&mut self, max: usize, counters: std::sync::Arc<crate::limit::LimitCounters>) {
        self.bound = Some((max, counters));
    }

    /// Past its bound, the counts reported longest ago are forgotten (half
    /// the age at a time) until they pack into half of it; a count
    /// forgotten only makes that client's next hits wait a round trip.
    fn keep_within(&mut self, now_ms: i64) {
        let Some((max, counters)) = &self.bound else {
            return;
        };
        let size = |c: &Map<(usize, IpNet), (u32, i64)>| {
            let bucket = std::mem::size_of::<CountEntry>() + 1;
            (
                (c.capacity() * 8).div_ceil(7) * bucket,
                (c.len() * 8).div_ceil(7) * bucket,
            )
        };
        let (held, _) = size(&self.counts);
        if held > *max {
            let before = self.counts.len();
            let mut age = self.counts.values().map(|&(_, at)| now_ms - at).max().unwrap_or(0);
            while size(&self.counts).1 > max / 4 && age > 0 {
                age /= 2;
                self.counts.retain(|_, &mut (_, at)| now_ms - at < age);
            }
            if size(&self.counts).1 > max / 4 {
                self.counts.clear();
            }
            self.counts.shrink_to_fit();
            counters
                .shed_keys
                .fetch_add((before - self.counts.len()) as u64, Relaxed);
            counters.sheds.fetch_add(1, Relaxed);
        }
        let (held, _) = size(&self.counts);
        counters.order_bytes.store(held as u64, Relaxed);
        counters.order_keys.store(self.counts.len() as u64, Relaxed);
    }
}

/// The batches of one round trip, with the addresses of `key: network`
/// batches' hits.
pub struct Trip {
    pub batches: Vec<Batch>,
    pub addrs: Vec<Vec<IpNet>>,
    /// A bound on the chunk sequence number of the oldest hit it holds.
    pub seq: Option<u64>,
}

impl Trip {
    pub fn retain_nonempty(&mut self) {
        let mut keep = self.batches.iter().map(|b| !b.hits.is_empty());
        let mut i = 0;
        self.addrs.retain(|_| {
            i += 1;
            keep.next().unwrap_or(false)
        });
        self.batches.retain(|b| !b.hits.is_empty());
    }
}

/// The possible bans of a round trip by what they cover: per prefix length
/// present, the two earliest places of two batches, so that a batch's own
/// is told from another's.
struct Risks {
    lengths: Vec<(bool, u8)>,
    earliest: Map<IpNet, Vec<(Pos, usize)>>,
}

impl Risks {
    fn new(risks: Vec<(IpNet, Pos, usize)>) -> Risks {
        let mut earliest: Map<IpNet, Vec<(Pos, usize)>> = Map::default();
        let mut lengths = Vec::new();
        for (cover, at, i) in risks {
            let len = (cover.addr().is_ipv4(), cover.prefix_len());
            if !lengths.contains(&len) {
                lengths.push(len);
            }
            let e = earliest.entry(cover).or_default();
            match e.iter_mut().find(|s| s.1 == i) {
                Some(s) => s.0 = s.0.min(at),
                None => e.push((at, i)),
            }
            e.sort_unstable();
            e.truncate(2);
        }
        Risks { lengths, earliest }
    }

    /// The earliest place a ban of a batch other than `own` may cover `addr`.
    fn earliest_other(&self, addr: &IpNet, own: usize) -> Option<Pos> {
        let mut best: Option<Pos> = None;
        for &(v4, len) in &self.lengths {
            if addr.addr().is_ipv4() != v4 || addr.prefix_len() < len {
                continue;
            }
            let Ok(n) = IpNet::new(addr.addr(), len) else { continue };
            let Some(e) = self.earliest.get(&n.trunc()) else {
                continue;
            };
            if let Some(&(at, _)) = e.iter().find(|s| s.1 != own) {
                best = Some(best.map_or(at, |b| b.min(at)));
            }
        }
        best
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn info(limit: u32, network: bool, escalates: bool) -> RuleOrder {
        RuleOrder {
            limit,
            unseen: 0,
            network,
            escalates: escalates.then_some((24, 56)),
            window_ms: 60_000,
        }
    }

    fn order(rules: Vec<RuleOrder>) -> Order {
        let crossed = rules.len() > 1 || rules.iter().any(|r| r.escalates.is_some());
        Order {
            rules,
            crossed,
            ..Order::default()
        }
    }

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    fn batch(rule: usize, key: &str, offsets: &[u64]) -> Batch {
        Batch {
            rule,
            key: net(key),
            hits: offsets.iter().map(|&o| Hit::of_line(o as i64, 7, o)).collect(),
        }
    }

    fn trip(o: &mut Order, batches: Vec<Batch>) -> Trip {
        o.gather(batches, |_| false)
    }

    #[test]
    fn a_neighbour_after_a_possible_escalation_waits_and_the_first_possible_ban_goes() {
        let mut o = order(vec![info(3, false, true)]);
        let mut t = trip(
            &mut o,
            vec![
                batch(0, "192.0.2.1/32", &[10, 30]),
                batch(0, "192.0.2.2/32", &[5, 20, 40]),
            ],
        );
        o.cut(&mut t, &[]);
        // Nothing known: each may be banned at its first hit; .2's first
        // (5) is the earliest, so .1 waits from 10 on and .2 from 20 on
        // (after .1's possible ban at 10).
        let offsets: Vec<Vec<u64>> = t
            .batches
            .iter()
            .map(|b| b.hits.iter().map(|h| h.offset).collect())
            .collect();
        assert_eq!(offsets, vec![vec![5]]);
        assert_eq!(o.held(), 4);
        // Counts known: room for all; the tails go whole next time.
        o.counts.insert((0, net("192.0.2.1/32")), (0, 0));
        o.counts.insert((0, net("192.0.2.2/32")), (1, 0));
        let mut t = trip(&mut o, Vec::new());
        o.cut(&mut t, &[]);
        assert_eq!(t.batches.iter().map(|b| b.hits.len()).sum::<usize>(), 4);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn one_rule_without_escalation_is_never_cut() {
        let mut o = order(vec![info(0, false, false)]);
        let mut t = trip(
            &mut o,
            vec![batch(0, "192.0.2.1/32", &[1, 2]), batch(0, "192.0.2.2/32", &[3])],
        );
        o.cut(&mut t, &[]);
        assert_eq!(t.batches.len(), 2);
        assert_eq!(o.held(), 0);
    }

    #[test]
    fn a_network_window_waits_for_the_address_bans_of_lines_before() {
        let mut o = order(vec![info(3, false, false), info(10, true, false)]);
        o.note(1, net("192.0.2.0/24"), net("192.0.2.1/32"));
        o.note(1, net("192.0.2.0/24"), net("192.0.2.9/32"));
        o.note(1, net("192.0.2.0/24"), net("192.0.2.1/32"));
        o.counts.insert((1, net("192.0.2.0/24")), (0, 0));
        let mut t = trip(
            &mut o,
            vec![batch(0, "192.0.2.1/32", &[10]), batch(1, "192.0.2.0/24", &[9, 11, 12])],
        );
        o.cut(&mut t, &[]);
        // The address's possible ban at line 10 covers the network's later
        // hit of that address (12), not .9's (11) nor its own earlier one
        // (9): the network's batch goes up to 11.
        let lens: Vec<usize> = t.batches.iter().map(|b| b.hits.len()).collect();
        assert_eq!(lens, vec![1, 2]);
        assert_eq!(o.tails[0].addrs, vec![net("192.0.2.1/32")]);
    }

    #[test]
    fn a_hit_read_before_a_ban_is_spared_by_it_and_one_after_is_not() {
        let mut o = order(vec![info(3, false, true)]);
        let h = |off: u64| Hit::of_line(100, 7, off);
        o.made(net("192.0.2.0/24"), 0, &h(50), Until::At(1_000), 0);
        assert!(o.spares(&net("192.0.2.7/32"), 0, &h(40)));
        assert!(!o.spares(&net("192.0.2.7/32"), 0, &h(60)));
        assert!(!o.spares(&net("198.51.100.7/32"), 0, &h(40)));
    }

    #[test]
    fn bans_come_out_in_log_order() {
        let mut o = order(vec![info(1, false, false), info(1, false, false)]);
        let batches = vec![batch(0, "192.0.2.1/32", &[30, 31]), batch(1, "192.0.2.2/32", &[10, 20])];
        let verdicts = [
            Verdict::Over { index: 0, count: 1 },
            Verdict::Over { index: 1, count: 1 },
        ];
        assert_eq!(o.sort(&batches, &verdicts), vec![(1, 1, 1), (0, 0, 1)]);
    }
}
