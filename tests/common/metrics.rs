//! The Prometheus endpoint, read as a scraper reads it.

use std::io::{Read, Write};
use std::time::Duration;

/// `GET path` at `addr`: the whole answer, or an empty one while nothing
/// listens yet.
pub fn http_get(addr: &str, path: &str) -> String {
    let Ok(mut s) = std::net::TcpStream::connect(addr) else {
        return String::new();
    };
    let _ = s.set_read_timeout(Some(Duration::from_secs(5)));
    let _ = s.write_all(format!("GET {path} HTTP/1.0\r\nHost: x\r\n\r\n").as_bytes());
    let mut out = String::new();
    let _ = s.read_to_string(&mut out);
    out
}

/// The value of one sample line (`name{labels} value`) in an exposition.
pub fn sample(text: &str, series: &str) -> Option<f64> {
    text.lines()
        .find(|l| l.split_whitespace().next() == Some(series))
        .and_then(|l| l.split_whitespace().nth(1))
        .and_then(|v| v.parse().ok())
}
