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

use std::sync::atomic::Ordering::Relaxed;
use std::sync::atomic::{AtomicI64, AtomicU64};
use std::sync::Mutex;

use ipnet::IpNet;
use tokio::sync::mpsc::UnboundedReceiver;
use tokio::sync::watch;
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ratelog::Every;
use super::sleep_until_opt;
use crate::addr::AddrText;
use crate::control::FirewallStatus;
use crate::detect::{AllowList, OwnAddresses};
use crate::enforce::{fold, Change, Element, EnforceError, Enforcer, Folded};

/// How often the table's presence is checked (one cheap `nft list tables`).
pub const CHECK_EVERY: Duration = Duration::from_secs(5);
/// The first retry after a failed nft call (itself already retried once
/// from a fresh listing), doubled up to [`RETRY_MAX`].
pub const RETRY_FIRST: Duration = Duration::from_secs(1);
pub const RETRY_MAX: Duration = Duration::from_secs(30);
/// Repeated warnings (failures, re-created tables): one per period.
const WARN_EVERY: Duration = Duration::from_secs(60);
/// How many bans not enforced `status` names.
const SAMPLE: usize = 10;
/// How many recently added nets the report keeps (see `Report::recent`).
const RECENT: usize = 1024;

/// What the enforcer task tells the rest of the daemon: what it could not
/// put into the kernel, and when its batches of changes are done (the
/// control socket's `ban` waits for its own).
pub struct Enforced {
    /// Batches of changes taken from the queue so far. A change queued
    /// after this was read goes in a batch numbered higher.
    begun: AtomicU64,
    /// Bumped after every call (batch, check, retry), its report updated.
    done: watch::Sender<u64>,
    report: Mutex<Report>,
    /// When the nft work in progress began (unix ms), 0 when none: a call
    /// running longer than half the watchdog interval stops the pings
    /// (`notify::watchdog`), so that systemd restarts a hung enforcer.
    pub busy_since_ms: AtomicI64,
    /// The blocklist files' state for `status` (`daemon::blocklist`).
    pub blocklist: Mutex<Vec<crate::control::BlocklistStatus>>,
}

#[derive(Default)]
struct Report {
    /// The nets added by the last batches, with their batch's number and
    /// whether they were kept (not allowed, not this host's) (`RECENT` at
    /// most): how a `ban` finds the batch that took it.
    recent: std::collections::VecDeque<(u64, IpNet, bool)>,
    /// Wanted bans the kernel does not hold, sorted; empty while nft works.
    unapplied: Vec<IpNet>,
    /// The last call's error, while it is not followed by a success.
    error: Option<String>,
    recreated: u64,
}

impl Default for Enforced {
    fn default() -> Enforced {
        Enforced {
            begun: AtomicU64::new(0),
            done: watch::channel(0).0,
            report: Mutex::new(Report::default()),
            busy_since_ms: AtomicI64::new(0),
            blocklist: Mutex::new(Vec::new()),
        }
    }
}

impl Enforced {
    fn report(&self) -> std::sync::MutexGuard<'_, Report> {
        self.report.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The firewall part of `status`.
    pub fn status(&self) -> FirewallStatus {
        let r = self.report();
        FirewallStatus {
            failing: r.error.is_some(),
            error: r.error.clone(),
            not_enforced: r.unapplied.len() as u64,
            not_enforced_sample: r
                .unapplied
                .iter()
                .take(SAMPLE)
                .map(|n| AddrText(n).to_string())
                .collect(),
            recreated: r.recreated,
        }
    }

    /// The blocklist part of `status`.
    pub fn blocklists(&self) -> Vec<crate::control::BlocklistStatus> {
        self.blocklist
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .clone()
    }

