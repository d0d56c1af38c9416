//! The dry-run enforcer: the same bookkeeping and plans as nftables, but
//! each change is logged instead of applied (`fleetban run --dry-run`).

use tracing::info;

use super::block::{BlockApplied, BlockState};
use super::cover::{Book, Plan};
use super::{Element, ReconcileStats, Until};

/// Elements logged one by one per call; the rest are counted.
const LOG_LIMIT: usize = 50;

/// Logs what the nft enforcer would add and remove.
#[derive(Debug, Default)]
pub struct LogEnforcer {
    /// Wanted bans and what a kernel would hold.
    book: Book,
    /// The blocklist, planned as for nft.
    block: BlockState,
}

impl LogEnforcer {
    pub fn new() -> LogEnforcer {
        LogEnforcer::default()
    }

    pub fn init(&mut self, _now_ms: i64) {
        info!("dry run: nftables is not touched; changes are logged");
    }

    pub fn add(&mut self, elems: &[Element], now_ms: i64) {
        self.book.desire(elems, now_ms);
        self.apply(now_ms);
    }

    pub fn remove(&mut self, nets: &[ipnet::IpNet], now_ms: i64) {
        self.book.undesire(nets);
        self.apply(now_ms);
    }

    pub fn update(&mut self, add: &[Element], remove: &[ipnet::IpNet], now_ms: i64) {
        self.book.desire(add, now_ms);
        self.book.undesire(remove);
        self.apply(now_ms);
    }

    pub fn replace_all(&mut self, desired: &[Element], now_ms: i64) -> ReconcileStats {
        let expired = self.book.set_desired(desired, now_ms);
        let mut stats = self.apply(now_ms);
        stats.expired = expired;
        stats.log(None);
        stats
    }

    pub fn tick(&mut self, now_ms: i64) {
        self.apply(now_ms);
    }

    pub fn next_wakeup(&self) -> Option<i64> {
        self.book.wake()
    }

    pub fn flush(&mut self) {
        info!(
            elements = self.book.applied_len(),
            "dry run: would delete the nftables table"
        );
        self.book.clear();
        self.block = BlockState::default();
    }

    pub(super) fn book(&self) -> &Book {
        &self.book
    }

    pub fn set_blocklist(&mut self, nets: &[ipnet::IpNet]) -> BlockApplied {
        let (_, a) = self.block.plan(&super::NftOptions::default(), nets);
        info!(
            full = a.full,
            added = a.added,
            deleted = a.deleted,
            total = a.total,
            "dry run: blocklist sets would change"
        );
        self.block.commit(nets);
        a
    }

    pub fn remove_blocklist(&mut self) {
        info!("dry run: would delete the blocklist chain and sets");
        self.block = BlockState::default();
    }

    pub(super) fn block(&self) -> &BlockState {
        &self.block
    }

    fn apply(&mut self, now_ms: i64) -> ReconcileStats {
        let plan = self.book.plan(now_ms);
        log_plan(&plan, now_ms);
        self.book.commit(&plan);
        plan.stats
    }
}

fn log_plan(plan: &Plan, now_ms: i64) {
    for span in plan.delete.iter().take(LOG_LIMIT) {
        info!(element = %span, "dry run: would delete");
    }
    for (net, until) in plan.add.iter().take(LOG_LIMIT) {
        match until {
            Until::At(t) => info!(element = %net, timeout_ms = t - now_ms, "dry run: would add"),
            Until::Permanent => info!(element = %net, "dry run: would add (permanent)"),
        }
    }
    let more = plan.delete.len().saturating_sub(LOG_LIMIT) + plan.add.len().saturating_sub(LOG_LIMIT);
    if more > 0 {
        info!(more, "dry run: further changes not listed");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_same_bookkeeping() {
        let mut e = LogEnforcer::new();
        let el = |s: &str| Element {
            net: crate::addr::net(s),
            until: Until::At(10_000),
        };
        e.add(&[el("10.0.0.5"), el("10.0.0.0/24"), el("2001:db8::/64")], 0);
        assert_eq!((e.book().applied_len(), e.book().desired_len()), (2, 3));
        e.remove(&[crate::addr::net("10.0.0.0/24")], 1);
        assert_eq!(e.book().applied_len(), 2);
        let stats = e.replace_all(
            &[
                el("192.0.2.1"),
                Element {
                    until: Until::At(5),
                    ..el("192.0.2.2")
                },
            ],
            10,
        );
        assert_eq!((stats.added, stats.removed, stats.expired), (1, 2, 1));
        e.flush();
        assert_eq!(e.book().applied_len(), 0);
    }
}
