//! `fleetban run`: wires the tasks of one host together.
//!
//! ```text
//! follower ──chunks──▶ pipeline ──bans──▶ enforcer task ──▶ nft
//!                        ▲    │                 ▲
//!        fleet sync ─────┴────┼─────────────────┤   (ban events, reconcile)
//!        control socket ──────┴─────────────────┘   (status, manual bans)
//! ```
//! With `http:`, the decision endpoint's view of the list takes every
//! change the enforcer takes (`http::follow`), and `http::serve` answers
//! nginx's checks from it.
//! Shutdown is one mechanism: a `CancellationToken` that every task watches
//! and a `TaskTracker` we wait on, with a deadline after which we go anyway.
//! The pipeline commits what it has read and saves offsets; the nft table
//! stays (the kernel keeps expiring bans while we are down).

mod alerts;
mod blocklist;
mod control;
mod enforcer;
mod logging;
mod memory;
mod metrics;
mod nearest;
mod notify;
mod order;
mod pipeline;
mod ratelog;
mod reload;
mod start;
pub mod stats;

pub use logging::{init_logging, wants_journal};
use memory::limit_arenas;
pub(crate) use memory::{release_code_pages, trim_heap};
pub use notify::notify;
pub use start::LOCK_FILE;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::config::Config;
use crate::detect::{Mode, Plan, Scanner};
use crate::enforce::{Changes, EnforceError};
use crate::source::OffsetStore;
use pipeline::{Inputs, Pipeline};
use reload::Following;
use stats::Stats;

