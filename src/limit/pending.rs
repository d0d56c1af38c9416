//! Pending hits, grouped per (rule, client key) in arrival order, so that one
//! script call carries every hit of one key and processes them in order.
//!
//! With Redis each script call costs Redis CPU per (rule, key), whatever
//! the number of hits it carries, so the hits of a client that *cannot
//! matter yet* may wait to share a call; no hit that could matter ever
//! waits (docs/design.md §2, "When hits reach Redis"). For a rule of limit
//! L counted by N hosts ([`HoldPolicy`]): while Redis's count for a client
//! is below H = L - floor(L/2) the client is *cold*, and each host keeps at
//! most its share, floor(floor(L/2) / N), of that client's hits unsent; the
//! fleet's true count, sent plus kept, then stays below H + N x share <= L,
//! so no verdict can be over the limit while hits wait. The host whose
//! round trip reports a count of H or more marks the client *hot* and
//! publishes the mark to the fleet (`fleet::publish_hot`); a hot client's
//! hits go with the next round trip on every host, and so does a cold
//! client's as soon as this host holds one hit past its share. No timer
//! decides anything: `redis.hold` only bounds how long a cold batch may
//! wait anyway (its lines stay uncommitted meanwhile).

use std::collections::{HashMap, VecDeque};

use ipnet::IpNet;

use crate::detect::Hit;

/// All pending hits of one (rule, key), in log order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub rule: usize,
    pub key: IpNet,
    pub hits: Vec<Hit>,
}

/// When a rule's batches may wait, and when they may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldPolicy {
    /// Longest wait of a cold batch, in ms (bookkeeping: its lines stay
    /// uncommitted meanwhile).
    pub hold_ms: i64,
    /// Hits of a cold client this host may keep unsent (0: none waits).
    pub share: u32,
    /// A reported count of at least this makes the client hot: H, less the
    /// hits the reported counts may leave out.
    pub hot_at: u32,
    /// How long a hot mark lasts after the count that made it: two windows
    /// (a count of H or more is renewed by a round trip before it can end).
    pub mark_ms: i64,
    /// Counted by other hosts too (`scope: fleet`): hot marks are published.
    pub fleet: bool,
}

impl HoldPolicy {
    /// No hold: every batch goes out with the next flush.
    pub const NONE: HoldPolicy = HoldPolicy {
        hold_ms: 0,
        share: 0,
        hot_at: 0,
        mark_ms: 0,
        fleet: false,
    };

    /// A rule of limit `hits` and window `window_ms` whose reported counts
    /// leave out up to `unseen` hits (a prefilter's screened hits: 2 x its
    /// threshold), counted by `hosts` hosts (1 for `scope: host`, and then
    /// not `fleet`); nothing waits if `hold_ms` is 0.
    pub fn new(hold_ms: i64, hits: u32, unseen: u32, window_ms: i64, hosts: u32, fleet: bool) -> HoldPolicy {
        let half = hits / 2;
        let hot_at = (hits - half).saturating_sub(unseen);
        let share = if hold_ms <= 0 || hot_at == 0 {
            0
        } else {
            half / hosts.max(1)
        };
        HoldPolicy {
            hold_ms: hold_ms.max(0),
            share,
            hot_at,
            mark_ms: 2 * window_ms.max(1),
            fleet,
        }
    }
}

struct Held {
    hits: Vec<Hit>,
    /// Tells this batch from an earlier one of the same key in `order`.
    generation: u64,
    /// The sequence number of the chunk of its first hit.
    seq: u64,
    urgent: bool,
}

/// Hits waiting for a flush.
#[derive(Default)]
pub struct Pending {
    held: HashMap<(usize, IpNet), Held, foldhash::fast::RandomState>,
    /// Batches in the order of their first hit: (rule, key, generation,
    /// deadline ms); deadlines are monotonic. Entries of batches already
    /// taken are skipped when met.
    order: VecDeque<(usize, IpNet, u64, i64)>,
    urgent: Vec<(usize, IpNet, u64)>,
    /// Hot clients per (rule, key), and until when (ms, this clock).
    hot: HashMap<(usize, IpNet), i64, foldhash::fast::RandomState>,
    /// Hot marks this host made and the fleet has not been told yet:
    /// (rule, key, until ms).
    fresh: Vec<(usize, IpNet, i64)>,
    /// False until the fleet's hot marks are known (start, reconnect):
    /// nothing waits meanwhile.
    blind: bool,
    policy: Vec<HoldPolicy>,
    hits: usize,
    generation: u64,
    pruned_at: i64,
}

