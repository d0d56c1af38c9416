//! The daemon's blocklists: reads each `blocklists:` file at start and
//! every `refresh` (and at once after SIGHUP), and hands the union of their
//! networks to the enforcer task, which puts it in nft (`enforce::block`).
//!
//! A file that is missing or unreadable on a refresh keeps its last good
//! networks in the kernel and is warned about once a minute per file: a
//! blocklist is never lifted silently. Each host reads its own files.

use std::sync::Arc;
use std::time::Duration;

use ipnet::IpNet;
use tokio::sync::{mpsc, watch};
use tokio::time::Instant;
use tokio_util::sync::CancellationToken;

use super::ratelog::Every;
use crate::blocklist::{self, Loaded, Spec};
use crate::control::BlocklistStatus;
use crate::verdict::NeverBanned;

const WARN_EVERY: Duration = Duration::from_secs(60);

/// What the enforcer task is asked to hold: every file's networks, merged,
/// and each file's status to publish once applied.
#[derive(Clone, Debug, Default)]
pub struct Wanted {
    pub nets: Arc<Vec<IpNet>>,
    pub files: Vec<BlocklistStatus>,
    /// `blocklists:` is empty: the chain and sets are removed.
    pub none: bool,
}

/// The files, their last good reads, and when each is due.
pub struct Blocklists {
    specs: Vec<Spec>,
    last: Vec<Option<Loaded>>,
    errors: Vec<Option<String>>,
    warned: Vec<Every>,
    due: Vec<Instant>,
}

impl Blocklists {
    pub fn new(specs: Vec<Spec>) -> Blocklists {
        let n = specs.len();
        Blocklists {
            specs,
            last: vec![None; n],
            errors: vec![None; n],
            warned: (0..n).map(|_| Every::default()).collect(),
            due: vec![Instant::now(); n],
        }
    }

    /// Reads the files that are due (all with `force`), cut around
    /// `never`; `Some` with what the sets must hold when any file's
    /// networks changed.
    pub fn read(&mut self, force: bool, never: &NeverBanned) -> Option<Wanted> {
        let allowed = never.nets();
        let now = Instant::now();
        let mut changed = force;
        for i in 0..self.specs.len() {
            if !force && self.due[i] > now {
                continue;
            }
            let spec = &self.specs[i];
            self.due[i] = now + spec.refresh;
            match blocklist::load(spec, allowed) {
                Ok(l) => {
                    report(spec, &l);
                    changed |= self.last[i].as_ref().map(|o| &o.nets) != Some(&l.nets);
                    changed |= self.errors[i].take().is_some();
                    self.last[i] = Some(l);
                }
                Err(e) => {
                    let kept = self.last[i].as_ref().map_or(0, |l| l.nets.len());
                    if let Some(n) = self.warned[i].note(1, WARN_EVERY) {
                        tracing::warn!(error = %e, kept, times = n, "Blocklist unreadable; its last good networks stay dropped.");
                    }
                    changed |= self.errors[i].is_none();
                    self.errors[i] = Some(e.to_string());
                }
            }
        }
        changed.then(|| self.wanted())
    }

    /// Sleeps until the next file is due.
    pub fn next_due(&self) -> Option<Instant> {
        self.due.iter().min().copied()
    }

    fn wanted(&self) -> Wanted {
        let all: Vec<IpNet> = self
            .last
            .iter()
            .flatten()
            .flat_map(|l| l.nets.iter().copied())
            .collect();
        let files = self
            .specs
            .iter()
            .zip(&self.last)
            .zip(&self.errors)
            .map(|((s, l), e)| BlocklistStatus {
                file: s.file.display().to_string(),
                entries: l.as_ref().map_or(0, |l| l.nets.len() as u64),
                listed: l.as_ref().map_or(0, |l| l.listed as u64),
                skipped_lines: l.as_ref().map_or(0, |l| l.garbage as u64),
                over_cap: l.as_ref().map_or(0, |l| l.over_cap as u64),
                too_wide: l.as_ref().map_or(0, |l| l.too_wide as u64),
                split_entries: l.as_ref().map_or(0, |l| l.split as u64),
                last_refresh: None,
                error: e.clone(),
            })
            .collect();
        Wanted {
            // Files may overlap: one more merge (subtraction is kept).
            nets: Arc::new(IpNet::aggregate(&all)),
            files,
            none: self.specs.is_empty(),
        }
    }
}

