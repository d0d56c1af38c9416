//! The nftables enforcer: one `nft -f -` transaction per call.
//!
//! Small commands run through libnftables in this process (`libnft.rs`,
//! when `NftOptions::library` and the library loads): the same text, the
//! same transaction, without starting a program. Element changes alone to
//! sets that exist go to nf_tables as one netlink batch of our own
//! (`batch.rs`), in the same cases: libnftables then runs only a change
//! that creates a set.
//!
//! Each call updates the wanted bans, plans against what the kernel is
//! believed to hold (`cover`), renders the plan (`script`) and pipes it to
//! nft. If nft refuses (an element expired under us, someone deleted the
//! table, ...), the kernel is re-read (`listing`), the plan recomputed and
//! tried once more; a second refusal is returned and the next call starts by
//! re-reading. Table, sets and chain are (re)created in the same transaction
//! as the elements whenever a listing shows they are missing or wrong;
//! `check` notices a table that vanished between calls.
//!
//! Cost on nft 1.0.6 / kernel 6.18: loading 100k elements into an empty set
//! takes ~0.7 s; nft reads a whole interval set into its cache before any
//! element change (~1.5-2 s per transaction at 100k elements), which is why
//! every ban set is plain (`script.rs`).

use std::collections::BTreeSet;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use tokio::io::AsyncWriteExt;
use tokio::process::Command;
use tokio::sync::mpsc::UnboundedReceiver;
use tracing::{debug, info, warn};

use super::batch::{Batch, Failed};
use super::block::{self, BlockApplied, BlockState, Length};
use super::cover::{Book, Plan};
use super::libnft::{self, Context};
use super::listing::{self, KernelView};
use super::netlink;
use super::script::{self, Preamble};
use super::{Element, EnforceError, NftOptions, ReconcileStats};

/// nft is killed if it takes longer (a 100k-element transaction takes ~2 s).
const NFT_TIMEOUT: Duration = Duration::from_secs(120);
/// How long `init`'s listing stands for the kernel's state (see `fresh`).
const FRESH_FOR: Duration = Duration::from_secs(10);
/// How much of nft's stderr an error keeps.
const STDERR_CAP: usize = 4096;
/// The largest transaction run in this process (`libnft.rs`): ~1,000
/// elements, a few MB of libnftables' objects in this heap at most.
const LIBRARY_MAX: usize = 64 * 1024;

/// Keeps `table inet T` in the kernel equal to the wanted bans.
pub struct NftEnforcer {
    /// Validated options (ports sorted and deduplicated).
    opts: NftOptions,
    /// Wanted bans and what the kernel holds.
    book: Book,
    /// Layout work the next transaction must carry; `None` when right.
    preamble: Option<Preamble>,
    /// The applied state may be wrong (never read, or a transaction failed):
    /// re-read the kernel before the next plan.
    stale: bool,
    /// When `init` read the kernel: a `replace_all` soon after it (the start's
    /// sync) plans against that listing instead of listing again (an empty
    /// listing is cheap, one of 100k elements is not). Any apply clears it.
    fresh: Option<Instant>,
    /// The blocklist sets' elements (`block.rs`).
    block: BlockState,
    /// The ban sets per prefix length the kernel holds (with their rules):
    /// a transaction adding to another length creates its set first.
    lengths: BTreeSet<Length>,
}

impl NftEnforcer {
    /// Validates the options; runs nothing.
    pub fn new(mut opts: NftOptions) -> Result<NftEnforcer, EnforceError> {
        let t = &opts.table;
        if t.is_empty() || t.len() > 32 || !t.bytes().all(|b| b.is_ascii_alphanumeric() || b == b'_') {
            return Err(EnforceError::InvalidTable(opts.table));
        }
        if opts.ports.contains(&0) {
            return Err(EnforceError::InvalidPort);
        }
        if opts.command.is_empty() {
            return Err(EnforceError::EmptyCommand);
        }
        opts.ports.sort_unstable();
        opts.ports.dedup();
        Ok(NftEnforcer {
            opts,
            book: Book::default(),
            preamble: None,
            stale: true,
            fresh: None,
            block: BlockState::default(),
            lengths: BTreeSet::new(),
        })
    }

