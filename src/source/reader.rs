//! One open file being read: its descriptor, identity, read position and line
//! splitter. Decides where reading starts when the file is opened, and notices
//! when the same inode was truncated or rewritten under it.
//!
//! Reads use `pread` at the splitter's position, so the position lives in one
//! place and the descriptor's cursor never matters. The descriptor stays open
//! after the path moves on (rename, delete): that is how an old file is drained.

use std::fs::File;
use std::io;
use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use memchr::memrchr;

use super::framing::{Framer, Framing};
use super::identity::{fingerprint_of, read_head, FINGERPRINT_BYTES};
use super::{Chunk, FileId, LineSplitter, OffsetStore};

/// Where a newly opened file starts, for logs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Start {
    /// Saved offset for this very file.
    Resumed,
    /// First time seen at startup: at its end.
    End,
    /// New, rotated while down, or shorter than the saved offset.
    Beginning,
}

impl std::fmt::Display for Start {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Start::Resumed => "resumed",
            Start::End => "end",
            Start::Beginning => "beginning",
        })
    }
}

#[derive(Debug)]
pub(crate) struct Reader {
    /// Pattern index, for the chunks.
    pub(crate) source: usize,
    /// Path the file had when it was opened (or adopted).
    pub(crate) path: Arc<Path>,
    pub(crate) id: FileId,
    file: File,
    /// The file's first bytes as last seen (up to `FINGERPRINT_BYTES`): a
    /// rewrite is noticed even before the fingerprint is known.
    head: Vec<u8>,
    split: LineSplitter,
    /// A framed source's lines between the splitter and `out`, and whether
    /// the last read found the end of the file (two in a row: quiet).
    framing: Option<(Framing, bool)>,
    /// The splitter's chunks on their way to `framing`.
    split_out: Vec<Chunk>,
    /// When data last arrived or the file was rotated away: the drain clock.
    pub(crate) last_data: Instant,
}

impl Reader {
    /// Opens `path` and picks the start: the saved offset if the store knows
    /// this file, else 0, except for a file first seen at startup (`initial`),
    /// which starts at its end. Registers the file with the store.
    pub(crate) fn open(
        source: usize,
        path: Arc<Path>,
        initial: bool,
        offsets: &OffsetStore,
        max_line: usize,
        framer: Option<Framer>,
    ) -> io::Result<(Reader, Start)> {
        let file = File::open(&path)?;
        let (meta, id, head) = identify(&file)?;
        if !meta.is_file() {
            return Err(io::Error::other("not a regular file"));
        }
        let size = meta.len();
        let (split, start, restart) = match offsets.get(&path) {
            Some((saved, offset)) if saved.same_file(&id) && offset <= size => {
                (LineSplitter::new(max_line, offset), Start::Resumed, false)
            }
            Some((saved, _)) if saved.same_file(&id) => (LineSplitter::new(max_line, 0), Start::Beginning, true),
            None if initial => (at_end(&file, size, max_line)?, Start::End, false),
            _ => (LineSplitter::new(max_line, 0), Start::Beginning, false),
        };
        offsets.begin(&path, id, split.position(), restart);
        let reader = Reader {
            source,
            path,
            id,
            file,
            head,
            framing: framer.map(|f| (Framing::new(f, split.position()), false)),
            split,
            split_out: Vec::new(),
            last_data: Instant::now(),
        };
        Ok((reader, start))
    }

    /// Position just past the last complete line read (and, framed, sent on).
    pub(crate) fn position(&self) -> u64 {
        match &self.framing {
            Some((f, _)) => f.position(),
            None => self.split.position(),
        }
    }

    /// The splitter's complete lines into `out`, through the framing if any;
    /// `quiet`: the file ended or has been quiet, every line is final.
    fn take(&mut self, quiet: bool, out: &mut Vec<Chunk>) {
        let Some((framing, _)) = &mut self.framing else {
            self.split.take(self.source, &self.path, self.id, out);
            return;
        };
        self.split.take(self.source, &self.path, self.id, &mut self.split_out);
        for chunk in self.split_out.drain(..) {
            framing.push(chunk, out);
        }
        if quiet {
            framing.flush(out);
        }
    }

