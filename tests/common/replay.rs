//! What the `fleetban test` tests share (tests/replay_inputs.rs,
//! tests/replay_output.rs): log lines at a fixed epoch, real gzip files,
//! and the JSON Lines report read back.

use std::io::Write;
use std::path::Path;

use super::{combined_line, CliOutput};

/// The epoch of the lines [`at`] writes.
pub const T0: i64 = 1_700_000_000_000;

/// rules/nginx-limit-req.yaml's format: the combined lines are not in it.
pub const LIMIT_REQ_FORMAT: &str = r#"{ log_format: '$remote_addr - $remote_user [$time_local] "$request" $status $body_bytes_sent "$http_referer" "$http_user_agent" $limit_req_status' }"#;

/// Writes `text` gzip-compressed (a real stream, flate2) at `path`.
pub fn write_gz(path: &Path, text: &str) {
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(text.as_bytes()).unwrap();
    std::fs::write(path, gz.finish().unwrap()).unwrap();
}

/// `addr`'s request at `s` seconds after [`T0`].
pub fn at(addr: &str, s: i64) -> String {
    combined_line(addr, T0 + s * 1000, "/", 200)
}

/// Every line of `test --json`'s output, parsed.
pub fn json_lines(out: &CliOutput) -> Vec<serde_json::Value> {
    out.stdout
        .lines()
        .map(|l| serde_json::from_str(l).unwrap_or_else(|e| panic!("{e}: {l}")))
        .collect()
}

/// `test --json`'s last line, which must be the summary.
pub fn summary(out: &CliOutput) -> serde_json::Value {
    let last = json_lines(out).pop().expect("a summary");
    assert_eq!(last["event"], "summary", "{}", out.stdout);
    last
}

/// A temp path as a command-line word.
pub fn s(p: &Path) -> &str {
    p.to_str().expect("a UTF-8 temp path")
}