    /// Makes the blocklist sets hold `nets` (sorted, non-overlapping): the
    /// first call replaces them whole, later ones send the difference; one
    /// transaction either way. A failure makes the next call a whole load.
    pub async fn set_blocklist(&mut self, nets: &[ipnet::IpNet]) -> Result<BlockApplied, EnforceError> {
        let (text, applied) = self.block.plan(&self.opts, nets);
        if let Some(text) = text {
            let started = Instant::now();
            if let Err(e) = self.run("transaction", &["-f", "-"], Some(text)).await {
                self.block.forget();
                return Err(e);
            }
            debug!(
                full = applied.full,
                added = applied.added,
                deleted = applied.deleted,
                took = %crate::took(started.elapsed()),
                "nft blocklist transaction applied"
            );
        }
        self.block.commit(nets);
        Ok(applied)
    }

    /// Deletes the blocklist chain and sets (none configured any more).
    pub async fn remove_blocklist(&mut self) -> Result<(), EnforceError> {
        let text = block::render_remove(&self.opts);
        run_with(
            &self.opts.command,
            self.library_for(true),
            "transaction",
            &["-f", "-"],
            Some(text),
        )
        .await?;
        self.block = BlockState::default();
        Ok(())
    }

    pub(super) fn block(&self) -> &BlockState {
        &self.block
    }

    pub async fn init(&mut self, now_ms: i64) -> Result<(), EnforceError> {
        self.reload(now_ms).await?;
        self.book.desire_applied();
        if let Some(p) = &self.preamble {
            info!(table = %self.opts.table, work = %p, "creating or repairing the nftables table");
            self.transact(&Plan::default(), now_ms).await?;
        }
        info!(
            table = %self.opts.table,
            elements = self.book.applied_len(),
            "nftables ready; kept the kernel's elements"
        );
        self.fresh = Some(Instant::now());
        Ok(())
    }

    /// See [`super::Enforcer::preload`]. The book is the kernel's after
    /// `init`'s listing and after each preload that nft took, so the
    /// `replace_all` that follows trusts it (`fresh`) rather than listing
    /// a million elements again.
    ///
    /// One transaction runs at a time, as a task of its own; meanwhile the
    /// pages that arrive are planned (~1 µs an element: the book's tables),
    /// and their transaction starts the moment the running one ends.
    /// Planning used to come between the transactions: ~50 ms before each
    /// large one at 100,000 bans.
    pub async fn preload(
        &mut self,
        pages: &mut UnboundedReceiver<Vec<Element>>,
        keep: impl Fn(&Element) -> bool,
    ) -> Preloaded {
        let mut done = Preloaded::default();
        if self.stale || self.fresh.is_none() {
            return done;
        }
        let mut next: Option<Plan> = None;
        let mut running: Option<Loading> = None;
        let mut open = true;
        loop {
            if running.is_none() {
                match next.take() {
                    // (Pages the kernel overlaps whole plan nothing.)
                    Some(plan) if !plan.is_empty() || self.preamble.is_some() => {
                        running = Some(self.start_loading(plan))
                    }
                    _ if !open => return done,
                    _ => {}
                }
            }
            let room = next.as_ref().is_none_or(|p| p.add.len() < PRELOAD_BATCH);
            tokio::select! {
                page = pages.recv(), if open && room => match page {
                    Some(page) => {
                        let page: Vec<Element> = page.into_iter().filter(&keep).collect();
                        let plan = crate::off_workers(|| self.book.plan_preload(&page, crate::now_ms()));
                        match &mut next {
                            Some(n) => {
                                n.add.extend(plan.add);
                                n.stats.added += plan.stats.added;
                            }
                            None => next = Some(plan),
                        }
                    }
                    None => open = false,
                },
                ran = async { (&mut running.as_mut().expect("guarded").run).await }, if running.is_some() => {
                    let l = running.take().expect("guarded");
                    let ran = ran.unwrap_or_else(|e| Err(EnforceError::Spawn {
                        program: "nft".to_owned(),
                        source: std::io::Error::other(e),
                    }));
                    match ran {
                        Ok(ran) => {
                            self.applied(l.added, 0, l.started, &l.render, ran.via);
                            self.fresh = Some(Instant::now());
                            done.loaded += l.added;
                            done.transactions += 1;
                        }
                        Err(e) => {
                            // What the kernel took is unknown: the next apply lists it.
                            (self.stale, self.fresh) = (true, None);
                            done.failed = Some(e);
                            return done;
                        }
                    }
                }
            }
        }
    }

