//! What a host does while Redis is down or too slow (`redis.on_down`).
//!
//! `local` (default): hits are decided by an in-process [`MemoryLimiter`]
//! whose fleet-wide limits are divided by `fleet_size` (each host takes its
//! share; `scope: host` limits stay whole), bans go to the kernel at once and
//! wait in a bounded queue until Redis answers again, then are written to the
//! list (with their original time, so their expiry does not move). `pause`:
//! nothing is decided; hits are held (reading stops at the backpressure
//! bound) and retried, and bans already known stay enforced.
//!
//! Bans waiting in the queue are also *held*: a reconcile that runs before
//! they reach the list keeps them in the set rather than lifting them.

use std::collections::VecDeque;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use crate::bans::BanRequest;
use crate::config::{OnDown, Scope};
use crate::enforce::{Element, Until};
use crate::limit::{MemoryLimiter, RuleLimit};

/// Bans decided while Redis was down that wait to be written, at most.
pub const QUEUE_CAP: usize = 10_000;

/// Local bans not yet in the fleet's list; shared with the fleet sync.
pub type Held = Arc<Mutex<Vec<Element>>>;

pub struct Outage {
    pub mode: OnDown,
    /// Decides while down (`local` only), limits divided by `fleet_size`.
    pub local: MemoryLimiter,
    down: bool,
    /// While down, Redis is tried again no earlier than this.
    next_try: Instant,
    backoff: Duration,
    /// (request, time decided in ms) in decision order.
    queue: VecDeque<(BanRequest, i64, Until)>,
    pub held: Held,
    /// Bans dropped from a full queue (enforced here, never written to the list).
    pub dropped: u64,
    /// Hosts sharing a `scope: fleet` limit (`redis.fleet_size`).
    fleet_size: u32,
}

/// The fallback limits: a `scope: fleet` limit shared by `fleet_size` hosts
/// becomes ceil(hits / fleet_size) per host (rounded up: the fallback must
/// not ban a client that stays under the fleet's limit on one host by more
/// than rounding).
pub fn local_limits(mut rules: Vec<RuleLimit>, fleet_size: u32) -> Vec<RuleLimit> {
    let n = fleet_size.max(1);
    for r in &mut rules {
        if r.scope == Scope::Fleet && n > 1 {
            let old = r.hits;
            r.hits = r.hits.div_ceil(n).max(1);
            // A token bucket refills n times slower; a prefilter keeps its fraction.
            r.interval_us = r.interval_us.saturating_mul(i64::from(n));
            r.prefilter = (u64::from(r.prefilter) * u64::from(r.hits) / u64::from(old.max(1))) as u32;
        }
    }
    rules
}

impl Outage {
    pub fn new(mode: OnDown, rules: Vec<RuleLimit>, fleet_size: u32) -> Outage {
        Outage {
            mode,
            local: MemoryLimiter::new(local_limits(rules, fleet_size)),
            down: false,
            next_try: Instant::now(),
            backoff: Duration::from_millis(100),
            queue: VecDeque::new(),
            held: Held::default(),
            dropped: 0,
            fleet_size,
        }
    }

    /// New rules (SIGHUP): the fallback's windows are kept by rule name.
    pub fn set_rules(&mut self, rules: Vec<RuleLimit>) {
        self.local.set_rules(local_limits(rules, self.fleet_size));
    }

    pub fn is_down(&self) -> bool {
        self.down
    }

    /// Whether Redis should be tried now (always when up; with backoff when down).
    pub fn due(&self) -> bool {
        !self.down || Instant::now() >= self.next_try
    }

    /// When the next attempt is due, if down or bans wait.
    pub fn next_attempt(&self) -> Option<Instant> {
        (self.down || !self.queue.is_empty()).then_some(self.next_try)
    }

    /// A Redis call failed: down, next try after the backoff. True if this
    /// is the start of an outage.
    pub fn failed(&mut self) -> bool {
        let started = !self.down;
        self.down = true;
        self.next_try = Instant::now() + self.backoff;
        self.backoff = (self.backoff * 2).min(Duration::from_secs(5));
        started
    }

    /// A Redis call succeeded. True if this ends an outage.
    pub fn succeeded(&mut self) -> bool {
        let ended = self.down;
        self.down = false;
        self.backoff = Duration::from_millis(100);
        ended
    }

    /// Queues a ban for the list and holds it in the set meanwhile.
    pub fn queue(&mut self, req: BanRequest, at_ms: i64, until: Until) {
        if self.queue.len() >= QUEUE_CAP {
            self.dropped += 1;
            return;
        }
        self.lock_held().push(Element { net: req.addr, until });
        self.queue.push_back((req, at_ms, until));
    }

    pub fn queued(&self) -> usize {
        self.queue.len()
    }

    /// The oldest queued ban, to write now.
    pub fn front(&self) -> Option<&(BanRequest, i64, Until)> {
        self.queue.front()
    }

    /// The oldest queued ban was written (or expired): no longer held.
    pub fn pop(&mut self) {
        if let Some((req, _, _)) = self.queue.pop_front() {
            self.lock_held().retain(|e| e.net != req.addr);
        }
    }

    fn lock_held(&self) -> std::sync::MutexGuard<'_, Vec<Element>> {
        self.held.lock().unwrap_or_else(|e| e.into_inner())
    }
}

/// Adds the held elements that the list lacks to a reconcile target.
pub fn with_held(mut elems: Vec<Element>, held: &Held, now_ms: i64) -> Vec<Element> {
    let held = held.lock().unwrap_or_else(|e| e.into_inner());
    for h in held.iter() {
        let live = match h.until {
            Until::At(t) => t > now_ms,
            Until::Permanent => true,
        };
        if live && !elems.iter().any(|e| e.net == h.net) {
            elems.push(h.clone());
        }
    }
    elems
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config::Clock;

    fn rule(hits: u32, scope: Scope) -> RuleLimit {
        RuleLimit {
            scope,
            clock: Clock::Log,
            ..RuleLimit::new("r", crate::config::Algorithm::SlidingWindow, hits, 1000)
        }
    }

    #[test]
    fn fleet_limits_are_shared_and_host_limits_kept() {
        let l = local_limits(
            vec![rule(10, Scope::Fleet), rule(10, Scope::Host), rule(1, Scope::Fleet)],
            3,
        );
        assert_eq!(l.iter().map(|r| r.hits).collect::<Vec<_>>(), vec![4, 10, 1]);
        let bucket = RuleLimit {
            interval_us: 200_000,
            prefilter: 0,
            ..rule(20, Scope::Fleet)
        };
        let l = local_limits(
            vec![
                bucket,
                RuleLimit {
                    prefilter: 8,
                    ..rule(10, Scope::Fleet)
                },
            ],
            2,
        );
        assert_eq!((l[0].hits, l[0].interval_us), (10, 400_000));
        assert_eq!((l[1].hits, l[1].prefilter), (5, 4));
    }
}
