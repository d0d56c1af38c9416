//! Notifications: webhook targets (`notify:`, docs/design.md §5) told of
//! bans, unbans, the safety valve and Redis outages.
//!
//! [`Notifier`] is the handle the ban owner (`bans::Bans`) and the daemon
//! hold: [`Notifier::send`] filters an event per target and puts it into
//! that target's bounded queue ([`fold::Queue`]) under a short lock, never
//! waiting: banning is never slowed by a target. Beyond a few events a
//! second, bans are folded into one summary per 10 s. One task per target
//! (`sender.rs`) takes from its queue and POSTs (`post.rs`: HTTP/1.1 over
//! tokio, rustls with the system's roots), with a timeout, and retries with
//! backoff on 5xx and connection errors, never on 4xx. `format.rs` writes
//! the bodies. Exactly one notification per ban for the fleet: only the
//! host whose write created the ban in the list sends it (`bans::Bans`).

mod fold;
mod format;
mod post;
mod sender;

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex};

use ipnet::IpNet;
use tokio_util::sync::CancellationToken;

use crate::config::{NotifyConfig, NotifyFormat};

pub use sender::test as send_test;

/// Something a target may be told.
#[derive(Clone, Debug, PartialEq)]
pub enum Event {
    /// A new ban this host decided (or an operator gave this daemon).
    Ban(BanEvent),
    /// An operator lifted the ban of `addr` through this daemon.
    Unban { addr: IpNet, host: String, at_ms: i64 },
    /// The safety valve refused a ban (`tripped`) or has refused none for a minute.
    Valve {
        tripped: bool,
        host: String,
        at_ms: i64,
        refused: u64,
        max_bans_per_minute: u64,
    },
    /// Redis stopped answering (`down`) or answers again.
    Redis { down: bool, host: String, at_ms: i64 },
    /// `check --online --notify-test`.
    Test { host: String, at_ms: i64 },
}

/// A ban as told.
#[derive(Clone, Debug, PartialEq)]
pub struct BanEvent {
    pub addr: IpNet,
    pub rule: String,
    pub reason: String,
    pub host: String,
    pub hits: u32,
    /// When the limit was crossed (or the operator asked), unix ms.
    pub at_ms: i64,
    /// None: permanent.
    pub until_ms: Option<i64>,
    /// The ban covers more than one client (a network).
    pub network: bool,
}

impl Event {
    /// Its name in `events:`.
    pub fn kind(&self) -> &'static str {
        match self {
            Event::Ban(_) => "ban",
            Event::Unban { .. } => "unban",
            Event::Valve { .. } => "valve",
            Event::Redis { .. } => "redis",
            Event::Test { .. } => "test",
        }
    }
}

/// What a target counts, for `status` and the metrics.
#[derive(Default)]
pub struct TargetCounters {
    /// Messages the target took (2xx).
    pub sent: AtomicU64,
    /// Messages given up on (4xx, or retries exhausted).
    pub failed: AtomicU64,
    /// Messages the full queue dropped (oldest first).
    pub dropped: AtomicU64,
    /// Bans folded into summaries.
    pub folded: AtomicU64,
    /// Messages waiting.
    pub queued: AtomicU64,
    /// The last failure's text (never the URL's path nor the secret), and when.
    pub last_error: Mutex<Option<String>>,
    pub last_error_ms: AtomicI64,
}

/// One target as `status` and the metrics show it.
#[derive(Clone)]
pub struct TargetInfo {
    /// `scheme://host[:port]` (the path may be a secret).
    pub origin: String,
    pub format: NotifyFormat,
    pub counters: Arc<TargetCounters>,
}

struct Target {
    config: NotifyConfig,
    info: TargetInfo,
    queue: Arc<fold::Queue>,
}

impl Target {
    fn wants(&self, event: &Event) -> bool {
        let c = &self.config;
        match event {
            Event::Test { .. } => return true,
            e if !c.events.iter().any(|k| k == e.kind()) => return false,
            _ => {}
        }
        match event {
            Event::Ban(b) => {
                (c.rules.is_empty() || c.rules.contains(&b.rule))
                    && b.until_ms.is_none_or(|u| u - b.at_ms >= c.min_duration_ms)
            }
            _ => true,
        }
    }
}

/// The handle: cheap to clone; without targets, sending is a no-op.
#[derive(Clone, Default)]
pub struct Notifier {
    targets: Arc<Vec<Target>>,
    /// How many clients a ban covers decides `network` (IPv6 clients are prefixes).
    ipv6_prefix: u8,
}

impl Notifier {
    /// The targets of `configs`, each with its sender task on `tracker`,
    /// stopping with `shutdown`. A secret file that cannot be read now
    /// leaves its target unsigned, with an error logged.
    pub fn start(
        configs: &[NotifyConfig],
        ipv6_prefix: u8,
        tracker: &tokio_util::task::TaskTracker,
        shutdown: CancellationToken,
    ) -> Notifier {
        let mut targets = Vec::new();
        for c in configs {
            let origin = c.endpoint.origin();
            let secret = c.secret_file.as_ref().and_then(|p| match crate::config::read_secret(p) {
                Ok(s) => Some(s),
                Err(e) => {
                    tracing::error!(target_url = %origin, error = %e, "Notify: secret file unreadable; posting unsigned.");
                    None
                }
            });
            let counters = Arc::new(TargetCounters::default());
            let queue = Arc::new(fold::Queue::new(counters.clone()));
            let info = TargetInfo {
                origin,
                format: c.format,
                counters,
            };
            tracker.spawn(sender::run(
                c.clone(),
                secret,
                queue.clone(),
                info.clone(),
                shutdown.clone(),
            ));
            targets.push(Target {
                config: c.clone(),
                info,
                queue,
            });
        }
        Notifier {
            targets: Arc::new(targets),
            ipv6_prefix,
        }
    }

    /// Whether any target is configured.
    pub fn is_on(&self) -> bool {
        !self.targets.is_empty()
    }

    /// Queues `event` for every target that wants it; never waits.
    pub fn send(&self, event: Event) {
        let now = crate::now_ms();
        for t in self.targets.iter().filter(|t| t.wants(&event)) {
            t.queue.push(event.clone(), now);
        }
    }

    /// A new ban: `network` set when it covers more than one client.
    pub fn ban(&self, mut ban: BanEvent) {
        if !self.is_on() {
            return;
        }
        let client_len = match ban.addr {
            IpNet::V4(_) => 32,
            IpNet::V6(_) => self.ipv6_prefix,
        };
        ban.network = ban.addr.prefix_len() < client_len;
        self.send(Event::Ban(ban));
    }

    /// The targets, for `status` and the metrics.
    pub fn targets(&self) -> Vec<TargetInfo> {
        self.targets.iter().map(|t| t.info.clone()).collect()
    }
}

/// When a failure happened, and what: kept for `status`.
fn note_error(counters: &TargetCounters, error: String) {
    counters.last_error_ms.store(crate::now_ms(), Relaxed);
    *counters.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(error);
}