    /// Renders `plan` (or encodes it as one netlink batch, [`batch_for`])
    /// and starts its transaction as a task of its own.
    ///
    /// [`batch_for`]: NftEnforcer::batch_for
    fn start_loading(&mut self, plan: Plan) -> Loading {
        let started = Instant::now();
        let now = crate::now_ms();
        let added = plan.add.len();
        if let Some(batch) = crate::off_workers(|| self.batch_for(&plan, now)) {
            let render = crate::took(started.elapsed());
            let (opts, lengths) = (self.opts.clone(), self.lengths.clone());
            let run = tokio::spawn(async move {
                if send_batch(batch).await? {
                    return Ok(Ran {
                        out: Vec::new(),
                        via: "netlink",
                    });
                }
                // Not sent: nft takes the same plan (its sets all exist).
                let (text, _) = script::render(&opts, None, &plan, now, &lengths);
                run_with(&opts.command, opts.library, "transaction", &["-f", "-"], Some(text)).await
            });
            return Loading {
                run,
                started,
                render,
                added,
            };
        }
        let (text, created) =
            crate::off_workers(|| script::render(&self.opts, self.preamble.as_ref(), &plan, now, &self.lengths));
        let render = crate::took(started.elapsed());
        let (command, library) = (self.opts.command.clone(), self.library_for(self.preamble.is_some()));
        // Taken as the kernel's once sent: if nft refuses it, the book is
        // stale and the next apply lists the kernel.
        self.preamble = None;
        self.lengths.extend(created);
        let run =
            tokio::spawn(async move { run_with(&command, library, "transaction", &["-f", "-"], Some(text)).await });
        Loading {
            run,
            started,
            render,
            added,
        }
    }

    pub fn preloaded(&mut self) {
        self.book.compact();
    }

    pub async fn add(&mut self, elems: &[Element], now_ms: i64) -> Result<(), EnforceError> {
        self.update(elems, &[], now_ms).await
    }

    pub async fn remove(&mut self, nets: &[ipnet::IpNet], now_ms: i64) -> Result<(), EnforceError> {
        self.update(&[], nets, now_ms).await
    }

    pub async fn update(&mut self, add: &[Element], remove: &[ipnet::IpNet], now_ms: i64) -> Result<(), EnforceError> {
        self.book.desire(add, now_ms);
        self.book.undesire(remove);
        let touched: Vec<ipnet::IpNet> = add.iter().map(|e| e.net).chain(remove.iter().copied()).collect();
        self.apply_touched(Some(&touched), now_ms).await.map(drop)
    }

    pub async fn replace_all(&mut self, desired: &[Element], now_ms: i64) -> Result<ReconcileStats, EnforceError> {
        let expired = self.book.set_desired(desired, now_ms);
        // A reconcile trusts the kernel, not the bookkeeping (but for the
        // one right after `init`, which has just listed it), up to
        // `list_max` elements: a listing's cost grows with the square of
        // the set's size, and nothing else goes to nft meanwhile.
        let applied = self.book.applied_len();
        if self.fresh.is_none_or(|t| t.elapsed() >= FRESH_FOR) {
            if applied <= self.opts.list_max {
                self.stale = true;
            } else if !self.stale {
                debug!(
                    table = %self.opts.table,
                    elements = applied,
                    list_max = self.opts.list_max,
                    "Reconcile planned against the bookkeeping; the kernel's set is too large to list at every repair."
                );
            }
        }
        let mut stats = self.apply(now_ms).await?;
        stats.expired = expired;
        stats.log(Some(&self.opts.table));
        Ok(stats)
    }

    pub async fn tick(&mut self, now_ms: i64) -> Result<(), EnforceError> {
        self.apply(now_ms).await.map(drop)
    }

    pub fn next_wakeup(&self) -> Option<i64> {
        self.book.wake()
    }

