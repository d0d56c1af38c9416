//! inotify as a wake-up: the directories holding the followed paths are
//! watched (not the files: a watch on a file follows its inode through a
//! rename and misses the new file), and any event in them makes the follower
//! poll at once; a name appearing or leaving also asks for a glob rescan.
//! Nothing is read from the events themselves, so a lost or coalesced event
//! (queue overflow) costs latency, never a line: the poll loop stays the
//! source of truth and runs every `poll_interval` anyway.

use std::path::{Path, PathBuf};

use notify::event::{EventKind, ModifyKind};
use notify::{RecommendedWatcher, RecursiveMode, Watcher};
use tracing::{debug, warn};

use super::WakeHandle;

/// Watches the directories of `patterns`; `None` if inotify cannot be set up
/// at all (then polling alone serves). A directory that cannot be watched
/// (missing, a glob in it, no watches left) is logged and left to polling.
pub(crate) fn watch(patterns: &[String], wake: WakeHandle) -> Option<RecommendedWatcher> {
    let handler = move |event: notify::Result<notify::Event>| match event {
        Ok(e)
            if matches!(
                e.kind,
                EventKind::Create(_) | EventKind::Remove(_) | EventKind::Modify(ModifyKind::Name(_))
            ) =>
        {
            wake.rescan()
        }
        Ok(e) if matches!(e.kind, EventKind::Access(_)) => {}
        _ => wake.wake(),
    };
    let mut watcher = match notify::recommended_watcher(handler) {
        Ok(w) => w,
        Err(e) => {
            warn!(error = %e, "inotify unavailable; following logs by polling only.");
            return None;
        }
    };
    let mut dirs: Vec<PathBuf> = patterns.iter().filter_map(|p| dir_of(p)).collect();
    dirs.sort();
    dirs.dedup();
    for dir in dirs {
        match watcher.watch(&dir, RecursiveMode::NonRecursive) {
            Ok(()) => debug!(dir = %dir.display(), "Watching with inotify."),
            Err(e) => warn!(dir = %dir.display(), error = %e, "Cannot watch directory with inotify; polling it."),
        }
    }
    Some(watcher)
}

/// The directory holding a pattern's files, unless it has glob characters.
fn dir_of(pattern: &str) -> Option<PathBuf> {
    let parent = Path::new(pattern).parent()?;
    let parent = if parent.as_os_str().is_empty() {
        Path::new(".")
    } else {
        parent
    };
    let s = parent.to_str()?;
    (!s.contains(['*', '?', '['])).then(|| parent.to_path_buf())
}
