//! The task that owns the firewall: changes from the pipeline (our own
//! bans), the fleet (everyone's) and the control socket queue up here and go
//! to nft folded into one transaction per wake-up (at 100k elements each nft
//! call costs a lot: see ARCHITECTURE.md). Allowed addresses are filtered
//! out here, the last step before the kernel.
//!
//! The kernel is not trusted to keep what it was given: every
//! [`CHECK_EVERY`] the task checks that the table is still there (`nft
//! flush ruleset`, an nftables service reload, remove it) and re-creates it
//! with every ban, in every mode; a failed call is retried from a fresh
//! listing after [`RETRY_FIRST`], backing off to [`RETRY_MAX`], until the
//! kernel holds what is wanted.

use std::time::Duration;

use tokio::sync::mpsc::UnboundedReceiver;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ratelog::Every;
use super::sleep_until_opt;
use crate::detect::AllowList;
use crate::enforce::{fold, Change, Element, EnforceError, Enforcer};

/// How often the table's presence is checked (one cheap `nft list tables`).
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The first retry after a failed nft call (itself already retried once
/// from a fresh listing), doubled up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Repeated warnings (failures, re-created tables): one per period.
const WARN_EVERY: Duration = Duration::from_secs(60);

pub async fn run(
    mut enforcer: Enforcer,
    mut rx: UnboundedReceiver<Change>,
    allow: AllowList,
    stats: std::sync::Arc<super::stats::Stats>,
    shutdown: CancellationToken,
) {
    let mut warned = 0u32;
    let mut next_check = Instant::now() + CHECK_EVERY;
    let mut retry: Option<(Instant, Duration)> = None;
    let (mut failures, mut recreated) = (Every::default(), Every::default());
    loop {
        let wake = enforcer.next_wakeup().map(|t| {
            let ms = (t - crate::now_ms()).clamp(0, 3_600_000) as u64;
            Instant::now() + Duration::from_millis(ms)
        });
        // While a retry is due, it (a full listing) stands for the check.
        let check = retry.is_none().then_some(next_check);
        let due = [wake, retry.map(|r| r.0), check].into_iter().flatten().min();
        let first = tokio::select! {
            c = rx.recv() => match c { Some(c) => Some(c), None => return },
            _ = sleep_until_opt(due) => None,
            _ = shutdown.cancelled() => return,
        };
        let result = match first {
            None if retry.is_some_and(|r| r.0 <= Instant::now()) || wake.is_some_and(|w| w <= Instant::now()) => {
                // A tick after a failure plans every ban against a fresh listing.
                enforcer.tick(crate::now_ms()).await
            }
            None => {
                next_check = Instant::now() + CHECK_EVERY;
                match enforcer.check(crate::now_ms()).await {
                    Ok(Some(s)) => {
                        if let Some(n) = recreated.note(1, WARN_EVERY) {
                            tracing::warn!(
                                bans = s.added,
                                times = n,
                                "The nftables table had vanished (nft flush ruleset?); re-created it with every ban."
                            );
                        }
                        Ok(())
                    }
                    Ok(None) => Ok(()),
                    Err(e) => Err(e),
                }
            }
            Some(first) => {
                let mut queue = vec![first];
                while let Ok(c) = rx.try_recv() {
                    queue.push(c);
                }
                apply(&mut enforcer, queue, &allow, &mut warned, &stats).await
            }
        };
        match result {
            Ok(()) => retry = None,
            Err(e) => {
                let after = retry.map_or(RETRY_FIRST, |r| (r.1 * 2).min(RETRY_MAX));
                retry = Some((Instant::now() + after, after));
                if let Some(n) = failures.note(1, WARN_EVERY) {
                    tracing::warn!(error = %e, failures = n, retry_in_s = after.as_secs(), "Applying bans to the firewall failed; retrying.");
                }
            }
        }
    }
}

/// One folded batch of changes, in one nft transaction.
async fn apply(
    enforcer: &mut Enforcer,
    queue: Vec<Change>,
    allow: &AllowList,
    warned: &mut u32,
    stats: &super::stats::Stats,
) -> Result<(), EnforceError> {
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
                .replace_all(&allowed(elems, allow, warned), now)
                .await
                .map(|_| ());
            // A reconcile read and copied the whole list: give it back.
            super::trim_heap();
            r
        }
        None => enforcer.update(&allowed(f.adds, allow, warned), &f.removes, now).await,
    };
    stats.nft_apply.observe(started.elapsed().as_secs_f64());
    result
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
