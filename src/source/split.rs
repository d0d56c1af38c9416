//! Bytes -> runs of whole lines. [`LineSplitter`] is fed the bytes of one file
//! in whatever pieces reads return and hands back [`Chunk`]s of complete lines.
//!
//! It finds newlines with `memchr` and copies runs of good lines in bulk: no
//! allocation per line. Where each line ends is kept with the chunk
//! ([`Chunk::lines`] walks those ends instead of searching again). The one unterminated line at the end of the input is
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
    /// Newlines of the lines pushed but not yet copied, by input index.
    newlines: Vec<usize>,
    /// Bytes of the carried line lent to a reader's buffer ([`LineSplitter::lend`]).
    lent: usize,
}

/// A chunk before it is labelled with the file it came from.
#[derive(Debug, Default)]
struct Run {
    start: u64,
    data: Vec<u8>,
    /// Where each line of `data` ends, past its `\n` (a run holds less than
    /// 4 GiB: callers take chunks after each read).
    ends: Vec<u32>,
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
            newlines: Vec::new(),
            lent: 0,
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
        let mut newlines = std::mem::take(&mut self.newlines);
        newlines.clear();
        let (mut run_start, mut line_start) = (0, 0);
        for nl in memchr_iter(b'\n', input) {
            if nl - line_start > self.max_line {
                self.emit_lines(input, run_start, line_start, &newlines);
                newlines.clear();
                self.skip((nl + 1 - line_start) as u64);
                run_start = nl + 1;
            } else {
                newlines.push(nl);
            }
            line_start = nl + 1;
        }
        self.emit_lines(input, run_start, line_start, &newlines);
        self.newlines = newlines;
        self.carry(&input[line_start..]);
    }

    /// Emits `input[from..to]`, whole lines whose newlines are `newlines`.
    fn emit_lines(&mut self, input: &[u8], from: usize, to: usize, newlines: &[usize]) {
        if from == to {
            return;
        }
        self.close_after_skip();
        let base = self.cur.data.len();
        self.cur
            .ends
            .extend(newlines.iter().map(|&nl| (base + nl + 1 - from) as u32));
        self.cur.data.extend_from_slice(&input[from..to]);
        self.cur.lines += newlines.len() as u64;
    }

    /// For a reader that reads into the splitter's memory instead of its
    /// own (no copy of what it reads): `buf` is emptied and gets the
    /// unterminated line carried so far; read the next bytes onto its end,
    /// then hand it back with [`LineSplitter::push_buf`].
    pub fn lend(&mut self, buf: &mut Vec<u8>) {
        buf.clear();
        buf.append(&mut self.carried);
        self.lent = buf.len();
    }

    /// [`LineSplitter::push`] of what was read onto a [`LineSplitter::lend`]
    /// buffer. When it holds only whole lines no longer than `max_line`
    /// after the carried one (the usual case), it becomes the chunk's data
    /// as it is, and `buf` gets an empty buffer to lend next time.
    pub fn push_buf(&mut self, buf: &mut Vec<u8>) {
        let lent = std::mem::take(&mut self.lent);
        let in_place = self.skipping.is_none()
            && self.carried.is_empty()
            && self.cur.data.is_empty()
            && self.cur.skipped_bytes == 0;
        let mut ends = std::mem::take(&mut self.cur.ends);
        ends.clear();
        let mut line_start = 0;
        let mut fits = in_place;
        if in_place {
            for nl in memchr_iter(b'\n', buf) {
                if nl - line_start > self.max_line {
                    fits = false;
                    break;
                }
                ends.push((nl + 1) as u32);
                line_start = nl + 1;
            }
        }
        if !fits {
            self.cur.ends = ends;
            self.cur.ends.clear();
            self.carried.extend_from_slice(&buf[..lent]);
            self.push(&buf[lent..]);
            return;
        }
        self.carry(&buf[line_start..]);
        buf.truncate(line_start);
        std::mem::swap(buf, &mut self.cur.data);
        self.cur.lines += ends.len() as u64;
        self.cur.ends = ends;
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
                ends: run.ends,
                lines: run.lines,
                skipped_long: run.skipped_long,
                skipped_bytes: run.skipped_bytes,
                split: Vec::new(),
            });
        }
    }

    /// Gives back the buffer of a chunk taken earlier, to be filled again:
    /// a reader that is done with its chunks saves an allocation (and its
    /// page faults) per chunk.
    pub fn recycle(&mut self, chunk: Chunk) {
        let (mut data, mut ends) = (chunk.data, chunk.ends);
        if self.cur.data.is_empty() && data.capacity() > self.cur.data.capacity() {
            data.clear();
            ends.clear();
            self.cur.data = data;
            self.cur.ends = ends;
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
            self.emit_line(&line);
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

    /// Emits one whole line, `\n` included.
    fn emit_line(&mut self, line: &[u8]) {
        self.close_after_skip();
        self.cur.data.extend_from_slice(line);
        self.cur.ends.push(self.cur.data.len() as u32);
        self.cur.lines += 1;
    }

    /// A chunk is one contiguous range of the file: good lines after a
    /// skipped one start the next.
    fn close_after_skip(&mut self) {
        if self.cur.skipped_bytes > 0 {
            let next = Run::at(self.cur.end());
            self.done.push(std::mem::replace(&mut self.cur, next));
        }
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
            self.emit_line(&line);
            line.clear();
            self.carried = line;
        }
    }
}
