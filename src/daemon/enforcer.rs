//! The task that owns the firewall: changes from the pipeline (our own
//! bans), the fleet (everyone's) and the control socket queue up here and go
//! to nft in as few transactions as they can. Allowed addresses are filtered
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

pub async fn run(mut enforcer: Enforcer, mut rx: UnboundedReceiver<Change>, allow: AllowList, shutdown: CancellationToken) {
    let mut warned = 0u32;
    loop {
        let first = tokio::select! {
            c = rx.recv() => match c { Some(c) => c, None => return },
            _ = shutdown.cancelled() => return,
        };
        let mut queue = vec![first];
        while let Ok(c) = rx.try_recv() {
            queue.push(c);
        }
        for change in coalesce(queue) {
            let now = crate::now_ms();
            let result = match change {
                Change::Add(elems) => {
                    let elems = allowed(elems, &allow, &mut warned);
                    if elems.is_empty() {
                        continue;
                    }
                    enforcer.add(&elems, now).await
                }
                Change::Remove(nets) => enforcer.remove(&nets, now).await,
                Change::Replace(elems) => {
                    let elems = allowed(elems, &allow, &mut warned);
                    enforcer.replace_all(&elems, now).await.map(|_| ())
                }
            };
            if let Err(e) = result {
                tracing::warn!(error = %e, "Applying bans to the firewall failed; the next reconcile retries.");
            }
        }
    }
}

/// Merges consecutive adds (one transaction) and drops what a later
/// `Replace` makes moot.
fn coalesce(queue: Vec<Change>) -> Vec<Change> {
    let start = queue.iter().rposition(|c| matches!(c, Change::Replace(_))).unwrap_or(0);
    let mut out: Vec<Change> = Vec::new();
    for c in queue.into_iter().skip(start) {
        match (out.last_mut(), c) {
            (Some(Change::Add(a)), Change::Add(b)) => a.extend(b),
            (_, c) => out.push(c),
        }
    }
    out
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
