//! The start of `fleetban run`: the store the configuration names (Redis,
//! waited for rather than exited on, or the embedded one), the limiter and
//! the ban owner built on it, the fleet sync, and the first sync: the
//! kernel's set equal to the list before anything else runs.

use std::time::Duration;

use super::Options;
use crate::bans::{BanCache, BanList, Bans, SharedView};
use crate::config::{Config, RedisConfig};
use crate::enforce::{Changes, Element, Enforcer, Until};
use crate::fleet::{hot::Publisher, FleetSync};
use crate::limit::{FleetNews, HotKey, Limiter, RedisLimiter, RuleLimit};
use crate::store::{self, Health, Keys};
use crate::verdict::{Cover, NeverBanned};
use tokio::sync::mpsc::{UnboundedReceiver, UnboundedSender};

/// The lock file in `state_dir` a daemon holds for its lifetime.
pub const LOCK_FILE: &str = "lock";

/// Takes the exclusive lock on `state_dir/lock` (flock, released by the
/// kernel when the process ends, however it ends) and writes our pid in
/// it; the file returned holds the lock. A second daemon on the same
/// state dir gets `DaemonError::Locked` with the holder's pid.
pub fn lock_state_dir(dir: &std::path::Path) -> Result<std::fs::File, super::DaemonError> {
    use std::io::{Read, Seek, Write};
    use std::os::fd::AsRawFd;
    let path = dir.join(LOCK_FILE);
    let err = |e| super::DaemonError::StateDir(path.clone(), e);
    let mut file = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .create(true)
        .truncate(false)
        .open(&path)
        .map_err(err)?;
    // SAFETY: flock takes a descriptor we own and constants.
    if unsafe { libc::flock(file.as_raw_fd(), libc::LOCK_EX | libc::LOCK_NB) } != 0 {
        let e = std::io::Error::last_os_error();
        if e.raw_os_error() != Some(libc::EWOULDBLOCK) {
            return Err(err(e));
        }
        let mut text = String::new();
        let _ = file.read_to_string(&mut text);
        return Err(super::DaemonError::Locked {
            pid: text.trim().parse().ok(),
            lock: path,
        });
    }
    file.set_len(0).map_err(err)?;
    file.rewind().map_err(err)?;
    writeln!(file, "{}", std::process::id()).map_err(err)?;
    Ok(file)
}

/// What the daemon runs on.
pub struct Store {
    pub limiter: Limiter,
    pub bans: Bans,
    /// With Redis: whether it answers, shared by the limiter and the bans.
    pub health: Option<Health>,
    /// With Redis: the fleet sync and the stream id it follows from.
    pub fleet: Option<(FleetSync, String)>,
    /// With Redis: the fleet's news for the limiter (from the fleet sync),
    /// where the limiter's hot marks go, and the task that writes them.
    pub hot: Option<(UnboundedReceiver<FleetNews>, UnboundedSender<Vec<HotKey>>, Publisher)>,
    /// The list as read at start; None if it could not be read (the
    /// kernel's set then stays as the last run left it until the first
    /// reconcile).
    pub initial: Option<Vec<Element>>,
}

