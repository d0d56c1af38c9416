//! Source: follows log files (tail -F that loses nothing) and hands their
//! complete lines downstream in chunks. First stage of the flow:
//! bytes -> **lines** -> request -> hit -> decision -> ban.
//!
//! [`spawn`] starts a follower for a list of paths or globs. It sends
//! [`Chunk`]s (many whole lines from one file, with their file offsets) into a
//! bounded channel, and pauses reading while the channel is full. It never
//! marks anything processed: the consumer calls [`OffsetStore::commit`] with
//! [`Chunk::end`] after handling a chunk, and [`OffsetStore::save`] now and then.
//!
//! Semantics, in short (details in `tracker.rs` and `reader.rs`):
//! - A file is known by device + inode + fingerprint of its first 256 bytes
//!   ([`FileId`]; fingerprint 0 = file still shorter than that, matches any
//!   fingerprint of the same inode). At start, a path whose saved identity
//!   matches resumes at the saved offset (0 if the file is now shorter); a
//!   different identity means it rotated while we were down: read from 0; no
//!   entry: first seen, start at its end (at the start of its last, maybe
//!   unfinished, line). Files that appear while running are read from 0.
//! - Rename+create and delete+recreate: the old descriptor is drained until it
//!   has been quiet for `drain_quiet`, while the new file is read from 0.
//!   Copytruncate (same inode, shorter, or other first bytes): restart at 0.
//!   Lines written between logrotate's copy and its truncation are lost by
//!   copytruncate itself, and so are lines not yet read when the truncation
//!   happens; nothing else is lost as long as a file stays at its path longer
//!   than a poll interval (paths are looked at even while reading is paused by
//!   backpressure, so a lagging consumer does not make files go unseen).
//! - Old files being drained have their own entries in the offset store
//!   ("rotated", by device + inode). After a restart (or a crash) each is
//!   looked for in the directory of its path and drained from its committed
//!   offset; so is the file a path named when we stopped if the path now
//!   names another one. A deleted or compressed one cannot be found: its
//!   unread lines are lost (logged).
//! - Only complete lines are sent; lines longer than `max_line` are counted
//!   and skipped. An unterminated tail of a drained-and-closed file is sent as
//!   a line (with a `\n` added); at shutdown it is not (it is read on restart).
//! - A path matched by several patterns, or a file reachable by several paths
//!   (symlink), is followed once, under the first. A rotated file that a glob
//!   also matches (`access.log*`) is followed on under its new name, not
//!   re-read.
//!
//! Layout: `identity.rs` (FileId, fingerprint), `split.rs` (bytes -> lines),
//! `reader.rs` (one open file), `patterns.rs` (paths and globs),
//! `tracker.rs` (which file each path names, rotation, draining),
//! `follow.rs` (the task, backpressure, stats), `watch.rs` (inotify wake-ups),
//! `framing.rs` (lines held until the records around them are known, for
//! error logs), `offsets.rs` (persistence), `inspect.rs` (what a pattern names now:
//! readable, missing, unreadable; for `check`, the start's warnings, `status`);
//! `once.rs` reads a file once to its end for
//! `fleetban test` (`compressed.rs`: gzip, other compressions refused).

mod compressed;
mod follow;
mod framing;
mod identity;
mod inspect;
mod offsets;
mod once;
mod patterns;
mod reader;
mod shared;
mod split;
mod tracker;
mod watch;

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

pub use follow::{spawn, Follower};
pub use framing::Framer;
pub use identity::{fingerprint, FileId, FINGERPRINT_BYTES};
pub use inspect::{first_lines, inspect, inspect_path, LogFile};
pub use offsets::OffsetStore;
pub use once::{read_file, ReadError};
pub use shared::WakeHandle;
pub use split::LineSplitter;

