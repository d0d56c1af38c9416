//! Pending hits, grouped per (rule, client key) in arrival order, so that one
//! script call carries every hit of one key and processes them in order.
//!
//! With Redis each script call costs Redis CPU per (rule, key), whatever
//! the number of hits it carries, so a batch of an address far below its
//! limit may be *held* up to `hold` to gather more hits: at 50,000 clients
//! a flush otherwise carries about one hit per address. A batch is urgent,
//! and goes out with the next flush, as soon as its hits plus what the
//! limiter last reported for that (rule, key) reach half the rule's limit:
//! a client near its limit is judged at once, and only a client spread so
//! thin over the fleet that no host sees half its limit waits, at most
//! `hold`. Holding changes when a batch is judged, never how: each batch is
//! still one call that processes its hits in order.

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

/// How long a rule's batches may wait, and when they may not.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct HoldPolicy {
    /// Longest wait of a batch that is not urgent, in ms (0: none waits).
    pub hold_ms: i64,
    /// A batch is urgent when its hits plus the last count reported for its
    /// (rule, key) reach this (half the limit; 1: every batch is urgent).
    pub urgent_at: u32,
    /// How long a reported count stays worth remembering (the rule's window).
    pub window_ms: i64,
}

impl HoldPolicy {
    /// No hold: every batch goes out with the next flush.
    pub const NONE: HoldPolicy = HoldPolicy {
        hold_ms: 0,
        urgent_at: 1,
        window_ms: 0,
    };

