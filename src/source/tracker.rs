//! The follower's state and one polling step over it: which paths are followed
//! (literal paths, and glob matches found by periodic expansion), which file
//! each path names now, and which old files are still being drained.
//!
//! One step, for each path: stat it; same inode as the open reader -> check for
//! truncation and read; another inode -> the reader joins the draining list and
//! the new file is opened (from 0); missing -> the reader joins the draining
//! list. Then every draining reader is read, and closed once it has been quiet
//! for `drain_quiet`. Each reader reads at most `read_chunk` bytes per step, so
//! one step's output is bounded. All of it is blocking file I/O: the task in
//! `follow.rs` runs steps on the blocking pool.

use std::fs::{self, Metadata};
use std::io;
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;
use std::time::{Duration, Instant};

use foldhash::{HashMap, HashSet};
use tracing::{debug, info, warn};

use super::patterns::Pattern;
use super::reader::Reader;
use super::shared::Shared;
use super::{Chunk, FollowOptions, OffsetStore};

/// The framer of source `source`, if it is framed.
fn framer(opts: &FollowOptions, source: usize) -> Option<super::Framer> {
    opts.framed.iter().find(|(s, _)| *s == source).map(|&(_, f)| f)
}

/// Repeat an unchanged error for a path at most this often.
const WARN_EVERY: Duration = Duration::from_secs(60);

/// A followed path.
#[derive(Debug)]
struct Tracked {
    source: usize,
    path: Arc<Path>,
    /// Found by a glob: dropped once missing and no longer matched.
    from_glob: bool,
    /// Matched by the latest expansion.
    matched: bool,
    /// The file the path named when last looked at.
    current: Option<Reader>,
    /// Existed at startup and not opened yet: the start-of-day rules apply
    /// (saved offset, else the end of the file).
    initial: bool,
    /// Seen with nothing at the path since its last file was opened: the
    /// next file there is announced as having appeared (a log missing at
    /// start, warned about then, is said to be read when it is).
    absent: bool,
    errors: Throttle,
}

/// Everything the follower knows; moved into the blocking pool for each step.
pub(crate) struct Tracker {
    patterns: Vec<Pattern>,
    paths: Vec<Tracked>,
    /// Old files rotated away from their path, read until quiet.
    draining: Vec<Reader>,
    offsets: Arc<OffsetStore>,
    opts: FollowOptions,
    shared: Arc<Shared>,
    /// Read buffer, `read_chunk` bytes, reused by every read.
    buf: Vec<u8>,
    /// `None` before the first expansion (whose matches are `initial`).
    next_rescan: Option<Instant>,
}

/// Output of one step.
pub(crate) struct Step {
    pub(crate) chunks: Vec<Chunk>,
    /// Some read filled the buffer: poll again without sleeping.
    pub(crate) more: bool,
}

impl Tracker {
    pub(crate) fn new(
        patterns: Vec<String>,
        offsets: Arc<OffsetStore>,
        opts: FollowOptions,
        shared: Arc<Shared>,
    ) -> Tracker {
        let patterns = patterns.into_iter().map(Pattern::new).collect();
        let buf = vec![0; opts.read_chunk.max(1)];
        Tracker {
            patterns,
            paths: Vec::new(),
            draining: Vec::new(),
            offsets,
            opts,
            shared,
            buf,
            next_rescan: None,
        }
    }

    /// The start-of-day work, before anything else may write to the logs
    /// unseen: expand the patterns, find rotated files left unfinished, and
    /// open every file, fixing where each starts (a file first seen starts
    /// at its end: lines appended after this returns are read).
    pub(crate) fn prime(&mut self) {
        let now = Instant::now();
        if self.next_rescan.is_none() {
            self.rescan(true);
            self.recover(now);
            self.next_rescan = Some(now + self.opts.rescan_interval);
        }
        self.watch();
    }

    pub(crate) fn step(&mut self) -> Step {
        let now = Instant::now();
        let due = self.next_rescan.is_none_or(|t| now >= t);
        if due || self.shared.take_rescan_request() {
            let first = self.next_rescan.is_none();
            self.rescan(first);
            if first {
                self.recover(now);
            }
            self.next_rescan = Some(now + self.opts.rescan_interval);
        }
        let mut chunks = Vec::new();
        let mut more = false;
        for i in 0..self.paths.len() {
            more |= self.poll_path(i, now, &mut chunks);
        }
        more |= self.poll_draining(now, &mut chunks);
        let offsets = &self.offsets;
        self.paths.retain(|t| {
            let keep = !t.from_glob || t.matched || t.current.is_some();
            if !keep {
                debug!(path = %t.path.display(), "Glob match gone; no longer followed.");
                offsets.forget(&t.path);
            }
            keep
        });
        self.publish_stats(&chunks);
        Step { chunks, more }
    }

