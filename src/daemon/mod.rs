//! `fleetban run`: wires the tasks of one host together.
//!
//! ```text
//! follower ──chunks──▶ pipeline ──bans──▶ enforcer task ──▶ nft
//!                        ▲    │                 ▲
//!        fleet sync ─────┴────┼─────────────────┤   (ban events, reconcile)
//!        control socket ──────┴─────────────────┘   (status, manual bans)
//! ```
//! Shutdown is one mechanism: a `CancellationToken` that every task watches
//! and a `TaskTracker` we wait on, with a deadline after which we go anyway.
//! The pipeline commits what it has read and saves offsets; the nft table
//! stays (the kernel keeps expiring bans while we are down).

pub mod control;
mod enforcer;
mod notify;
mod pipeline;
pub mod stats;

pub use enforcer::Change;
pub use notify::notify;

use std::future::Future;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::bans::{BanCache, BanList, SafetyValve};
use crate::config::{Backend, Config};
use crate::detect::{AllowList, Pending, Plan};
use crate::enforce::{Action, Element, EnforceError, Enforcer, NftOptions};
use crate::fleet::FleetSync;
use crate::limit::{Limiter, MemoryLimiter, RedisLimiter, RuleLimit};
use crate::source::{FollowOptions, OffsetStore};
use crate::store::{self, Keys};

