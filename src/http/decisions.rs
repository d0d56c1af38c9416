//! [`Decisions`]: the endpoint's view of the ban list, asked once per check
//! and never Redis. It starts as the list the first sync applied, then
//! follows the same [`Change`]s the enforcer gets (this host's decisions,
//! the fleet's events and reconciles) in [`follow`], the one writer. Readers
//! share a `RwLock`; the writer holds it only to add or remove a few
//! entries or to swap in a view built beside the old one (a reconcile of
//! 100k bans, the periodic sweep of ended bans), so a check never waits
//! for a large rebuild.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::bans::BanCache;
use crate::detect::AllowList;
use crate::enforce::{fold, Change, Until};

/// How often bans that ended are dropped from the view (they never deny:
/// [`Decisions::banned_until`] compares their end with now).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Changes folded per update at most, so a flood of single bans still
/// reaches readers in bounded steps.
const MAX_FOLD: usize = 4096;

#[derive(Default)]
pub struct Decisions {
    /// Who is banned until when; covering lookups by address.
    view: RwLock<BanCache>,
}

impl Decisions {
    pub fn new(view: BanCache) -> Decisions {
        Decisions {
            view: RwLock::new(view),
        }
    }

    /// When the ban covering `addr` at `now_ms` ends; None if no ban in
    /// force covers it.
    pub fn banned_until(&self, addr: IpAddr, now_ms: i64) -> Option<Until> {
        let until = self.read().covering(addr)?;
        (until > Until::At(now_ms)).then_some(until)
    }

    /// Entries in the view, ended ones not yet swept included.
    pub fn len(&self) -> usize {
        self.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, BanCache> {
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, BanCache> {
        self.view.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `new` in place; the old view is returned, to be dropped
    /// outside the lock.
    fn swap(&self, new: BanCache) -> BanCache {
        std::mem::replace(&mut *self.write(), new)
    }
}

/// Keeps `decisions` equal to the list as the changes on `rx` describe it,
/// without the allowed addresses (as the enforcer applies it), until
/// `shutdown` or until every sender is gone.
pub async fn follow(
    decisions: Arc<Decisions>,
    mut rx: UnboundedReceiver<Change>,
    allow: AllowList,
    shutdown: CancellationToken,
) {
    let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        let first = tokio::select! {
            c = rx.recv() => match c { Some(c) => c, None => return },
            _ = sweep.tick() => {
                let (d, now) = (decisions.clone(), crate::now_ms());
                let swept = tokio::task::spawn_blocking(move || {
                    let mut live = d.read().clone();
                    live.expire(now);
                    drop(d.swap(live));
                });
                let _ = swept.await;
                continue;
            }
            _ = shutdown.cancelled() => return,
        };
        let mut queue = vec![first];
        while queue.len() < MAX_FOLD {
            match rx.try_recv() {
                Ok(c) => queue.push(c),
                Err(_) => break,
            }
        }
        let folded = fold(queue);
        if let Some(elems) = folded.replace {
            let (d, allow) = (decisions.clone(), allow.clone());
            let built = tokio::task::spawn_blocking(move || {
                let mut view = BanCache::default();
                view.replace(
                    elems
                        .into_iter()
                        .filter(|e| !allow.overlaps(&e.net))
                        .map(|e| (e.net, e.until)),
                );
                drop(d.swap(view));
            });
            // The next changes apply on top of this one: wait for it.
            let _ = built.await;
            continue;
        }
        let mut view = decisions.write();
        for n in &folded.removes {
            view.remove(n);
        }
        for e in folded.adds.iter().filter(|e| !allow.overlaps(&e.net)) {
            view.insert(e.net, e.until);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Element;

    fn el(s: &str, until: Until) -> Element {
        Element {
            net: s.parse().unwrap(),
            until,
        }
    }

    fn at(s: &str) -> IpAddr {
        s.parse().unwrap()
    }

    #[test]
    fn ended_bans_do_not_deny() {
        let mut view = BanCache::default();
        view.insert("192.0.2.1/32".parse().unwrap(), Until::At(1_000));
        view.insert("192.0.2.2/32".parse().unwrap(), Until::Permanent);
        let d = Decisions::new(view);
        assert_eq!(d.banned_until(at("192.0.2.1"), 999), Some(Until::At(1_000)));
        assert_eq!(d.banned_until(at("192.0.2.1"), 1_000), None);
        assert_eq!(d.banned_until(at("192.0.2.2"), i64::MAX), Some(Until::Permanent));
        assert_eq!(d.banned_until(at("192.0.2.3"), 0), None);
    }

    #[tokio::test]
    async fn follows_adds_removes_and_replaces_in_order_without_allowed() {
        let d = Arc::new(Decisions::default());
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let allow = AllowList::new(&["10.0.0.0/8".parse().unwrap()]);
        let token = CancellationToken::new();
        let task = tokio::spawn(follow(d.clone(), rx, allow, token.clone()));
        let p = Until::Permanent;
        tx.send(Change::Add(vec![el("192.0.2.1/32", p), el("10.1.2.3/32", p)]))
            .unwrap();
        tx.send(Change::Add(vec![el("2001:db8::/64", p)])).unwrap();
        tx.send(Change::Remove(vec!["192.0.2.1/32".parse().unwrap()])).unwrap();
        tx.send(Change::Replace(vec![el("198.51.100.0/24", p), el("10.0.0.0/16", p)]))
            .unwrap();
        tx.send(Change::Add(vec![el("192.0.2.9/32", p)])).unwrap();
        drop(tx);
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
        assert!(d.banned_until(at("198.51.100.77"), 0).is_some());
        assert!(d.banned_until(at("192.0.2.9"), 0).is_some());
        assert!(d.banned_until(at("2001:db8::1"), 0).is_none(), "replaced");
        assert!(d.banned_until(at("10.0.0.1"), 0).is_none(), "allowed");
        assert_eq!(d.len(), 2);
    }
}
