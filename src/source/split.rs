//! Bytes -> runs of whole lines. [`LineSplitter`] is fed the bytes of one file
//! in whatever pieces reads return and hands back [`Chunk`]s of complete lines.
//!
//! It finds newlines with `memchr` and copies runs of good lines in bulk: no
//! allocation per line. The one unterminated line at the end of the input is
//! carried to the next push, but never more than `max_line` bytes of it: a line
//! longer than that switches to skip mode, which only counts bytes until the
//! newline. Skipped lines are recorded at the end of a chunk (a chunk is closed
//! when good lines follow a skipped one), so a chunk's data is always one
//! contiguous range of the file and [`Chunk::end`] is the offset to checkpoint.

use std::path::Path;
use std::sync::Arc;

use memchr::{memchr, memchr_iter};

use super::{Chunk, FileId};

/// Incremental line splitter for one file. See the module docs.
#[derive(Debug)]
pub struct LineSplitter {
    /// Longest line kept, in bytes without its `\n`.
    max_line: usize,
    /// The unterminated line carried from the previous push (not in skip mode).
    carried: Vec<u8>,
    /// `Some(bytes seen so far)` while inside a line longer than `max_line`.
    skipping: Option<u64>,
    /// The run being filled; its `end()` is where the carried line starts.
    cur: Run,
    /// Runs closed because a skipped line was followed by good lines.
    done: Vec<Run>,
}

/// A chunk before it is labelled with the file it came from.
#[derive(Debug, Default)]
struct Run {
    start: u64,
    data: Vec<u8>,
    lines: u64,
    skipped_long: u64,
    skipped_bytes: u64,
}

impl Run {
    fn at(start: u64) -> Run {
        Run {
            start,
            ..Run::default()
        }
    }

    fn end(&self) -> u64 {
        self.start + self.data.len() as u64 + self.skipped_bytes
    }

    fn is_empty(&self) -> bool {
        self.data.is_empty() && self.skipped_long == 0
    }
}

impl LineSplitter {
    /// A splitter whose first pushed byte is at file offset `start`, which
    /// must be the start of a line.
    pub fn new(max_line: usize, start: u64) -> LineSplitter {
        LineSplitter {
            max_line,
            carried: Vec::new(),
            skipping: None,
            cur: Run::at(start),
            done: Vec::new(),
        }
    }

    /// A splitter that starts at `start` inside a line whose beginning is
    /// unknown: everything up to the next newline is counted as a skipped line.
    pub fn new_skipping(max_line: usize, start: u64) -> LineSplitter {
        let mut s = LineSplitter::new(max_line, start);
        s.skipping = Some(0);
        s
    }

    /// Offset just past the last complete line: where to resume reading
    /// without loss or duplication.
    pub fn position(&self) -> u64 {
        self.cur.end()
    }

    /// Offset of the next byte to push (after the carried partial line).
    pub fn read_position(&self) -> u64 {
        self.position() + self.skipping.unwrap_or(self.carried.len() as u64)
    }

    /// Feeds the next bytes of the file.
    pub fn push(&mut self, mut input: &[u8]) {
        if self.skipping.is_some() || !self.carried.is_empty() {
            let Some(i) = memchr(b'\n', input) else {
                self.carry(input);
                return;
            };
            let (head, tail) = input.split_at(i + 1);
            self.finish_carried(head);
            input = tail;
        }
        self.cur.data.reserve(input.len());
        let (mut run_start, mut line_start, mut lines) = (0, 0, 0);
        for nl in memchr_iter(b'\n', input) {
            if nl - line_start > self.max_line {
                self.emit(&input[run_start..line_start], lines);
                self.skip((nl + 1 - line_start) as u64);
                run_start = nl + 1;
                lines = 0;
            } else {
                lines += 1;
            }
            line_start = nl + 1;
        }
        self.emit(&input[run_start..line_start], lines);
        self.carry(&input[line_start..]);
    }

    /// Moves the complete lines seen so far into `out` as chunks labelled
    /// with `source`, `path` and `file`.
    pub fn take(&mut self, source: usize, path: &Arc<Path>, file: FileId, out: &mut Vec<Chunk>) {
        let next = Run::at(self.cur.end());
        let cur = std::mem::replace(&mut self.cur, next);
        for run in self.done.drain(..).chain(Some(cur)) {
            if run.is_empty() {
                continue;
            }
            out.push(Chunk {
                source,
                path: Arc::clone(path),
                file,
                start: run.start,
                data: run.data,
                lines: run.lines,
                skipped_long: run.skipped_long,
                skipped_bytes: run.skipped_bytes,
            });
        }
    }

    /// Ends the stream: an unterminated last line becomes a line of its own
    /// (a `\n` is added, so its chunk's `end()` is one past the file's end),
    /// and a long one being skipped is counted. Call [`take`](Self::take) after.
    pub fn finish(&mut self) {
        if let Some(n) = self.skipping.take() {
            if n > 0 {
                self.skip(n);
            }
        } else if !self.carried.is_empty() {
            let mut line = std::mem::take(&mut self.carried);
            line.push(b'\n');
            self.emit(&line, 1);
        }
    }

    /// Drops everything carried and restarts at `start` (after truncation).
    /// Complete lines not yet taken are dropped too: take them first.
    pub fn reset(&mut self, start: u64) {
        self.carried.clear();
        self.skipping = None;
        self.done.clear();
        self.cur = Run::at(start);
    }

    fn emit(&mut self, bytes: &[u8], lines: u64) {
        if bytes.is_empty() {
            return;
        }
        if self.cur.skipped_bytes > 0 {
            let next = Run::at(self.cur.end());
            self.done.push(std::mem::replace(&mut self.cur, next));
        }
        self.cur.data.extend_from_slice(bytes);
        self.cur.lines += lines;
    }

    fn skip(&mut self, bytes: u64) {
        self.cur.skipped_long += 1;
        self.cur.skipped_bytes += bytes;
    }

    /// Keeps an unterminated tail, or only counts it once it is too long.
    fn carry(&mut self, bytes: &[u8]) {
        if let Some(n) = &mut self.skipping {
            *n += bytes.len() as u64;
        } else if self.carried.len() + bytes.len() > self.max_line {
            self.skipping = Some((self.carried.len() + bytes.len()) as u64);
            self.carried.clear();
        } else {
            self.carried.extend_from_slice(bytes);
        }
    }

    /// Completes the carried line with `head`, which ends in its `\n`.
    fn finish_carried(&mut self, head: &[u8]) {
        if let Some(n) = self.skipping.take() {
            self.skip(n + head.len() as u64);
        } else if self.carried.len() + head.len() - 1 > self.max_line {
            self.skip((self.carried.len() + head.len()) as u64);
            self.carried.clear();
        } else {
            let mut line = std::mem::take(&mut self.carried);
            line.extend_from_slice(head);
            self.emit(&line, 1);
            line.clear();
            self.carried = line;
        }
    }
}
