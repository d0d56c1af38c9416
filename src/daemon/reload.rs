//! SIGHUP: the configuration loaded again and, if valid, applied without a
//! restart: the pipeline swaps rules (windows and bans stay: they are keyed
//! by rule name and address), and the follower is restarted on the new
//! list of logs if it changed. Settings that need a restart are reported.

use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::pipeline::{Reload, RuleInfo};
use super::stats::Stats;
use crate::config::Config;
use crate::detect::Plan;
use crate::limit::RuleLimit;
use crate::source::{FollowOptions, OffsetStore};

/// What the pipeline knows of each rule, with its counters in `stats`.
pub fn rule_infos(config: &Config, stats: &Stats) -> Vec<RuleInfo> {
    let names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
    let counters = stats.set_rules(&names);
    config
        .rules
        .iter()
        .zip(counters)
        .map(|(r, counters)| RuleInfo {
            name: r.name.clone(),
            window_ms: r.limit.window_ms,
            ban: r.ban,
            limit: r.limit,
            counters,
            order: super::order::RuleOrder::of(r),
        })
        .collect()
}

/// The logs `config`'s rules read, and which of them (indexes) some rule
/// reads as nginx's error log, whose records may span lines.
fn logs_of(config: &Config) -> (Vec<String>, Vec<usize>) {
    let patterns = config.log_patterns();
    let framed = (0..patterns.len())
        .filter(|&i| {
            config
                .rules
                .iter()
                .any(|r| r.format == crate::parse::Format::NginxError && r.logs.contains(&patterns[i]))
        })
        .collect();
    (patterns, framed)
}

/// The log follower of the running rules; restarted when a reload changes
/// which logs they name.
pub struct Following {
    /// The logs it follows (paths and globs).
    patterns: Vec<String>,
    /// Those read as nginx's error log: framed (`source/framing.rs`).
    framed: Vec<usize>,
    token: CancellationToken,
    pub follower: crate::source::Follower,
}

impl Following {
    /// Follows the logs of `config`'s rules.
    pub fn start(
        config: &Config,
        offsets: &Arc<OffsetStore>,
        tx: &tokio::sync::mpsc::Sender<crate::source::Chunk>,
        parent: &CancellationToken,
    ) -> Following {
        let (patterns, framed) = logs_of(config);
        let token = parent.child_token();
        let follower = crate::source::spawn(
            patterns.clone(),
            offsets.clone(),
            FollowOptions {
                framed: framed
                    .iter()
                    .map(|&i| (i, crate::parse::split_records as crate::source::Framer))
                    .collect(),
                ..FollowOptions::default()
            },
            tx.clone(),
            token.clone(),
        );
        Following {
            patterns,
            framed,
            token,
            follower,
        }
    }

    pub async fn stop(self) {
        self.token.cancel();
        let _ = tokio::time::timeout(Duration::from_secs(5), self.follower.join()).await;
    }
}

/// SIGHUP: loads the config again. Invalid: every error is logged and the
/// running config stays. Valid: the pipeline swaps rules (windows and bans
/// stay: they are keyed by rule name and address), and the follower is
/// restarted on the new list of logs if it changed. Settings that need a
/// restart (store, firewall, sockets, allow list, notify targets) are
/// reported and kept.
#[allow(clippy::too_many_arguments)]
pub async fn reload(
    old: &Config,
    path: &std::path::Path,
    stats: &Arc<Stats>,
    reload_tx: &tokio::sync::mpsc::UnboundedSender<Reload>,
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
    let plan = match Plan::new(&new.rules, &old.proxies) {
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
        ("proxies", old.proxies != new.proxies),
        ("http", old.http != new.http),
        ("ipv6_prefix", old.ipv6_prefix != new.ipv6_prefix),
        ("control", old.control != new.control),
        ("metrics", old.metrics != new.metrics),
        ("state_dir", old.state_dir != new.state_dir),
        ("host_id", old.host_id != new.host_id),
        ("safety", old.max_bans_per_minute != new.max_bans_per_minute),
        ("notify", old.notify != new.notify),
    ] {
        if changed {
            tracing::warn!(
                setting = what,
                "Changed in the configuration; takes effect at the next restart."
            );
        }
    }
    let (patterns, framed) = logs_of(&new);
    let restart_follower = following
        .as_ref()
        .is_none_or(|f| f.patterns != patterns || f.framed != framed);
    if restart_follower {
        // Stop reading first: the pipeline then handles every chunk already
        // read under the old rules before it swaps, and commits them.
        if let Some(f) = following.take() {
            f.stop().await;
        }
    }
    let (done_tx, done_rx) = tokio::sync::oneshot::channel();
    let msg = Reload {
        rules: rule_infos(&new, stats),
        plan,
        limits: RuleLimit::of(&new.rules),
        unbannable: crate::bans::Unbannable::of(&new),
        done: done_tx,
    };
    if reload_tx.send(msg).is_err() || done_rx.await.is_err() {
        tracing::warn!("The pipeline stopped during the reload.");
    }
    if restart_follower {
        super::start::warn_logs(&new);
        let f = Following::start(&new, offsets, chunk_tx, parent);
        stats.set_logs(patterns, f.follower.waker());
        *following = Some(f);
    }
    let names: Vec<&str> = new.rules.iter().map(|r| r.name.as_str()).collect();
    tracing::info!(rules = %names.join(","), logs_changed = restart_follower, "Configuration reloaded.");
    Some(new)
}
