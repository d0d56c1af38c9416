//! Bans decided while Redis was down, waiting to be written to the list,
//! and the operators' unbans asked for meanwhile, in the order they came.
//! Bans are enforced here at once (a rule's for its base duration, an
//! operator's for what was asked); the queue writes them when Redis answers
//! again, each with the time it was decided, so their ends do not move.
//! Until then they are also *held*: a reconcile with the fleet's list
//! (which lacks them) keeps them in the set rather than lifting them. An
//! unban is lifted here at once, un-holds the address, and is written
//! after the bans queued before it.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use super::BanRequest;
use crate::enforce::{Element, Until};
use crate::store::Health;

/// Bans decided while Redis was down that wait to be written, at most.
pub const QUEUE_CAP: usize = 10_000;

/// The wait after the list refused a queued ban (Redis answered with an
/// error: OOM, a script error), doubling per refusal up to [`MAX_RETRY`].
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_RETRY: Duration = Duration::from_secs(5);

/// Local bans not yet in the fleet's list; shared with the fleet sync.
pub type Held = Arc<Mutex<Vec<Element>>>;

/// One change waiting for the list.
#[derive(Clone, Debug)]
pub(super) enum Queued {
    /// (request, time decided in ms, local end).
    Ban(BanRequest, i64, Until),
    /// An operator's unban: the network, and the rules (name, window ms)
    /// whose windows of it to delete.
    Unban(ipnet::IpNet, Vec<(String, i64)>),
}

pub(super) struct Queue {
    /// Whether Redis answers, shared with the limiter.
    pub health: Health,
    /// In decision order.
    items: VecDeque<Queued>,
    pub held: Held,
    /// After a refusal, no attempt before this (an outage is `health`'s).
    retry_at: Instant,
    retry: Duration,
}

impl Queue {
    pub fn new(health: Health) -> Queue {
        Queue {
            health,
            items: VecDeque::new(),
            held: Held::default(),
            retry_at: Instant::now(),
            retry: FIRST_RETRY,
        }
    }

    /// Queues a ban for the list and holds it in the set meanwhile; false
    /// if the queue is full (the ban stays enforced here, unwritten).
    pub fn push(&mut self, req: BanRequest, at_ms: i64, until: Until) -> bool {
        if self.items.len() >= QUEUE_CAP {
            return false;
        }
        self.lock_held().push(Element { net: req.addr, until });
        self.items.push_back(Queued::Ban(req, at_ms, until));
        true
    }

    /// Queues an unban for the list, after the bans queued before it; the
    /// address is no longer held. False if the queue is full.
    pub fn push_unban(&mut self, net: ipnet::IpNet, rules: Vec<(String, i64)>) -> bool {
        if self.items.len() >= QUEUE_CAP {
            return false;
        }
        self.lock_held().retain(|e| e.net != net);
        self.items.push_back(Queued::Unban(net, rules));
        true
    }

    pub fn len(&self) -> usize {
        self.items.len()
    }

    /// The oldest queued change, to write now.
    pub fn front(&self) -> Option<&Queued> {
        self.items.front()
    }

    /// The oldest queued change was written (or, a ban, has ended): its
    /// address is no longer held.
    pub fn pop(&mut self) {
        if let Some(Queued::Ban(req, _, _)) = self.items.pop_front() {
            self.lock_held().retain(|e| e.net != req.addr);
        }
    }

    /// When to try again: while Redis is down, or while bans wait.
    pub fn next_attempt(&self) -> Option<Instant> {
        (self.health.is_down() || !self.items.is_empty()).then(|| self.health.next_try().max(self.retry_at))
    }

    /// Whether an attempt is due: Redis not known down (or its retry due),
    /// and no refusal's wait running.
    pub fn due(&self) -> bool {
        self.health.due() && Instant::now() >= self.retry_at
    }

    /// Redis refused a queued ban: the next attempt waits, longer each time.
    pub fn refused(&mut self) {
        self.retry_at = Instant::now() + self.retry;
        self.retry = (self.retry * 2).min(MAX_RETRY);
    }

    /// A queued ban was written: the next refusal waits the least again.
    pub fn written(&mut self) {
        self.retry = FIRST_RETRY;
    }

    /// The records of the bans waiting to be written, as the list will
    /// have them (the time each was decided, its end here).
    pub fn records(&self) -> Vec<super::BanRecord> {
        self.items
            .iter()
            .filter_map(|q| match q {
                Queued::Ban(req, at, until) => Some(req.record(*at, super::list::until_ms(*until), 1)),
                Queued::Unban(..) => None,
            })
            .collect()
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Vec<Element>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Adds the held elements that the list lacks to a reconcile target.
pub fn with_held(mut elems: Vec<Element>, held: &Held, now_ms: i64) -> Vec<Element> {
    let held = held.lock().unwrap_or_else(|e| e.into_inner());
    if held.is_empty() {
        return elems;
    }
    // A set of the list's nets: a scan of the list per held ban was
    // quadratic (an outage's flood of bans against 1,000,000).
    let mut listed: std::collections::HashSet<ipnet::IpNet> = elems.iter().map(|e| e.net).collect();
    for h in held.iter() {
        let live = match h.until {
            Until::At(t) => t > now_ms,
            Until::Permanent => true,
        };
        if live && listed.insert(h.net) {
            elems.push(h.clone());
        }
    }
    elems
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A held ban the list lacks is kept once, however often it is held;
    /// one the list has, or one ended, is not added.
    #[test]
    fn a_reconcile_keeps_each_held_ban_the_list_lacks_once() {
        let e = |s: &str, t: i64| Element {
            net: crate::addr::net(s),
            until: Until::At(t),
        };
        let held: Held = Arc::new(Mutex::new(vec![
            e("192.0.2.1", 50),
            e("192.0.2.2", 50),
            e("192.0.2.2", 60),
            e("192.0.2.3", 5),
        ]));
        let out = with_held(vec![e("192.0.2.1", 40)], &held, 10);
        assert_eq!(out, vec![e("192.0.2.1", 40), e("192.0.2.2", 50)]);
    }

    #[tokio::test(start_paused = true)]
    async fn refusals_wait_longer_each_time_up_to_five_seconds() {
        let mut q = Queue::new(Health::default());
        assert!(q.due());
        let mut waits = Vec::new();
        for _ in 0..8 {
            q.refused();
            assert!(!q.due());
            let wait = q.retry_at - Instant::now();
            waits.push(wait.as_millis());
            tokio::time::advance(wait).await;
            assert!(q.due());
        }
        assert_eq!(waits, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        q.written();
        q.refused();
        assert_eq!((q.retry_at - Instant::now()).as_millis(), 100);
    }
}