    /// Whether the table is still in the kernel: its chain `input` asked
    /// of nf_tables directly (`netlink.rs`) where libnftables would run,
    /// else found in nft's `-j list chains inet` (nft 1.0.6 fetches every
    /// element of every set for `list tables` and even `list chain`, 1.0-1.5
    /// s with 100k bans every 5 s, but none for `list chains`). When the
    /// table or its chain is gone (`nft flush ruleset`, an nftables service
    /// reload) it is re-created with every wanted ban and the stats of that
    /// load are returned.
    pub async fn check(&mut self, now_ms: i64) -> Result<Option<ReconcileStats>, EnforceError> {
        // The socket is this process's namespace's, as libnftables' is.
        let asked = self
            .opts
            .library
            .then(|| netlink::has_chain(&self.opts.table, script::CHAIN));
        let present = match asked {
            Some(Ok(present)) => present,
            failed => {
                if let Some(Err(e)) = failed {
                    static SAID: std::sync::Once = std::sync::Once::new();
                    SAID.call_once(
                        || info!(error = %e, "Cannot ask nf_tables for the table's chain; nft lists the chains instead."),
                    );
                }
                let out = self
                    .run("list chains", &["-j", "list", "chains", "inet"], None)
                    .await?
                    .out;
                listing::has_chain(&out, &self.opts).map_err(|detail| EnforceError::Listing {
                    table: self.opts.table.clone(),
                    detail,
                })?
            }
        };
        if present {
            return Ok(None);
        }
        self.stale = true;
        // The blocklist sets went with the table: the next load is whole.
        self.block.forget();
        self.apply(now_ms).await.map(Some)
    }

    /// Whether nft runs and lists the tables, and whether ours is among
    /// them (`fleetban check --online`); changes nothing.
    pub async fn probe(&mut self) -> Result<bool, EnforceError> {
        let out = self.run("list tables", &["list", "tables"], None).await?.out;
        let want = format!("table inet {}", self.opts.table);
        Ok(String::from_utf8_lossy(&out).lines().any(|l| l.trim() == want))
    }

    /// Deletes the table; what was in it (read first, `fleetban flush` says it).
    pub async fn flush(&mut self) -> Result<super::Flushed, EnforceError> {
        // A listing that fails (an unreadable table) does not stop the delete.
        let elements = match self.reload(crate::now_ms()).await {
            Ok(()) => self.book.applied_len(),
            Err(_) => 0,
        };
        let text = format!("delete table inet {}\n", self.opts.table);
        let table = match self.run("delete table", &["-f", "-"], Some(text)).await {
            Ok(_) => true,
            Err(EnforceError::Nft { stderr, .. }) if is_enoent(&stderr) => false,
            Err(e) => return Err(e),
        };
        self.book.clear();
        self.block = BlockState::default();
        self.lengths.clear();
        self.preamble = Some(Preamble::create());
        self.stale = false;
        self.fresh = None;
        if table {
            info!(table = %self.opts.table, elements, "nftables table deleted");
        }
        Ok(super::Flushed { table, elements })
    }

    pub(super) fn book(&self) -> &Book {
        &self.book
    }

    /// Plans and runs one transaction; on refusal re-reads and retries once.
    async fn apply(&mut self, now_ms: i64) -> Result<ReconcileStats, EnforceError> {
        self.apply_touched(None, now_ms).await
    }

    /// As `apply`; when only `touched` nets changed and the kernel's state
    /// is known, plans for them alone (`Book::plan_for`) instead of walking
    /// every ban: one ban on top of 100k planned in µs instead of ~10 ms.
    async fn apply_touched(
        &mut self,
        touched: Option<&[ipnet::IpNet]>,
        now_ms: i64,
    ) -> Result<ReconcileStats, EnforceError> {
        // Listings and transactions take time at 100k elements: keep `now`
        // moving so timeouts and expiry margins stay right.
        let t0 = Instant::now();
        self.fresh = None;
        let now = || now_ms + i64::try_from(t0.elapsed().as_millis()).unwrap_or(i64::MAX / 2);
        let listed = self.stale;
        if listed {
            self.reload(now()).await?;
        }
        let at = now();
        let quick = touched
            .filter(|_| !listed)
            .and_then(|nets| self.book.plan_for(nets, at));
        let incremental = quick.is_some();
        let plan = quick.unwrap_or_else(|| self.book.plan(at));
        debug!(
            took = %crate::took(t0.elapsed()),
            listed, incremental, "nft plan ready"
        );
        let first = match self.transact(&plan, at).await {
            Ok(()) => {
                self.book.commit(&plan);
                return Ok(plan.stats);
            }
            Err(e @ EnforceError::Nft { .. }) => e,
            Err(e) => {
                self.stale = true;
                return Err(e);
            }
        };
        warn!(table = %self.opts.table, error = %first, "nft transaction failed; re-reading the kernel and retrying once");
        self.reload(now()).await?;
        let at = now();
        let plan = self.book.plan(at);
        match self.transact(&plan, at).await {
            Ok(()) => {
                self.book.commit(&plan);
                Ok(plan.stats)
            }
            Err(e) => {
                self.stale = true;
                Err(e)
            }
        }
    }