impl Pending {
    /// One policy per rule index; rules without one are never held.
    pub fn new(policy: Vec<HoldPolicy>) -> Pending {
        Pending {
            policy,
            ..Pending::default()
        }
    }

    /// New policies: rules reloaded (then `remap` gives each old rule index
    /// its new one, if the rule is still there) or the fleet grew. A batch
    /// past its new share becomes urgent.
    pub fn set_policy(&mut self, policy: Vec<HoldPolicy>, remap: Option<&[Option<usize>]>) {
        self.policy = policy;
        if let Some(map) = remap {
            let moved = |r: usize| map.get(r).copied().flatten();
            self.hot = self
                .hot
                .drain()
                .filter_map(|((r, k), u)| Some(((moved(r)?, k), u)))
                .collect();
            self.fresh.retain_mut(|(r, _, _)| match moved(*r) {
                Some(n) => {
                    *r = n;
                    true
                }
                None => false,
            });
        }
        let policy = &self.policy;
        for (&(rule, key), h) in &mut self.held {
            let share = policy.get(rule).map_or(0, |p| p.share);
            if !h.urgent && h.hits.len() > share as usize {
                h.urgent = true;
                self.urgent.push((rule, key, h.generation));
            }
        }
    }

    /// Whether the fleet's hot marks are unknown (nothing waits then).
    pub fn set_blind(&mut self, blind: bool) {
        self.blind = blind;
        if blind {
            for (&(rule, key), h) in &mut self.held {
                if !h.urgent {
                    h.urgent = true;
                    self.urgent.push((rule, key, h.generation));
                }
            }
        }
    }

    fn policy(&self, rule: usize) -> HoldPolicy {
        self.policy.get(rule).copied().unwrap_or(HoldPolicy::NONE)
    }