/// Opens the store: `to_enforcer` takes this host's ban changes,
/// `to_all` (the enforcer and the pipeline) the fleet's.
/// With Redis, the pages of the list read at start go to `early` as they
/// come ([`preload`]).
pub async fn open(
    config: &Config,
    opts: &Options,
    to_enforcer: Changes,
    to_all: Changes,
    early: UnboundedSender<Vec<Element>>,
) -> Store {
    // The safety valve keeps a reserve for each of them.
    let rule_names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    let rules = RuleLimit::of(&config.rules);
    let client_state = usize::try_from(config.max_client_state).unwrap_or(usize::MAX);
    let Some(r) = &config.redis else {
        let mut list = BanList::memory(Some(config.state_dir.join("bans.json")));
        // A file that is no list lifts nothing: the kernel keeps its set.
        let initial = (!list.lost_at_start()).then_some(
            list.active(crate::now_ms())
                .await
                .unwrap_or_default()
                .into_iter()
                .map(|(net, until)| Element { net, until })
                .collect(),
        );
        return Store {
            limiter: Limiter::memory(rules).with_memory_bound(client_state),
            bans: Bans::new(list, &config.host_id, to_enforcer).with_valve(
                config.max_bans_per_minute,
                config.ipv6_prefix,
                &rule_names,
            ),
            health: None,
            fleet: None,
            hot: None,
            initial,
        };
    };
    let (con, events) = connect_until_up(r).await;
    let keys = Keys::new(&r.prefix);
    let health = Health::default();
    let bans = Bans::new(BanList::redis(con.clone(), keys.clone()), &config.host_id, to_enforcer)
        .with_valve(config.max_bans_per_minute, config.ipv6_prefix, &rule_names)
        .with_queue(health.clone());
    let (news_tx, news_rx) = tokio::sync::mpsc::unbounded_channel();
    let (marks_tx, marks_rx) = tokio::sync::mpsc::unbounded_channel();
    let publisher = Publisher {
        con: con.clone(),
        keys: keys.clone(),
        host: config.host_id.clone(),
        marks: marks_rx,
        health: health.clone(),
    };
    let mut fleet = FleetSync {
        events,
        list: BanList::redis(con.clone(), keys.clone()),
        host: config.host_id.clone(),
        keys: keys.clone(),
        reconcile_every: r.reconcile_every,
        changes: to_all,
        gaps: 0,
        listed: 0,
        held: bans.held(),
        news: Some(news_tx),
        marks_id: "0-0".to_owned(),
        remembered: Default::default(),
        story: Default::default(),
        health: health.clone(),
        early: Some(early),
    };
    fleet.remembered.keep_epoch_in(config.state_dir.join("epoch"));
    // A host that ran on the embedded store joins with its bans.
    let file = config.state_dir.join("bans.json");
    if let Some(bans) = crate::bans::list::embedded_bans(&file, crate::now_ms()) {
        fleet.remembered.joining(file, bans);
    }
    let (last_id, initial) = match fleet.snapshot(false).await {
        Ok((id, list, _)) => {
            health.succeeded();
            (id, Some(list))
        }
        Err(e) => {
            tracing::warn!(error = %e, "Reading the ban list at start failed; keeping the kernel's set until Redis answers.");
            ("$".to_owned(), None)
        }
    };
    warn_listpack(config, store::listpack_threshold(&mut con.clone()).await);
    store::warn_old_layout(&mut con.clone(), &keys).await;
    let mut redis = RedisLimiter::new(con, keys, &config.host_id, rules);
    redis.one_call_per_hit = opts.bench_one_call_per_hit;
    // The benchmark baseline is the textbook form: nothing waits.
    let hold_ms = match opts.bench_one_call_per_hit {
        true => 0,
        false => i64::try_from(r.hold.as_millis()).unwrap_or(i64::MAX),
    };
    Store {
        limiter: Limiter::redis(redis, health.clone(), r.on_down, r.fleet_size, hold_ms)
            .with_memory_bound(client_state),
        bans,
        health: Some(health),
        fleet: Some((fleet, last_id)),
        hot: Some((news_rx, marks_tx, publisher)),
        initial,
    }
}

/// While the list is read at start, its pages (`FleetSync::early`) go
/// into the kernel as they come (`Enforcer::preload`): while nft runs one
/// transaction, the pages that arrive are planned for the next, so
/// Redis's reads, the plans and nft's load overlap (1,000,000 bans: 2 s of
/// reads no longer come before nft's 5 s). Only bans enforced whole
/// (`verdict::cover`) and nothing the kernel already overlaps; the first
/// sync that follows does the rest, and lists the kernel first if a
/// transaction failed. Ends when the pages do (the start's snapshot is
/// over).
pub async fn preload(enforcer: &mut Enforcer, pages: &mut UnboundedReceiver<Vec<Element>>, never: &NeverBanned) {
    let started = std::time::Instant::now();
    let whole = |e: &Element| matches!(crate::verdict::cover(&e.net.trunc(), never), Cover::Whole);
    let done = enforcer.preload(pages, whole).await;
    if let Some(e) = &done.failed {
        tracing::warn!(error = %e, "Loading the ban list into nftables while reading it failed; the first sync puts it in whole.");
    }
    if done.loaded > 0 {
        enforcer.preloaded();
        tracing::info!(elements = done.loaded, transactions = done.transactions, took = %crate::took(started.elapsed()),
            "Ban list loaded into nftables while it was read.");
    }
}

/// This host's view of `list` (every ban of it: what is enforced for an
/// address is `verdict::verdict` over it), built off the runtime's workers
/// when it has several (100,000 bans: tens of ms).
pub fn view_of(list: &[Element]) -> BanCache {
    crate::off_workers(|| BanCache::built(list.iter().map(|e| (e.net, e.until))))
}