    /// Runs the preamble (if due) and the plan as one nft transaction.
    async fn transact(&mut self, plan: &Plan, now: i64) -> Result<(), EnforceError> {
        if plan.is_empty() && self.preamble.is_none() {
            return Ok(());
        }
        let started = Instant::now();
        if let Some(batch) = self.batch_for(plan, now) {
            let encode = crate::took(started.elapsed());
            if send_batch(batch).await? {
                self.applied(plan.add.len(), plan.delete.len(), started, &encode, "netlink");
                return Ok(());
            }
        }
        let (text, created) = script::render(&self.opts, self.preamble.as_ref(), plan, now, &self.lengths);
        let render = crate::took(started.elapsed());
        let library = self.library_for(self.preamble.is_some());
        let via = run_with(&self.opts.command, library, "transaction", &["-f", "-"], Some(text))
            .await?
            .via;
        self.preamble = None;
        self.lengths.extend(created);
        self.applied(plan.add.len(), plan.delete.len(), started, &render, via);
        Ok(())
    }

    /// The debug line of a transaction nft took (`bench/scale.rs` reads it).
    fn applied(&self, added: usize, deleted: usize, started: Instant, render: &str, via: &str) {
        debug!(
            table = %self.opts.table,
            added,
            deleted,
            took = %crate::took(started.elapsed()),
            render = %render,
            via = %via,
            "nft transaction applied"
        );
    }

    /// Replaces the applied state with the kernel's, and notes layout work.
    async fn reload(&mut self, now: i64) -> Result<(), EnforceError> {
        self.stale = true;
        let t = self.opts.table.clone();
        // `now` is when the listing began: each `expires` was read later,
        // by up to its whole duration (`Book::slack`).
        let started = Instant::now();
        let listed = self
            .run("list table", &["-j", "list", "table", "inet", &t], None)
            .await
            .map(|r| r.out);
        let took = i64::try_from(started.elapsed().as_millis()).unwrap_or(i64::MAX);
        let view = match listed {
            Ok(out) => listing::parse(&out, &self.opts, now).map_err(|detail| EnforceError::Listing {
                table: self.opts.table.clone(),
                detail,
            })?,
            Err(EnforceError::Nft { stderr, .. }) if is_enoent(&stderr) => KernelView::absent(),
            Err(e) => return Err(e),
        };
        if view.unknown > 0 {
            warn!(table = %self.opts.table, count = view.unknown, "nft listed elements of an unknown shape; left alone");
        }
        self.book.load_applied(&view.elems, took);
        self.preamble = view.preamble;
        self.lengths = view.lengths;
        self.stale = false;
        Ok(())
    }

    /// `plan` as one netlink batch to nf_tables (`batch.rs`), when it is
    /// element changes alone, to sets the kernel holds, and nft would run
    /// in process (the system's nft: the socket is this namespace's). Else
    /// nft runs it.
    fn batch_for(&self, plan: &Plan, now: i64) -> Option<Batch> {
        if !self.opts.library || self.preamble.is_some() || UNSENT.load(Ordering::Relaxed) {
            return None;
        }
        if plan
            .add
            .iter()
            .any(|(net, _)| script::missing_length(net, &self.lengths).is_some())
        {
            return None;
        }
        Batch::of(&self.opts.table, plan, now)
    }

    /// Whether a transaction may run through libnftables. Table work (the
    /// table's creation or repair, a blocklist's removal) comes once a
    /// start or a repair and runs the program, so that a daemon with no
    /// ban to add never loads the library (an idle daemon's memory,
    /// design §10); a change that creates a set runs in process when
    /// small (element changes alone are batches, `batch_for`).
    fn library_for(&self, table_work: bool) -> bool {
        self.opts.library && !table_work
    }

