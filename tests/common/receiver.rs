//! A webhook receiver on loopback: a real HTTP/1.1 server (one thread,
//! one connection at a time) that records every POST it reads whole and
//! answers each with the next status of its script (then 200), or never
//! answers at all ([`Receiver::silent`]), holding the connection open until
//! the client gives up. Stopped on Drop.

use std::io::{Read, Write};
use std::net::{TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::{self, JoinHandle};
use std::time::{Duration, Instant};

/// One POST as read.
#[derive(Clone, Debug)]
pub struct Post {
    /// `POST /path HTTP/1.1`.
    pub request_line: String,
    /// Header names lower-cased, in order.
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl Post {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(n, _)| n == &name.to_ascii_lowercase())
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {}", String::from_utf8_lossy(&self.body)))
    }

    pub fn text(&self) -> String {
        String::from_utf8_lossy(&self.body).into_owned()
    }
}

pub struct Receiver {
    pub port: u16,
    posts: Arc<Mutex<Vec<Post>>>,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl Receiver {
    /// Answers the n-th POST with `script[n]`, 200 past its end.
    pub fn start(script: &[u16]) -> Receiver {
        Receiver::launch(script.to_vec(), false)
    }

    /// Reads each POST and never answers: the connection stays open (until
    /// the client closes it, or 60 s).
    pub fn silent() -> Receiver {
        Receiver::launch(Vec::new(), true)
    }

    fn launch(script: Vec<u16>, silent: bool) -> Receiver {
        let listener = TcpListener::bind("127.0.0.1:0").expect("bind a receiver");
        listener.set_nonblocking(true).expect("non-blocking listener");
        let port = listener.local_addr().expect("its address").port();
        let posts = Arc::new(Mutex::new(Vec::new()));
        let stop = Arc::new(AtomicBool::new(false));
        let (p, s) = (posts.clone(), stop.clone());
        let thread = thread::spawn(move || {
            let mut n = 0;
            // Bounded: a test lasts minutes at most.
            let deadline = Instant::now() + Duration::from_secs(600);
            while !s.load(Ordering::Relaxed) && Instant::now() < deadline {
                let Ok((conn, _)) = listener.accept() else {
                    thread::sleep(Duration::from_millis(5));
                    continue;
                };
                let status = script.get(n).copied().unwrap_or(200);
                n += 1;
                if let Some(post) = serve(conn, status, silent) {
                    p.lock().unwrap().push(post);
                }
            }
        });
        Receiver {
            port,
            posts,
            stop,
            thread: Some(thread),
        }
    }

    /// `http://127.0.0.1:PORT{path}`.
    pub fn url(&self, path: &str) -> String {
        format!("http://127.0.0.1:{}{path}", self.port)
    }

    pub fn posts(&self) -> Vec<Post> {
        self.posts.lock().unwrap().clone()
    }
}

impl Drop for Receiver {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Reads one request (head, then Content-Length bytes), answers `status`
/// unless `silent`. In silent mode the post is recorded once read, then
/// the connection is held until the peer closes it or the test stops.
fn serve(mut conn: TcpStream, status: u16, silent: bool) -> Option<Post> {
    conn.set_nonblocking(false).ok()?;
    conn.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    let mut buf = Vec::new();
    let mut chunk = [0u8; 8192];
    let head_end = loop {
        if let Some(i) = buf.windows(4).position(|w| w == b"\r\n\r\n") {
            break i + 4;
        }
        if buf.len() > 1 << 20 {
            return None;
        }
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    };
    let head = String::from_utf8_lossy(&buf[..head_end]).into_owned();
    let mut lines = head.split("\r\n");
    let request_line = lines.next().unwrap_or("").to_owned();
    let headers: Vec<(String, String)> = lines
        .filter(|l| !l.is_empty())
        .filter_map(|l| l.split_once(':'))
        .map(|(n, v)| (n.trim().to_ascii_lowercase(), v.trim().to_owned()))
        .collect();
    let length: usize = headers
        .iter()
        .find(|(n, _)| n == "content-length")
        .and_then(|(_, v)| v.parse().ok())
        .unwrap_or(0);
    while buf.len() < head_end + length {
        match conn.read(&mut chunk) {
            Ok(0) | Err(_) => return None,
            Ok(k) => buf.extend_from_slice(&chunk[..k]),
        }
    }
    let post = Post {
        request_line,
        headers,
        body: buf[head_end..head_end + length].to_vec(),
    };
    if silent {
        // Held open on a thread of its own, so the next connection is read too.
        thread::spawn(move || {
            let _ = conn.set_read_timeout(Some(Duration::from_millis(200)));
            let deadline = Instant::now() + Duration::from_secs(60);
            while Instant::now() < deadline {
                match conn.read(&mut chunk) {
                    Ok(0) => return,
                    Ok(_) => {}
                    Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => {}
                    Err(_) => return,
                }
            }
        });
        return Some(post);
    }
    let reason = if status < 300 { "OK" } else { "Status" };
    let _ = conn
        .write_all(format!("HTTP/1.1 {status} {reason}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n").as_bytes());
    Some(post)
}