pub struct Options {
    pub dry_run: bool,
    pub config_path: PathBuf,
    /// Benchmark baseline only (hidden `run --bench-one-call-per-hit`): the
    /// Redis limiter sends one EVALSHA per hit, unpipelined.
    pub bench_one_call_per_hit: bool,
    /// Benchmark comparison only (hidden `run --bench-one-flight`): one
    /// limiter round trip in flight at most, as before two were allowed.
    pub bench_one_flight: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("state dir {0}: {1}")]
    StateDir(PathBuf, std::io::Error),
    #[error("{} is held by another fleetban{}: one daemon per state_dir", lock.display(), pid.map(|p| format!(" (pid {p})")).unwrap_or_default())]
    Locked { lock: PathBuf, pid: Option<u32> },
    #[error("firewall: {0}")]
    Enforce(#[from] EnforceError),
    #[error("log format: {0}")]
    Format(#[from] crate::parse::FormatError),
    #[error("metrics endpoint {0}: {1}")]
    Metrics(std::net::SocketAddr, std::io::Error),
    #[error("control socket {0}: {1}")]
    Control(PathBuf, std::io::Error),
    #[error("decision endpoint {0}: {1}")]
    Http(crate::config::Listen, std::io::Error),
}

/// What the daemon's process needs before its runtime starts: the
/// allocator's arenas limited, logging to the journal or stderr.
pub fn prepare_process() {
    limit_arenas();
    init_logging();
}

/// Sleeps until `at`; forever if None.
pub(crate) async fn sleep_until_opt(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}

/// Resolves on SIGTERM or SIGINT.
pub async fn signals() {
    use tokio::signal::unix::{signal, SignalKind};
    let (Ok(mut term), Ok(mut int)) = (signal(SignalKind::terminate()), signal(SignalKind::interrupt())) else {
        return std::future::pending().await;
    };
    tokio::select! {
        _ = term.recv() => {}
        _ = int.recv() => {}
    }
}

pub async fn run(config: Config, opts: Options, shutdown: impl Future<Output = ()>) -> Result<(), DaemonError> {
    tokio::pin!(shutdown);
    // Installed first: SIGHUP's default action would end the process.
    let mut hup = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::hangup()).ok();
    std::fs::create_dir_all(&config.state_dir).map_err(|e| DaemonError::StateDir(config.state_dir.clone(), e))?;
    // Held until the process ends: a second daemon on this state dir stops here.
    let _lock = start::lock_state_dir(&config.state_dir)?;
    let offsets =
        Arc::new(OffsetStore::open(&config.state_dir).map_err(|e| DaemonError::StateDir(config.state_dir.clone(), e))?);
    // The host's one never-banned set, following its interfaces: the
    // pipeline (never counted), the enforcer (never in nft), the endpoint
    // (never denied) and the blocklists (never dropped) all read it.
    let own = Arc::new(config.own_addresses());
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();

    let mut enforcer = config.firewall.enforcer(opts.dry_run)?;
    // nft's listing and table creation run while the ban list is read (at
    // 100k bans both take tens of ms), then the list's pages go into nft
    // as they are read (`start::preload`).
    let (early, mut pages) = tokio::sync::mpsc::unbounded_channel();
    let never = own.current();
    let init = tokio::spawn(async move {
        let r = enforcer.init(crate::now_ms()).await;
        // What the kernel kept, before the list's pages join it.
        let kept = start::kernel_kept(&enforcer);
        if r.is_ok() {
            start::preload(&mut enforcer, &mut pages, &never).await;
        }
        (enforcer, r, kept)
    });
    let read_started = std::time::Instant::now();

    // This host's ban changes go to the enforcer; the fleet's to the
    // enforcer and to the pipeline's view of the list (which the endpoint
    // reads: one view).
    let (enf_tx, enf_rx) = tokio::sync::mpsc::unbounded_channel();
    let (updates_tx, updates_rx) = tokio::sync::mpsc::unbounded_channel();
    let (ours, all) = (vec![enf_tx.clone()], vec![enf_tx, updates_tx]);
    let store = tokio::select! {
        s = start::open(&config, &opts, Changes::to(ours), Changes::to(all), early) => s,
        _ = &mut shutdown => return Ok(()),
    };
    let start::Store {
        limiter,
        bans,
        health,
        fleet,
        hot,
        initial,
    } = store;
    tracing::debug!(took = %crate::took(read_started.elapsed()), "Ban list read.");
    // This host's view of the list, built while nft's load goes on: the
    // endpoint serves from it once the start knows the list stays as read.
    let early_view = initial.as_deref().map(start::view_of);
    // `notify:`: each target's sender runs on its own task; the ban owner
    // only queues (never waits on a target).
    let notifier = crate::notify::Notifier::start(&config.notify, config.ipv6_prefix, &tracker, token.clone());
    let mut bans = bans.with_notify(notifier.clone());
    let (mut enforcer, init, mut kept) = match init.await {
        Ok(done) => done,
        // Only a panic in init (a bug) gets here: keep it a panic.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    init?;

    // A host new to the embedded store keeps what its firewall enforces.
    let (initial, adopted) = match bans.absent_at_start() {
        true => start::adopt_kernel(std::mem::take(&mut kept), &mut bans, initial),
        false => (initial, false),
    };
    // With Redis: a list lost while this host was down gets its set back.
    let mut fleet = fleet;
    let (initial, written_back) = match fleet.as_mut() {
        Some((f, _)) => start::after_a_loss(kept, f, initial).await,
        None => (initial, false),
    };
    // The view built from the list as read stands unless the list grew.
    let early_view = early_view.filter(|_| !adopted && !written_back);
    // The decision endpoint serves from the start's view as soon as it is
    // built, while the first sync plans the kernel's set; the blocklists
    // join it once read, below.
    let http_counters = Arc::new(crate::http::HttpCounters::default());
    let (view_built, view_ready) = tokio::sync::oneshot::channel();
    let (nets_tx, endpoint_blocks) = tokio::sync::watch::channel(Arc::default());
    if let Some(http) = &config.http {
        let listener = match crate::http::bind(http).await {
            Ok(l) => l,
            Err(e) => {
                token.cancel();
                return Err(DaemonError::Http(http.listen.clone(), e));
            }
        };
        let decisions = Arc::new(crate::http::Decisions::new(bans.view(), own.current()));
        let endpoint = crate::http::Endpoint {
            decisions: decisions.clone(),
            deny_status: http.deny_status,
            counters: http_counters.clone(),
            proxies: crate::addr::NetSet::new(&config.proxies),
        };
        let (listen, deny_status) = (http.listen.clone(), http.deny_status);
        let (never, tasks, token) = (own.subscribe(), tracker.clone(), token.clone());
        tracker.spawn(async move {
            // The start failed before its view was built: nothing to serve.
            if view_ready.await.is_err() {
                return;
            }
            tracing::info!(%listen, deny_status, "Decision endpoint on GET /check.");
            tasks.spawn(crate::http::follow(decisions, never, endpoint_blocks, token.clone()));
            crate::http::serve(listener, endpoint, token).await;
        });
    }
    // First sync: the kernel set equals the list before anything else runs.
    let (applied, asked) = start::first_sync(
        &mut enforcer,
        initial,
        &own.current(),
        (early_view, bans.view(), view_built),
    )
    .await;
    bans.view_built();
    tracing::info!(bans = applied, rules = config.rules.len(), "Ban list applied.");
    // The list's reply, its copies and the transaction's text are freed now.
    trim_heap();

    let names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    let mut stats = Stats::new(
        &names,
        config.max_bans_per_minute,
        limiter.counters(),
        bans.counters(),
        health,
    );
    if let Some(http) = &config.http {
        stats = stats.with_http(http.listen.to_string(), http_counters.clone());
    }
    stats = stats.with_notify(notifier.targets());
    if let Some(r) = &config.redis {
        stats = stats.with_on_down(r.on_down);
        // `status` says `down` within about a second, traffic or not.
        let wait = r.timeout.max(Duration::from_millis(500));
        if let (Some(h), Ok(con)) = (&stats.health, crate::store::connect_lazy(r, Some(wait))) {
            tracker.spawn(crate::store::heartbeat(con, h.clone(), wait, token.clone()));
        }
    }
    let stats = Arc::new(stats);
    if notifier.is_on() {
        tracker.spawn(alerts::run(
            stats.clone(),
            notifier,
            config.host_id.clone(),
            token.clone(),
        ));
    }
    let enforced = Arc::new(enforcer::Enforced::default());
    // Blocklists: read and loaded before anything else is enforced after
    // the bans, in one transaction; then refreshed by their own task.
    let mut lists = blocklist::Blocklists::new(config.blocklists.clone());
    let wanted = match config.blocklists.is_empty() {
        true => {
            // A blocklist an earlier configuration left in the table would
            // go on dropping what this one no longer lists: removed (the
            // removal is a no-op without it).
            if let Err(e) = enforcer.remove_blocklist().await {
                tracing::warn!(error = %e, "Removing a blocklist left in the table failed.");
            }
            blocklist::Wanted {
                none: true,
                ..Default::default()
            }
        }
        false => {
            let w = lists.read(true, &own.current()).unwrap_or_default();
            blocklist::apply(&mut enforcer, &w, &enforced.blocklist).await;
            w
        }
    };
    nets_tx.send_replace(wanted.nets.clone());
    let (blocks_tx, blocks_rx) = tokio::sync::watch::channel(wanted);
    let (blocklist_reload_tx, blocklist_reload_rx) = tokio::sync::mpsc::unbounded_channel();
    tracker.spawn(blocklist::run(
        lists,
        blocks_tx,
        nets_tx,
        own.subscribe(),
        blocklist_reload_rx,
        token.clone(),
    ));
    tracker.spawn(enforcer::run(
        enforcer,
        enf_rx,
        own.clone(),
        asked,
        stats.clone(),
        enforced.clone(),
        blocks_rx,
        token.clone(),
    ));
    if let Some((fleet, last_id)) = fleet {
        tracker.spawn(fleet.run(last_id, token.clone()));
    }
    let (news, marks) = match hot {
        Some((news, marks, publisher)) => {
            tracker.spawn(publisher.run(token.clone()));
            (Some(news), Some(marks))
        }
        None => (None, None),
    };
    if let Some(addr) = config.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| DaemonError::Metrics(addr, e))?;
        tracing::info!(%addr, "Prometheus metrics on /metrics.");
        tracker.spawn(metrics::serve(listener, stats.clone(), token.clone()));
    }
    let scanner = Scanner::new(
        Mode::Live,
        Plan::new(&config.rules, &config.proxies)?,
        own.current(),
        config.ipv6_prefix,
    );
    // A few chunks of up to 1 MiB: enough to overlap reading with a flush, small
    // enough that a large backlog costs no memory.
    let (chunk_tx, chunk_rx) = tokio::sync::mpsc::channel(4);
    start::warn_logs(&config);
    let mut follower = Some(Following::start(&config, &offsets, &chunk_tx, &token));
    if let Some(f) = &follower {
        stats.set_logs(config.log_patterns(), f.follower.waker());
    }
    // Let the follower take its start positions before anyone is told we
    // are up (control socket, READY=1): a line written after that is read.
    // Bounded: logs that do not exist yet never show up here.
    if let Some(f) = &follower {
        for _ in 0..100 {
            if !f.follower.stats().is_empty() || f.follower.is_finished() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(10)).await;
        }
    }
    let listener = match crate::control::bind(&config.control) {
        Ok(l) => l,
        Err(e) => {
            token.cancel();
            return Err(DaemonError::Control(config.control.clone(), e));
        }
    };
    let (commands_tx, commands_rx) = tokio::sync::mpsc::channel(16);
    let answers = control::Answers {
        stats: stats.clone(),
        pipeline: commands_tx,
        enforced: enforced.clone(),
    };
    tracker.spawn(crate::control::serve(listener, answers, token.clone()));
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    let inputs = Inputs {
        updates: updates_rx,
        commands: commands_rx,
        reloads: reload_rx,
        news,
        marks,
    };
    let rules = reload::rule_infos(&config, &stats);
    let mut pipeline = Pipeline::new(rules, scanner, limiter, bans, inputs, offsets.clone(), stats.clone());
    pipeline.set_unbannable(crate::bans::Unbannable::of(&config));
    pipeline.set_own_addresses(own.clone());
    if opts.bench_one_flight {
        pipeline.set_max_in_flight(1);
    }
    tracker.spawn(pipeline.run(chunk_rx, token.clone()));
    if let Some(interval) = notify::watchdog_interval() {
        tracker.spawn(notify::watchdog(
            stats.clone(),
            enforced.clone(),
            interval,
            token.clone(),
        ));
    }
    tracker.spawn(notify::status_updates(stats.clone(), token.clone()));
    tracker.close();

    notify(&format!("READY=1\nSTATUS={}", notify::summary(&stats)));
    // Started: the code only the start ran is let go.
    release_code_pages();
    tracing::info!(host = %config.host_id, "fleetban running.");
    let mut config = config;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => {
                notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", notify::monotonic_usec()));
                match reload::reload(&config, &opts.config_path, &stats, &reload_tx, &mut follower, &offsets, &chunk_tx, &token).await {
                    Some(new) => {
                        stats.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let _ = blocklist_reload_tx.send(new.blocklists.clone());
                        config = new;
                    }
                    None => {
                        stats.reload_errors.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    }
                }
                notify(&format!("READY=1\nSTATUS={}", notify::summary(&stats)));
            }
        }
    }
    tracing::info!("Stopping.");
    notify("STOPPING=1");
    token.cancel();
    if tokio::time::timeout(Duration::from_secs(5), tracker.wait())
        .await
        .is_err()
    {
        tracing::warn!("Tasks did not stop within 5 s; exiting anyway.");
    }
    drop(follower);
    Ok(())
}