    /// Runs `nft <args...>`, feeding `stdin`; returns its output. Through
    /// libnftables when `in_process` says so, else `<command...> <args...>`.
    async fn run(&self, what: &'static str, args: &[&str], stdin: Option<String>) -> Result<Ran, EnforceError> {
        run_with(&self.opts.command, self.opts.library, what, args, stdin).await
    }
}

/// Runs `nft <args...>`, feeding `stdin`; returns its output. Through
/// libnftables when `library` and [`in_process`] say so, else `<command...>
/// <args...>`.
async fn run_with(
    command: &[String],
    library: bool,
    what: &'static str,
    args: &[&str],
    stdin: Option<String>,
) -> Result<Ran, EnforceError> {
    if let Some((ctx, cmd)) = in_process(library, args, stdin.as_deref()) {
        // The transaction's text itself, not a copy (it becomes the
        // library's C string).
        let (text, json) = match cmd {
            LibraryCommand::Stdin => (stdin.unwrap_or_default(), false),
            LibraryCommand::Text(text, json) => (text.to_owned(), json),
        };
        let call = tokio::task::spawn_blocking(move || {
            let mut ctx = ctx.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            ctx.run(text, json)
        });
        let answer = within(what, call).await?.map_err(|e| EnforceError::Spawn {
            program: "libnftables".to_owned(),
            source: std::io::Error::other(e),
        })?;
        return match answer {
            Ok(out) => Ok(Ran {
                out,
                via: "libnftables",
            }),
            Err(stderr) => Err(EnforceError::Nft {
                what,
                status: "libnftables".to_owned(),
                stderr: cap(&stderr),
            }),
        };
    }
    let out = run_program(command, what, args, stdin).await?;
    Ok(Ran { out, via: "nft" })
}

/// A batch could not be sent once (no socket, no buffer): nft runs every
/// later change.
static UNSENT: AtomicBool = AtomicBool::new(false);

/// Sends `batch` on a blocking thread: true once nf_tables applied it,
/// false if it could not be sent (nothing changed: the caller has nft run
/// the plan). A refusal, or no answer, is an error as nft's refusal is:
/// the caller lists the kernel and plans again.
async fn send_batch(batch: Batch) -> Result<bool, EnforceError> {
    let sent = within("transaction", tokio::task::spawn_blocking(move || batch.send()))
        .await?
        .map_err(|e| EnforceError::Spawn {
            program: "nf_tables batch".to_owned(),
            source: std::io::Error::other(e),
        })?;
    match sent {
        Ok(()) => Ok(true),
        Err(Failed::Unsent(e)) => {
            UNSENT.store(true, Ordering::Relaxed);
            info!(error = %e, "Cannot send element changes to nf_tables directly; nft runs them.");
            Ok(false)
        }
        Err(e) => Err(EnforceError::Nft {
            what: "transaction",
            status: "nf_tables".to_owned(),
            stderr: e.to_string(),
        }),
    }
}

/// The libnftables context and the command for `nft <args...>`, when
/// `library_command` takes it and the library loads.
fn in_process(library: bool, args: &[&str], stdin: Option<&str>) -> Option<(&'static Mutex<Context>, LibraryCommand)> {
    if !library {
        return None;
    }
    let cmd = library_command(args, stdin)?;
    let ctx = match libnft::shared() {
        Ok(ctx) => ctx,
        Err(why) => {
            static SAID: std::sync::Once = std::sync::Once::new();
            SAID.call_once(|| info!(reason = why, "Running the nft program for every nftables command."));
            return None;
        }
    };
    Some((ctx, cmd))
}