    /// Which of `nets` the kernel does not hold.
    pub fn not_enforced<'a>(&self, nets: impl Iterator<Item = &'a IpNet>) -> Vec<IpNet> {
        let r = self.report();
        nets.filter(|n| r.unapplied.binary_search(&n.trunc()).is_ok())
            .copied()
            .collect()
    }

    /// Batches taken so far: read it before queueing a change.
    pub fn begun(&self) -> u64 {
        self.begun.load(Relaxed)
    }

    /// Whether `net`, queued after [`Enforced::begun`] returned `begun`, is
    /// in the kernel once the batch that took it is done; false if that
    /// takes longer than `wait` (nft slow or hung, or a batch too large to
    /// be remembered).
    pub async fn applied(&self, net: &IpNet, begun: u64, wait: Duration) -> bool {
        let net = net.trunc();
        let mut rx = self.done.subscribe();
        let taken = async {
            loop {
                {
                    let r = self.report();
                    if let Some(&(_, _, kept)) = r.recent.iter().find(|&&(b, n, _)| b > begun && n == net) {
                        return kept && r.unapplied.binary_search(&net).is_err();
                    }
                }
                if rx.changed().await.is_err() {
                    return false;
                }
            }
        };
        tokio::time::timeout(wait, taken).await.unwrap_or(false)
    }
}

