//! The task that owns the firewall: changes from the pipeline (our own
//! bans), the fleet (everyone's) and the control socket queue up here and go
//! to nft folded into one transaction per wake-up (at 100k elements each nft
//! call costs a lot: see ARCHITECTURE.md). Allowed addresses are filtered
//! out here, the last step before the kernel.

use tokio::sync::mpsc::UnboundedReceiver;
use tokio_util::sync::CancellationToken;

use super::sleep_until_opt;
use crate::detect::AllowList;
use crate::enforce::{fold, Change, Element, Enforcer};

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
        stats.nft_apply.observe(started.elapsed().as_secs_f64());
        if let Err(e) = result {
            tracing::warn!(error = %e, "Applying bans to the firewall failed; the next reconcile retries.");
        }
    }
}

fn allowed(elems: Vec<Element>, allow: &AllowList, warned: &mut u32) -> Vec<Element> {
    elems
        .into_iter()
        .filter(|e| {
            let ok = !allow.overlaps(&e.net);
            if !ok && *warned < 20 {
                *warned += 1;
                tracing::warn!(addr = %e.net, "Ban of an allowed address (loopback, own, `allow:` or `proxies:`) not applied.");
            }
            ok
        })
        .collect()
}
