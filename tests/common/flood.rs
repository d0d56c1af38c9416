//! A flood of connections to the decision endpoint's unix socket from one
//! process (issue 25, item 2): half trickle a request head a byte at a
//! time, half sit idle after a complete request, and each one the daemon
//! closes is reopened. Used by `tests/http_flood.rs` and `bench/http.rs`.

use std::io::{ErrorKind, Read, Write};
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering::Relaxed};
use std::thread;
use std::time::{Duration, Instant};

/// Raises this process's soft `RLIMIT_NOFILE` to hold the flood.
pub fn raise_nofile(want: u64) {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit read or write only the struct given.
    unsafe {
        assert_eq!(libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim), 0);
        if lim.rlim_cur < want {
            lim.rlim_cur = want.min(lim.rlim_max);
            assert_eq!(libc::setrlimit(libc::RLIMIT_NOFILE, &lim), 0);
        }
    }
    assert!(lim.rlim_cur >= want, "RLIMIT_NOFILE {} < {want}", lim.rlim_cur);
}

/// One connection of the flood.
struct Flooder {
    sock: Option<UnixStream>,
    /// Trickling a head (else: idle after a complete request).
    trickle: bool,
}

const HEAD_START: &[u8] = b"GET /check HTTP/1.1\r\n";
const WHOLE: &[u8] = b"GET /check HTTP/1.1\r\nHost: fleetban\r\nX-Client-Addr: 192.0.2.1\r\n\r\n";

impl Flooder {
    /// (Re)opens the connection and sends its first bytes; false if
    /// connecting failed (tried again next round).
    fn open(&mut self, path: &Path) -> bool {
        let Ok(mut s) = UnixStream::connect(path) else {
            return false;
        };
        let first = if self.trickle { HEAD_START } else { WHOLE };
        if s.write_all(first).is_err() || s.set_nonblocking(true).is_err() {
            return false;
        }
        self.sock = Some(s);
        true
    }

    /// One round: a trickler sends one more byte; either kind finds out
    /// whether the daemon closed it (then it is reopened next round).
    fn tick(&mut self) {
        let Some(s) = &mut self.sock else { return };
        let mut buf = [0u8; 256];
        let closed = loop {
            match s.read(&mut buf) {
                Ok(0) => break true,
                Ok(_) => continue,
                Err(e) if e.kind() == ErrorKind::WouldBlock => break false,
                Err(_) => break true,
            }
        };
        let closed = closed || (self.trickle && !matches!(s.write(b"X"), Ok(1)));
        if closed {
            self.sock = None;
        }
    }
}

/// Holds `n` connections until `stop`: every round (2 s) each trickler
/// sends a byte and every closed connection is reopened. Counts reopenings.
pub fn flood(path: &Path, n: usize, stop: &AtomicBool, opened: &AtomicU64, reopened: &AtomicU64) {
    let mut all: Vec<Flooder> = (0..n)
        .map(|i| Flooder {
            sock: None,
            trickle: i % 2 == 0,
        })
        .collect();
    // Bounded: the test stops it; 120 s at most in any case.
    let end = Instant::now() + Duration::from_secs(120);
    let mut first = true;
    while !stop.load(Relaxed) && Instant::now() < end {
        for f in &mut all {
            if f.sock.is_none() {
                if f.open(path) && !first {
                    reopened.fetch_add(1, Relaxed);
                }
            } else {
                f.tick();
            }
        }
        if first {
            opened.store(all.iter().filter(|f| f.sock.is_some()).count() as u64, Relaxed);
            first = false;
        }
        for _ in 0..20 {
            if stop.load(Relaxed) {
                return;
            }
            thread::sleep(Duration::from_millis(100));
        }
    }
}
