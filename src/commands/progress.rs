//! `fleetban test`'s progress line: on a terminal only (stderr), never with
//! `--json` or when stderr is a pipe or a file, refreshed in place (`\r`,
//! erase to the end of the line) at most four times a second and erased
//! when the replay ends, so that what stays on the screen is the report.
//!
//! It says which file of how many, the lines read, the speed in MB/s of
//! the files as stored (compressed bytes for gzip), and the time left when
//! every input's size is known (regular files; not stdin nor a pipe).

use std::io::Write;
use std::path::Path;
use std::time::{Duration, Instant};

/// Time between two refreshes.
const EVERY: Duration = Duration::from_millis(250);

/// The line, drawn on stderr.
pub struct Progress {
    /// Each input's size as stored, `None` when it has none (a pipe).
    sizes: Vec<Option<u64>>,
    /// The inputs' names, as the report names them.
    names: Vec<String>,
    started: Instant,
    /// When the line was last drawn (`None`: never, nothing to erase).
    drawn: Option<Instant>,
}

impl Progress {
    /// A progress line for these inputs, when stderr is a terminal and
    /// the output is not JSON (`None` otherwise).
    pub fn on_terminal(paths: &[&Path], json: bool) -> Option<Progress> {
        use std::io::IsTerminal;
        if json || !std::io::stderr().is_terminal() {
            return None;
        }
        let sizes = paths
            .iter()
            .map(|p| {
                std::fs::metadata(p)
                    .ok()
                    .filter(|m| m.is_file() && *p != Path::new("-"))
                    .map(|m| m.len())
            })
            .collect();
        Some(Progress {
            sizes,
            names: paths.iter().map(|p| p.display().to_string()).collect(),
            started: Instant::now(),
            drawn: None,
        })
    }

    /// Input `file` read to `bytes`, `lines` read in all: redraws the line
    /// if it is due.
    pub fn update(&mut self, file: usize, bytes: u64, lines: u64) {
        let now = Instant::now();
        let due = match self.drawn {
            None => now.duration_since(self.started) >= EVERY,
            Some(at) => now.duration_since(at) >= EVERY,
        };
        if !due {
            return;
        }
        let done: u64 = self.sizes[..file.min(self.sizes.len())]
            .iter()
            .map(|s| s.unwrap_or(0))
            .sum::<u64>()
            + bytes;
        let total: Option<u64> = self.sizes.iter().copied().sum();
        let text = line(
            file,
            self.sizes.len(),
            self.names.get(file).map_or("", String::as_str),
            lines,
            done,
            total,
            now.duration_since(self.started),
        );
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[K{text}");
        let _ = err.flush();
        self.drawn = Some(now);
    }

    /// Erases the line (before the report is printed).
    pub fn finish(&mut self) {
        if self.drawn.take().is_some() {
            let mut err = std::io::stderr().lock();
            let _ = write!(err, "\r\x1b[K");
            let _ = err.flush();
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// The text of the line: `file 2/7 access.log.3.gz, 1234567 lines, 45.2
/// MB/s, 12s left` (the time left only when `total` is known).
pub fn line(
    file: usize,
    files: usize,
    name: &str,
    lines: u64,
    done: u64,
    total: Option<u64>,
    elapsed: Duration,
) -> String {
    let secs = elapsed.as_secs_f64().max(0.001);
    let rate = done as f64 / secs;
    let mut out = format!(
        "file {}/{files} {name}, {lines} lines, {:.1} MB/s",
        file + 1,
        rate / 1_000_000.0
    );
    if let Some(total) = total.filter(|_| rate > 0.0) {
        let left = total.saturating_sub(done) as f64 / rate;
        out += &format!(", {} left", fleetban::duration_text((left.ceil() as i64).max(1) * 1000));
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_says_files_lines_speed_and_time_left_when_known() {
        let t = line(
            1,
            7,
            "a.log.3.gz",
            1_234_567,
            50_000_000,
            Some(150_000_000),
            Duration::from_secs(2),
        );
        assert_eq!(t, "file 2/7 a.log.3.gz, 1234567 lines, 25.0 MB/s, 4s left");
        let t = line(0, 1, "-", 10, 1_000_000, None, Duration::from_secs(1));
        assert_eq!(t, "file 1/1 -, 10 lines, 1.0 MB/s");
        let t = line(0, 1, "big", 10, 1_000_000, Some(121_000_000), Duration::from_secs(1));
        assert!(t.ends_with(", 2m left"), "{t}");
    }
}