    /// At start: files that were being read when we stopped but are no
    /// longer at their path (rotated while we were down, or still being
    /// drained) are looked for beside it and drained from their offset.
    fn recover(&mut self, now: Instant) {
        for t in &self.paths {
            let Some((saved, _)) = self.offsets.get(&t.path) else {
                continue;
            };
            let moved = fs::metadata(&t.path).map_or(true, |m| !saved.matches_meta(&m));
            if moved {
                self.offsets.retire(&t.path, saved);
            }
        }
        let held_at = self.offsets.saved_at();
        for r in self.offsets.rotated() {
            let source = self.paths.iter().find(|t| *t.path == *r.path).map_or(0, |t| t.source);
            let path: Arc<Path> = r.path.as_path().into();
            let found = find_inode(&r.path, r.file.dev, r.file.ino).and_then(|f| {
                Reader::resume(
                    source,
                    Arc::clone(&path),
                    &f,
                    (r.file, r.offset),
                    held_at,
                    self.opts.max_line,
                    framer(&self.opts, source),
                )
                .ok()
                .flatten()
                .map(|reader| (f, reader))
            });
            match found {
                Some((f, (mut reader, rewritten))) => {
                    if rewritten {
                        // Truncated in place, then renamed, while we were
                        // down: what it holds now came after the copy.
                        self.offsets.restart_rotated(r.file, reader.id);
                        info!(path = %r.path.display(), now_at = %f.display(),
                            "A rotated file left unfinished at the last stop was truncated since (copytruncate); draining it from its start.");
                    } else {
                        info!(path = %r.path.display(), now_at = %f.display(), offset = reader.position(),
                            "Draining a rotated file left unfinished at the last stop.");
                    }
                    reader.last_data = now;
                    self.draining.push(reader);
                }
                None => {
                    warn!(path = %r.path.display(), offset = r.offset,
                        "A rotated file left unfinished at the last stop is gone (deleted or compressed); its unread lines are lost.");
                    self.offsets.drop_rotated(r.file);
                }
            }
        }
    }

    /// Looks at every path without reading: a file that replaced the one
    /// being read is opened (so it is held, whatever happens to its path
    /// next) and the old one joins the draining list. Run while the consumer
    /// is too slow for a step to run.
    pub(crate) fn watch(&mut self) {
        let now = Instant::now();
        for i in 0..self.paths.len() {
            let Some(meta) = self.stat_path(i, now) else { continue };
            let same = self.paths[i].current.as_ref().is_some_and(|r| r.id.matches_meta(&meta));
            if !same {
                self.switch_file(i, &meta, now);
            }
        }
    }

    /// Expands the patterns again; new paths are followed from the next poll.
    fn rescan(&mut self, first: bool) {
        let mut known: HashMap<Arc<Path>, usize> = HashMap::default();
        for (i, t) in self.paths.iter_mut().enumerate() {
            t.matched = false;
            known.insert(Arc::clone(&t.path), i);
        }
        for (source, pattern) in self.patterns.iter().enumerate() {
            let from_glob = pattern.is_glob();
            for path in pattern.expand() {
                if let Some(&i) = known.get(path.as_path()) {
                    self.paths[i].matched = true;
                    continue;
                }
                let path: Arc<Path> = path.into();
                known.insert(Arc::clone(&path), self.paths.len());
                self.paths.push(Tracked {
                    source,
                    path,
                    from_glob,
                    matched: true,
                    current: None,
                    initial: first,
                    absent: false,
                    errors: Throttle::default(),
                });
            }
        }
    }

