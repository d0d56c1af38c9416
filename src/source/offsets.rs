//! Where each followed file was processed up to, kept across restarts.
//!
//! One entry per path: the identity of the file at that path and the offset
//! just past the last line the consumer has processed. The consumer calls
//! [`OffsetStore::commit`] after handling a chunk and [`OffsetStore::save`]
//! now and then and at shutdown; the file (`offsets.json` under the state
//! directory) is replaced atomically: temp file, fsync, rename, fsync dir.
//!
//! The follower also talks to the store, never to mark anything processed:
//! when it opens a file at a path it registers that file as the path's current
//! one and seeds an entry at the offset where it starts reading, so a restart
//! before the first commit neither skips lines (a first-seen file that started
//! at its end) nor re-reads them. Commits for any other file at that path (an
//! old file still being drained after a rename) are ignored: the old file is no
//! longer at the path, and its entry would make a restart re-read the new one.
//!
//! Old files still being drained are kept apart, as *rotated* entries keyed by
//! device + inode: [`OffsetStore::retire`] moves the path's entry there when
//! the follower sees the file leave its path, commits for that file move it
//! on, and it is dropped once the follower has closed the file and everything
//! it sent is committed. A restart looks for each rotated file beside the path
//! it had (`access.log.1`) and drains it from its offset, so a crash while an
//! old file still had unread lines loses none of them (unless the file was
//! deleted or compressed meanwhile: then nothing can read it).

use std::collections::BTreeMap;
use std::fs::{self, File};
use std::io::{self, Write};
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

use foldhash::HashMap;
use serde::{Deserialize, Serialize};

use super::FileId;

const FILE_NAME: &str = "offsets.json";
const FORMAT_VERSION: u32 = 1;

/// Persisted offsets, shared between the follower and the consumer.
#[derive(Debug)]
pub struct OffsetStore {
    /// `state_dir/offsets.json`.
    file: PathBuf,
    inner: Mutex<Inner>,
    /// Serializes writers of the file, outside the `inner` lock.
    save_lock: Mutex<()>,
    /// Whether the last save failed, and its warnings' rate limit.
    save_warn: Mutex<(bool, crate::ratelog::Every)>,
    /// When the file found at open was written: a moment at which the
    /// files it names were open in the process that saved it.
    saved_at: Option<std::time::SystemTime>,
}

#[derive(Debug, Default)]
struct Inner {
    entries: HashMap<PathBuf, Entry>,
    /// Old files being drained, by (device, inode).
    rotated: HashMap<(u64, u64), Rotated>,
    /// Something changed since the last successful save.
    dirty: bool,
}

#[derive(Debug, Default)]
struct Entry {
    /// What a restart resumes from.
    saved: Option<(FileId, u64)>,
    /// The file the follower reads at this path now (not persisted).
    current: Option<FileId>,
    /// The follower dropped this path (a glob match whose file is gone):
    /// late commits from chunks still in flight must not bring it back.
    gone: bool,
}