pub struct Options {
    pub dry_run: bool,
    pub config_path: PathBuf,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("state dir {0}: {1}")]
    StateDir(PathBuf, std::io::Error),
    #[error("firewall: {0}")]
    Enforce(#[from] EnforceError),
    #[error("log format: {0}")]
    Format(#[from] crate::parse::FormatError),
    #[error("control socket {0}: {1}")]
    Control(PathBuf, std::io::Error),
}

/// The firewall backend the configuration asks for (`log` on --dry-run).
pub fn enforcer_for(config: &Config, dry_run: bool) -> Result<Enforcer, EnforceError> {
    if dry_run || config.firewall.backend == Backend::Log {
        return Ok(Enforcer::log());
    }
    let command = match std::env::var("FLEETBAN_NFT") {
        // Tests and unusual installs: the nft binary's path (argv, never a shell string).
        Ok(p) if !p.is_empty() => vec![p],
        _ => vec!["nft".to_owned()],
    };
    Enforcer::nft(NftOptions {
        table: config.firewall.table.clone(),
        action: match config.firewall.action {
            crate::config::ActionSpec::Drop => Action::Drop,
            crate::config::ActionSpec::Reject => Action::Reject,
        },
        ports: config.firewall.ports.clone(),
        command,
    })
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
    let _ = &opts.config_path;
    tokio::pin!(shutdown);
    std::fs::create_dir_all(&config.state_dir).map_err(|e| DaemonError::StateDir(config.state_dir.clone(), e))?;
    let offsets =
        Arc::new(OffsetStore::open(&config.state_dir).map_err(|e| DaemonError::StateDir(config.state_dir.clone(), e))?);
    let allow = AllowList::new(&config.allow);
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    let stats = Arc::new(stats::Stats::new(&names));

    let mut enforcer = enforcer_for(&config, opts.dry_run)?;
    enforcer.init(crate::now_ms()).await?;

    let (enf_tx, enf_rx) = tokio::sync::mpsc::unbounded_channel();
    let (cache_tx, cache_rx) = tokio::sync::mpsc::unbounded_channel();
    let rules = RuleLimit::of(&config.rules);

    // The store: Redis when configured (waiting for it rather than exiting),
    // the embedded one otherwise.
    let (limiter, bans, fleet, initial) = match &config.redis {
        Some(r) => {
            let (con, events) = tokio::select! {
                c = connect_until_up(r) => c,
                _ = &mut shutdown => return Ok(()),
            };
            let keys = Keys::new(&r.prefix);
            let mut fleet = FleetSync {
                events,
                list: BanList::redis(con.clone(), keys.clone()),
                keys: keys.clone(),
                reconcile_every: r.reconcile_every,
                sinks: vec![enf_tx.clone(), cache_tx.clone()],
            };
            let (last_id, initial) = match fleet.snapshot().await {
                Ok(s) => s,
                Err(e) => {
                    tracing::warn!(error = %e, "Reading the ban list at start failed; the first reconcile retries.");
                    ("$".to_owned(), Vec::new())
                }
            };
            stats.redis_connected.store(true, std::sync::atomic::Ordering::Relaxed);
            let limiter = Limiter::Redis(RedisLimiter::new(con.clone(), keys.clone(), &config.host_id, rules));
            (limiter, BanList::redis(con, keys), Some((fleet, last_id)), initial)
        }
        None => {
            let mut list = BanList::memory(Some(config.state_dir.join("bans.json")));
            let initial = list
                .active(crate::now_ms())
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|(net, until)| Element { net, until })
                .collect();
            (Limiter::Memory(MemoryLimiter::new(rules)), list, None, initial)
        }
    };

    // First sync: the kernel set equals the list before anything else runs.
    let initial: Vec<Element> = initial.into_iter().filter(|e| !allow.overlaps(&e.net)).collect();
    if let Err(e) = enforcer.replace_all(&initial, crate::now_ms()).await {
        tracing::warn!(error = %e, "Applying the ban list at start failed; the next reconcile retries.");
    }
    let mut cache = BanCache::default();
    cache.replace(initial.iter().map(|e| (e.net, e.until)));
    stats
        .bans_active
        .store(cache.len() as u64, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(bans = initial.len(), rules = config.rules.len(), "Ban list applied.");

    tracker.spawn(enforcer::run(enforcer, enf_rx, allow.clone(), token.clone()));
    if let Some((fleet, last_id)) = fleet {
        tracker.spawn(fleet.run(last_id, token.clone()));
    }

    let patterns = config.log_patterns();
    let plan = Plan::new(&config.rules)?;
    // A few chunks of up to 1 MiB: enough to overlap reading with a flush, small
    // enough that a large backlog costs no memory.
    let (chunk_tx, chunk_rx) = tokio::sync::mpsc::channel(4);
    let follower = crate::source::spawn(
        patterns,
        offsets.clone(),
        FollowOptions::default(),
        chunk_tx,
        token.clone(),
    );
    // The control socket answers once the logs are open (tests and scripts
    // take an answer as "appended lines will be read").
    let bans = Arc::new(Mutex::new(bans));
    let listener = match control::bind(&config.control) {
        Ok(l) => l,
        Err(e) => {
            token.cancel();
            return Err(DaemonError::Control(config.control.clone(), e));
        }
    };
    let ctl = control::Control {
        stats: stats.clone(),
        bans: bans.clone(),
        host: config.host_id.clone(),
        sinks: vec![enf_tx.clone(), cache_tx.clone()],
    };
    tracker.spawn(ctl.serve(listener, token.clone()));

    let pipeline = pipeline::Pipeline {
        host: config.host_id.clone(),
        rules: config
            .rules
            .iter()
            .map(|r| pipeline::RuleInfo {
                name: r.name.clone(),
                window_ms: r.limit.window_ms,
                clock: r.limit.clock,
                ban: r.ban,
            })
            .collect(),
        plan,
        routes: Default::default(),
        allow,
        ipv6_prefix: config.ipv6_prefix,
        limiter,
        bans,
        valve: SafetyValve::new(config.max_bans_per_minute),
        changes: enf_tx,
        updates: cache_rx,
        offsets,
        stats,
        cache,
        pending: Pending::default(),
        uncommitted: Vec::new(),
    };
    drop(cache_tx);
    tracker.spawn(pipeline.run(chunk_rx, token.clone()));
    tracker.close();

    notify("READY=1\nSTATUS=following logs");
    tracing::info!(host = %config.host_id, "fleetban running.");
    shutdown.await;
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

/// Two connections (commands, and blocking event reads), retried with
/// backoff until Redis answers: a Redis that is down at start is waited for.
async fn connect_until_up(
    r: &crate::config::RedisConfig,
) -> (redis::aio::ConnectionManager, redis::aio::ConnectionManager) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let cmd = store::connect(r, Some(r.timeout)).await;
        let ev = store::connect(r, Some(Duration::from_secs(5))).await;
        match (cmd, ev) {
            (Ok(c), Ok(e)) => return (c, e),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(url = %r.url, error = %e, "Redis unreachable; retrying.");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
