//! [`Decisions`]: what the endpoint answers from, asked once per check and
//! never Redis: the view of the ban list, the blocklists' networks and this
//! host's never-banned set, the same three inputs the enforcer puts into
//! nft, and `verdict::verdict` over them, so a check is denied exactly when
//! the kernel would drop the address. The view starts as the list the first
//! sync applied, then follows the same [`Change`]s the enforcer gets (this
//! host's decisions, the fleet's events and reconciles) in [`follow`], the
//! one writer, which also takes each new blocklist and never-banned set.
//! Readers share a `RwLock`; the writer holds it only to add or remove a few
//! entries or to swap in a view built beside the old one (a reconcile of
//! 100k bans, the periodic sweep of ended bans), so a check never waits for
//! a large rebuild.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};
use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::bans::BanCache;
use crate::enforce::{fold, Change, Until};
use crate::verdict::{self, NetRanges, NeverBanned, Verdict};

/// How often bans that ended are dropped from the view (they never deny:
/// [`Decisions::verdict`] compares their end with now).
const SWEEP_EVERY: Duration = Duration::from_secs(60);

/// Changes folded per update at most, so a flood of single bans still
/// reaches readers in bounded steps.
const MAX_FOLD: usize = 4096;

#[derive(Default)]
struct View {
    /// Who is banned until when; covering lookups by address.
    bans: BanCache,
    /// The blocklists' networks, as the enforcer loads them.
    blocks: Arc<NetRanges>,
    /// Never denied.
    never: Arc<NeverBanned>,
}

#[derive(Default)]
pub struct Decisions {
    view: RwLock<View>,
}

impl Decisions {
    pub fn new(bans: BanCache, never: Arc<NeverBanned>) -> Decisions {
        Decisions {
            view: RwLock::new(View {
                bans,
                never,
                ..View::default()
            }),
        }
    }

    /// What is enforced for `addr` at `now_ms`: the end of the ban in force
    /// covering it, or `()` for a blocklist's network.
    pub fn verdict(&self, addr: IpAddr, now_ms: i64) -> Verdict<Until, ()> {
        let v = self.read();
        verdict::verdict(
            addr,
            &v.never,
            |a| v.bans.covering(a).filter(|&u| u > Until::At(now_ms)),
            |a| v.blocks.contains(a).then_some(()),
        )
    }

    /// Until when a check of `addr` is denied: a ban's end, a blocklist's
    /// network for good; None if it is not.
    pub fn denied_until(&self, addr: IpAddr, now_ms: i64) -> Option<Until> {
        match self.verdict(addr, now_ms) {
            Verdict::Banned(until) => Some(until),
            Verdict::Blocked(()) => Some(Until::Permanent),
            Verdict::Never(_) | Verdict::Open => None,
        }
    }

    /// Entries in the view, ended ones not yet swept included.
    pub fn len(&self) -> usize {
        self.read().bans.len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn read(&self) -> std::sync::RwLockReadGuard<'_, View> {
        self.view.read().unwrap_or_else(|e| e.into_inner())
    }

    fn write(&self) -> std::sync::RwLockWriteGuard<'_, View> {
        self.view.write().unwrap_or_else(|e| e.into_inner())
    }

    /// Puts `new` in place; the old view is returned, to be dropped
    /// outside the lock.
    fn swap(&self, new: BanCache) -> BanCache {
        std::mem::replace(&mut self.write().bans, new)
    }
}

