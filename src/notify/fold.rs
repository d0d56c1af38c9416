//! One target's queue: bounded (the oldest message goes first, counted),
//! and folding: beyond [`PER_SECOND`] events in a second, bans and unbans
//! are counted into a [`Summary`] sent once per [`SUMMARY_EVERY`] instead
//! of one message each. Pushing takes a short lock and never waits.

use std::collections::{HashMap, VecDeque};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::{Arc, Mutex};

use ipnet::IpNet;

use super::{Event, TargetCounters};

/// Messages a target may have waiting; past it the oldest is dropped.
pub const CAPACITY: usize = 1000;
/// Events a second told one by one; more are folded.
pub const PER_SECOND: u32 = 5;
/// How long a summary gathers before it is sent, ms.
pub const SUMMARY_EVERY: i64 = 10_000;
/// How many rules and networks a summary names.
const TOP: usize = 5;

/// What a target is sent.
#[derive(Clone, Debug, PartialEq)]
pub enum Message {
    Event(Event),
    Summary(Summary),
}

/// Bans and unbans folded over a period.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Summary {
    pub bans: u64,
    pub unbans: u64,
    /// When the first folded event came, and the period's end, unix ms.
    pub from_ms: i64,
    pub to_ms: i64,
    /// Bans per rule, most first (at most five once taken).
    pub rules: Vec<(String, u64)>,
    /// Bans per network (IPv4 /24, IPv6 /48, or the ban's own when wider), most first.
    pub networks: Vec<(IpNet, u64)>,
    /// The host whose bans these are.
    pub host: String,
}

/// A summary being gathered: its counts, bans per rule and per network.
type Folding = (Summary, HashMap<String, u64>, HashMap<IpNet, u64>);

#[derive(Default)]
struct State {
    items: VecDeque<Message>,
    /// The current second (unix ms at its start) and the events told in it.
    second_ms: i64,
    in_second: u32,
    /// Being gathered: the counts and the maps, turned into a [`Summary`] when due.
    folding: Option<Folding>,
}

pub struct Queue {
    state: Mutex<State>,
    /// Wakes the sender when something is pushed.
    pub wake: tokio::sync::Notify,
    counters: Arc<TargetCounters>,
}

