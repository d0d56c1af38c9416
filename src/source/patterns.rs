//! The patterns a follower is given: plain paths, followed whether or not the
//! file exists yet, and globs, expanded again every `rescan_interval` so that
//! files created later are picked up.

use std::fs;
use std::path::PathBuf;

use tracing::warn;

/// One entry of the list given to [`spawn`](super::spawn).
#[derive(Debug)]
pub(crate) enum Pattern {
    Path(PathBuf),
    Glob(String),
}

impl Pattern {
    /// A pattern with glob metacharacters (`*?[`) is a glob, unless it is not
    /// a valid one: then it is taken as a plain path (and a warning logged).
    pub(crate) fn new(pattern: String) -> Pattern {
        let globby = pattern.contains(['*', '?', '[']);
        match glob::Pattern::new(&pattern) {
            Ok(_) if globby => Pattern::Glob(pattern),
            Err(e) if globby => {
                warn!(pattern = %pattern, error = %e, "Not a valid glob; followed as a plain path.");
                Pattern::Path(pattern.into())
            }
            _ => Pattern::Path(pattern.into()),
        }
    }

    pub(crate) fn is_glob(&self) -> bool {
        matches!(self, Pattern::Glob(_))
    }

    /// The paths to follow now: the path itself, or the regular files the
    /// glob matches (unreadable directories are passed over).
    pub(crate) fn expand(&self) -> Vec<PathBuf> {
        match self {
            Pattern::Path(p) => vec![p.clone()],
            Pattern::Glob(g) => match glob::glob(g) {
                Ok(paths) => paths
                    .filter_map(Result::ok)
                    .filter(|p| fs::metadata(p).is_ok_and(|m| m.is_file()))
                    .collect(),
                Err(_) => Vec::new(), // new() only keeps valid globs
            },
        }
    }
}