/// Runs `<command...> <args...>`, feeding `stdin`; returns stdout.
async fn run_program(
    command: &[String],
    what: &'static str,
    args: &[&str],
    stdin: Option<String>,
) -> Result<Vec<u8>, EnforceError> {
    let (program, prefix) = command.split_first().ok_or(EnforceError::EmptyCommand)?;
    let spawn_err = |source| EnforceError::Spawn {
        program: program.clone(),
        source,
    };
    let mut child = Command::new(program)
        .args(prefix)
        .args(args)
        .stdin(if stdin.is_some() { Stdio::piped() } else { Stdio::null() })
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true)
        .spawn()
        .map_err(spawn_err)?;
    let pipe = child.stdin.take();
    let write = async move {
        if let (Some(mut pipe), Some(text)) = (pipe, stdin) {
            // An early exit of nft shows as its status; ignore EPIPE here.
            let _ = pipe.write_all(text.as_bytes()).await;
        }
    };
    let both = async { tokio::join!(write, child.wait_with_output()).1 };
    let output = within(what, both).await?.map_err(spawn_err)?;
    if !output.status.success() {
        return Err(EnforceError::Nft {
            what,
            status: output.status.to_string(),
            stderr: cap(&String::from_utf8_lossy(&output.stderr)),
        });
    }
    Ok(output.stdout)
}

/// `call`'s output, or a timeout after `NFT_TIMEOUT` (nft is killed, or
/// libnftables' call left to finish behind the context's lock).
async fn within<T>(what: &'static str, call: impl std::future::Future<Output = T>) -> Result<T, EnforceError> {
    tokio::time::timeout(NFT_TIMEOUT, call)
        .await
        .map_err(|_| EnforceError::Timeout {
            what,
            after: NFT_TIMEOUT,
        })
}

/// What libnftables runs for an `nft <args...>`.
#[derive(Debug, PartialEq)]
enum LibraryCommand {
    /// The transaction on stdin (`-f -`).
    Stdin,
    /// A command, and whether as `nft -j`.
    Text(&'static str, bool),
}

/// `nft <args...>` (with `stdin`) as libnftables' command, when it is
/// small enough to run in this process: a transaction of at most
/// `LIBRARY_MAX` bytes, the chain and table lists. A table's listing is as
/// long as the table: always the program's.
fn library_command(args: &[&str], stdin: Option<&str>) -> Option<LibraryCommand> {
    match (args, stdin) {
        (["-f", "-"], Some(text)) if text.len() <= LIBRARY_MAX => Some(LibraryCommand::Stdin),
        (["-j", "list", "chains", "inet"], None) => Some(LibraryCommand::Text("list chains inet", true)),
        (["list", "tables"], None) => Some(LibraryCommand::Text("list tables", false)),
        _ => None,
    }
}

/// What a command printed, and which nft ran it: `libnftables` (in this
/// process) or `nft` (the program).
struct Ran {
    out: Vec<u8>,
    via: &'static str,
}

/// Elements per preload transaction at most.
const PRELOAD_BATCH: usize = 262_144;

/// What the start's preload put into the kernel.
#[derive(Debug, Default)]
pub struct Preloaded {
    pub loaded: usize,
    pub transactions: usize,
    /// The transaction that failed (the preload stopped there).
    pub failed: Option<EnforceError>,
}

/// A preload transaction nft runs while the next is planned.
struct Loading {
    run: tokio::task::JoinHandle<Result<Ran, EnforceError>>,
    started: Instant,
    render: String,
    added: usize,
}

/// nft's answer for a table (or element) that does not exist.
fn is_enoent(stderr: &str) -> bool {
    stderr.contains("No such file or directory")
}

fn cap(stderr: &str) -> String {
    let s = stderr.trim();
    if s.len() <= STDERR_CAP {
        return s.to_owned();
    }
    let mut end = STDERR_CAP;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{} ... ({} more bytes)", &s[..end], s.len() - end)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn small_transactions_and_the_short_lists_run_in_process_a_table_listing_never() {
        let one = "add element inet fleetban v4 { 192.0.2.1 timeout 3600000ms }\n";
        assert_eq!(library_command(&["-f", "-"], Some(one)), Some(LibraryCommand::Stdin));
        let long = one.repeat(LIBRARY_MAX / one.len() + 1);
        assert_eq!(library_command(&["-f", "-"], Some(&long)), None, "a large transaction");
        assert_eq!(
            library_command(&["-j", "list", "chains", "inet"], None),
            Some(LibraryCommand::Text("list chains inet", true))
        );
        assert_eq!(
            library_command(&["list", "tables"], None),
            Some(LibraryCommand::Text("list tables", false))
        );
        assert_eq!(
            library_command(&["-j", "list", "table", "inet", "fleetban"], None),
            None
        );
    }
}
