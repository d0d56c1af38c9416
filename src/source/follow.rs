//! The follower task: runs polling steps (`tracker.rs`) on the blocking pool
//! and sends their chunks into the bounded channel, one at a time.
//!
//! Backpressure is the send itself: while the channel is full the task waits,
//! and no step runs, so at most one step's chunks (one `read_chunk` per open
//! file) are held beyond what sits in the channel. Between steps it sleeps for
//! `poll_interval`, unless a step filled a read buffer (more is waiting) or a
//! [`WakeHandle`] wakes it: the hook for a notify/inotify watcher.
//! While a send waits, the paths are still looked at every `poll_interval`
//! (`Tracker::watch`: stat, open a new file, retire the old one, no reads), so
//! a consumer lagging by more than a rotation interval loses no file: each
//! file that was at a path is held open until it has been read.
//!
//! Shutdown: the token stops the task at its next await; chunks read but not
//! sent are dropped, which loses nothing since only committed offsets persist.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::mpsc;
use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;
use tracing::{debug, error};

use super::shared::{Shared, WakeHandle};
use super::tracker::Tracker;
use super::{Chunk, FollowOptions, OffsetStore, SourceStat};

/// A running follower: its task and what it reports.
pub struct Follower {
    task: JoinHandle<()>,
    shared: Arc<Shared>,
    /// The inotify watcher, kept alive as long as the follower.
    watcher: Option<notify::RecommendedWatcher>,
}

impl Follower {
    /// One entry per followed path, by pattern index then path.
    pub fn stats(&self) -> Vec<SourceStat> {
        let mut v: Vec<SourceStat> = self.shared.lock_stats().values().cloned().collect();
        v.sort_by(|a, b| (a.source, &a.path).cmp(&(b.source, &b.path)));
        v
    }

    /// An inotify watcher is running (else: polling only).
    pub fn is_watching(&self) -> bool {
        self.watcher.is_some()
    }

    pub fn waker(&self) -> WakeHandle {
        WakeHandle(Arc::clone(&self.shared))
    }

    /// The task has stopped (shutdown, or the receiver was dropped).
    pub fn is_finished(&self) -> bool {
        self.task.is_finished()
    }

    /// Waits for the task to stop; cancel the shutdown token first.
    pub async fn join(self) {
        if let Err(e) = self.task.await {
            error!(error = %e, "Log follower task failed.");
        }
    }
}

/// Starts following `patterns` (paths or globs; a chunk's `source` is the
/// index in this list) on the current tokio runtime. Files that exist are
/// opened before it returns: whatever is appended afterwards is read. A path matched by several
/// patterns is followed once, under the first. The task ends when `shutdown`
/// is cancelled or the receiver of `tx` is dropped.
pub fn spawn(
    patterns: Vec<String>,
    offsets: Arc<OffsetStore>,
    opts: FollowOptions,
    tx: mpsc::Sender<Chunk>,
    shutdown: CancellationToken,
) -> Follower {
    let shared = Arc::new(Shared::default());
    let watcher = if opts.inotify {
        super::watch::watch(&patterns, WakeHandle(Arc::clone(&shared)))
    } else {
        None
    };
    let poll = opts.poll_interval;
    let mut tracker = Tracker::new(patterns, offsets, opts, Arc::clone(&shared));
    // Blocking, but short and once: when spawn returns, every file that
    // exists is open and its start fixed.
    tracker.prime();
    let task = tokio::spawn(run(tracker, poll, tx, shutdown, Arc::clone(&shared)));
    Follower { task, shared, watcher }
}

async fn run(
    mut tracker: Tracker,
    poll: Duration,
    tx: mpsc::Sender<Chunk>,
    shutdown: CancellationToken,
    shared: Arc<Shared>,
) {
    while !shutdown.is_cancelled() && !tx.is_closed() {
        let blocking = tokio::task::spawn_blocking(move || {
            let step = tracker.step();
            (tracker, step)
        });
        let step = tokio::select! {
            biased;
            // A step stuck in the kernel (dead NFS) must not hold up shutdown.
            _ = shutdown.cancelled() => return,
            done = blocking => match done {
                Ok((t, step)) => {
                    tracker = t;
                    step
                }
                Err(e) => {
                    error!(error = %e, "Log follower step failed; following stopped.");
                    return;
                }
            },
        };
        for chunk in step.chunks {
            let send = tx.send(chunk);
            tokio::pin!(send);
            loop {
                tokio::select! {
                    biased;
                    _ = shutdown.cancelled() => return,
                    sent = &mut send => {
                        if sent.is_err() {
                            debug!("Chunk receiver gone; follower stops.");
                            return;
                        }
                        break;
                    }
                    // While the consumer is slow, still notice rotations:
                    // a file that came and went at the path while we were
                    // paused would otherwise never be opened, and be lost.
                    _ = tokio::time::sleep(poll) => {
                        let watching = tokio::task::spawn_blocking(move || {
                            tracker.watch();
                            tracker
                        });
                        tracker = tokio::select! {
                            biased;
                            _ = shutdown.cancelled() => return,
                            done = watching => match done {
                                Ok(t) => t,
                                Err(e) => {
                                    error!(error = %e, "Log follower step failed; following stopped.");
                                    return;
                                }
                            },
                        };
                    }
                }
            }
        }
        if !step.more {
            tokio::select! {
                biased;
                _ = shutdown.cancelled() => return,
                _ = shared.wake.notified() => {}
                _ = tokio::time::sleep(poll) => {}
            }
        }
    }
}