impl Queue {
    pub fn new(counters: Arc<TargetCounters>) -> Queue {
        Queue {
            state: Mutex::default(),
            wake: tokio::sync::Notify::new(),
            counters,
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Queues `event` at `now_ms`, or folds it (a ban or unban past
    /// [`PER_SECOND`] this second).
    pub fn push(&self, event: Event, now_ms: i64) {
        let mut s = self.lock();
        if now_ms - s.second_ms >= 1000 {
            s.second_ms = now_ms;
            s.in_second = 0;
        }
        let foldable = matches!(event, Event::Ban(_) | Event::Unban { .. });
        if foldable && s.in_second >= PER_SECOND {
            let (sum, rules, nets) = s.folding.get_or_insert_with(|| {
                (
                    Summary {
                        from_ms: now_ms,
                        ..Default::default()
                    },
                    HashMap::new(),
                    HashMap::new(),
                )
            });
            match event {
                Event::Ban(b) => {
                    sum.bans += 1;
                    sum.host = b.host;
                    *rules.entry(b.rule).or_default() += 1;
                    *nets.entry(crate::addr::ranked_network(&b.addr)).or_default() += 1;
                }
                Event::Unban { host, .. } => {
                    sum.unbans += 1;
                    sum.host = host;
                }
                _ => {}
            }
            self.counters.folded.fetch_add(1, Relaxed);
            drop(s);
            self.wake.notify_one();
            return;
        }
        s.in_second += 1;
        s.items.push_back(Message::Event(event));
        self.bound(&mut s);
        drop(s);
        self.wake.notify_one();
    }

    fn bound(&self, s: &mut State) {
        while s.items.len() > CAPACITY {
            s.items.pop_front();
            self.counters.dropped.fetch_add(1, Relaxed);
        }
        self.counters.queued.store(s.items.len() as u64, Relaxed);
    }

    /// The next message to send at `now_ms`: the oldest queued, else a
    /// summary whose period is over.
    pub fn take(&self, now_ms: i64) -> Option<Message> {
        let mut s = self.lock();
        if let Some(m) = s.items.pop_front() {
            self.counters.queued.store(s.items.len() as u64, Relaxed);
            return Some(m);
        }
        let due = s
            .folding
            .as_ref()
            .is_some_and(|(f, ..)| now_ms - f.from_ms >= SUMMARY_EVERY);
        if !due {
            return None;
        }
        let (mut sum, rules, nets) = s.folding.take()?;
        sum.to_ms = now_ms;
        sum.rules = top(rules);
        sum.networks = top(nets);
        Some(Message::Summary(sum))
    }

    /// When the summary being gathered is due (unix ms), if one is.
    pub fn summary_due(&self) -> Option<i64> {
        self.lock().folding.as_ref().map(|(f, ..)| f.from_ms + SUMMARY_EVERY)
    }
}

/// The most frequent first (ties by key, for a stable text), at most [`TOP`].
fn top<K: Ord>(map: HashMap<K, u64>) -> Vec<(K, u64)> {
    let mut v: Vec<(K, u64)> = map.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
    v.truncate(TOP);
    v
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::notify::BanEvent;

    fn ban(addr: &str, rule: &str) -> Event {
        Event::Ban(BanEvent {
            addr: addr.parse().unwrap(),
            rule: rule.to_owned(),
            reason: String::new(),
            host: "h1".to_owned(),
            hits: 3,
            at_ms: 0,
            until_ms: None,
            network: false,
        })
    }

    #[test]
    fn past_a_few_a_second_bans_fold_into_one_summary_with_top_rules_and_networks() {
        let counters = Arc::new(TargetCounters::default());
        let q = Queue::new(counters.clone());
        for i in 0..1000u32 {
            let rule = if i % 4 == 0 { "login" } else { "scraper" };
            q.push(
                ban(&format!("10.{}.{}.{}/32", i / 256 % 2, i % 3, i % 250), rule),
                1_000 + 2 * i64::from(i),
            );
        }
        // Two seconds: five each told one by one.
        let mut single = 0;
        while let Some(Message::Event(_)) = q.take(2_000) {
            single += 1;
        }
        assert_eq!(single, 2 * PER_SECOND as usize);
        assert_eq!(q.take(5_000), None, "not due yet");
        let Some(Message::Summary(s)) = q.take(12_000) else {
            panic!("a summary is due")
        };
        assert_eq!(s.bans, 1000 - single as u64);
        assert_eq!(counters.folded.load(Relaxed), s.bans);
        assert_eq!(s.rules[0].0, "scraper");
        assert_eq!(s.rules.iter().map(|r| r.1).sum::<u64>(), s.bans);
        assert!(
            s.networks.len() <= TOP && s.networks[0].0.prefix_len() == 24,
            "{:?}",
            s.networks
        );
        assert_eq!(q.take(30_000), None);
    }

    #[test]
    fn a_full_queue_drops_its_oldest_and_counts_them() {
        let counters = Arc::new(TargetCounters::default());
        let q = Queue::new(counters.clone());
        // Valve events never fold: one each.
        for i in 0..(CAPACITY as i64 + 7) {
            q.push(
                Event::Redis {
                    down: true,
                    host: "h".into(),
                    at_ms: i,
                },
                i * 1000,
            );
        }
        assert_eq!(counters.dropped.load(Relaxed), 7);
        let Some(Message::Event(Event::Redis { at_ms, .. })) = q.take(0) else {
            panic!()
        };
        assert_eq!(at_ms, 7, "the oldest went");
    }
}