    /// Queues a hit read from chunk `seq` at `now_ms`.
    pub fn push(&mut self, rule: usize, key: IpNet, hit: Hit, seq: u64, now_ms: i64) {
        let p = self.policy(rule);
        self.hits += 1;
        let held = match self.held.entry((rule, key)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.generation += 1;
                self.order.push_back((rule, key, self.generation, now_ms + p.hold_ms));
                // Blind, or hot: the batch goes with the next flush.
                let urgent = self.blind || self.hot.get(&(rule, key)).is_some_and(|&until| until > now_ms);
                if urgent {
                    self.urgent.push((rule, key, self.generation));
                }
                e.insert(Held {
                    hits: Vec::with_capacity(4),
                    generation: self.generation,
                    seq,
                    urgent,
                })
            }
        };
        held.hits.push(hit);
        if !held.urgent && held.hits.len() > p.share as usize {
            held.urgent = true;
            self.urgent.push((rule, key, held.generation));
        }
    }

    pub fn hits(&self) -> usize {
        self.hits
    }

    pub fn is_empty(&self) -> bool {
        self.hits == 0
    }

    /// Batches to send at `now_ms`: the urgent ones and those whose hold is
    /// over (every one if `all`), in the order of their first hit, but none
    /// whose key `busy` says is still in a round trip (they stay, in order).
    pub fn take_ready(&mut self, now_ms: i64, all: bool, busy: impl Fn(&IpNet) -> bool) -> Vec<Batch> {
        let mut taken: Vec<(u64, Batch)> = Vec::with_capacity(self.urgent.len());
        let mut urgent = std::mem::take(&mut self.urgent);
        urgent.retain(|&(rule, key, generation)| {
            if !self.is_live(rule, key, generation) {
                return false;
            }
            if busy(&key) {
                return true;
            }
            taken.extend(self.take_one(rule, key, generation));
            false
        });
        self.urgent = urgent;
        while let Some(&(rule, key, generation, deadline)) = self.order.front() {
            let live = self.is_live(rule, key, generation);
            if live && (deadline > now_ms && !all || busy(&key)) {
                break;
            }
            self.order.pop_front();
            taken.extend(self.take_one(rule, key, generation));
        }
        taken.sort_unstable_by_key(|(generation, _)| *generation);
        taken.into_iter().map(|(_, b)| b).collect()
    }

    /// Hits that [`Pending::take_ready`] would give at `now_ms`, counted up
    /// to `enough` (a cheap look, not a take).
    pub fn ready_hits(&self, now_ms: i64, enough: usize) -> usize {
        let mut n = 0;
        let len = |rule: usize, key: IpNet| self.held.get(&(rule, key)).map_or(0, |h| h.hits.len());
        for &(rule, key, _) in &self.urgent {
            n += len(rule, key);
            if n >= enough {
                return n;
            }
        }
        for &(rule, key, generation, deadline) in &self.order {
            if deadline > now_ms || n >= enough {
                break;
            }
            // The urgent ones are counted above.
            n += self
                .held
                .get(&(rule, key))
                .filter(|h| h.generation == generation && !h.urgent)
                .map_or(0, |h| h.hits.len());
        }
        n
    }

    /// Every pending batch (stop, reload, a limiter with nothing to gain
    /// from holding), in the order of their first hit.
    pub fn take(&mut self) -> Vec<Batch> {
        self.take_ready(i64::MAX, true, |_| false)
    }

    #[cfg(test)]
    fn take_ready_now(&mut self, now_ms: i64) -> Vec<Batch> {
        self.take_ready(now_ms, false, |_| false)
    }

    fn is_live(&self, rule: usize, key: IpNet, generation: u64) -> bool {
        self.held.get(&(rule, key)).is_some_and(|h| h.generation == generation)
    }

    fn take_one(&mut self, rule: usize, key: IpNet, generation: u64) -> Option<(u64, Batch)> {
        if !self.is_live(rule, key, generation) {
            return None;
        }
        let h = self.held.remove(&(rule, key))?;
        self.hits -= h.hits.len();
        Some((
            h.generation,
            Batch {
                rule,
                key,
                hits: h.hits,
            },
        ))
    }

    /// When the next held batch is due (ms), if any is held.
    pub fn next_deadline(&mut self) -> Option<i64> {
        self.skip_taken();
        self.order.front().map(|o| o.3)
    }

    /// The chunk sequence number of the oldest hit still held: chunks from
    /// it on may not be committed yet.
    pub fn oldest_seq(&mut self) -> Option<u64> {
        self.skip_taken();
        // Batches are created in chunk order: the first live one is the oldest.
        let &(rule, key, _, _) = self.order.front()?;
        self.held.get(&(rule, key)).map(|h| h.seq)
    }

    fn skip_taken(&mut self) {
        while let Some(&(rule, key, generation, _)) = self.order.front() {
            if self.is_live(rule, key, generation) {
                break;
            }
            self.order.pop_front();
        }
    }

    /// What the limiter reported for a batch: `count` after it (under the
    /// limit), or None (over: the address is being banned). A count of
    /// `hot_at` or more marks the client hot for `mark_ms`; a mark made or
    /// renewed past half its life is also for the fleet ([`Pending::take_fresh`]).
    pub fn learn(&mut self, rule: usize, key: IpNet, count: Option<u32>, now_ms: i64) {
        if now_ms - self.pruned_at >= 10_000 {
            self.pruned_at = now_ms;
            self.release(now_ms);
        }
        let p = self.policy(rule);
        let Some(count) = count else { return };
        if p.share == 0 || count < p.hot_at {
            return;
        }
        let until = now_ms + p.mark_ms;
        let mark = self.hot.entry((rule, key)).or_insert(i64::MIN);
        if mark.saturating_sub(now_ms) < p.mark_ms / 2 {
            *mark = until;
            if p.fleet {
                self.fresh.push((rule, key, until));
            }
        }
        // Hits read while this round trip was out go at once too.
        self.hurry(rule, key);
    }

    /// The batch of (rule, key) held here, if any, goes with the next flush.
    fn hurry(&mut self, rule: usize, key: IpNet) {
        if let Some(h) = self.held.get_mut(&(rule, key)) {
            if !h.urgent {
                h.urgent = true;
                self.urgent.push((rule, key, h.generation));
            }
        }
    }

    /// Another host found (rule, key) hot until `until_ms` (this clock): its
    /// batch here, if any, goes with the next flush, and so does every hit
    /// of it until then.
    pub fn mark_hot(&mut self, rule: usize, key: IpNet, until_ms: i64) {
        let mark = self.hot.entry((rule, key)).or_insert(i64::MIN);
        *mark = (*mark).max(until_ms);
        self.hurry(rule, key);
    }

    /// The hot marks made here since the last call, for the fleet.
    pub fn take_fresh(&mut self) -> Vec<(usize, IpNet, i64)> {
        std::mem::take(&mut self.fresh)
    }

    /// Forgets the hot marks that ended and gives back the spare room a
    /// burst left in the tables: every 10 s while learning, and when the
    /// pipeline is idle. True if room was given back (worth a `malloc_trim`).
    pub fn release(&mut self, now_ms: i64) -> bool {
        self.hot.retain(|_, until| *until > now_ms);
        let room = |p: &Pending| p.hot.capacity() + p.held.capacity() + p.order.capacity();
        let before = room(self);
        shrink_map(&mut self.hot);
        shrink_map(&mut self.held);
        if self.order.capacity() > 4 * self.order.len().max(1024) {
            self.order.shrink_to(2 * self.order.len());
        }
        room(self) < before
    }

    /// How many (rule, key) are marked hot (tests).
    pub fn hot(&self) -> usize {
        self.hot.len()
    }
}

