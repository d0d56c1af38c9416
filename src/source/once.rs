//! A file read once, start to end, in the same [`Chunk`]s of whole lines
//! the follower sends (`fleetban test`): one line splitter for both. No line
//! is too long here (nothing is followed, nothing waits), and an
//! unterminated last line is a line. `-` is standard input; gzip is read
//! decompressed, other compressions are refused by name (`compressed.rs`).
//! Every error names the file, and where in it the reading stopped.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;

use super::compressed::{read_head, sniff, Compression, Counting};
use super::framing::{Framer, Framing};
use super::{Chunk, FileId, LineSplitter};

/// Bytes read at a time.
const READ: usize = 256 << 10;

/// Why a file could not be read (to its end).
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    #[error("{}: {source}", .path.display())]
    Open { path: PathBuf, source: io::Error },
    #[error(
        "{}: {name}-compressed; fleetban test reads plain text and gzip only: \
         decompress it first (`{tool} FILE | fleetban test -`)",
        .path.display()
    )]
    Unsupported {
        path: PathBuf,
        name: &'static str,
        tool: &'static str,
    },
    #[error(
        "{}: corrupt gzip stream after line {line} (at or before compressed byte {offset}): {source}",
        .path.display()
    )]
    Corrupt {
        path: PathBuf,
        /// Lines read whole before the fault.
        line: u64,
        offset: u64,
        source: io::Error,
    },
    #[error("{}: after line {line}: {source}", .path.display())]
    Read {
        path: PathBuf,
        line: u64,
        source: io::Error,
    },
}

/// Reads `path` (`-`: standard input) to its end, decompressed, handing
/// each chunk of lines to `each` in order. Returns whether it was gzip.
/// With a `framer` (nginx's error log), lines reach `each` once the
/// records around them are known, the split ones marked (`framing.rs`).
pub fn read_file(path: &Path, framer: Option<Framer>, mut each: impl FnMut(&Chunk, u64)) -> Result<bool, ReadError> {
    let open = |source| ReadError::Open {
        path: path.to_owned(),
        source,
    };
    let (mut raw, id): (Box<dyn Read>, FileId) = if path == Path::new("-") {
        (
            Box::new(io::stdin().lock()),
            FileId {
                dev: 0,
                ino: 0,
                fingerprint: 0,
            },
        )
    } else {
        let file = File::open(path).map_err(open)?;
        let meta = file.metadata().map_err(open)?;
        if meta.is_dir() {
            return Err(open(io::Error::from(io::ErrorKind::IsADirectory)));
        }
        let id = FileId {
            dev: meta.dev(),
            ino: meta.ino(),
            fingerprint: 0,
        };
        (Box::new(file), id)
    };
    let head = read_head(&mut raw).map_err(open)?;
    let kind = sniff(&head);
    let rest = io::Cursor::new(head).chain(raw);
    let (mut input, compressed): (Box<dyn Read>, _) = match kind {
        Compression::Plain => (Box::new(rest), None),
        Compression::Gzip => {
            let counting = Counting::new(rest);
            let read = counting.read.clone();
            (Box::new(flate2::read::MultiGzDecoder::new(counting)), Some(read))
        }
        Compression::Unsupported { name, tool } => {
            return Err(ReadError::Unsupported {
                path: path.to_owned(),
                name,
                tool,
            })
        }
    };
    let path: Arc<Path> = Arc::from(path);
    let mut split = LineSplitter::new(super::MAX_LINE, 0);
    let mut buf = Vec::with_capacity(READ);
    let mut chunks = Vec::new();
    let mut framing = framer.map(|f| (Framing::new(f, 0), Vec::new()));
    let mut lines = 0u64;
    // Bytes of the file read so far, as stored (compressed for gzip).
    let mut plain = 0u64;
    loop {
        // Straight into the splitter's memory, after the line it carries.
        split.lend(&mut buf);
        let n = match (&mut input).take(READ as u64).read_to_end(&mut buf) {
            Ok(n) => n,
            Err(source) => {
                let path = path.to_path_buf();
                return Err(match &compressed {
                    Some(read) => ReadError::Corrupt {
                        path,
                        line: lines,
                        offset: read.load(Relaxed),
                        source,
                    },
                    None => ReadError::Read {
                        path,
                        line: lines,
                        source,
                    },
                });
            }
        };
        split.push_buf(&mut buf);
        if n == 0 {
            split.finish();
        }
        plain += n as u64;
        let stored = compressed.as_ref().map_or(plain, |read| read.load(Relaxed));
        split.take(0, &path, id, &mut chunks);
        if let Some((framing, framed)) = &mut framing {
            for c in chunks.drain(..) {
                framing.push(c, framed);
            }
            if n == 0 {
                framing.flush(framed);
            }
            std::mem::swap(&mut chunks, framed);
        }
        for c in chunks.drain(..) {
            lines += c.lines + c.skipped_long;
            each(&c, stored);
            split.recycle(c);
        }
        if n == 0 {
            return Ok(compressed.is_some());
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write;

    use super::*;

    fn lines_of(p: &Path) -> Result<Vec<(u64, Vec<u8>)>, ReadError> {
        let mut lines = Vec::new();
        read_file(p, None, |c, _| lines.extend(c.lines().map(|(o, l)| (o, l.to_vec()))))?;
        Ok(lines)
    }

    #[test]
    fn every_line_with_its_offset_the_last_one_unterminated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        std::fs::write(&p, b"one\r\n\ntwo\nthree").unwrap();
        let want: Vec<(u64, Vec<u8>)> = vec![
            (0, b"one".to_vec()),
            (5, Vec::new()),
            (6, b"two".to_vec()),
            (10, b"three".to_vec()),
        ];
        assert_eq!(lines_of(&p).unwrap(), want);
        let missing = dir.path().join("missing");
        let e = lines_of(&missing).unwrap_err().to_string();
        assert!(e.starts_with(&format!("{}: ", missing.display())), "{e}");
    }

    #[test]
    fn gzip_is_read_by_its_bytes_whatever_its_name_and_a_cut_stream_is_named() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("access.log.1");
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"one\ntwo\n").unwrap();
        let mut bytes = gz.finish().unwrap();
        // A second member, as `cat a.gz b.gz` makes.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(b"three\n").unwrap();
        bytes.extend(gz.finish().unwrap());
        std::fs::write(&p, &bytes).unwrap();
        let got: Vec<Vec<u8>> = lines_of(&p).unwrap().into_iter().map(|(_, l)| l).collect();
        assert_eq!(got, [b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]);

        std::fs::write(&p, &bytes[..bytes.len() / 3]).unwrap();
        let e = lines_of(&p).unwrap_err();
        assert!(matches!(e, ReadError::Corrupt { .. }), "{e}");
        assert!(e.to_string().contains("access.log.1: corrupt gzip stream"), "{e}");
    }

    #[test]
    fn other_compressions_are_refused_by_name() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("access.log");
        std::fs::write(&p, [0x28, 0xb5, 0x2f, 0xfd, 0, 0, 0, 0]).unwrap();
        let e = lines_of(&p).unwrap_err().to_string();
        assert!(e.contains("access.log: zstd-compressed"), "{e}");
    }
}