    /// Looks at one path and reads from the file it names. Returns `more`.
    fn poll_path(&mut self, i: usize, now: Instant, out: &mut Vec<Chunk>) -> bool {
        let Some(meta) = self.stat_path(i, now) else {
            return false;
        };
        let same = self.paths[i].current.as_ref().is_some_and(|r| r.id.matches_meta(&meta));
        if !same && !self.switch_file(i, &meta, now) {
            return false;
        }
        let t = &mut self.paths[i];
        let Some(r) = t.current.as_mut() else {
            return false;
        };
        match r.check_truncated(Some(&self.offsets)) {
            Ok(true) => {
                info!(path = %t.path.display(), "File truncated (copytruncate?); reading it from 0.")
            }
            Ok(false) => {}
            Err(e) => t.errors.warn(&t.path, &e, now),
        }
        match r.read(&mut self.buf, out) {
            Ok(n) => {
                t.errors.clear(&t.path);
                if n > 0 {
                    r.last_data = now;
                }
                n == self.buf.len()
            }
            Err(e) => {
                t.errors.warn(&t.path, &e, now);
                false
            }
        }
    }

    /// Stats path `i`; if it no longer names a regular file, its reader (if
    /// any) starts draining.
    fn stat_path(&mut self, i: usize, now: Instant) -> Option<Metadata> {
        let t = &mut self.paths[i];
        let missing = match fs::metadata(&t.path) {
            Ok(m) if m.is_file() => return Some(m),
            Ok(_) => io::Error::other("not a regular file"),
            Err(e) if e.kind() == io::ErrorKind::NotFound => e,
            Err(e) => {
                t.errors.warn(&t.path, &e, now);
                return None;
            }
        };
        if missing.kind() != io::ErrorKind::NotFound {
            t.errors.warn(&t.path, &missing, now);
        } else {
            t.absent = true;
        }
        t.initial = false;
        if let Some(r) = t.current.take() {
            debug!(path = %t.path.display(), "File gone from its path; draining it.");
            retire(&mut self.draining, r, now, &self.offsets);
        }
        None
    }

    /// Path `i` names another inode than its reader's: retire the reader and
    /// take up the new file. Returns whether the path now has a reader.
    fn switch_file(&mut self, i: usize, meta: &Metadata, now: Instant) -> bool {
        if let Some(r) = self.paths[i].current.take() {
            debug!(path = %r.path.display(), "File rotated; draining the old one.");
            retire(&mut self.draining, r, now, &self.offsets);
        }
        let (dev, ino) = (meta.dev(), meta.ino());
        let held = |r: &Reader| r.id.same_inode(dev, ino);
        if self.paths.iter().any(|o| o.current.as_ref().is_some_and(held)) {
            // Another path (symlink, hard link) already follows this file.
            return false;
        }
        let t = &mut self.paths[i];
        if let Some(j) = self.draining.iter().position(held) {
            // A file rotated to a name that a glob also matches: go on reading
            // it where we are rather than reading it again.
            let mut r = self.draining.swap_remove(j);
            r.adopt(t.source, Arc::clone(&t.path), &self.offsets);
            debug!(path = %t.path.display(), offset = r.position(), "Following a rotated file under its new name.");
            t.current = Some(r);
            return true;
        }
        let opened = Reader::open(
            t.source,
            Arc::clone(&t.path),
            t.initial,
            &self.offsets,
            self.opts.max_line,
            framer(&self.opts, t.source),
        );
        match opened {
            Ok((r, start)) => {
                if t.absent {
                    info!(path = %t.path.display(), offset = r.position(), start = %start, "Log file appeared; following it.");
                } else {
                    info!(path = %t.path.display(), offset = r.position(), start = %start, "Following file.");
                }
                t.absent = false;
                t.initial = false;
                t.errors.clear(&t.path);
                t.current = Some(r);
                // Where this file starts (its end, if first seen at startup)
                // and the rotated entry of the old one must survive a crash
                // before the consumer's next save.
                self.offsets.save_or_warn();
                true
            }
            Err(e) => {
                if e.kind() == io::ErrorKind::NotFound {
                    t.initial = false;
                } else {
                    t.errors.warn(&t.path, &e, now);
                }
                false
            }
        }
    }

