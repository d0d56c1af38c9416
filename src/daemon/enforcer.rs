//! The task that owns the firewall: changes from the pipeline (our own
//! bans), the fleet (everyone's) and the control socket queue up here and go
//! to nft folded into one transaction per wake-up (at 100k elements each nft
//! call costs a lot: see ARCHITECTURE.md). Allowed addresses are filtered
//! out here, the last step before the kernel.

use ipnet::IpNet;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use crate::detect::AllowList;
use crate::enforce::{Element, Enforcer};

/// One change to the local set (also used for the pipeline's ban cache).
#[derive(Clone, Debug)]
pub enum Change {
    Add(Vec<Element>),
    Remove(Vec<IpNet>),
    /// The whole list (after a reconcile).
    Replace(Vec<Element>),
}

/// A queue of changes folded into what one nft transaction must do.
#[derive(Default, Debug, PartialEq)]
struct Folded {
    /// A reconcile target, with later adds and removes applied to it.
    replace: Option<Vec<Element>>,
    adds: Vec<Element>,
    removes: Vec<IpNet>,
}

fn fold(queue: Vec<Change>) -> Folded {
    let mut f = Folded::default();
    for c in queue {
        match c {
            Change::Replace(elems) => {
                f = Folded {
                    replace: Some(elems),
                    ..Folded::default()
                };
            }
            Change::Add(elems) => {
                f.removes.retain(|n| !elems.iter().any(|e| e.net == *n));
                match &mut f.replace {
                    Some(r) => {
                        r.retain(|x| !elems.iter().any(|e| e.net == x.net));
                        r.extend(elems);
                    }
                    None => f.adds.extend(elems),
                }
            }
            Change::Remove(nets) => {
                f.adds.retain(|e| !nets.contains(&e.net));
                match &mut f.replace {
                    Some(r) => r.retain(|e| !nets.contains(&e.net)),
                    None => f.removes.extend(nets),
                }
            }
        }
    }
    f
}

pub async fn run(
    mut enforcer: Enforcer,
    mut rx: UnboundedReceiver<Change>,
    allow: AllowList,
    stats: std::sync::Arc<super::stats::Stats>,
    shutdown: CancellationToken,
) {
    let mut warned = 0u32;
    loop {
        let wake = enforcer.next_wakeup().map(|t| {
            let ms = (t - crate::now_ms()).clamp(0, 3_600_000) as u64;
            tokio::time::Instant::now() + std::time::Duration::from_millis(ms)
        });
        let first = tokio::select! {
            c = rx.recv() => match c { Some(c) => Some(c), None => return },
            _ = sleep_until_opt(wake) => None,
            _ = shutdown.cancelled() => return,
        };
        let Some(first) = first else {
            if let Err(e) = enforcer.tick(crate::now_ms()).await {
                tracing::warn!(error = %e, "Firewall upkeep failed; retried at the next change.");
            }
            continue;
        };
        let mut queue = vec![first];
        while let Ok(c) = rx.try_recv() {
            queue.push(c);
        }
        let f = fold(queue);
        let now = crate::now_ms();
        // One line per unban, whoever asked (manual, another host, the fleet's list).
        for net in &f.removes {
            tracing::info!(addr = %crate::addr::AddrText(net), "Unbanned.");
        }
        let started = std::time::Instant::now();
        let result = match f.replace {
            Some(elems) => {
                let r = enforcer
                    .replace_all(&allowed(elems, &allow, &mut warned), now)
                    .await
                    .map(|_| ());
                // A reconcile read and copied the whole list: give it back.
                super::trim_heap();
                r
            }
            None => {
                enforcer
                    .update(&allowed(f.adds, &allow, &mut warned), &f.removes, now)
                    .await
            }
        };
        stats.timings.nft_apply.observe(started.elapsed().as_secs_f64());
        if let Err(e) = result {
            tracing::warn!(error = %e, "Applying bans to the firewall failed; the next reconcile retries.");
        }
    }
}

async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

fn allowed(elems: Vec<Element>, allow: &AllowList, warned: &mut u32) -> Vec<Element> {
    elems
        .into_iter()
        .filter(|e| {
            let ok = !allow.overlaps(&e.net);
            if !ok && *warned < 20 {
                *warned += 1;
                tracing::warn!(addr = %e.net, "Ban of an allowed address (loopback, own, or `allow:`) not applied.");
            }
            ok
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Until;

    fn el(s: &str) -> Element {
        Element {
            net: s.parse().unwrap(),
            until: Until::At(1),
        }
    }

    #[test]
    fn folds_into_one_transaction() {
        let f = fold(vec![
            Change::Add(vec![el("192.0.2.1/32")]),
            Change::Remove(vec!["192.0.2.1/32".parse().unwrap(), "192.0.2.2/32".parse().unwrap()]),
            Change::Add(vec![el("192.0.2.2/32"), el("192.0.2.3/32")]),
        ]);
        assert_eq!(f.adds, vec![el("192.0.2.2/32"), el("192.0.2.3/32")]);
        assert_eq!(f.removes, vec!["192.0.2.1/32".parse::<IpNet>().unwrap()]);
        let f = fold(vec![
            Change::Add(vec![el("192.0.2.9/32")]),
            Change::Replace(vec![el("192.0.2.1/32")]),
            Change::Add(vec![el("192.0.2.2/32")]),
            Change::Remove(vec!["192.0.2.1/32".parse().unwrap()]),
        ]);
        assert_eq!(f.replace, Some(vec![el("192.0.2.2/32")]));
        assert!(f.adds.is_empty() && f.removes.is_empty());
    }
}