fn shrink_map<K: Eq + std::hash::Hash, V>(m: &mut HashMap<K, V, foldhash::fast::RandomState>) {
    if m.capacity() > 4 * m.len().max(1024) {
        m.shrink_to(2 * m.len());
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn hit(t: i64) -> Hit {
        Hit::of_line(t, 1, t as u64)
    }

    /// One rule of `limit` over `hosts` hosts, and `times` pushed for one
    /// address at 0 ms, the address.
    fn held(limit: u32, hosts: u32, times: impl IntoIterator<Item = i64>) -> (Pending, IpNet) {
        let mut p = Pending::new(vec![HoldPolicy::new(1000, limit, 0, 60_000, hosts, true)]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        for t in times {
            p.push(0, a, hit(t), 1, 0);
        }
        (p, a)
    }

    #[test]
    fn groups_per_rule_and_key_in_order() {
        let mut p = Pending::default();
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        for (i, (rule, key)) in [(0, a), (0, b), (1, a), (0, a)].into_iter().enumerate() {
            p.push(rule, key, hit(i as i64), 0, 0);
        }
        assert_eq!(p.hits(), 4);
        let bs = p.take_ready_now(0);
        assert_eq!(bs.len(), 3);
        assert_eq!(bs[0].hits.iter().map(|h| h.time_ms).collect::<Vec<_>>(), vec![0, 3]);
        assert_eq!((bs[1].key, bs[2].rule), (b, 1));
        assert!(p.is_empty());
    }

    #[test]
    fn a_cold_client_waits_within_its_share_and_goes_one_hit_past_it() {
        // Limit 10 on one host: a share of 5, hot at 5.
        let mut p = Pending::new(vec![HoldPolicy::new(1000, 10, 0, 60_000, 1, true)]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        for t in 0..5 {
            p.push(0, a, hit(t), 1, 100);
        }
        p.push(0, b, hit(0), 2, 200);
        assert!(
            p.take_ready_now(500).is_empty(),
            "5 of 10 kept: the fleet's count stays below 10"
        );
        assert_eq!(p.next_deadline(), Some(1100));
        assert_eq!(p.oldest_seq(), Some(1));
        // A sixth hit is past the share: `a` goes; `b` keeps waiting.
        p.push(0, a, hit(5), 3, 600);
        let out = p.take_ready_now(600);
        assert_eq!((out.len(), out[0].key, out[0].hits.len()), (1, a, 6));
        assert_eq!(p.oldest_seq(), Some(2));
        assert_eq!(p.next_deadline(), Some(1200));
        // Past its hold, a cold batch goes anyway (bookkeeping, not a decision).
        assert!(p.take_ready_now(1199).is_empty());
        assert_eq!(p.take_ready_now(1200).len(), 1);
        assert!(p.is_empty());
        assert_eq!((p.oldest_seq(), p.next_deadline()), (None, None));
    }

    #[test]
    fn a_count_at_half_the_limit_makes_the_client_hot_and_tells_the_fleet_twice_a_mark() {
        let mut p = Pending::new(vec![
            HoldPolicy::new(1000, 10, 0, 60_000, 1, true),
            HoldPolicy::new(1000, 10, 0, 60_000, 1, false),
        ]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        p.learn(0, a, Some(4), 0);
        assert_eq!((p.hot(), p.take_fresh()), (0, vec![]), "4 of 10 is cold");
        p.learn(0, a, Some(5), 10);
        assert_eq!(p.take_fresh(), vec![(0, a, 120_010)], "marked for two windows");
        p.push(0, a, hit(0), 1, 20);
        assert_eq!(p.take_ready_now(20).len(), 1, "a hot client's first hit goes at once");
        p.learn(0, a, Some(6), 30);
        assert!(p.take_fresh().is_empty(), "a fresh mark is not published again");
        // Hits read while the round trip that finds the client hot is out.
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        p.push(0, b, hit(0), 1, 40);
        assert!(p.take_ready_now(40).is_empty());
        p.learn(0, b, Some(5), 41);
        assert_eq!(p.take_ready_now(41).len(), 1, "b's kept hit goes once b is found hot");
        p.take_fresh();
        p.learn(0, a, Some(6), 60_011);
        assert_eq!(
            p.take_fresh(),
            vec![(0, a, 180_011)],
            "past half its life it is renewed"
        );
        // `scope: host` marks stay here.
        p.learn(1, a, Some(9), 0);
        assert!(p.take_fresh().is_empty());
        p.push(1, a, hit(0), 1, 1);
        assert_eq!(p.take_ready_now(1).len(), 1);
        // Marks end: forgotten.
        p.release(200_000);
        assert_eq!(p.hot(), 0);
        p.push(0, a, hit(1), 2, 200_000);
        assert!(p.take_ready_now(200_000).is_empty());
    }

    #[test]
    fn a_mark_from_the_fleet_sends_the_batch_held_here_at_once() {
        let (mut p, a) = held(20, 3, 0..3);
        assert!(p.take_ready_now(0).is_empty(), "3 of a share of 3");
        p.mark_hot(0, a, 60_000);
        assert_eq!(p.take_ready_now(1)[0].hits.len(), 3);
        p.push(0, a, hit(4), 2, 2);
        assert_eq!(p.take_ready_now(2).len(), 1, "and every hit after it");
        assert!(p.take_fresh().is_empty(), "another host's mark is not published again");
    }

    #[test]
    fn blind_nothing_waits_and_a_larger_fleet_shrinks_each_share() {
        let policy = |hosts| vec![HoldPolicy::new(1000, 20, 0, 60_000, hosts, true)];
        let mut p = Pending::new(policy(1));
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        for t in 0..4 {
            p.push(0, a, hit(t), 1, 0);
        }
        p.push(0, b, hit(0), 1, 0);
        assert!(p.take_ready_now(0).is_empty(), "within a share of 10");
        p.set_policy(policy(3), None);
        let out = p.take_ready_now(0);
        assert_eq!((out.len(), out[0].key), (1, a), "4 is past a share of 3; b's 1 is not");
        p.set_blind(true);
        assert_eq!(p.take_ready_now(0)[0].key, b, "blind: what was kept goes");
        p.push(0, b, hit(1), 2, 0);
        assert_eq!(p.take_ready_now(0).len(), 1, "blind: nothing is kept");
        p.set_blind(false);
        p.push(0, b, hit(2), 3, 0);
        assert!(p.take_ready_now(0).is_empty());
    }

    #[test]
    fn a_key_taken_and_queued_again_keeps_its_own_deadline() {
        let (mut p, a) = held(4, 1, [0; 3]);
        assert_eq!(p.take_ready_now(10).len(), 1, "3 is past a share of 2");
        p.push(0, a, hit(2), 2, 500);
        // The stale entry (deadline 1000) must not release the new batch.
        assert!(p.take_ready_now(1200).is_empty());
        assert_eq!(p.take_ready_now(1500).len(), 1);
    }

    #[test]
    fn reloaded_rules_keep_their_marks_by_index() {
        let one = HoldPolicy::new(1000, 10, 0, 60_000, 1, true);
        let mut p = Pending::new(vec![one, one]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        p.learn(1, a, Some(5), 0);
        // Rule 1 is now rule 0; rule 0 is gone.
        p.set_policy(vec![one], Some(&[None, Some(0)]));
        p.push(0, a, hit(0), 1, 1);
        assert_eq!(p.take_ready_now(1).len(), 1, "still hot under its new index");
        assert_eq!(p.take_fresh(), vec![(0, a, 120_000)]);
    }

    #[test]
    fn a_key_in_a_round_trip_stays_pending_in_order_until_it_lands() {
        let mut p = Pending::default();
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        p.push(0, a, hit(0), 1, 0);
        p.push(0, b, hit(1), 1, 0);
        p.push(1, a, hit(2), 2, 0);
        let out = p.take_ready(0, false, |k| *k == a);
        assert_eq!(out.iter().map(|b| b.key).collect::<Vec<_>>(), vec![b]);
        assert_eq!(
            (p.hits(), p.oldest_seq()),
            (2, Some(1)),
            "a's batches wait, the oldest chunk with them"
        );
        assert_eq!(p.ready_hits(0, 100), 2);
        p.push(0, a, hit(3), 3, 0);
        let out = p.take_ready(0, true, |_| false);
        let got: Vec<(usize, Vec<i64>)> = out
            .iter()
            .map(|b| (b.rule, b.hits.iter().map(|h| h.time_ms).collect()))
            .collect();
        assert_eq!(
            got,
            vec![(0, vec![0, 3]), (1, vec![2])],
            "in the order of their first hit, each whole"
        );
    }

    #[test]
    fn a_prefilter_or_no_hold_leaves_no_share() {
        let share = |hold, hits, unseen, hosts| HoldPolicy::new(hold, hits, unseen, 1, hosts, true).share;
        assert_eq!(share(1000, 100, 0, 1), 50);
        assert_eq!(share(1000, 100, 0, 3), 16);
        assert_eq!(HoldPolicy::new(1000, 100, 40, 1, 1, true).hot_at, 10);
        assert_eq!(
            share(1000, 100, 2 * 80, 1),
            0,
            "reported counts may miss more than half"
        );
        assert_eq!(share(1000, 1, 0, 1), 0);
        assert_eq!(share(0, 100, 0, 1), 0);
    }

    /// The invariant the share rests on, for every limit, fleet size and
    /// prefilter: a client not yet hot has a reported count of at most
    /// hot_at - 1, so a true count of at most hot_at - 1 + unseen; with every
    /// host keeping at most its share, the fleet's count is below the limit.
    #[test]
    fn while_a_client_is_cold_the_fleet_cannot_reach_its_limit() {
        for hits in 1..=300u32 {
            for hosts in 1..=12u32 {
                for unseen in [0, 1, 2, 7, hits / 4, hits / 2, hits] {
                    let p = HoldPolicy::new(1000, hits, unseen, 1, hosts, true);
                    if p.share == 0 {
                        continue;
                    }
                    let worst = u64::from(p.hot_at - 1 + unseen) + u64::from(hosts) * u64::from(p.share);
                    assert!(
                        worst < u64::from(hits),
                        "hits {hits}, hosts {hosts}, unseen {unseen}: {worst}"
                    );
                }
            }
        }
    }
}