    /// Reads once, up to `buf.len()` bytes, and appends the complete lines to
    /// `out`. Returns the number of bytes read (0 at end of file).
    pub(crate) fn read(&mut self, buf: &mut [u8], out: &mut Vec<Chunk>) -> io::Result<usize> {
        let n = loop {
            match self.file.read_at(buf, self.split.read_position()) {
                Ok(n) => break n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) => return Err(e),
            }
        };
        if n > 0 {
            self.split.push(&buf[..n]);
        }
        // Framed: the lines held go once the file has been quiet, i.e.
        // a read after one that found its end found nothing new either
        // (not at the first end: a record being written may be half there).
        let quiet = match &mut self.framing {
            Some((_, at_end)) => std::mem::replace(at_end, n == 0) && n == 0,
            None => false,
        };
        if n > 0 || quiet {
            self.take(quiet, out);
        }
        Ok(n)
    }

    /// The file's first bytes into `buf`, and whether the file is no longer
    /// what we have been reading: shorter than our position (truncated) or
    /// with other first bytes (rewritten).
    fn probe(&self, buf: &mut [u8; FINGERPRINT_BYTES]) -> io::Result<(usize, bool)> {
        let size = self.file.metadata()?.len();
        let n = read_head(&self.file, buf)?;
        let rewritten = size < self.split.read_position() || !buf[..n].starts_with(&self.head);
        Ok((n, rewritten))
    }

    /// See [`probe`](Self::probe).
    pub(crate) fn is_rewritten(&self) -> io::Result<bool> {
        Ok(self.probe(&mut [0u8; FINGERPRINT_BYTES])?.1)
    }

    /// If the file was truncated or rewritten in place (copytruncate),
    /// restart at 0 and return true. Learns the fingerprint once the file is
    /// long enough. `offsets` is given when the file is the one its path
    /// names, so the store learns the restart.
    pub(crate) fn check_truncated(&mut self, offsets: Option<&OffsetStore>) -> io::Result<bool> {
        let mut buf = [0u8; FINGERPRINT_BYTES];
        let (n, truncated) = self.probe(&mut buf)?;
        let head = &buf[..n];
        if truncated {
            // A partial line carried from before is dropped: its rest, if
            // any, went to the copy.
            self.split.reset(0);
            if let Some((f, _)) = &mut self.framing {
                f.restart(0);
            }
            self.head.clear();
        }
        if head.len() > self.head.len() {
            self.head.clear();
            self.head.extend_from_slice(head);
        }
        let fingerprint = fingerprint_of(&self.head);
        let learnt = fingerprint != self.id.fingerprint;
        self.id.fingerprint = fingerprint;
        if let Some(offsets) = offsets {
            if truncated {
                offsets.begin(&self.path, self.id, 0, true);
            } else if learnt {
                offsets.update_current(&self.path, self.id);
            }
        }
        Ok(truncated)
    }

    /// The file is being closed for good (drained after rotation): an
    /// unterminated last line is sent as a line. `offsets` learns where the
    /// file ends, so its rotated entry goes once that much is committed.
    pub(crate) fn finish(mut self, out: &mut Vec<Chunk>, offsets: &OffsetStore) {
        let before = out.len();
        self.split.finish();
        self.take(true, out);
        let end = out[before..].last().map_or(self.position(), Chunk::end);
        offsets.closed(self.id, end);
    }

    /// Follows the same descriptor under another path (a rotated file that a
    /// glob also matches).
    pub(crate) fn adopt(&mut self, source: usize, path: Arc<Path>, offsets: &OffsetStore) {
        self.source = source;
        self.path = path;
        offsets.drop_rotated(self.id);
        offsets.begin(&self.path, self.id, self.position(), false);
    }
}

impl Reader {
    /// A file rotated away from `path` before a restart, found again at
    /// `found`: read from `offset` if it is still the file `want` (the
    /// rotated entry: file, offset), else None.
    ///
    /// The same inode with other first bytes is the file rewritten in place
    /// (a copytruncate, then a rename, while we were down) only if it was
    /// created no later than `held_at`, a moment we held `want` open (the
    /// last save of the offsets): an inode is not reused while its file
    /// exists. It is then read from 0 (`rewritten`), else it is another file.
    pub(crate) fn resume(
        source: usize,
        path: Arc<Path>,
        found: &Path,
        (want, offset): (FileId, u64),
        held_at: Option<std::time::SystemTime>,
        max_line: usize,
        framer: Option<Framer>,
    ) -> io::Result<Option<(Reader, bool)>> {
        let file = File::open(found)?;
        let (meta, id, head) = identify(&file)?;
        if !meta.is_file() || !want.same_inode(id.dev, id.ino) {
            return Ok(None);
        }
        let rewritten = !want.same_file(&id);
        let born_before = || {
            meta.created()
                .ok()
                .zip(held_at)
                .is_some_and(|(born, held)| born <= held)
        };
        if rewritten && !born_before() {
            return Ok(None);
        }
        let start = if !rewritten && offset <= meta.len() { offset } else { 0 };
        let reader = Reader {
            source,
            path,
            id,
            file,
            head,
            split: LineSplitter::new(max_line, start),
            framing: framer.map(|f| (Framing::new(f, start), false)),
            split_out: Vec::new(),
            last_data: Instant::now(),
        };
        Ok(Some((reader, rewritten)))
    }
}

/// An open file's metadata, identity and first bytes (none read but from
/// a regular file).
fn identify(file: &File) -> io::Result<(std::fs::Metadata, FileId, Vec<u8>)> {
    let meta = file.metadata()?;
    let mut buf = [0u8; FINGERPRINT_BYTES];
    let n = if meta.is_file() { read_head(file, &mut buf)? } else { 0 };
    let head = buf[..n].to_vec();
    let id = FileId {
        dev: meta.dev(),
        ino: meta.ino(),
        fingerprint: fingerprint_of(&head),
    };
    Ok((meta, id, head))
}

/// A splitter at the start of the line being written at the end of the file,
/// so that line is not lost or cut; mid-line (skipping) if the file ends in a
/// line already too long to keep.
fn at_end(file: &File, size: u64, max_line: usize) -> io::Result<LineSplitter> {
    let window = (max_line as u64 + 1).min(size);
    let from = size - window;
    let mut tail = vec![0u8; window as usize];
    file.read_exact_at(&mut tail, from)?;
    Ok(match memrchr(b'\n', &tail) {
        Some(i) => LineSplitter::new(max_line, from + i as u64 + 1),
        None if from == 0 => LineSplitter::new(max_line, 0),
        None => LineSplitter::new_skipping(max_line, size),
    })
}
