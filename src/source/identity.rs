//! Which file is this? Paths lie after a rotation, so a followed file is known
//! by its device and inode plus a fingerprint of its first bytes.
//!
//! Device + inode tell two files apart while both exist; the fingerprint tells
//! a file from a later one that reused the inode (after a restart, when we held
//! no descriptor that would have kept the old inode alive), or from the same
//! inode rewritten by copytruncate. The fingerprint is FNV-1a 64 over the first
//! [`FINGERPRINT_BYTES`] bytes: stable across builds and versions, because it is
//! persisted in the offsets file.

use std::fs::{File, Metadata};
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;

/// How many leading bytes the fingerprint covers. Changing it invalidates every
/// persisted fingerprint (files would be re-read from 0 after an upgrade).
pub const FINGERPRINT_BYTES: usize = 256;

/// Identity of one file: device + inode + fingerprint.
///
/// `fingerprint` is the hash of the first [`FINGERPRINT_BYTES`] bytes, or 0
/// while the file is shorter than that: 0 means "not known yet" and matches any
/// fingerprint of the same device and inode (see [`FileId::same_file`]). The
/// follower fills it in once the file has grown long enough.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
pub struct FileId {
    pub dev: u64,
    pub ino: u64,
    pub fingerprint: u64,
}

impl FileId {
    /// Identity of an open file, from the descriptor itself (no path race).
    pub fn of_file(file: &File) -> io::Result<FileId> {
        let meta = file.metadata()?;
        Ok(FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            fingerprint: fingerprint(file)?,
        })
    }

    /// Identity of the file a path names now.
    pub fn of_path(path: &Path) -> io::Result<FileId> {
        FileId::of_file(&File::open(path)?)
    }

    /// Same file, as far as we can tell: same device and inode, and equal
    /// fingerprints unless one of them is still unknown (0).
    pub fn same_file(&self, other: &FileId) -> bool {
        self.same_inode(other.dev, other.ino)
            && (self.fingerprint == 0 || other.fingerprint == 0 || self.fingerprint == other.fingerprint)
    }

    pub(crate) fn same_inode(&self, dev: u64, ino: u64) -> bool {
        self.dev == dev && self.ino == ino
    }

    pub(crate) fn matches_meta(&self, meta: &Metadata) -> bool {
        self.same_inode(meta.dev(), meta.ino())
    }
}

/// Fingerprint of an open file (reads at offset 0, whatever its cursor).
pub fn fingerprint(file: &File) -> io::Result<u64> {
    let mut buf = [0u8; FINGERPRINT_BYTES];
    let n = read_head(file, &mut buf)?;
    Ok(fingerprint_of(&buf[..n]))
}

/// Reads the file's first bytes into `buf`; fewer at end of file.
pub(crate) fn read_head(file: &File, buf: &mut [u8]) -> io::Result<usize> {
    let mut filled = 0;
    while filled < buf.len() {
        match file.read_at(&mut buf[filled..], filled as u64) {
            Ok(0) => break,
            Ok(n) => filled += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(filled)
}

/// The fingerprint of a file whose first bytes are `head`: 0 (unknown) while
/// it is shorter than [`FINGERPRINT_BYTES`], else FNV-1a 64 of them, never 0.
pub(crate) fn fingerprint_of(head: &[u8]) -> u64 {
    if head.len() < FINGERPRINT_BYTES {
        return 0;
    }
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in &head[..FINGERPRINT_BYTES] {
        h ^= u64::from(b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    h.max(1)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn unknown_fingerprint_matches_same_inode_only() {
        let id = |ino, fingerprint| FileId {
            dev: 1,
            ino,
            fingerprint,
        };
        let (a, b, c, d) = (id(2, 0), id(2, 7), id(2, 8), id(3, 7));
        assert!(a.same_file(&b) && b.same_file(&a));
        assert!(!b.same_file(&c));
        assert!(!b.same_file(&d) && !a.same_file(&d));
    }

    #[test]
    fn fingerprint_is_stable_and_nonzero() {
        // Persisted: this value must never change.
        assert_eq!(fingerprint_of(&[b'a'; FINGERPRINT_BYTES]), 0xfd29_1620_0943_d825);
        assert_ne!(fingerprint_of(&[0u8; FINGERPRINT_BYTES]), 0);
        assert_eq!(fingerprint_of(b"short"), 0);
    }
}
