//! [`Decisions`]: what the endpoint answers from, asked once per check and
//! never Redis: the view of the ban list, the blocklists' networks and this
//! host's never-banned set, the same three inputs the enforcer puts into
//! nft, and `verdict::verdict` over them, so a check is denied exactly when
//! the kernel would drop the address. The view of the list is the ban
//! owner's own ([`SharedView`]: the list the first sync applied, then this
//! host's decisions and the fleet's events and reconciles, as the pipeline
//! takes them), held once however long the list; [`follow`] takes each new
//! blocklist and never-banned set. The writer holds the view's lock only to
//! add or remove a few entries or to swap in a view built beside it, so a
//! check never waits for a large rebuild.

use std::net::IpAddr;
use std::sync::{Arc, RwLock};

use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

use crate::bans::SharedView;
use crate::enforce::Until;
use crate::verdict::{self, NetRanges, NeverBanned, Verdict};

#[derive(Default)]
struct Sets {
    /// The blocklists' networks, as the enforcer loads them.
    blocks: Arc<NetRanges>,
    /// Never denied.
    never: Arc<NeverBanned>,
}

#[derive(Default)]
pub struct Decisions {
    /// Who is banned until when (the ban owner's view).
    bans: SharedView,
    sets: RwLock<Sets>,
}

impl Decisions {
    pub fn new(bans: SharedView, never: Arc<NeverBanned>) -> Decisions {
        Decisions {
            bans,
            sets: RwLock::new(Sets {
                never,
                ..Sets::default()
            }),
        }
    }

    /// What is enforced for `addr` at `now_ms`: the end of the ban in force
    /// covering it, or `()` for a blocklist's network.
    pub fn verdict(&self, addr: IpAddr, now_ms: i64) -> Verdict<Until, ()> {
        let sets = self.sets();
        verdict::verdict(
            addr,
            &sets.never,
            |a| self.bans.read().covering(a).filter(|&u| u > Until::At(now_ms)),
            |a| sets.blocks.contains(a).then_some(()),
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
        self.bans.read().len()
    }

    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    fn sets(&self) -> std::sync::RwLockReadGuard<'_, Sets> {
        self.sets.read().unwrap_or_else(|e| e.into_inner())
    }

    fn sets_mut(&self) -> std::sync::RwLockWriteGuard<'_, Sets> {
        self.sets.write().unwrap_or_else(|e| e.into_inner())
    }
}

/// Keeps `decisions` equal to the blocklists and never-banned set the
/// enforcer holds, until `shutdown`.
pub async fn follow(
    decisions: Arc<Decisions>,
    mut never: watch::Receiver<Arc<NeverBanned>>,
    mut blocks: watch::Receiver<Arc<Vec<ipnet::IpNet>>>,
    shutdown: CancellationToken,
) {
    // The blocklists as they are now, then each change.
    blocks.mark_changed();
    loop {
        tokio::select! {
            Ok(()) = never.changed() => {
                let set = never.borrow_and_update().clone();
                decisions.sets_mut().never = set;
            }
            Ok(()) = blocks.changed() => {
                let nets = blocks.borrow_and_update().clone();
                let built = tokio::task::spawn_blocking(move || Arc::new(NetRanges::new(&nets)));
                if let Ok(ranges) = built.await {
                    let old = std::mem::replace(&mut decisions.sets_mut().blocks, ranges);
                    drop(old);
                }
            }
            _ = shutdown.cancelled() => return,
            else => return,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bans::BanCache;
    use std::time::Duration;

    use crate::addr::at;

    fn shared(view: BanCache) -> SharedView {
        let s = SharedView::default();
        drop(s.swap(view));
        s
    }

    #[test]
    fn ended_bans_do_not_deny() {
        let mut view = BanCache::default();
        view.insert("192.0.2.1/32".parse().unwrap(), Until::At(1_000));
        view.insert("192.0.2.2/32".parse().unwrap(), Until::Permanent);
        let d = Decisions::new(shared(view), Arc::default());
        assert_eq!(d.denied_until(at("192.0.2.1"), 999), Some(Until::At(1_000)));
        assert_eq!(d.denied_until(at("192.0.2.1"), 1_000), None);
        assert_eq!(d.denied_until(at("192.0.2.2"), i64::MAX), Some(Until::Permanent));
        assert_eq!(d.denied_until(at("192.0.2.3"), 0), None);
    }

    #[tokio::test]
    async fn follows_the_shared_view_blocklists_and_the_never_banned_set() {
        let never = NeverBanned::only(&["10.0.0.0/8".parse().unwrap(), "198.51.100.10/32".parse().unwrap()]);
        let (never_tx, never_rx) = watch::channel(Arc::new(never));
        let (blocks_tx, blocks_rx) = watch::channel(Arc::new(vec!["203.0.113.0/24".parse().unwrap()]));
        let view = SharedView::default();
        let d = Arc::new(Decisions::new(view.clone(), never_tx.borrow().clone()));
        let token = CancellationToken::new();
        let task = tokio::spawn(follow(d.clone(), never_rx, blocks_rx, token.clone()));
        let p = Until::Permanent;
        // The writer's changes are the endpoint's at once: one view.
        view.write().insert("192.0.2.1/32".parse().unwrap(), p);
        assert!(d.denied_until(at("192.0.2.1"), 0).is_some());
        drop(view.swap(BanCache::built([
            ("198.51.100.0/24".parse().unwrap(), p),
            ("10.0.0.0/16".parse().unwrap(), p),
        ])));
        assert!(d.denied_until(at("192.0.2.1"), 0).is_none(), "replaced");
        for _ in 0..500 {
            if d.denied_until(at("203.0.113.7"), 0).is_some() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
        assert!(d.denied_until(at("198.51.100.77"), 0).is_some());
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
        assert_eq!(d.len(), 2);
        token.cancel();
        tokio::time::timeout(Duration::from_secs(5), task)
            .await
            .unwrap()
            .unwrap();
    }
}