/// A file rotated away from its path and still being drained.
#[derive(Clone, Debug)]
pub(crate) struct Rotated {
    /// The path it had.
    pub(crate) path: PathBuf,
    pub(crate) file: FileId,
    /// Processed up to here.
    pub(crate) offset: u64,
    /// Set when the follower closed it: the offset just past its last line.
    closed_at: Option<u64>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct OnDisk {
    version: u32,
    /// Keyed by path; paths that are not UTF-8 are not persisted.
    files: BTreeMap<String, Saved>,
    /// Old files still being drained (absent in files of older versions).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    rotated: Vec<SavedRotated>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct SavedRotated {
    path: String,
    dev: u64,
    ino: u64,
    fingerprint: u64,
    offset: u64,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct Saved {
    dev: u64,
    ino: u64,
    fingerprint: u64,
    offset: u64,
}

impl OffsetStore {
    /// Opens (creating the directory if needed) the store under `state_dir`.
    /// A file that cannot be parsed is set aside as `offsets.json.corrupt`
    /// and the store starts empty (files are then treated as first seen).
    pub fn open(state_dir: &Path) -> io::Result<OffsetStore> {
        fs::create_dir_all(state_dir)?;
        let file = state_dir.join(FILE_NAME);
        let mut inner = Inner::default();
        let saved_at = fs::metadata(&file).and_then(|m| m.modified()).ok();
        match fs::read(&file) {
            Ok(bytes) => match serde_json::from_slice::<OnDisk>(&bytes) {
                Ok(disk) if disk.version == FORMAT_VERSION => {
                    for (path, s) in disk.files {
                        let id = FileId {
                            dev: s.dev,
                            ino: s.ino,
                            fingerprint: s.fingerprint,
                        };
                        let entry = Entry {
                            saved: Some((id, s.offset)),
                            ..Entry::default()
                        };
                        inner.entries.insert(PathBuf::from(path), entry);
                    }
                    for r in disk.rotated {
                        let file = FileId {
                            dev: r.dev,
                            ino: r.ino,
                            fingerprint: r.fingerprint,
                        };
                        let rotated = Rotated {
                            path: PathBuf::from(r.path),
                            file,
                            offset: r.offset,
                            closed_at: None,
                        };
                        inner.rotated.insert((file.dev, file.ino), rotated);
                    }
                }
                Ok(disk) => {
                    set_aside(&file, &format!("unknown version {}", disk.version))?;
                }
                Err(e) => set_aside(&file, &e.to_string())?,
            },
            Err(e) if e.kind() == io::ErrorKind::NotFound => {}
            Err(e) => return Err(e),
        }
        Ok(OffsetStore {
            file,
            inner: Mutex::new(inner),
            save_lock: Mutex::new(()),
            save_warn: Mutex::new((false, crate::ratelog::Every::default())),
            saved_at,
        })
    }

    /// When the offsets found at open were saved (the file's mtime).
    pub(crate) fn saved_at(&self) -> Option<std::time::SystemTime> {
        self.saved_at
    }

    /// The file last recorded at `path` and the offset processed in it.
    pub fn get(&self, path: &Path) -> Option<(FileId, u64)> {
        self.lock().entries.get(path).and_then(|e| e.saved)
    }

    /// Records that `file` at `path` has been processed up to `offset`
    /// (normally [`Chunk::end`](super::Chunk::end)). Ignored when `file` is
    /// not the file the follower currently reads at `path`.
    pub fn commit(&self, path: &Path, file: FileId, offset: u64) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let key = (file.dev, file.ino);
        if let Some(r) = inner.rotated.get_mut(&key) {
            if r.file.same_file(&file) {
                // An old file being drained.
                if offset > r.offset {
                    r.offset = offset;
                    inner.dirty = true;
                }
                if r.closed_at.is_some_and(|end| r.offset >= end) {
                    inner.rotated.remove(&key);
                    inner.dirty = true;
                }
                return;
            }
            // Other first bytes on an inode still held open: what it held
            // before a truncation, which went to the copy. Stale; the path
            // has another file now. (Once closed, the inode may be reused.)
            if r.closed_at.is_none() {
                return;
            }
        }
        let entry = match inner.entries.get_mut(path) {
            Some(e) => e,
            None => inner.entries.entry(path.to_path_buf()).or_default(),
        };
        if entry.gone || entry.current.is_some_and(|cur| !cur.same_file(&file)) {
            return;
        }
        if entry.saved != Some((file, offset)) {
            entry.saved = Some((file, offset));
            inner.dirty = true;
        }
    }

    /// Writes the entries if anything changed since the last save.
    /// [`OffsetStore::save`], a failure logged at most once a minute (a
    /// full disk fails every second's save) and the recovery once.
    pub fn save_or_warn(&self) {
        let result = self.save();
        let mut w = self.save_warn.lock().unwrap_or_else(|e| e.into_inner());
        match result {
            Ok(()) if w.0 => {
                w.0 = false;
                tracing::info!(path = %self.file.display(), "Log offsets saved again.");
            }
            Ok(()) => {}
            Err(e) => {
                w.0 = true;
                if let Some(n) = w.1.note(1, std::time::Duration::from_secs(60)) {
                    tracing::warn!(path = %self.file.display(), error = %e, failures = n,
                        "Saving log offsets failed; retried every second (at most one warning a minute).");
                }
            }
        }
    }

    pub fn save(&self) -> io::Result<()> {
        let _writer = self.save_lock.lock().unwrap_or_else(|e| e.into_inner());
        let bytes = {
            let mut inner = self.lock();
            if !inner.dirty {
                return Ok(());
            }
            inner.dirty = false;
            let mut files = BTreeMap::new();
            for (path, entry) in &inner.entries {
                if let (Some((id, offset)), Some(path)) = (entry.saved, path.to_str()) {
                    let saved = Saved {
                        dev: id.dev,
                        ino: id.ino,
                        fingerprint: id.fingerprint,
                        offset,
                    };
                    files.insert(path.to_owned(), saved);
                }
            }
            let rotated = inner
                .rotated
                .values()
                .filter_map(|r| {
                    Some(SavedRotated {
                        path: r.path.to_str()?.to_owned(),
                        dev: r.file.dev,
                        ino: r.file.ino,
                        fingerprint: r.file.fingerprint,
                        offset: r.offset,
                    })
                })
                .collect();
            let disk = OnDisk {
                version: FORMAT_VERSION,
                files,
                rotated,
            };
            serde_json::to_vec_pretty(&disk).map_err(io::Error::other)
        };
        let result = bytes.and_then(|b| write_atomically(&self.file, &b));
        if result.is_err() {
            self.lock().dirty = true;
        }
        result
    }

    /// The follower opened `file` at `path` and starts reading at `offset`.
    /// `restart`: the same inode was truncated, so the saved offset is void.
    pub(crate) fn begin(&self, path: &Path, file: FileId, offset: u64, restart: bool) {
        let mut inner = self.lock();
        let entry = inner.entries.entry(path.to_path_buf()).or_default();
        entry.current = Some(file);
        entry.gone = false;
        let known = entry.saved.is_some_and(|(id, _)| id.same_file(&file));
        if restart || !known {
            entry.saved = Some((file, offset));
            inner.dirty = true;
        } else if let Some((id, _)) = &mut entry.saved {
            if id.fingerprint == 0 && file.fingerprint != 0 {
                id.fingerprint = file.fingerprint;
                inner.dirty = true;
            }
        }
    }

    /// The file the follower read at `path` left it (renamed or deleted) and
    /// is drained from now on: what was committed of it moves to a rotated
    /// entry, so commits of its last lines are kept and survive a restart.
    pub(crate) fn retire(&self, path: &Path, file: FileId) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let Some(entry) = inner.entries.get_mut(path) else {
            return;
        };
        let Some((saved, offset)) = entry.saved.filter(|(id, _)| id.same_file(&file)) else {
            return;
        };
        // The path has no file until the follower opens the next one.
        entry.current = None;
        let rotated = Rotated {
            path: path.to_path_buf(),
            file: if saved.fingerprint == 0 { file } else { saved },
            offset,
            closed_at: None,
        };
        inner.rotated.insert((file.dev, file.ino), rotated);
        inner.dirty = true;
    }