/// Keeps `decisions` equal to the list as the changes on `rx` describe it,
/// and to the blocklists and never-banned set the enforcer holds, until
/// `shutdown` or until every sender is gone.
pub async fn follow(
    decisions: Arc<Decisions>,
    mut rx: UnboundedReceiver<Change>,
    mut never: watch::Receiver<Arc<NeverBanned>>,
    mut blocks: watch::Receiver<Arc<Vec<ipnet::IpNet>>>,
    shutdown: CancellationToken,
) {
    let mut sweep = tokio::time::interval_at(tokio::time::Instant::now() + SWEEP_EVERY, SWEEP_EVERY);
    sweep.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The blocklists as they are now, then each change.
    blocks.mark_changed();
    loop {
        let first = tokio::select! {
            c = rx.recv() => match c { Some(c) => c, None => return },
            _ = sweep.tick() => {
                let (d, now) = (decisions.clone(), crate::now_ms());
                let swept = tokio::task::spawn_blocking(move || {
                    let mut live = d.read().bans.clone();
                    live.expire(now);
                    drop(d.swap(live));
                });
                let _ = swept.await;
                continue;
            }
            Ok(()) = never.changed() => {
                let set = never.borrow_and_update().clone();
                decisions.write().never = set;
                continue;
            }
            Ok(()) = blocks.changed() => {
                let nets = blocks.borrow_and_update().clone();
                let built = tokio::task::spawn_blocking(move || Arc::new(NetRanges::new(&nets)));
                if let Ok(ranges) = built.await {
                    let old = std::mem::replace(&mut decisions.write().blocks, ranges);
                    drop(old);
                }
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
            let d = decisions.clone();
            let built = tokio::task::spawn_blocking(move || {
                let mut view = BanCache::default();
                view.replace(elems.into_iter().map(|e| (e.net, e.until)));
                drop(d.swap(view));
            });
            // The next changes apply on top of this one: wait for it.
            let _ = built.await;
            continue;
        }
        let mut view = decisions.write();
        for n in &folded.removes {
            view.bans.remove(n);
        }
        for e in &folded.adds {
            view.bans.insert(e.net, e.until);
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

    use crate::addr::at;

    #[test]
    fn ended_bans_do_not_deny() {
        let mut view = BanCache::default();
        view.insert("192.0.2.1/32".parse().unwrap(), Until::At(1_000));
        view.insert("192.0.2.2/32".parse().unwrap(), Until::Permanent);
        let d = Decisions::new(view, Arc::default());
        assert_eq!(d.denied_until(at("192.0.2.1"), 999), Some(Until::At(1_000)));
        assert_eq!(d.denied_until(at("192.0.2.1"), 1_000), None);
        assert_eq!(d.denied_until(at("192.0.2.2"), i64::MAX), Some(Until::Permanent));
        assert_eq!(d.denied_until(at("192.0.2.3"), 0), None);
    }

    #[tokio::test]
    async fn follows_bans_blocklists_and_the_never_banned_set() {
        let never = NeverBanned::only(&["10.0.0.0/8".parse().unwrap(), "198.51.100.10/32".parse().unwrap()]);
        let (never_tx, never_rx) = watch::channel(Arc::new(never));
        let (blocks_tx, blocks_rx) = watch::channel(Arc::new(vec!["203.0.113.0/24".parse().unwrap()]));
        let d = Arc::new(Decisions::new(BanCache::default(), never_tx.borrow().clone()));
        let (tx, rx) = tokio::sync::mpsc::unbounded_channel();
        let token = CancellationToken::new();
        let task = tokio::spawn(follow(d.clone(), rx, never_rx, blocks_rx, token.clone()));
        let p = Until::Permanent;
        tx.send(Change::Add(vec![el("192.0.2.1/32", p), el("10.1.2.3/32", p)]))
            .unwrap();
        tx.send(Change::Add(vec![el("2001:db8::/64", p)])).unwrap();
        tx.send(Change::Remove(vec!["192.0.2.1/32".parse().unwrap()])).unwrap();
        tx.send(Change::Replace(vec![el("198.51.100.0/24", p), el("10.0.0.0/16", p)]))
            .unwrap();
        tx.send(Change::Add(vec![el("192.0.2.9/32", p)])).unwrap();
        let settled = |d: &Decisions| d.denied_until(at("192.0.2.9"), 0).is_some();
        for _ in 0..500 {
            if settled(&d) && d.denied_until(at("203.0.113.7"), 0).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(d.denied_until(at("198.51.100.77"), 0).is_some());
        assert!(d.denied_until(at("192.0.2.9"), 0).is_some());
        assert!(d.denied_until(at("2001:db8::1"), 0).is_none(), "replaced");
        // The network ban spares what is never banned inside it.
        assert!(d.denied_until(at("10.0.0.1"), 0).is_none(), "allowed");
        assert!(d.denied_until(at("198.51.100.10"), 0).is_none(), "spared");
        assert!(matches!(d.verdict(at("::ffff:198.51.100.10"), 0), Verdict::Never(_)));
        // A blocklist's network is denied for good.
        assert_eq!(d.denied_until(at("203.0.113.7"), 0), Some(Until::Permanent));
        assert_eq!(d.denied_until(at("::ffff:203.0.113.7"), 0), Some(Until::Permanent));
        // The set changes (an address this host took): never denied from then on.
        never_tx.send_replace(Arc::new(NeverBanned::only(&["203.0.113.7/32".parse().unwrap()])));
        blocks_tx.send_replace(Arc::new(vec!["203.0.113.0/24".parse().unwrap()]));
        for _ in 0..500 {
            if d.denied_until(at("203.0.113.7"), 0).is_none() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(d.denied_until(at("203.0.113.7"), 0).is_none());
        assert!(d.denied_until(at("203.0.113.8"), 0).is_some());
        assert!(d.denied_until(at("198.51.100.10"), 0).is_some(), "no longer spared");
        assert_eq!(d.len(), 3);
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
