//! A file read once, start to end, in the same [`Chunk`]s of whole lines
//! the follower sends (`fleetban test`): one line splitter for both. No line
//! is too long here (nothing is followed, nothing waits), and an
//! unterminated last line is a line.

use std::fs::File;
use std::io::{self, Read};
use std::os::unix::fs::MetadataExt;
use std::path::Path;
use std::sync::Arc;

use super::{Chunk, FileId, LineSplitter};

/// Bytes read at a time.
const READ: usize = 256 << 10;

/// Reads `path` to its end, handing each chunk of lines to `each` in order.
pub fn read_file(path: &Path, mut each: impl FnMut(&Chunk)) -> io::Result<()> {
    let mut file = File::open(path)?;
    let meta = file.metadata()?;
    let id = FileId {
        dev: meta.dev(),
        ino: meta.ino(),
        fingerprint: 0,
    };
    let path: Arc<Path> = Arc::from(path);
    let mut split = LineSplitter::new(super::MAX_LINE, 0);
    let mut buf = Vec::with_capacity(READ);
    let mut chunks = Vec::new();
    loop {
        // Straight into the splitter's memory, after the line it carries.
        split.lend(&mut buf);
        let n = (&mut file).take(READ as u64).read_to_end(&mut buf)?;
        if n == 0 {
            split.push_buf(&mut buf);
            split.finish();
        } else {
            split.push_buf(&mut buf);
        }
        split.take(0, &path, id, &mut chunks);
        for c in chunks.drain(..) {
            each(&c);
            split.recycle(c);
        }
        if n == 0 {
            return Ok(());
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_line_with_its_offset_the_last_one_unterminated() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("a.log");
        std::fs::write(&p, b"one\r\n\ntwo\nthree").unwrap();
        let mut lines = Vec::new();
        read_file(&p, |c| lines.extend(c.lines().map(|(o, l)| (o, l.to_vec())))).unwrap();
        let want: Vec<(u64, Vec<u8>)> = vec![
            (0, b"one".to_vec()),
            (5, Vec::new()),
            (6, b"two".to_vec()),
            (10, b"three".to_vec()),
        ];
        assert_eq!(lines, want);
        assert!(read_file(&dir.path().join("missing"), |_| {}).is_err());
    }
}