    /// A rotated file found again at start, to be drained from `offset`.
    pub(crate) fn rotated(&self) -> Vec<Rotated> {
        self.lock().rotated.values().cloned().collect()
    }

    /// The follower closed a drained file; its last line ends at `end`. Its
    /// entry goes once everything up to `end` is committed.
    pub(crate) fn closed(&self, file: FileId, end: u64) {
        let mut guard = self.lock();
        let inner = &mut *guard;
        let key = (file.dev, file.ino);
        if let Some(r) = inner.rotated.get_mut(&key) {
            if r.offset >= end {
                inner.rotated.remove(&key);
                inner.dirty = true;
            } else {
                r.closed_at = Some(end);
            }
        }
    }

    /// A rotated file found again at start rewritten in place (truncated):
    /// its entry names it as it is now, from 0.
    pub(crate) fn restart_rotated(&self, was: FileId, now: FileId) {
        let mut inner = self.lock();
        if let Some(r) = inner.rotated.get_mut(&(was.dev, was.ino)) {
            r.file = now;
            r.offset = 0;
            inner.dirty = true;
        }
    }

    /// A rotated file that cannot be found or read any more.
    pub(crate) fn drop_rotated(&self, file: FileId) {
        let mut inner = self.lock();
        if inner.rotated.remove(&(file.dev, file.ino)).is_some() {
            inner.dirty = true;
        }
    }

