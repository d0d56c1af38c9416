//! The pipeline's round trips: what is ready goes to the limiter as a
//! round trip in flight (at most two, landing in order, no key in both)
//! while the next chunks are read; what lands is applied in log order and
//! the offsets behind it committed.

use super::*;

impl Pipeline {
    /// Sends what is ready (everything if `all`) to the limiter, bans what
    /// went over, commits the offsets of chunks with nothing pending; again
    /// while hits were held back for the bans of the one before. False if
    /// asked to stop meanwhile (nothing committed: those lines are read
    /// again next start).
    pub(super) async fn flush(&mut self, shutdown: &CancellationToken, all: bool) -> bool {
        loop {
            let Some(batches) = self.ready(all) else {
                self.commit();
                return true;
            };
            // Being decided: neither kept nor in flight, but not decided yet.
            let hits: usize = batches.iter().map(|b| b.hits.len()).sum();
            self.stats.inflight_hits.store(hits as u64, Relaxed);
            let decided = self.limiter.decide(&batches, shutdown).await;
            self.publish_inflight();
            let Some(verdicts) = decided else {
                return false;
            };
            self.apply(&batches, verdicts).await;
            if self.order.held() == 0 {
                return true;
            }
        }
    }

    /// With Redis up: takes what is ready and starts its round trip without
    /// waiting for it, so that the next chunks are parsed while Redis works
    /// ([`Pipeline::land`] takes the answer). Otherwise a plain flush.
    pub(super) async fn launch_or_flush(&mut self, shutdown: &CancellationToken) -> bool {
        if self.limiter.flight().is_none() {
            let all = std::mem::take(&mut self.drain);
            return self.flush(shutdown, all).await;
        }
        if !self.launch() {
            self.commit();
        }
        true
    }

    /// Starts a round trip with what is ready and whose keys are in no
    /// round trip still, if Redis answers; false if none started.
    pub(super) fn launch(&mut self) -> bool {
        let Some(flight) = self.limiter.flight() else {
            return false;
        };
        let oldest_seq = self.oldest_seq().unwrap_or(u64::MAX);
        let all = std::mem::take(&mut self.drain);
        let Some(batches) = self.ready(all) else {
            return false;
        };
        let risks = self.order.risks_of(&batches);
        // Keys of a round trip still out stayed: they go with the next one.
        self.drain = all && self.limiter.pending_hits() > 0;
        let hits: usize = batches.iter().map(|b| b.hits.len()).sum();
        let keys = batches.iter().map(|b| b.key).collect();
        self.inflight.push_back(InFlight {
            handle: tokio::spawn(flight.run(batches)),
            keys,
            oldest_seq,
            hits,
            risks,
        });
        self.publish_inflight();
        true
    }

    pub(super) fn publish_inflight(&self) {
        let hits: usize = self.inflight.iter().map(|f| f.hits).sum();
        self.stats.inflight_hits.store(hits as u64, Relaxed);
    }

    /// The answer of the round trip in flight: bans and commits as a flush
    /// does. False if asked to stop meanwhile.
    pub(super) async fn land(
        &mut self,
        landed: Result<Landed, tokio::task::JoinError>,
        shutdown: &CancellationToken,
    ) -> bool {
        let landed = match landed {
            Ok(l) => l,
            Err(e) => {
                // Only a panic gets here; those lines stay uncommitted.
                tracing::error!(error = %e, "A limiter round trip failed; its hits are read again at the next start.");
                return true;
            }
        };
        // What the answer left undecided may be decided now, at length:
        // still counted as in flight until then.
        let out: usize = self.inflight.iter().map(|f| f.hits).sum();
        self.stats.inflight_hits.store((out + landed.hits()) as u64, Relaxed);
        let decided = self.limiter.land(landed, shutdown).await;
        self.publish_inflight();
        let Some((batches, verdicts)) = decided else {
            return false;
        };
        self.apply(&batches, verdicts).await;
        true
    }

    /// Waits for the round trips in flight, if any, and applies their answers.
    pub(super) async fn land_inflight(&mut self, shutdown: &CancellationToken) -> bool {
        while let Some(f) = self.inflight.pop_front() {
            let landed = f.handle.await;
            if !self.land(landed, shutdown).await {
                return false;
            }
        }
        true
    }

    /// The chunk sequence number of the oldest hit pending or held back.
    pub(super) fn oldest_seq(&mut self) -> Option<u64> {
        let pending = self.limiter.oldest_seq();
        match (pending, self.order.oldest_seq()) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }

    /// The batches to send now (all of them if `all`, or when too many
    /// wait), the hits held back for the round trip before first, without
    /// the hits of addresses banned before them in the log, and without
    /// what a ban of another batch in it may cover (held back for the next
    /// one, `Order::cut`); None if there are none.
    pub(super) fn ready(&mut self, all: bool) -> Option<Vec<Batch>> {
        if self.limiter.pending_hits() == 0 && self.order.held() == 0 {
            return None;
        }
        let all = all || self.limiter.pending_hits() >= MAX_HELD_HITS;
        let floor = self.oldest_seq();
        let inflight = &self.inflight;
        let busy = |key: &IpNet| inflight.iter().any(|f| f.keys.contains(key));
        let taken = self.limiter.take(all, busy);
        let mut trip = self.order.gather(taken, busy);
        trip.seq = floor;
        // A hit that waited may belong to an address banned meanwhile (by
        // another rule, or by the fleet): not counted, as at ingest, unless
        // the ban came after it in the log.
        for (b, addrs) in trip.batches.iter_mut().zip(trip.addrs.iter_mut()) {
            let (rule, key) = (b.rule, b.key);
            if addrs.is_empty() {
                let Some(until) = self.bans.until(&key) else { continue };
                let order = &mut self.order;
                b.hits
                    .retain(|h| until <= Until::At(h.time_ms) || order.spares(&key, rule, h));
                continue;
            }
            let mut keep = Vec::with_capacity(b.hits.len());
            for (h, a) in b.hits.iter().zip(addrs.iter()) {
                let banned = self.bans.until(a).is_some_and(|u| Until::At(h.time_ms) < u);
                keep.push(!banned || self.order.spares(a, rule, h));
            }
            let mut k = keep.iter();
            b.hits.retain(|_| *k.next().unwrap_or(&true));
            let mut k = keep.iter();
            addrs.retain(|_| *k.next().unwrap_or(&true));
        }
        trip.retain_nonempty();
        let out: Vec<(IpNet, Pos)> = self.inflight.iter().flat_map(|f| f.risks.iter().copied()).collect();
        self.order.cut(&mut trip, &out);
        (!trip.batches.is_empty()).then_some(trip.batches)
    }
}

/// The answer of the oldest round trip in flight; never, if none is.
pub(super) async fn join_front(f: &mut VecDeque<InFlight>) -> Result<Landed, tokio::task::JoinError> {
    match f.front_mut() {
        Some(f) => (&mut f.handle).await,
        None => std::future::pending().await,
    }
}