/// The first sync: the kernel's set takes `initial`, each ban as its cover
/// under `never` (as the enforcer task puts every later one). First the
/// view goes into the shared one: `view.0`, built from the list as read
/// ([`view_of`], the list stayed so), else one of `initial` built here;
/// `view.2` is told then (the endpoint serves from that moment). The
/// number of bans applied and the bans not put in whole.
pub async fn first_sync(
    enforcer: &mut Enforcer,
    initial: Option<Vec<Element>>,
    never: &crate::verdict::NeverBanned,
    view: (Option<BanCache>, SharedView, tokio::sync::oneshot::Sender<()>),
) -> (usize, super::enforcer::Asked) {
    let (built, shared, ready) = view;
    let mut asked = super::enforcer::Asked::default();
    let Some(list) = initial else {
        let _ = ready.send(());
        return (0, asked);
    };
    drop(shared.swap(built.unwrap_or_else(|| view_of(&list))));
    let _ = ready.send(());
    let n = list.len();
    let elems = super::enforcer::covered(list, never, &mut 0, &mut asked, None);
    if let Err(e) = enforcer.replace_all(&elems, crate::now_ms()).await {
        tracing::warn!(error = %e, "Applying the ban list at start failed; the next reconcile retries.");
    }
    (n, asked)
}

/// With Redis, after [`Enforcer::init`]: if the list read at start is one
/// Redis lost while this host was down, what the nft set kept is written
/// back; if it could not be read, the fleet sync takes what the set kept
/// as the list to write back should the first snapshot that works find it
/// lost. `initial` as the first sync is to apply it, and whether it grew
/// (written back).
pub async fn after_a_loss(
    kept: Vec<Element>,
    fleet: &mut FleetSync,
    initial: Option<Vec<Element>>,
) -> (Option<Vec<Element>>, bool) {
    match initial {
        None => {
            fleet.remembered.resume(kept);
            (None, false)
        }
        Some(list) if fleet.remembered.take_lost_while_down() && !kept.is_empty() => {
            let fallback = list.clone();
            match fleet
                .remembered
                .write_back_kept(&mut fleet.list, &fleet.host, kept, list)
                .await
            {
                Ok(list) => (Some(list), true),
                Err(e) => {
                    tracing::warn!(error = %e, "Writing back the bans the nft set kept failed; the list is taken as Redis has it.");
                    (Some(fallback), false)
                }
            }
        }
        other => (other, false),
    }
}

/// What the nft set held at start, as bans (right after `Enforcer::init`,
/// before [`preload`]: the bans wanted are then what the kernel held), the
/// ended ones left out.
pub fn kernel_kept(enforcer: &Enforcer) -> Vec<Element> {
    let now = crate::now_ms();
    enforcer
        .wanted_until()
        .filter(|(_, u)| *u > Until::At(now))
        .map(|(net, until)| Element { net, until })
        .collect()
}

/// A host on the embedded store that starts without `bans.json` (it ran
/// on Redis, or the file was removed) takes what its firewall kept as its
/// list, rather than lifting it; said once with the count. `initial` (the
/// empty list read) or the bans taken, and whether it took any.
pub fn adopt_kernel(
    kept: Vec<Element>,
    bans: &mut Bans,
    initial: Option<Vec<Element>>,
) -> (Option<Vec<Element>>, bool) {
    let now = crate::now_ms();
    let n = bans.adopt(&kept, now);
    if n == 0 {
        return (initial, false);
    }
    tracing::warn!(count = n,
        "No bans.json in state_dir: kept the bans the firewall's set holds as this host's list (it left Redis, or the file was removed); `fleetban unban` lifts them.");
    let mut list = initial.unwrap_or_default();
    let known: std::collections::HashSet<_> = list.iter().map(|e| e.net).collect();
    list.extend(kept.into_iter().filter(|e| !known.contains(&e.net)));
    (Some(list), true)
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

/// Two connections (commands, and blocking event reads), connected lazily:
/// a Redis that is down at start is handled like one that goes down later
/// (`redis.on_down`), so the daemon follows its logs from the first second.
/// Only a URL the client refuses is retried here (logged, never an exit).
async fn connect_until_up(r: &RedisConfig) -> (store::Conn, store::Conn) {
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

/// One warning per configured log that is not read now: missing (followed
/// once it appears; the follower logs when it does), unreadable, or a glob
/// matching nothing, with the rules that name it.
pub fn warn_logs(config: &Config) {
    for pattern in config.log_patterns() {
        let rules: Vec<&str> = config
            .rules
            .iter()
            .filter(|r| r.logs.contains(&pattern))
            .map(|r| r.name.as_str())
            .collect();
        for file in crate::source::inspect(&pattern) {
            if let Some(problem) = file.problem() {
                tracing::warn!(
                    path = %file.path(),
                    rules = %rules.join(","),
                    state = %file.state(),
                    error = %problem,
                    "Log not read; followed once it can be."
                );
            }
        }
    }
}
