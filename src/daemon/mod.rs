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
mod metrics;
mod notify;
mod pipeline;
mod ratelog;
pub mod stats;

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
    /// Benchmark baseline only (hidden `run --bench-one-call-per-hit`): the
    /// Redis limiter sends one EVALSHA per hit, unpipelined.
    pub bench_one_call_per_hit: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum DaemonError {
    #[error("state dir {0}: {1}")]
    StateDir(PathBuf, std::io::Error),
    #[error("firewall: {0}")]
    Enforce(#[from] EnforceError),
    #[error("log format: {0}")]
    Format(#[from] crate::parse::FormatError),
    #[error("metrics endpoint {0}: {1}")]
    Metrics(std::net::SocketAddr, std::io::Error),
    #[error("control socket {0}: {1}")]
    Control(PathBuf, std::io::Error),
}

/// Logs the server's ZSET listpack threshold and warns for each sliding
/// window that can outgrow it.
fn warn_listpack(config: &Config, threshold: Option<u64>) {
    let effective = match threshold {
        Some(t) => {
            tracing::info!(
                zset_max_listpack_entries = t,
                "Read the ZSET listpack threshold from the server."
            );
            t
        }
        None => {
            tracing::info!(
                zset_max_listpack_entries = crate::limit::LISTPACK_DEFAULT,
                "CONFIG GET refused or unanswered; assuming Redis's default ZSET listpack threshold."
            );
            crate::limit::LISTPACK_DEFAULT
        }
    };
    for r in &config.rules {
        if let Some(w) = crate::limit::listpack_warning(&r.limit, effective) {
            tracing::warn!(rule = %r.name, "{w}");
        }
    }
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

/// Gives the allocator's free pages back to the kernel. glibc keeps what a
/// large load freed (the list's reply, the 100k-element transaction text)
/// in its per-thread arenas: without this, RSS after loading 100k bans
/// stays well above what is live. Called after loads, never per line.
pub(crate) fn trim_heap() {
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim takes no pointer; it only walks glibc's own free lists.
    unsafe {
        libc::malloc_trim(0);
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
    let offsets =
        Arc::new(OffsetStore::open(&config.state_dir).map_err(|e| DaemonError::StateDir(config.state_dir.clone(), e))?);
    let allow = AllowList::new(&config.allow);
    let token = CancellationToken::new();
    let tracker = TaskTracker::new();
    let names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    let stats = Arc::new(stats::Stats::new(&names));
    stats.valve_limit.store(
        u64::from(config.max_bans_per_minute),
        std::sync::atomic::Ordering::Relaxed,
    );

    let mut enforcer = enforcer_for(&config, opts.dry_run)?;
    // nft's listing and table creation run while the ban list is read: at
    // 100k bans both take tens of ms.
    let init = tokio::spawn(async move {
        let r = enforcer.init(crate::now_ms()).await;
        (enforcer, r)
    });
    let read_started = std::time::Instant::now();

    let (enf_tx, enf_rx) = tokio::sync::mpsc::unbounded_channel();
    let (cache_tx, cache_rx) = tokio::sync::mpsc::unbounded_channel();
    let rules = RuleLimit::of(&config.rules);

    // The store: Redis when configured (waiting for it rather than exiting),
    // the embedded one otherwise.
    let outage = crate::fleet::outage::Outage::new(
        config
            .redis
            .as_ref()
            .map_or(crate::config::OnDown::Local, |r| r.on_down),
        rules.clone(),
        config.redis.as_ref().map_or(1, |r| r.fleet_size),
    );
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
                changes: crate::enforce::Changes::to(vec![enf_tx.clone(), cache_tx.clone()]),
                gaps: 0,
                held: outage.held.clone(),
            };
            let (last_id, initial) = match fleet.snapshot().await {
                Ok((id, list)) => {
                    stats.redis_connected.store(true, std::sync::atomic::Ordering::Relaxed);
                    (id, Some(list))
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Reading the ban list at start failed; keeping the kernel's set until Redis answers.");
                    ("$".to_owned(), None)
                }
            };
            warn_listpack(&config, store::listpack_threshold(&mut con.clone()).await);
            stats.redis_used.store(true, std::sync::atomic::Ordering::Relaxed);
            let mut redis_limiter = RedisLimiter::new(con.clone(), keys.clone(), &config.host_id, rules);
            redis_limiter.one_call_per_hit = opts.bench_one_call_per_hit;
            let limiter = Limiter::Redis(redis_limiter);
            (limiter, BanList::redis(con, keys), Some((fleet, last_id)), initial)
        }
        None => {
            let mut list = BanList::memory(Some(config.state_dir.join("bans.json")));
            let initial = Some(
                list.active(crate::now_ms())
                    .await
                    .unwrap_or_default()
                    .into_iter()
                    .map(|(net, until)| Element { net, until })
                    .collect(),
            );
            (Limiter::Memory(MemoryLimiter::new(rules)), list, None, initial)
        }
    };
    tracing::debug!(seconds = read_started.elapsed().as_secs_f64(), "Ban list read.");
    let (mut enforcer, init) = match init.await {
        Ok(done) => done,
        // Only a panic in init (a bug) gets here: keep it a panic.
        Err(e) => std::panic::resume_unwind(e.into_panic()),
    };
    init?;

    // First sync: the kernel set equals the list before anything else runs
    // (when the list could be read: otherwise the kernel's set stays as the
    // last run left it until the first reconcile).
    let (applied, cache) = match initial {
        Some(list) => {
            let initial: Vec<Element> = list.into_iter().filter(|e| !allow.overlaps(&e.net)).collect();
            // The pipeline's cache is built on another thread while nft works.
            let copy: Vec<_> = initial.iter().map(|e| (e.net, e.until)).collect();
            let cache = tokio::task::spawn_blocking(move || {
                let mut cache = BanCache::default();
                cache.replace(copy);
                cache
            });
            if let Err(e) = enforcer.replace_all(&initial, crate::now_ms()).await {
                tracing::warn!(error = %e, "Applying the ban list at start failed; the next reconcile retries.");
            }
            match cache.await {
                Ok(cache) => (initial.len(), cache),
                // Only a panic in the cache (a bug) gets here: keep it a panic.
                Err(e) => std::panic::resume_unwind(e.into_panic()),
            }
        }
        None => (0, BanCache::default()),
    };
    stats
        .bans_active
        .store(cache.len() as u64, std::sync::atomic::Ordering::Relaxed);
    tracing::info!(bans = applied, rules = config.rules.len(), "Ban list applied.");
    // The list's reply, its copies and the transaction's text are freed now.
    trim_heap();

    tracker.spawn(enforcer::run(
        enforcer,
        enf_rx,
        allow.clone(),
        stats.clone(),
        token.clone(),
    ));
    if let Some((fleet, last_id)) = fleet {
        tracker.spawn(fleet.run(last_id, token.clone()));
    }

    let bans = Arc::new(Mutex::new(bans));
    if let Some(addr) = config.metrics {
        let listener = tokio::net::TcpListener::bind(addr)
            .await
            .map_err(|e| DaemonError::Metrics(addr, e))?;
        tracing::info!(%addr, "Prometheus metrics on /metrics.");
        tracker.spawn(metrics::serve(listener, stats.clone(), token.clone()));
    }

    let patterns = config.log_patterns();
    let plan = Plan::new(&config.rules)?;
    // A few chunks of up to 1 MiB: enough to overlap reading with a flush, small
    // enough that a large backlog costs no memory.
    let (chunk_tx, chunk_rx) = tokio::sync::mpsc::channel(4);
    let mut follower = Some(Following::start(patterns, &offsets, &chunk_tx, &token));
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
        changes: crate::enforce::Changes::to(vec![enf_tx.clone(), cache_tx.clone()]),
    };
    tracker.spawn(ctl.serve(listener, token.clone()));
    let (reload_tx, reload_rx) = tokio::sync::mpsc::unbounded_channel();
    // The benchmark baseline is the textbook form: nothing waits.
    let hold_ms = match &config.redis {
        Some(r) if !opts.bench_one_call_per_hit => i64::try_from(r.hold.as_millis()).unwrap_or(i64::MAX),
        _ => 0,
    };
    let pending = Pending::new(pipeline::hold_policy(&limiter, &RuleLimit::of(&config.rules), hold_ms));
    let pipeline = pipeline::Pipeline {
        host: config.host_id.clone(),
        rules: rule_infos(&config, &stats),
        plan,
        routes: Default::default(),
        allow,
        ipv6_prefix: config.ipv6_prefix,
        limiter,
        bans,
        valve: SafetyValve::new(config.max_bans_per_minute),
        changes: enf_tx,
        updates: cache_rx,
        offsets: offsets.clone(),
        stats: stats.clone(),
        cache,
        pending,
        hold_ms,
        uncommitted: Default::default(),
        seq: 0,
        started: tokio::time::Instant::now(),
        inflight: None,
        outage: config.redis.is_some().then_some(outage),
        reloads: reload_rx,
        unparsed_warn: Default::default(),
    };
    drop(cache_tx);
    tracker.spawn(pipeline.run(chunk_rx, token.clone()));
    if let Some(interval) = notify::watchdog_interval() {
        tracker.spawn(notify::watchdog(stats.clone(), interval, token.clone()));
    }
    tracker.spawn(notify::status_updates(stats.clone(), token.clone()));
    tracker.close();

    notify(&format!("READY=1\nSTATUS={}", notify::summary(&stats)));
    tracing::info!(host = %config.host_id, "fleetban running.");
    let mut config = config;
    loop {
        tokio::select! {
            _ = &mut shutdown => break,
            Some(()) = async { match hup.as_mut() { Some(h) => h.recv().await, None => None } } => {
                notify(&format!("RELOADING=1\nMONOTONIC_USEC={}", notify::monotonic_usec()));
                match reload(&config, &opts.config_path, &stats, &reload_tx, &mut follower, &offsets, &chunk_tx, &token).await {
                    Some(new) => {
                        stats.reloads.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
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

/// What the pipeline knows of each rule, with its counters in `stats`.
fn rule_infos(config: &Config, stats: &stats::Stats) -> Vec<pipeline::RuleInfo> {
    let names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    let counters = stats.set_rules(&names);
    config
        .rules
        .iter()
        .zip(counters)
        .map(|(r, counters)| pipeline::RuleInfo {
            name: r.name.clone(),
            window_ms: r.limit.window_ms,
            clock: r.limit.clock,
            ban: r.ban,
            counters,
        })
        .collect()
}

/// The log follower of the running rules; restarted when a reload changes
/// which logs they name.
struct Following {
    patterns: Vec<String>,
    token: CancellationToken,
    follower: crate::source::Follower,
}

impl Following {
    fn start(
        patterns: Vec<String>,
        offsets: &Arc<OffsetStore>,
        tx: &tokio::sync::mpsc::Sender<crate::source::Chunk>,
        parent: &CancellationToken,
    ) -> Following {
        let token = parent.child_token();
        let follower = crate::source::spawn(
            patterns.clone(),
            offsets.clone(),
            FollowOptions::default(),
            tx.clone(),
            token.clone(),
        );
        Following {
            patterns,
            token,
            follower,
        }
    }

    async fn stop(self) {
        self.token.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.follower.join()).await;
    }
}

/// SIGHUP: loads the config again. Invalid: every error is logged and the
/// running config stays. Valid: the pipeline swaps rules (windows and bans
/// stay: they are keyed by rule name and address), and the follower is
/// restarted on the new list of logs if it changed. Settings that need a
/// restart (store, firewall, sockets, allow list) are reported and kept.
#[allow(clippy::too_many_arguments)]
async fn reload(
    old: &Config,
    path: &std::path::Path,
    stats: &Arc<stats::Stats>,
    reload_tx: &tokio::sync::mpsc::UnboundedSender<pipeline::Reload>,
    following: &mut Option<Following>,
    offsets: &Arc<OffsetStore>,
    chunk_tx: &tokio::sync::mpsc::Sender<crate::source::Chunk>,
    parent: &CancellationToken,
) -> Option<Config> {
    tracing::info!(config = %path.display(), "SIGHUP: reloading the configuration.");
    let new = match Config::load(path) {
        Ok(c) => c,
        Err(errors) => {
            for e in &errors.0 {
                tracing::error!(error = %e, "Reload refused: configuration error.");
            }
            tracing::warn!(
                errors = errors.0.len(),
                "Reload refused; the running configuration stays."
            );
            return None;
        }
    };
    let plan = match Plan::new(&new.rules) {
        Ok(p) => p,
        Err(e) => {
            tracing::error!(error = %e, "Reload refused: log format.");
            return None;
        }
    };
    for (what, changed) in [
        ("redis", format!("{:?}", old.redis) != format!("{:?}", new.redis)),
        (
            "firewall",
            format!("{:?}", old.firewall) != format!("{:?}", new.firewall),
        ),
        ("allow", old.allow != new.allow),
        ("ipv6_prefix", old.ipv6_prefix != new.ipv6_prefix),
        ("control", old.control != new.control),
        ("metrics", old.metrics != new.metrics),
        ("state_dir", old.state_dir != new.state_dir),
        ("host_id", old.host_id != new.host_id),
        ("safety", old.max_bans_per_minute != new.max_bans_per_minute),
    ] {
        if changed {
            tracing::warn!(
                setting = what,
                "Changed in the configuration; takes effect at the next restart."
            );
        }
    }
    let patterns = new.log_patterns();
    let restart_follower = following.as_ref().is_none_or(|f| f.patterns != patterns);
    if restart_follower {
        // Stop reading first: the pipeline then handles every chunk already
        // read under the old rules before it swaps, and commits them.
        if let Some(f) = following.take() {
            f.stop().await;
        }
    }
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let msg = pipeline::Reload {
        rules: rule_infos(&new, stats),
        plan,
        limits: RuleLimit::of(&new.rules),
        done: done_tx,
    };
    if reload_tx.send(msg).is_err() || done_rx.await.is_err() {
        tracing::warn!("The pipeline stopped during the reload.");
    }
    if restart_follower {
        *following = Some(Following::start(patterns, offsets, chunk_tx, parent));
    }
    let names: Vec<&str> = new.rules.iter().map(|r| r.name.as_str()).collect();
    tracing::info!(rules = ?names, logs_changed = restart_follower, "Configuration reloaded.");
    Some(new)
}

/// Two connections (commands, and blocking event reads), connected lazily:
/// a Redis that is down at start is handled like one that goes down later
/// (`redis.on_down`), so the daemon follows its logs from the first second.
/// Only a URL the client refuses is retried here (logged, never an exit).
async fn connect_until_up(r: &crate::config::RedisConfig) -> (store::Conn, store::Conn) {
    let mut backoff = Duration::from_millis(100);
    loop {
        let cmd = store::connect_lazy(r, Some(r.timeout));
        let ev = store::connect_lazy(r, Some(Duration::from_secs(5)));
        match (cmd, ev) {
            (Ok(c), Ok(e)) => return (c, e),
            (Err(e), _) | (_, Err(e)) => {
                tracing::warn!(url = %r.url, error = %e, "Redis client refused the URL; retrying.");
                tokio::time::sleep(backoff).await;
                backoff = (backoff * 2).min(Duration::from_secs(5));
            }
        }
    }
}
