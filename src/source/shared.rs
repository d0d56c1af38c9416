//! What the follower's task shares with the handles outside it: the
//! per-path counters it publishes, and the wake-ups a watcher sends it.

use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

use foldhash::HashMap;
use tokio::sync::Notify;

use super::SourceStat;

/// State shared by the task and its [`Follower`] / [`WakeHandle`]s.
#[derive(Default)]
pub(crate) struct Shared {
    /// Per-path counters, updated once per step.
    pub(super) stats: Mutex<HashMap<Arc<Path>, SourceStat>>,
    /// Cuts the sleep between steps short.
    pub(super) wake: Notify,
    /// Expand the globs at the next step rather than at the next interval.
    pub(super) rescan: AtomicBool,
}

impl Shared {
    pub(crate) fn lock_stats(&self) -> MutexGuard<'_, HashMap<Arc<Path>, SourceStat>> {
        self.stats.lock().unwrap_or_else(|e| e.into_inner())
    }

    pub(crate) fn take_rescan_request(&self) -> bool {
        self.rescan.swap(false, Ordering::Relaxed)
    }
}

/// Lets a watcher (notify/inotify, a signal) make the follower poll now.
#[derive(Clone)]
pub struct WakeHandle(pub(super) Arc<Shared>);

impl WakeHandle {
    /// Some file may have new data: poll now.
    pub fn wake(&self) {
        self.0.wake.notify_one();
    }

    /// What the follower knows about each path, as [`Follower::stats`](super::Follower::stats).
    pub fn stats(&self) -> Vec<SourceStat> {
        let mut v: Vec<SourceStat> = self.0.lock_stats().values().cloned().collect();
        v.sort_by(|a, b| (a.source, &a.path).cmp(&(b.source, &b.path)));
        v
    }

    /// Files may have appeared: expand the globs and poll now.
    pub fn rescan(&self) {
        self.0.rescan.store(true, Ordering::Relaxed);
        self.wake();
    }
}