    /// The follower learnt the fingerprint of the file it reads at `path`.
    pub(crate) fn update_current(&self, path: &Path, file: FileId) {
        if let Some(e) = self.lock().entries.get_mut(path) {
            e.current = Some(file);
        }
    }

    /// `path` (matched by a glob) is gone and no longer followed. Its entry
    /// stays in memory as a tombstone (a path, a few bytes) but not on disk.
    pub(crate) fn forget(&self, path: &Path) {
        let mut inner = self.lock();
        if let Some(entry) = inner.entries.get_mut(path) {
            *entry = Entry {
                gone: true,
                ..Entry::default()
            };
            inner.dirty = true;
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock().unwrap_or_else(|e| e.into_inner())
    }
}

fn set_aside(file: &Path, why: &str) -> io::Result<()> {
    let aside = file.with_extension("json.corrupt");
    tracing::warn!(file = %file.display(), error = why, aside = %aside.display(),
        "Offsets file unreadable; set aside, every file starts as first seen.");
    fs::rename(file, aside)
}

fn write_atomically(file: &Path, bytes: &[u8]) -> io::Result<()> {
    let tmp = file.with_extension("json.tmp");
    let written = File::create(&tmp).and_then(|mut f| {
        f.write_all(bytes)?;
        f.sync_all()
    });
    if let Err(e) = written.and_then(|()| fs::rename(&tmp, file)) {
        // No half-written file left behind (a full disk).
        let _ = fs::remove_file(&tmp);
        return Err(e);
    }
    if let Some(dir) = file.parent() {
        File::open(dir)?.sync_all()?;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(fingerprint: u64) -> FileId {
        FileId {
            dev: 1,
            ino: 7,
            fingerprint,
        }
    }

    /// The follower saw a copytruncate only as the file left its path: the
    /// rotated entry starts at 0 under the new first bytes, and a late
    /// commit of the content before the truncation moves nothing.
    #[test]
    fn a_late_commit_from_before_a_truncation_is_stale() {
        let dir = tempfile::tempdir().unwrap();
        let store = OffsetStore::open(dir.path()).unwrap();
        let path = Path::new("/logs/access.log");
        let (before, after) = (id(11), id(22));
        store.begin(path, before, 0, false);
        store.commit(path, before, 500);
        store.begin(path, after, 0, true);
        store.retire(path, after);

        store.commit(path, before, 800);
        store.commit(path, after, 40);
        let r = store.rotated();
        assert_eq!((r.len(), r[0].file, r[0].offset), (1, after, 40));
        assert_eq!(
            store.get(path),
            Some((after, 0)),
            "the path's entry is not the stale file's"
        );

        // Closed: the inode may be reused by a new file at the path, whose
        // commits count.
        store.closed(after, 60);
        let reused = id(33);
        store.begin(path, reused, 0, false);
        store.commit(path, reused, 90);
        assert_eq!(store.get(path), Some((reused, 90)));
    }
}
