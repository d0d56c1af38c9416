//! The endpoint's open connections, at most a fixed number: a connection
//! that would be one too many is never refused nor kept waiting in the
//! backlog; it takes the place of the one quiet the longest (idle since
//! its last answer, or with a request begun longest ago and still not
//! whole), which is closed. nginx's pooled connections, asked all the
//! time, are the last to go; a flood of idle or trickling connections
//! pushes out only itself.
//!
//! Locked at a connection's arrival and departure only: a request moves
//! its connection's place in the order by one atomic store.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use super::HttpCounters;

/// The open connections.
pub(super) struct Table {
    /// By id; locked to admit, evict and remove, never per request.
    open: Mutex<HashMap<u64, Arc<Slot>>>,
    next_id: AtomicU64,
    max: usize,
    /// What [`Slot::since`] counts from.
    epoch: Instant,
    counters: Arc<HttpCounters>,
}

/// One open connection, as the table sees it.
pub(super) struct Slot {
    /// Milliseconds after the table's epoch since which it has been quiet:
    /// its last answer, or the first byte of the request it has not
    /// finished sending. The smallest is evicted first.
    since: AtomicU64,
    /// Cancelled to close it: eviction, or the server's shutdown (a child
    /// of its token).
    pub(super) close: CancellationToken,
    epoch: Instant,
}

impl Slot {
    /// A slot outside any table (a connection served on its own).
    #[cfg(test)]
    pub(super) fn alone(close: CancellationToken) -> Slot {
        Slot {
            since: AtomicU64::new(0),
            close,
            epoch: Instant::now(),
        }
    }

    /// Quiet since `at`.
    pub(super) fn quiet_since(&self, at: Instant) {
        let ms = at.saturating_duration_since(self.epoch).as_millis();
        self.since.store(u64::try_from(ms).unwrap_or(u64::MAX), Relaxed);
    }
}

/// A connection's place in the table; leaving it on drop.
pub(super) struct Lease {
    table: Arc<Table>,
    id: u64,
    pub(super) slot: Arc<Slot>,
}

impl Drop for Lease {
    fn drop(&mut self) {
        let mut open = self.table.lock();
        // Gone already if it was evicted.
        if open.remove(&self.id).is_some() {
            self.table.counters.open.store(open.len() as u64, Relaxed);
        }
    }
}

impl Table {
    pub(super) fn new(max: usize, counters: Arc<HttpCounters>) -> Arc<Table> {
        Arc::new(Table {
            open: Mutex::new(HashMap::with_capacity(max)),
            next_id: AtomicU64::new(0),
            max: max.max(1),
            epoch: Instant::now(),
            counters,
        })
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<u64, Arc<Slot>>> {
        // The map stays consistent whatever panicked while holding it.
        self.open.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// A place for a connection just accepted, closing the one quiet the
    /// longest if the table is full; `shutdown` closes it too.
    pub(super) fn admit(self: &Arc<Table>, shutdown: &CancellationToken) -> Lease {
        let slot = Arc::new(Slot {
            since: AtomicU64::new(0),
            close: shutdown.child_token(),
            epoch: self.epoch,
        });
        slot.quiet_since(Instant::now());
        let id = self.next_id.fetch_add(1, Relaxed);
        let mut open = self.lock();
        if open.len() >= self.max {
            self.evict_oldest(&mut open);
        }
        open.insert(id, slot.clone());
        self.counters.open.store(open.len() as u64, Relaxed);
        drop(open);
        Lease {
            table: self.clone(),
            id,
            slot,
        }
    }

    /// Closes the connection quiet the longest, if any (to free a
    /// descriptor when accept fails for want of one).
    pub(super) fn evict_one(&self) {
        let mut open = self.lock();
        self.evict_oldest(&mut open);
        self.counters.open.store(open.len() as u64, Relaxed);
    }

    fn evict_oldest(&self, open: &mut HashMap<u64, Arc<Slot>>) {
        let oldest = open
            .iter()
            .min_by_key(|(_, s)| s.since.load(Relaxed))
            .map(|(&id, _)| id);
        if let Some(slot) = oldest.and_then(|id| open.remove(&id)) {
            slot.close.cancel();
            self.counters.evicted.fetch_add(1, Relaxed);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn a_full_table_closes_the_one_quiet_the_longest() {
        let counters = Arc::new(HttpCounters::default());
        let table = Table::new(3, counters.clone());
        let shutdown = CancellationToken::new();
        let t0 = Instant::now();
        let leases: Vec<Lease> = (0..3).map(|_| table.admit(&shutdown)).collect();
        // The first one is the busiest: it answered last.
        leases[1].slot.quiet_since(t0 + Duration::from_millis(10));
        leases[2].slot.quiet_since(t0 + Duration::from_millis(20));
        leases[0].slot.quiet_since(t0 + Duration::from_millis(30));
        let fourth = table.admit(&shutdown);
        assert!(leases[1].slot.close.is_cancelled(), "the longest quiet is closed");
        assert!(!leases[0].slot.close.is_cancelled() && !leases[2].slot.close.is_cancelled());
        assert_eq!((counters.open.load(Relaxed), counters.evicted.load(Relaxed)), (3, 1));
        // An evicted connection leaving changes nothing; another one frees its place.
        drop(leases);
        assert_eq!(counters.open.load(Relaxed), 1);
        drop(fourth);
        assert_eq!(counters.open.load(Relaxed), 0);
        // Shutdown closes every connection.
        let l = table.admit(&shutdown);
        shutdown.cancel();
        assert!(l.slot.close.is_cancelled());
    }
}