/// How the follower reads. `Default` gives the production values.
#[derive(Clone, Debug)]
pub struct FollowOptions {
    /// Pause between polls when no file had more data (50 ms).
    pub poll_interval: Duration,
    /// Most bytes read from one file in one go; bounds a chunk (1 MiB).
    pub read_chunk: usize,
    /// Longest line kept, without its newline; longer ones are skipped (64 KiB).
    pub max_line: usize,
    /// After a rename or delete, keep reading the old file until it has been
    /// quiet this long: nginx writes to it until it reopens its logs (5 s).
    pub drain_quiet: Duration,
    /// How often globs are expanded again to find new files (1 s).
    pub rescan_interval: Duration,
    /// Wake up on inotify events in the directories holding the logs (true).
    /// Polling every `poll_interval` goes on either way: it is the fallback
    /// where inotify says nothing (NFS, a directory that does not exist yet,
    /// a glob in a directory part, inotify limits exhausted).
    pub inotify: bool,
    /// Sources (pattern indexes) whose records may span lines (nginx's
    /// error log), with the [`Framer`] that tells their split records: a
    /// line is sent only once the records around it are known (`framing.rs`).
    pub framed: Vec<(usize, Framer)>,
}

/// The longest line read, in `run` and `test` alike: longer ones are
/// counted (`skipped_long`) and skipped.
pub const MAX_LINE: usize = 64 << 10;

impl Default for FollowOptions {
    fn default() -> Self {
        FollowOptions {
            poll_interval: Duration::from_millis(50),
            read_chunk: 1 << 20,
            max_line: MAX_LINE,
            drain_quiet: Duration::from_secs(5),
            rescan_interval: Duration::from_secs(1),
            inotify: true,
            framed: Vec::new(),
        }
    }
}

/// A run of complete lines read from one file.
#[derive(Clone, Debug)]
pub struct Chunk {
    /// Index of the pattern (path or glob) in the list given to [`spawn`].
    pub source: usize,
    /// The concrete file's path (for a drained old file: the path it had).
    pub path: Arc<Path>,
    /// Identity of the file the bytes came from.
    pub file: FileId,
    /// Offset in the file of `data[0]`.
    pub start: u64,
    /// Whole lines, each ending in `\n`; contiguous in the file.
    pub data: Vec<u8>,
    /// Where each line of `data` ends, just past its `\n`.
    pub ends: Vec<u32>,
    /// Number of lines in `data`.
    pub lines: u64,
    /// Lines longer than `max_line` dropped right after `data`.
    pub skipped_long: u64,
    /// Their bytes, newlines included: they occupy `start + data.len()..end()`.
    pub skipped_bytes: u64,
    /// Lines (indexes, ascending) that may belong to a record split across
    /// lines, as a framed source's [`Framer`] marked them: counted unparsed,
    /// never read. Empty for a source not framed.
    pub split: Vec<u32>,
}

impl Chunk {
    /// Offset just past this chunk's lines: the offset to checkpoint.
    pub fn end(&self) -> u64 {
        self.start + self.data.len() as u64 + self.skipped_bytes
    }

    /// The lines with their offsets in the file, without `\n` or a trailing `\r`.
    pub fn lines(&self) -> Lines<'_> {
        Lines {
            data: &self.data,
            ends: self.ends.iter(),
            start: self.start,
            pos: 0,
        }
    }
}

/// Iterator over a chunk's lines: `(offset of the line in the file, line)`.
#[derive(Clone, Debug)]
pub struct Lines<'a> {
    data: &'a [u8],
    ends: std::slice::Iter<'a, u32>,
    start: u64,
    pos: usize,
}

impl<'a> Iterator for Lines<'a> {
    type Item = (u64, &'a [u8]);

    #[inline]
    fn next(&mut self) -> Option<Self::Item> {
        let end = *self.ends.next()? as usize;
        let line = self.data.get(self.pos..end - 1)?;
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        let offset = self.start + self.pos as u64;
        self.pos = end;
        Some((offset, line))
    }
}

/// What the follower knows about one followed path (for `status`).
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct SourceStat {
    /// Index of the pattern that matched the path.
    pub source: usize,
    pub path: PathBuf,
    /// The file read at the path now; `None` while the path is missing.
    pub file: Option<FileId>,
    /// Read position in that file: just past the last complete line read.
    pub offset: u64,
    /// Lines read from every file that was at this path (sent or about to be).
    pub lines: u64,
    /// Bytes of those lines, skipped long lines included.
    pub bytes: u64,
    /// Lines longer than `max_line` that were skipped.
    pub skipped_long: u64,
    /// Old files (rotated away from this path) still being drained.
    pub draining: usize,
}
