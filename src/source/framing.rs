//! Lines handed on only once the record around them is known: for logs
//! whose records may span lines (nginx's error log, where a decoded `%0A`
//! in a path starts a line the client wrote). A [`Framer`] marks the lines
//! that may belong to a record split across lines; it needs the
//! [`Framing::REACH`] bytes before and after a line to decide. So a line is
//! released once that many bytes of whole lines follow it, or when the
//! reader says the file ended or has been quiet ([`Framing::flush`]), and
//! the last `REACH` bytes released are kept to look back at. Access logs
//! are not framed and never pass here.

use std::path::Path;
use std::sync::Arc;

use super::{Chunk, FileId};

/// Marks (sets, never clears) `marks[i]` for each line `i` of `data` that
/// belongs to a record split across lines; line `i` ends just past its
/// `\n` at `ends[i]`. `marks` is resized to the lines by the framer.
pub type Framer = fn(data: &[u8], ends: &[u32], marks: &mut Vec<bool>);

/// The lines of one file between its splitter and the chunks sent on.
#[derive(Debug)]
pub(crate) struct Framing {
    framer: Framer,
    /// Lines kept to look back at, then those not released yet.
    data: Vec<u8>,
    ends: Vec<u32>,
    /// File offset of `data[0]`.
    base: u64,
    /// Lines of `data` already released (the look-behind).
    released: usize,
    marks: Vec<bool>,
    /// Labels of the last chunk pushed.
    label: Option<(usize, Arc<Path>, FileId)>,
}

impl Framing {
    /// How far a record reaches: bytes looked at on each side of a line.
    pub(crate) const REACH: usize = 2048;

    /// Lines are pushed from `start`, the start of a line.
    pub(crate) fn new(framer: Framer, start: u64) -> Framing {
        Framing {
            framer,
            data: Vec::new(),
            ends: Vec::new(),
            base: start,
            released: 0,
            marks: Vec::new(),
            label: None,
        }
    }

    /// Offset just past the last line released: where to resume without
    /// loss or duplication.
    pub(crate) fn position(&self) -> u64 {
        self.base + self.released_bytes() as u64
    }

    fn released_bytes(&self) -> usize {
        match self.released {
            0 => 0,
            n => self.ends[n - 1] as usize,
        }
    }

    /// Takes the lines of `chunk`; appends to `out` the chunks of lines now
    /// final. Skipped long lines end a run: everything before them goes.
    pub(crate) fn push(&mut self, chunk: Chunk, out: &mut Vec<Chunk>) {
        let at = self.data.len();
        self.data.extend_from_slice(&chunk.data);
        self.ends.extend(chunk.ends.iter().map(|&e| e + at as u32));
        self.label = Some((chunk.source, chunk.path.clone(), chunk.file));
        if chunk.skipped_long > 0 {
            self.release(self.ends.len(), out);
            if let Some(last) = out
                .last_mut()
                .filter(|c| c.end() == chunk.start + chunk.data.len() as u64)
            {
                last.skipped_long += chunk.skipped_long;
                last.skipped_bytes += chunk.skipped_bytes;
            } else {
                out.push(Chunk {
                    skipped_long: chunk.skipped_long,
                    skipped_bytes: chunk.skipped_bytes,
                    ..self.empty_chunk(chunk.start + chunk.data.len() as u64)
                });
            }
            // Nothing reaches across a line longer than any record.
            self.restart(chunk.end());
            return;
        }
        let end = self.data.len();
        let final_lines = self.ends.partition_point(|&e| e as usize + Self::REACH <= end);
        self.release(final_lines, out);
    }

    /// The file ended, or has been quiet: every line pushed is final.
    pub(crate) fn flush(&mut self, out: &mut Vec<Chunk>) {
        self.release(self.ends.len(), out);
    }

    /// Drops every line and starts again at `start` (after truncation).
    pub(crate) fn restart(&mut self, start: u64) {
        self.data.clear();
        self.ends.clear();
        self.marks.clear();
        self.base = start;
        self.released = 0;
    }

    fn empty_chunk(&self, start: u64) -> Chunk {
        let (source, path, file) = self.label.clone().unwrap_or_else(|| {
            (
                0,
                Arc::from(Path::new("")),
                FileId {
                    dev: 0,
                    ino: 0,
                    fingerprint: 0,
                },
            )
        });
        Chunk {
            source,
            path,
            file,
            start,
            data: Vec::new(),
            ends: Vec::new(),
            lines: 0,
            skipped_long: 0,
            skipped_bytes: 0,
            split: Vec::new(),
        }
    }

    /// Sends lines `released..upto` as one chunk, then keeps only the
    /// look-behind.
    fn release(&mut self, upto: usize, out: &mut Vec<Chunk>) {
        if upto <= self.released {
            return;
        }
        self.marks.clear();
        (self.framer)(&self.data, &self.ends, &mut self.marks);
        let from = self.released_bytes();
        let to = self.ends[upto - 1] as usize;
        let mut chunk = self.empty_chunk(self.base + from as u64);
        chunk.data = self.data[from..to].to_vec();
        chunk.ends = self.ends[self.released..upto]
            .iter()
            .map(|&e| e - from as u32)
            .collect();
        chunk.lines = chunk.ends.len() as u64;
        chunk.split = (self.released..upto)
            .filter(|&i| self.marks.get(i).copied().unwrap_or(false))
            .map(|i| (i - self.released) as u32)
            .collect();
        out.push(chunk);
        self.released = upto;
        // Keep the lines that end within REACH of the release point.
        let keep = self.ends[..upto].partition_point(|&e| e as usize + Self::REACH <= to);
        if keep > 0 {
            let cut = self.ends[keep - 1];
            self.data.drain(..cut as usize);
            self.ends.drain(..keep);
            self.ends.iter_mut().for_each(|e| *e -= cut);
            self.base += u64::from(cut);
            self.released -= keep;
        }
    }
}