// One input per source of work (bans, blocklist, addresses): a struct would
// only rename them.
#[allow(clippy::too_many_arguments)]
pub async fn run(
    mut enforcer: Enforcer,
    mut rx: UnboundedReceiver<Change>,
    mut allow: AllowList,
    mut own: OwnAddresses,
    stats: std::sync::Arc<super::stats::Stats>,
    enforced: std::sync::Arc<Enforced>,
    mut blocks: watch::Receiver<super::blocklist::Wanted>,
    shutdown: CancellationToken,
) {
    // A blocklist load that failed is tried again at the next check.
    let mut blocks_failed = false;
    let mut warned = 0u32;
    let mut next_check = Instant::now() + CHECK_EVERY;
    let mut retry: Option<(Instant, Duration)> = None;
    let (mut failures, mut recreated) = (Every::default(), Every::default());
    let mut taken: Vec<(u64, IpNet, bool)> = Vec::new();
    let mut splits = Splits::default();
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
            Ok(()) = blocks.changed() => {
                let w = blocks.borrow_and_update().clone();
                enforced.busy_since_ms.store(crate::now_ms(), Relaxed);
                blocks_failed = !super::blocklist::apply(&mut enforcer, &w, &enforced.blocklist).await;
                enforced.busy_since_ms.store(0, Relaxed);
                continue;
            }
            _ = shutdown.cancelled() => return,
        };
        enforced.busy_since_ms.store(crate::now_ms(), Relaxed);
        let result = match first {
            None if retry.is_some_and(|r| r.0 <= Instant::now()) || wake.is_some_and(|w| w <= Instant::now()) => {
                // A tick after a failure plans every ban against a fresh listing.
                enforcer.tick(crate::now_ms()).await
            }
            None => {
                next_check = Instant::now() + CHECK_EVERY;
                let lifted = lift_own(&mut own, &mut allow, &mut enforcer).await;
                let checked = enforcer.check(crate::now_ms()).await;
                if blocks_failed || matches!(checked, Ok(Some(_))) {
                    // A re-created table lost the blocklist sets too.
                    let w = blocks.borrow().clone();
                    blocks_failed = !super::blocklist::apply(&mut enforcer, &w, &enforced.blocklist).await;
                }
                match lifted.and(checked) {
                    Ok(Some(s)) => {
                        enforced.report().recreated += 1;
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
                let number = enforced.begun.fetch_add(1, Relaxed) + 1;
                let mut queue = vec![first];
                while let Ok(c) = rx.try_recv() {
                    queue.push(c);
                }
                let mut f = fold(queue);
                // Addresses this host took since the last read are never put in.
                let lifted = match f.adds.is_empty() && f.replace.is_none() {
                    true => Ok(()),
                    false => lift_own(&mut own, &mut allow, &mut enforcer).await,
                };
                let adds = std::mem::take(&mut f.adds);
                // A network ban applied as pieces is applied, for `ban`'s wait.
                let asked: Vec<IpNet> = adds.iter().map(|e| e.net.trunc()).collect();
                let mut refused = Vec::new();
                f.adds = allowed(adds, &allow, &mut warned, &mut splits, Some(&mut refused));
                taken.clear();
                let kept = f.adds.iter().map(|e| (e.net.trunc(), true));
                let split = asked
                    .into_iter()
                    .filter(|n| splits.0.contains_key(n))
                    .map(|n| (n, true));
                let kept = split.chain(kept);
                let refused = refused.into_iter().map(|n| (n.trunc(), false));
                taken.extend(kept.chain(refused).take(RECENT).map(|(n, k)| (number, n, k)));
                let applied = apply(&mut enforcer, f, &allow, &mut warned, &mut splits, &stats).await;
                lifted.and(applied)
            }
        };
        enforced.busy_since_ms.store(0, Relaxed);
        // What is not enforced: walked after a failure, and after each call
        // until the kernel holds everything again.
        {
            let mut report = enforced.report();
            if result.is_err() || !report.unapplied.is_empty() {
                let mut missing = enforcer.unapplied();
                missing.sort_unstable();
                report.unapplied = missing;
            }
            report.error = result.as_ref().err().map(ToString::to_string);
            if !taken.is_empty() {
                report.recent.extend(taken.drain(..));
                let excess = report.recent.len().saturating_sub(RECENT);
                report.recent.drain(..excess);
            }
        }
        enforced.done.send_modify(|d| *d += 1);
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
    f: Folded,
    allow: &AllowList,
    warned: &mut u32,
    splits: &mut Splits,
    stats: &super::stats::Stats,
) -> Result<(), EnforceError> {
    let now = crate::now_ms();
    // One line per unban of a ban this host held, whoever asked (manual,
    // another host, the fleet's list); none for an address never banned.
    for net in f
        .removes
        .iter()
        .filter(|n| enforcer.wants(n) || splits.0.contains_key(&n.trunc()))
    {
        tracing::info!(addr = %crate::addr::AddrText(net), "Unbanned.");
    }
    let removes = splits.expand(f.removes);
    let started = std::time::Instant::now();
    let result = match f.replace {
        Some(elems) => {
            splits.0.clear();
            let r = enforcer
                .replace_all(&allowed(elems, allow, warned, splits, None), now)
                .await
                .map(|_| ());
            // A reconcile read and copied the whole list: give it back.
            super::trim_heap();
            r
        }
        None => enforcer.update(&f.adds, &removes, now).await,
    };
    stats.nft_apply.observe(started.elapsed().as_secs_f64());
    result
}

/// `elems` without the addresses of the allow list: a ban inside an allowed
/// network (or of an allowed address) is not applied (noted in `refused`);
/// a network ban holding allowed addresses is split into the networks
/// around them (noted in `splits`, so that its unban lifts every piece).
fn allowed(
    elems: Vec<Element>,
    allow: &AllowList,
    warned: &mut u32,
    splits: &mut Splits,
    mut refused: Option<&mut Vec<IpNet>>,
) -> Vec<Element> {
    let mut out = Vec::with_capacity(elems.len());
    for e in elems {
        if !allow.overlaps(&e.net) {
            splits.0.remove(&e.net.trunc());
            out.push(e);
            continue;
        }
        let pieces = crate::blocklist::subtract(&[e.net.trunc()], allow.nets()).nets;
        if pieces.is_empty() {
            if *warned < 20 {
                *warned += 1;
                tracing::warn!(addr = %AddrText(&e.net), "Ban of an allowed address (loopback, own, `allow:` or `proxies:`) not applied.");
            }
            if let Some(r) = refused.as_deref_mut() {
                r.push(e.net);
            }
            continue;
        }
        if *warned < 20 && splits.0.get(&e.net.trunc()) != Some(&pieces) {
            *warned += 1;
            tracing::warn!(
                addr = %AddrText(&e.net),
                networks = pieces.len(),
                "Network ban split around the allowed addresses inside it (loopback, own, `allow:` or `proxies:`): those stay reachable."
            );
        }
        out.extend(pieces.iter().map(|&net| Element { net, until: e.until }));
        splits.0.insert(e.net.trunc(), pieces);
    }
    out
}

/// The network bans applied as pieces around allowed addresses: ban ->
/// the networks put into the kernel for it.
#[derive(Default)]
pub(super) struct Splits(std::collections::HashMap<IpNet, Vec<IpNet>>);

impl Splits {
    /// `removes` with each split ban replaced by its pieces.
    fn expand(&mut self, removes: Vec<IpNet>) -> Vec<IpNet> {
        let mut out = Vec::with_capacity(removes.len());
        for net in removes {
            match self.0.remove(&net.trunc()) {
                Some(pieces) => out.extend(pieces),
                None => out.push(net),
            }
        }
        out
    }
}

/// Follows this host's addresses (one getifaddrs): when they changed, the
/// allow list is replaced, and a wanted ban covering an address that
/// appeared is lifted here, said once per address (the fleet's list keeps
/// it; other hosts still drop it).
async fn lift_own(own: &mut OwnAddresses, allow: &mut AllowList, enforcer: &mut Enforcer) -> Result<(), EnforceError> {
    let Some((new, added)) = own.refresh() else {
        return Ok(());
    };
    *allow = new;
    for a in &added {
        tracing::info!(addr = %a, "This host has a new address: it is never banned here.");
    }
    let lift: Vec<IpNet> = enforcer
        .wanted()
        .filter(|n| added.iter().any(|a| n.contains(a)))
        .copied()
        .collect();
    if lift.is_empty() {
        return Ok(());
    }
    for n in &lift {
        tracing::warn!(addr = %AddrText(n), "A ban covers an address this host now has: lifted here, the list keeps it.");
    }
    enforcer.remove(&lift, crate::now_ms()).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Until;

    fn net(s: &str) -> IpNet {
        s.parse().unwrap()
    }

    #[test]
    fn a_network_ban_is_split_around_allowed_addresses_and_its_unban_lifts_every_piece() {
        let allow = AllowList::only(&[net("198.51.100.7/32"), net("203.0.113.0/24")]);
        let (mut warned, mut splits, mut refused) = (0, Splits::default(), Vec::new());
        let ban = |s: &str| Element {
            net: net(s),
            until: Until::At(1_000_000),
        };
        let out = allowed(
            vec![
                ban("198.51.100.0/24"),
                ban("203.0.113.5/32"),
                ban("203.0.113.0/25"),
                ban("192.0.2.1/32"),
            ],
            &allow,
            &mut warned,
            &mut splits,
            Some(&mut refused),
        );
        // Inside an allowed network: refused, whole.
        assert_eq!(refused, vec![net("203.0.113.5/32"), net("203.0.113.0/25")]);
        let applied: Vec<IpNet> = out.iter().map(|e| e.net).collect();
        // The /24 minus .7 is eight networks, /25 .. /32, none holding .7.
        assert_eq!(applied.len(), 9, "{applied:?}");
        assert!(applied.contains(&net("192.0.2.1/32")));
        assert!(applied.iter().all(|n| !n.contains(&net("198.51.100.7/32"))));
        let covered: u64 = applied[..8].iter().map(|n| 1u64 << (32 - n.prefix_len())).sum();
        assert_eq!(covered, 255);
        assert!(out.iter().all(|e| e.until == Until::At(1_000_000)));
        let lifted = splits.expand(vec![net("198.51.100.0/24"), net("192.0.2.1/32")]);
        assert_eq!(lifted.len(), 9);
        assert_eq!(lifted[..8], applied[..8]);
        // Lifted once: a second unban is the network itself.
        assert_eq!(
            splits.expand(vec![net("198.51.100.0/24")]),
            vec![net("198.51.100.0/24")]
        );
    }
}
