//! Access-log lines in nginx's `combined` format, and appending them to a log
//! the daemon follows, as nginx would (one write per call).

use std::io::Write;
use std::path::Path;

/// The wall clock in unix ms, as the daemon reads it.
pub fn now_ms() -> i64 {
    fleetban::now_ms()
}

/// One nginx `combined` line for `addr` at unix ms `ms`.
pub fn combined_line(addr: &str, ms: i64, path: &str, status: u16) -> String {
    format!(
        "{addr} - - [{}] \"GET {path} HTTP/1.1\" {status} 12 \"-\" \"curl/7.88\"\n",
        fleetban::time_local(ms)
    )
}

/// `n` requests of `addr` for `path` starting now, 1 ms apart.
pub fn combined_lines(addr: &str, n: i64, path: &str, status: u16) -> String {
    let now = now_ms();
    (0..n).map(|i| combined_line(addr, now + i, path, status)).collect()
}

/// Appends `text` to `log` in one write.
pub fn append(log: &Path, text: &str) {
    std::fs::OpenOptions::new()
        .append(true)
        .open(log)
        .and_then(|mut f| f.write_all(text.as_bytes()))
        .unwrap_or_else(|e| panic!("append to {}: {e}", log.display()));
}