    /// Reads the old files; closes those quiet for `drain_quiet`.
    fn poll_draining(&mut self, now: Instant, out: &mut Vec<Chunk>) -> bool {
        let mut more = false;
        let mut i = 0;
        while i < self.draining.len() {
            let r = &mut self.draining[i];
            if r.is_rewritten().unwrap_or(false) {
                // Someone rewrote a file that is no longer a log (a copy
                // made onto the rotated name): its content is not ours.
                debug!(path = %r.path.display(), "Rotated file rewritten in place; closed.");
                self.offsets.drop_rotated(r.id);
                self.draining.swap_remove(i);
                continue;
            }
            let failed = match r.read(&mut self.buf, out) {
                Ok(n) => {
                    if n > 0 {
                        r.last_data = now;
                        more |= n == self.buf.len();
                    }
                    false
                }
                Err(e) => {
                    warn!(path = %r.path.display(), error = %e, "Reading a rotated file failed; closing it.");
                    true
                }
            };
            if failed || now.duration_since(r.last_data) >= self.opts.drain_quiet {
                let r = self.draining.swap_remove(i);
                debug!(path = %r.path.display(), offset = r.position(), "Rotated file drained; closed.");
                r.finish(out, &self.offsets);
                continue;
            }
            i += 1;
        }
        more
    }

    fn publish_stats(&self, chunks: &[Chunk]) {
        let mut draining: HashMap<&Path, usize> = HashMap::default();
        for r in &self.draining {
            *draining.entry(&*r.path).or_default() += 1;
        }
        let mut stats = self.shared.lock_stats();
        let mut live: HashSet<&Path> = HashSet::default();
        for t in &self.paths {
            live.insert(&t.path);
            let s = stats.entry(Arc::clone(&t.path)).or_insert_with(|| super::SourceStat {
                source: t.source,
                path: t.path.to_path_buf(),
                file: None,
                offset: 0,
                lines: 0,
                bytes: 0,
                skipped_long: 0,
                draining: 0,
            });
            s.source = t.source;
            s.file = t.current.as_ref().map(|r| r.id);
            s.offset = t.current.as_ref().map_or(0, Reader::position);
            s.draining = draining.get(&*t.path).copied().unwrap_or(0);
        }
        for c in chunks {
            if let Some(s) = stats.get_mut(&*c.path) {
                s.lines += c.lines;
                s.bytes += c.data.len() as u64 + c.skipped_bytes;
                s.skipped_long += c.skipped_long;
            }
        }
        for r in &self.draining {
            live.insert(&r.path);
        }
        stats.retain(|p, _| live.contains(&**p));
    }
}

/// Moves a reader whose path names another file now to the draining list.
/// A truncation that happened while the file was still at its path (a
/// copytruncate just before the rename or delete) is caught here, so its new
/// lines are drained from 0. It is caught before the store retires the
/// path's entry: the rotated entry then starts at 0 with the fingerprint of
/// the file's new first bytes, which is what a restart finds beside the
/// path (with the old ones it would not know the file, and lose its lines).
fn retire(draining: &mut Vec<Reader>, mut r: Reader, now: Instant, offsets: &OffsetStore) {
    match r.check_truncated(Some(offsets)) {
        Ok(true) => {
            debug!(path = %r.path.display(), "Rotated file had been truncated; draining it from 0.")
        }
        Ok(false) => {}
        Err(e) => debug!(path = %r.path.display(), error = %e, "Cannot check a rotated file."),
    }
    offsets.retire(&r.path, r.id);
    r.last_data = now;
    draining.push(r);
}

/// A regular file in the directory of `path` with this device and inode
/// (where rotation tools move a log: `access.log.1`, `access.log-20261130`).
fn find_inode(path: &Path, dev: u64, ino: u64) -> Option<std::path::PathBuf> {
    let dir = path
        .parent()
        .filter(|d| !d.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .take(100_000)
        .map(|e| e.path())
        .find(|p| fs::metadata(p).is_ok_and(|m| m.is_file() && m.dev() == dev && m.ino() == ino))
}

/// Logs an I/O error for a path once, again when it changes or every
/// `WARN_EVERY`, and once more when it clears.
#[derive(Debug, Default)]
struct Throttle {
    last: Option<(String, Instant)>,
}

impl Throttle {
    fn warn(&mut self, path: &Path, e: &io::Error, now: Instant) {
        let msg = e.to_string();
        if let Some((prev, at)) = &self.last {
            if *prev == msg && now.duration_since(*at) < WARN_EVERY {
                return;
            }
        }
        warn!(path = %path.display(), error = %e, "Cannot read log file; retrying.");
        self.last = Some((msg, now));
    }

    fn clear(&mut self, path: &Path) {
        if self.last.take().is_some() {
            info!(path = %path.display(), "Log file readable again.");
        }
    }
}
