//! What a replayed file holds, told by its first bytes (never by its name:
//! logrotate's `delaycompress` leaves `access.log.1` plain and a renamed
//! `.gz` is still gzip): plain text, gzip (read through flate2's
//! `MultiGzDecoder`, so a file of several concatenated members is read
//! whole, as `zcat` does), or another compression refused by name.
//! `fleetban run` follows plain files only; this is `fleetban test`'s.

use std::io::{self, Read};
use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::Arc;

/// Bytes enough to tell every format below apart.
pub const MAGIC_BYTES: usize = 10;

/// The kind of a stream, from its first [`MAGIC_BYTES`] bytes.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Compression {
    Plain,
    Gzip,
    /// A compression not read: its name and the command that decompresses it.
    Unsupported {
        name: &'static str,
        tool: &'static str,
    },
}

/// Tells `head` (the stream's first bytes, fewer at a short stream) apart.
pub fn sniff(head: &[u8]) -> Compression {
    const BZ_BLOCK: [u8; 6] = [0x31, 0x41, 0x59, 0x26, 0x53, 0x59];
    const BZ_END: [u8; 6] = [0x17, 0x72, 0x45, 0x38, 0x50, 0x90];
    let unsupported = |name, tool| Compression::Unsupported { name, tool };
    match head {
        [0x1f, 0x8b, ..] => Compression::Gzip,
        [0x28, 0xb5, 0x2f, 0xfd, ..] => unsupported("zstd", "zstd -dc"),
        [0xfd, b'7', b'z', b'X', b'Z', 0x00, ..] => unsupported("xz", "xz -dc"),
        // `BZh` then the block size then a block's or the end's magic: a
        // text line could start with `BZh9`, not with these 48 bits too.
        [b'B', b'Z', b'h', b'1'..=b'9', rest @ ..]
            if rest.len() >= 6 && (rest[..6] == BZ_BLOCK || rest[..6] == BZ_END) =>
        {
            unsupported("bzip2", "bzip2 -dc")
        }
        [0x04, 0x22, 0x4d, 0x18, ..] => unsupported("lz4", "lz4 -dc"),
        _ => Compression::Plain,
    }
}

/// Reads up to [`MAGIC_BYTES`] from `r` (fewer only at its end).
pub fn read_head(r: &mut impl Read) -> io::Result<Vec<u8>> {
    let mut head = vec![0; MAGIC_BYTES];
    let mut n = 0;
    while n < head.len() {
        match r.read(&mut head[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    head.truncate(n);
    Ok(head)
}

/// Counts the bytes read through it: how far into the compressed stream
/// the decoder had got when it failed.
pub struct Counting<R> {
    inner: R,
    pub read: Arc<AtomicU64>,
}

impl<R> Counting<R> {
    pub fn new(inner: R) -> Counting<R> {
        Counting {
            inner,
            read: Arc::default(),
        }
    }
}

impl<R: Read> Read for Counting<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.inner.read(buf)?;
        self.read.fetch_add(n as u64, Relaxed);
        Ok(n)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn kinds_by_their_magic_bytes_not_by_text_that_resembles_them() {
        assert_eq!(sniff(b"\x1f\x8b\x08\x00"), Compression::Gzip);
        assert_eq!(sniff(b"203.0.113.7 - - [17/May/2015"), Compression::Plain);
        assert_eq!(sniff(b""), Compression::Plain);
        assert!(matches!(
            sniff(&[0x28, 0xb5, 0x2f, 0xfd, 0]),
            Compression::Unsupported { name: "zstd", .. }
        ));
        assert!(matches!(
            sniff(b"\xfd7zXZ\x00\x00"),
            Compression::Unsupported { name: "xz", .. }
        ));
        assert!(matches!(
            sniff(b"BZh91AY&SY"),
            Compression::Unsupported { name: "bzip2", .. }
        ));
        // A line that only starts like bzip2.
        assert_eq!(sniff(b"BZh9 is not a host"), Compression::Plain);
    }
}