/// The log lines of one good read.
fn report(spec: &Spec, l: &Loaded) {
    tracing::info!(file = %spec.file.display(), entries = l.nets.len(), listed = l.listed,
        skipped = l.garbage, comments = l.comments, host_bits = l.host_bits, split = l.split,
        allowed_dropped = l.dropped, "Blocklist read.");
    if l.garbage > 0 {
        tracing::warn!(file = %spec.file.display(), count = l.garbage,
            first = %blocklist::named_garbage(&spec.file, l), "Blocklist lines that are not networks skipped.");
    }
    if l.too_wide > 0 {
        tracing::warn!(file = %spec.file.display(), count = l.too_wide,
            first = %blocklist::named_too_wide(&spec.file, l),
            "Blocklist networks wider than /8 (IPv4) or /16 (IPv6) refused: fleetban never drops that much.");
    }
    if l.over_cap > 0 {
        tracing::warn!(file = %spec.file.display(), count = l.over_cap, max_entries = spec.max_entries,
            "Blocklist has more networks than max_entries; the excess is refused.");
    }
    if l.split > 0 {
        tracing::info!(file = %spec.file.display(), count = l.split,
            "Blocklist networks holding an allowed address were split around it.");
    }
}

/// Re-reads files when due, after each reload (a new list of specs) and
/// when the never-banned set changes (this host's addresses: a blocklist
/// never drops one); publishes to the enforcer through `tx`, and the
/// networks alone to the decision endpoint through `nets`.
pub async fn run(
    mut lists: Blocklists,
    tx: watch::Sender<Wanted>,
    nets: watch::Sender<Arc<Vec<IpNet>>>,
    mut never: watch::Receiver<Arc<NeverBanned>>,
    mut reloads: mpsc::UnboundedReceiver<Vec<Spec>>,
    shutdown: CancellationToken,
) {
    loop {
        let due = lists.next_due();
        let force = tokio::select! {
            _ = super::sleep_until_opt(due) => false,
            Ok(()) = never.changed(), if !lists.specs.is_empty() => true,
            r = reloads.recv() => match r {
                Some(specs) => {
                    // A file that stays keeps its last good read: unreadable
                    // now, its networks stay dropped.
                    let mut new = Blocklists::new(specs);
                    for (i, s) in new.specs.iter().enumerate() {
                        if let Some(j) = lists.specs.iter().position(|o| o.file == s.file) {
                            new.last[i] = lists.last[j].take();
                        }
                    }
                    lists = new;
                    true
                }
                None => return,
            },
            _ = shutdown.cancelled() => return,
        };
        // File reads and the subtraction of 100k networks: off the runtime.
        let set = never.borrow_and_update().clone();
        let (back, wanted) = match tokio::task::spawn_blocking(move || {
            let w = lists.read(force, &set);
            (lists, w)
        })
        .await
        {
            Ok(r) => r,
            Err(e) => std::panic::resume_unwind(e.into_panic()),
        };
        lists = back;
        if let Some(w) = wanted {
            nets.send_replace(w.nets.clone());
            tx.send_replace(w);
        }
    }
}

/// Puts `w` into the firewall, publishing each file's status: its last
/// refresh on success, nft's error on failure (the sets keep what they had).
pub async fn apply(
    enforcer: &mut crate::enforce::Enforcer,
    w: &Wanted,
    status: &std::sync::Mutex<Vec<BlocklistStatus>>,
) -> bool {
    let started = std::time::Instant::now();
    let result = match w.none {
        true if enforcer.blocklist().is_empty() => Ok(None),
        true => enforcer.remove_blocklist().await.map(|()| None),
        false => enforcer.set_blocklist(&w.nets).await.map(Some),
    };
    let mut files = w.files.clone();
    let ok = result.is_ok();
    match result {
        Ok(a) => {
            if let Some(a) = a {
                tracing::info!(
                    full = a.full,
                    added = a.added,
                    deleted = a.deleted,
                    total = a.total,
                    took = %crate::took(started.elapsed()),
                    "Blocklist applied."
                );
            }
            let now = crate::rfc3339(crate::now_ms());
            for f in files.iter_mut().filter(|f| f.error.is_none()) {
                f.last_refresh = Some(now.clone());
            }
            let old = status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            // A file whose read failed keeps its last refresh time.
            for f in files.iter_mut().filter(|f| f.error.is_some()) {
                f.last_refresh = old
                    .iter()
                    .find(|o| o.file == f.file)
                    .and_then(|o| o.last_refresh.clone());
            }
        }
        Err(e) => {
            tracing::warn!(error = %e, "Loading the blocklist into the firewall failed; retrying.");
            let old = status.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone();
            for f in files.iter_mut() {
                f.last_refresh = old
                    .iter()
                    .find(|o| o.file == f.file)
                    .and_then(|o| o.last_refresh.clone());
                f.error = Some(format!("nft: {e}"));
            }
        }
    }
    *status.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = files;
    ok
}
