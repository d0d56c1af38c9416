//! The task that owns the firewall: changes from the pipeline (our own
//! bans), the fleet (everyone's) and the control socket queue up here and go
//! to nft folded into one transaction per wake-up (at 100k elements each nft
//! call costs a lot: see BENCHMARKS.md). Each ban goes in as its
//! [`verdict::cover`]: never-banned addresses (loopback, `allow:`,
//! `proxies:`, this host's own as they change) are cut out here, the last
//! step before the kernel, and a ban's cover follows the set when this
//! host's addresses change.
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
use crate::enforce::{fold, Change, Element, EnforceError, Enforcer, Folded, Until};
use crate::verdict::{self, Cover, NeverBanned, Own};

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
    /// whether they were kept (not wholly never banned) (`RECENT` at
    /// most): how a `ban` finds the batch that took it.
    recent: std::collections::VecDeque<(u64, IpNet, bool)>,
    /// Wanted bans the kernel does not hold, sorted; empty while nft works.
    unapplied: Vec<IpNet>,
    /// The last call's error, while it is not followed by a success.
    error: Option<String>,
    recreated: u64,
    /// Bans applied around never-banned addresses, and not applied at all.
    split: u64,
    spared: u64,
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
            split: r.split,
            spared: r.spared,
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
    own: std::sync::Arc<Own>,
    mut asked: Asked,
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
    let mut never_rx = own.subscribe();
    let mut never = never_rx.borrow_and_update().clone();
    let mut library_settled = false;
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
            Ok(()) = never_rx.changed() => {
                let new = never_rx.borrow_and_update().clone();
                enforced.busy_since_ms.store(crate::now_ms(), Relaxed);
                let r = follow_never(&mut enforcer, &mut asked, &new).await;
                never = new;
                enforced.busy_since_ms.store(0, Relaxed);
                let mut report = enforced.report();
                (report.split, report.spared) = asked.counts();
                if let Err(e) = r {
                    tracing::warn!(error = %e, "Applying bans around this host's new addresses failed; the next check retries.");
                }
                continue;
            }
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
                let lifted = follow_own(&own, &mut never, &mut enforcer, &mut asked).await;
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
                    false => follow_own(&own, &mut never, &mut enforcer, &mut asked).await,
                };
                let adds = std::mem::take(&mut f.adds);
                // A network ban applied as pieces is applied, for `ban`'s wait.
                let bans: Vec<IpNet> = adds.iter().map(|e| e.net.trunc()).collect();
                let mut refused = Vec::new();
                f.adds = covered(adds, &never, &mut warned, &mut asked, Some(&mut refused));
                taken.clear();
                let kept = f.adds.iter().map(|e| (e.net.trunc(), true));
                let split = bans
                    .into_iter()
                    .filter(|n| asked.0.get(n).is_some_and(|(_, p)| !p.is_empty()))
                    .map(|n| (n, true));
                let kept = split.chain(kept);
                let refused = refused.into_iter().map(|n| (n.trunc(), false));
                taken.extend(kept.chain(refused).take(RECENT).map(|(n, k)| (number, n, k)));
                let applied = apply(&mut enforcer, f, &never, &mut warned, &mut asked, &stats).await;
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
            (report.split, report.spared) = asked.counts();
            if !taken.is_empty() {
                report.recent.extend(taken.drain(..));
                let excess = report.recent.len().saturating_sub(RECENT);
                report.recent.drain(..excess);
            }
        }
        enforced.done.send_modify(|d| *d += 1);
        // The first in-process transaction loaded libnftables: the loader's
        // relocations and the context's creation ran code nothing runs
        // again (~0.3-0.9 MB mapped), let go as a start's is.
        if !library_settled && crate::enforce::library_loaded() {
            library_settled = true;
            super::trim_heap();
            super::release_code_pages();
        }
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
    never: &NeverBanned,
    warned: &mut u32,
    asked: &mut Asked,
    stats: &super::stats::Stats,
) -> Result<(), EnforceError> {
    let now = crate::now_ms();
    let removes = asked.expand(f.removes);
    let started = std::time::Instant::now();
    let result = match f.replace {
        Some(elems) => {
            asked.0.clear();
            let r = enforcer
                .replace_all(&covered(elems, never, warned, asked, None), now)
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

/// `elems` as each one's [`verdict::cover`] under `never`: a ban wholly
/// never banned is not applied (noted in `refused`); a network ban holding
/// never-banned addresses goes in as the networks around them. Both are
/// noted in `asked`, so that an unban lifts every piece and a change of
/// the set puts them in again as their new cover.
pub(super) fn covered(
    elems: Vec<Element>,
    never: &NeverBanned,
    warned: &mut u32,
    asked: &mut Asked,
    mut refused: Option<&mut Vec<IpNet>>,
) -> Vec<Element> {
    let mut out = Vec::with_capacity(elems.len());
    for e in elems {
        let ban = e.net.trunc();
        match verdict::cover(&ban, never) {
            Cover::Whole => {
                asked.0.remove(&ban);
                out.push(e);
            }
            Cover::Spared(why) => {
                if *warned < 20 {
                    *warned += 1;
                    tracing::warn!(addr = %AddrText(&e.net), never_banned = %why, "Ban of a never-banned address not applied here.");
                }
                if let Some(r) = refused.as_deref_mut() {
                    r.push(e.net);
                }
                asked.0.insert(ban, (e.until, Vec::new()));
            }
            Cover::Around(pieces) => {
                if *warned < 20 && asked.0.get(&ban).map(|(_, p)| p) != Some(&pieces) {
                    *warned += 1;
                    let why: Vec<String> = never.overlapping(&ban).map(|w| w.to_string()).collect();
                    tracing::warn!(
                        addr = %AddrText(&e.net),
                        networks = pieces.len(),
                        never_banned = %why.join("; "),
                        "Network ban applied around the never-banned addresses inside it: those stay reachable."
                    );
                }
                out.extend(pieces.iter().map(|&net| Element { net, until: e.until }));
                asked.0.insert(ban, (e.until, pieces));
            }
        }
    }
    out
}

/// The bans whose cover is not the whole ban: ban -> its end and the
/// networks put into the kernel for it (none when spared).
#[derive(Default)]
pub(super) struct Asked(std::collections::HashMap<IpNet, (Until, Vec<IpNet>)>);

impl Asked {
    /// How many bans go in as pieces, and how many not at all.
    fn counts(&self) -> (u64, u64) {
        let spared = self.0.values().filter(|(_, p)| p.is_empty()).count();
        ((self.0.len() - spared) as u64, spared as u64)
    }

    /// `removes` with each such ban replaced by its pieces.
    fn expand(&mut self, removes: Vec<IpNet>) -> Vec<IpNet> {
        let mut out = Vec::with_capacity(removes.len());
        for net in removes {
            match self.0.remove(&net.trunc()) {
                Some((_, pieces)) => out.extend(pieces),
                None => out.push(net),
            }
        }
        out
    }
}

/// Reads this host's addresses again (`Own::refresh`); when the set
/// changed, every ban's cover follows it.
async fn follow_own(
    own: &Own,
    never: &mut std::sync::Arc<NeverBanned>,
    enforcer: &mut Enforcer,
    asked: &mut Asked,
) -> Result<(), EnforceError> {
    own.refresh();
    let now = own.current();
    if std::sync::Arc::ptr_eq(&now, never) {
        return Ok(());
    }
    *never = now;
    follow_never(enforcer, asked, never).await
}

/// The never-banned set is now `never`: each ban whose cover that changes
/// (a whole ban holding a new address, a split or spared one) goes in as
/// its new cover, in one transaction.
async fn follow_never(enforcer: &mut Enforcer, asked: &mut Asked, never: &NeverBanned) -> Result<(), EnforceError> {
    let now = crate::now_ms();
    // (ban, end, what the kernel was given for it)
    let mut changed: Vec<(IpNet, Until, Vec<IpNet>)> = asked.0.drain().map(|(b, (u, p))| (b, u, p)).collect();
    let whole: Vec<(IpNet, Until)> = enforcer.wanted_until().filter(|(n, _)| never.overlaps(n)).collect();
    // A piece of a split ban is wanted too: only a ban put in whole is taken here.
    let pieces: std::collections::HashSet<IpNet> = changed.iter().flat_map(|(_, _, p)| p.iter().copied()).collect();
    for (n, u) in whole {
        if !pieces.contains(&n) {
            changed.push((n, u, vec![n]));
        }
    }
    let (mut adds, mut removes) = (Vec::new(), Vec::new());
    // Said below, once per ban, rather than as a new ban's warning.
    let mut warned = u32::MAX;
    for (ban, until, was) in changed {
        if matches!(until, Until::At(t) if t <= now) {
            removes.extend(was);
            continue;
        }
        let mut none = Vec::new();
        let mut scratch = Asked::default();
        let now_in = covered(
            vec![Element { net: ban, until }],
            never,
            &mut warned,
            &mut scratch,
            Some(&mut none),
        );
        let now_nets: Vec<IpNet> = now_in.iter().map(|e| e.net).collect();
        if now_nets != was {
            let addr = AddrText(&ban);
            match (now_nets.as_slice(), was.as_slice()) {
                ([], _) => {
                    tracing::warn!(%addr, "A ban covers an address this host now has: lifted here, the list keeps it.")
                }
                (_, [w]) if *w == ban => tracing::warn!(%addr, networks = now_nets.len(),
                    "A ban covers an address this host now has: applied around it here, the list keeps it."),
                _ => tracing::info!(%addr, networks = now_nets.len(),
                    "This host's addresses changed: the ban is applied as its new cover here."),
            }
            removes.extend(was.iter().filter(|n| !now_nets.contains(n)).copied());
            adds.extend(now_in.into_iter().filter(|e| !was.contains(&e.net)));
        }
        asked.0.extend(scratch.0);
    }
    if adds.is_empty() && removes.is_empty() {
        return Ok(());
    }
    enforcer.update(&adds, &removes, now).await
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::enforce::Until;

    use crate::addr::net;

    #[test]
    fn a_network_ban_is_split_around_allowed_addresses_and_its_unban_lifts_every_piece() {
        let allow = NeverBanned::only(&[net("198.51.100.7/32"), net("203.0.113.0/24")]);
        let (mut warned, mut splits, mut refused) = (0, Asked::default(), Vec::new());
        let ban = |s: &str| Element {
            net: net(s),
            until: Until::At(1_000_000),
        };
        let out = covered(
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