    /// `hold_ms` for a rule of limit `hits` whose reported counts leave out
    /// up to `unseen` hits (a prefilter's screened hits: 2 x its threshold).
    pub fn new(hold_ms: i64, hits: u32, unseen: u32, window_ms: i64) -> HoldPolicy {
        HoldPolicy {
            hold_ms: hold_ms.max(0),
            urgent_at: (hits / 2).saturating_sub(unseen).max(1),
            window_ms,
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
    /// Last count the limiter reported per (rule, key), and when.
    known: HashMap<(usize, IpNet), (u32, i64), foldhash::fast::RandomState>,
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

    /// New rules (reload): only called with nothing pending.
    pub fn set_policy(&mut self, policy: Vec<HoldPolicy>) {
        self.policy = policy;
        self.known.clear();
    }

    fn policy(&self, rule: usize) -> HoldPolicy {
        self.policy.get(rule).copied().unwrap_or(HoldPolicy::NONE)
    }

    /// Queues a hit read from chunk `seq` at wall time `now_ms`.
    pub fn push(&mut self, rule: usize, key: IpNet, hit: Hit, seq: u64, now_ms: i64) {
        let p = self.policy(rule);
        self.hits += 1;
        let held = match self.held.entry((rule, key)) {
            std::collections::hash_map::Entry::Occupied(e) => e.into_mut(),
            std::collections::hash_map::Entry::Vacant(e) => {
                self.generation += 1;
                self.order.push_back((rule, key, self.generation, now_ms + p.hold_ms));
                e.insert(Held {
                    hits: Vec::with_capacity(4),
                    generation: self.generation,
                    seq,
                    urgent: false,
                })
            }
        };
        held.hits.push(hit);
        if !held.urgent {
            let known = if p.urgent_at > 1 {
                self.known.get(&(rule, key)).map_or(0, |k| k.0)
            } else {
                0
            };
            if known as usize + held.hits.len() >= p.urgent_at as usize {
                held.urgent = true;
                self.urgent.push((rule, key, held.generation));
            }
        }
    }

    pub fn hits(&self) -> usize {
        self.hits
    }

    pub fn is_empty(&self) -> bool {
        self.hits == 0
    }

    /// Batches to send at `now_ms`: the urgent ones and those whose hold is
    /// over, in the order of their first hit.
    pub fn take_ready(&mut self, now_ms: i64) -> Vec<Batch> {
        let mut taken: Vec<(u64, Batch)> = Vec::with_capacity(self.urgent.len());
        for (rule, key, generation) in std::mem::take(&mut self.urgent) {
            if let Some(b) = self.take_one(rule, key, generation) {
                taken.push(b);
            }
        }
        while let Some(&(rule, key, generation, deadline)) = self.order.front() {
            if deadline > now_ms && self.is_live(rule, key, generation) {
                break;
            }
            self.order.pop_front();
            if let Some(b) = self.take_one(rule, key, generation) {
                taken.push(b);
            }
        }
        taken.sort_unstable_by_key(|(generation, _)| *generation);
        taken.into_iter().map(|(_, b)| b).collect()
    }

    /// Every pending batch (stop, reload, a limiter with nothing to gain
    /// from holding), in the order of their first hit.
    pub fn take(&mut self) -> Vec<Batch> {
        self.urgent.clear();
        let mut out = Vec::with_capacity(self.held.len());
        while let Some((rule, key, generation, _)) = self.order.pop_front() {
            if let Some((_, b)) = self.take_one(rule, key, generation) {
                out.push(b);
            }
        }
        out
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
    /// limit), or None (over: the address is being banned).
    pub fn learn(&mut self, rule: usize, key: IpNet, count: Option<u32>, now_ms: i64) {
        if self.policy(rule).urgent_at <= 1 {
            return;
        }
        match count {
            Some(c) => {
                self.known.insert((rule, key), (c, now_ms));
            }
            None => {
                self.known.remove(&(rule, key));
            }
        }
        if now_ms - self.pruned_at >= 10_000 {
            self.pruned_at = now_ms;
            self.release(now_ms);
        }
    }

    /// Forgets the counts older than their rule's window (they say nothing
    /// any more) and gives back the spare room a burst left in the tables:
    /// every 10 s while learning, and when the pipeline is idle. True if
    /// room was given back (worth a `malloc_trim`).
    pub fn release(&mut self, now_ms: i64) -> bool {
        let policy = &self.policy;
        self.known
            .retain(|(r, _), (_, at)| policy.get(*r).is_some_and(|p| now_ms - *at < p.window_ms));
        let room = |p: &Pending| p.known.capacity() + p.held.capacity() + p.order.capacity();
        let before = room(self);
        shrink_map(&mut self.known);
        shrink_map(&mut self.held);
        if self.order.capacity() > 4 * self.order.len().max(1024) {
            self.order.shrink_to(2 * self.order.len());
        }
        room(self) < before
    }

    /// How many (rule, key) counts are remembered (tests).
    pub fn known(&self) -> usize {
        self.known.len()
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

    #[test]
    fn groups_per_rule_and_key_in_order() {
        let mut p = Pending::default();
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        for (i, (rule, key)) in [(0, a), (0, b), (1, a), (0, a)].into_iter().enumerate() {
            p.push(rule, key, hit(i as i64), 0, 0);
        }
        assert_eq!(p.hits(), 4);
        let bs = p.take_ready(0);
        assert_eq!(bs.len(), 3);
        assert_eq!(bs[0].hits.iter().map(|h| h.time_ms).collect::<Vec<_>>(), vec![0, 3]);
        assert_eq!((bs[1].key, bs[2].rule), (b, 1));
        assert!(p.is_empty());
    }

    #[test]
    fn far_from_the_limit_waits_its_hold_near_it_goes_at_once() {
        // Limit 10: urgent at 5 (hits pending + last reported count).
        let mut p = Pending::new(vec![HoldPolicy::new(1000, 10, 0, 60_000)]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        for t in 0..4 {
            p.push(0, a, hit(t), 1, 100);
        }
        p.push(0, b, hit(0), 2, 200);
        assert!(p.take_ready(500).is_empty(), "4 of 10: held");
        assert_eq!(p.next_deadline(), Some(1100));
        assert_eq!(p.oldest_seq(), Some(1));
        // The fifth hit makes `a` urgent; `b` keeps waiting.
        p.push(0, a, hit(4), 3, 600);
        let out = p.take_ready(600);
        assert_eq!((out.len(), out[0].key, out[0].hits.len()), (1, a, 5));
        assert_eq!(p.oldest_seq(), Some(2));
        assert_eq!(p.next_deadline(), Some(1200));
        // Redis said `b` has 4 already: its next hit is urgent.
        p.learn(0, b, Some(4), 650);
        p.push(0, b, hit(1), 4, 700);
        assert_eq!(p.take_ready(700).len(), 1);
        assert!(p.is_empty());
        assert_eq!((p.oldest_seq(), p.next_deadline()), (None, None));
        // Past its hold, a batch goes however far from the limit.
        p.learn(0, a, None, 800);
        p.push(0, a, hit(9), 5, 900);
        assert!(p.take_ready(1899).is_empty());
        assert_eq!(p.take_ready(1900).len(), 1);
    }

    #[test]
    fn a_key_taken_and_queued_again_keeps_its_own_deadline() {
        let mut p = Pending::new(vec![HoldPolicy::new(1000, 4, 0, 60_000)]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        p.push(0, a, hit(0), 1, 0);
        p.push(0, a, hit(1), 1, 0);
        assert_eq!(p.take_ready(10).len(), 1, "2 of 4 is urgent");
        p.push(0, a, hit(2), 2, 500);
        // The stale entry (deadline 1000) must not release the new batch.
        assert!(p.take_ready(1200).is_empty());
        assert_eq!(p.take_ready(1500).len(), 1);
    }

    #[test]
    fn counts_are_forgotten_after_their_window() {
        let mut p = Pending::new(vec![HoldPolicy::new(1000, 100, 0, 5_000)]);
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        p.learn(0, a, Some(49), 0);
        assert_eq!(p.known(), 1);
        p.push(0, a, hit(0), 0, 1);
        assert_eq!(p.take_ready(1).len(), 1, "49 + 1 reaches 50");
        p.learn(0, b, Some(3), 20_000);
        assert_eq!(p.known(), 1, "a's count, 20 s old in a 5 s window, is gone");
    }

    #[test]
    fn a_prefilter_shortens_the_hold() {
        assert_eq!(HoldPolicy::new(1000, 100, 0, 1).urgent_at, 50);
        assert_eq!(HoldPolicy::new(1000, 100, 2 * 20, 1).urgent_at, 10);
        assert_eq!(HoldPolicy::new(1000, 100, 2 * 80, 1).urgent_at, 1);
        assert_eq!(HoldPolicy::new(1000, 1, 0, 1).urgent_at, 1);
    }
}
