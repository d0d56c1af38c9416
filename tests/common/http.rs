//! The daemon's decision endpoint asked as nginx's `auth_request` asks it:
//! `GET /check` with `X-Client-Addr`, HTTP/1.1 on one kept-alive
//! connection (a unix socket or loopback TCP), every read bounded by a
//! timeout.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::os::unix::net::UnixStream;
use std::path::Path;
use std::time::Duration;

/// One answer: its status and `Retry-After`, and the whole head.
#[derive(Debug)]
pub struct Answer {
    pub status: u16,
    pub retry_after: Option<u64>,
    pub head: String,
}

/// Either kind of stream the endpoint listens on.
trait Conn: Read + Write + Send {}
impl<T: Read + Write + Send> Conn for T {}

/// A kept-alive connection to the endpoint.
pub struct Checker {
    conn: Box<dyn Conn>,
    /// Bytes read past the last answer's head.
    pending: Vec<u8>,
}

const TIMEOUT: Duration = Duration::from_secs(5);

impl Checker {
    /// Connects to the unix socket at `path`.
    pub fn unix(path: &Path) -> Checker {
        let s = UnixStream::connect(path).unwrap_or_else(|e| panic!("connect {}: {e}", path.display()));
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Checker {
            conn: Box::new(s),
            pending: Vec::new(),
        }
    }

    /// Connects to `addr` (`127.0.0.1:PORT`).
    pub fn tcp(addr: &str) -> Checker {
        let s = TcpStream::connect(addr).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        s.set_read_timeout(Some(TIMEOUT)).unwrap();
        s.set_write_timeout(Some(TIMEOUT)).unwrap();
        Checker {
            conn: Box::new(s),
            pending: Vec::new(),
        }
    }

    /// `GET /check` for `addr`.
    pub fn check(&mut self, addr: &str) -> Answer {
        self.send(&format!(
            "GET /check HTTP/1.1\r\nHost: fleetban\r\nX-Client-Addr: {addr}\r\n\r\n"
        ))
    }

    /// Sends `request` verbatim and reads one answer's head (the
    /// endpoint's answers have no body).
    pub fn send(&mut self, request: &str) -> Answer {
        self.conn.write_all(request.as_bytes()).expect("send a request");
        let mut chunk = [0u8; 1024];
        // Bounded: each read waits TIMEOUT at most, and a head is small.
        for _ in 0..64 {
            if let Some(end) = self.pending.windows(4).position(|w| w == b"\r\n\r\n") {
                let head = String::from_utf8_lossy(&self.pending[..end]).into_owned();
                self.pending.drain(..end + 4);
                return parse_answer(head);
            }
            let n = self.conn.read(&mut chunk).expect("read an answer");
            assert!(n > 0, "the endpoint closed the connection");
            self.pending.extend_from_slice(&chunk[..n]);
        }
        panic!("no answer head in {:?}", String::from_utf8_lossy(&self.pending));
    }
}

fn parse_answer(head: String) -> Answer {
    let status = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or_else(|| panic!("not an HTTP answer: {head:?}"));
    let retry_after = head.lines().find_map(|l| {
        let (name, value) = l.split_once(':')?;
        name.eq_ignore_ascii_case("retry-after")
            .then(|| value.trim().parse().expect("Retry-After in seconds"))
    });
    Answer {
        status,
        retry_after,
        head,
    }
}
