//! `fleetban test`'s progress line as a person sees it: tmux runs the
//! command on a terminal of its own and `tmux capture-pane` reads the
//! screen. The log is a FIFO the test feeds in bursts, so that the replay
//! lasts as long as the test needs to look (no timing is asserted: the
//! screen is read until it shows the line, within a bound). With `--json`,
//! or with stderr not a terminal, no progress is ever written.

mod common;

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use common::{combined_line, fleetban_bin, ConfigDir, Rule};

/// A tmux server of the test's own (its socket in a temp dir), killed at drop.
struct Tmux {
    socket: PathBuf,
    _dir: tempfile::TempDir,
}

impl Tmux {
    /// Runs `args` (no shell) in a 160x40 pane kept after it exits.
    fn run(args: &[&str]) -> Tmux {
        let dir = tempfile::tempdir().unwrap();
        let socket = dir.path().join("tmux.sock");
        let conf = dir.path().join("tmux.conf");
        std::fs::write(&conf, "set -g remain-on-exit on\n").unwrap();
        let status = Command::new("tmux")
            .arg("-S")
            .arg(&socket)
            .arg("-f")
            .arg(&conf)
            .args(["new-session", "-d", "-x", "160", "-y", "40", "--"])
            .args(args)
            .env("TERM", "xterm")
            .stdin(Stdio::null())
            .status()
            .unwrap();
        assert!(status.success());
        Tmux { socket, _dir: dir }
    }

    /// The screen as it stands (and what scrolled off it), wrapped lines joined.
    fn screen(&self) -> String {
        let out = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .args(["capture-pane", "-p", "-J", "-S", "-200", "-t", "0"])
            .output()
            .unwrap();
        String::from_utf8_lossy(&out.stdout).into_owned()
    }
}

impl Drop for Tmux {
    fn drop(&mut self) {
        let _ = Command::new("tmux")
            .arg("-S")
            .arg(&self.socket)
            .arg("kill-server")
            .status();
    }
}

/// A FIFO at `path`.
fn fifo(path: &Path) {
    let c = std::ffi::CString::new(path.as_os_str().as_encoded_bytes()).unwrap();
    // SAFETY: a valid NUL-terminated path.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
}

/// About 300 KB of lines (more than one read of the replay), from
/// addresses that stay under the limit.
fn burst(k: u64) -> String {
    let t0 = 1_700_000_000_000i64 + k as i64 * 1000;
    (0..3000)
        .map(|i| combined_line(&format!("198.51.{}.{}", i % 200, 1 + k % 200), t0 + i, "/page", 200))
        .collect()
}

/// A configuration whose one rule reads `log` (the FIFO).
fn rig() -> (ConfigDir, PathBuf) {
    let c = ConfigDir::new();
    let log = c.path().join("feed.log");
    fifo(&log);
    c.write(
        &c.main_config().log_firewall(),
        &[Rule::new("web", &log, "{ hits: 1000, window: 1m }")],
    );
    (c, log)
}

/// Feeds `log` a burst at a time until `seen` says enough (at most 200
/// bursts), then closes it.
fn feed(log: &Path, mut seen: impl FnMut(u64) -> bool) {
    let mut w = std::fs::OpenOptions::new().write(true).open(log).unwrap();
    for k in 0..200 {
        w.write_all(burst(k).as_bytes()).unwrap();
        w.flush().unwrap();
        std::thread::sleep(Duration::from_millis(50));
        if seen(k) {
            break;
        }
    }
}

/// Waits (at most 30 s) until the pane shows `what`.
fn until_screen(t: &Tmux, what: &str) -> String {
    let start = Instant::now();
    loop {
        let s = t.screen();
        if s.contains(what) {
            return s;
        }
        assert!(
            start.elapsed() < Duration::from_secs(30),
            "no `{what}` on the screen:\n{s}"
        );
        std::thread::sleep(Duration::from_millis(50));
    }
}

#[test]
fn on_a_terminal_test_shows_progress_in_place_and_erases_it_for_the_report() {
    let (c, log) = rig();
    let bin = fleetban_bin();
    let t = Tmux::run(&[
        bin.to_str().unwrap(),
        "test",
        "-c",
        c.cfg.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    let mut shown = String::new();
    feed(&log, |_| {
        shown = t.screen();
        shown.contains("lines, ") && shown.contains("MB/s")
    });
    let line = shown
        .lines()
        .find(|l| l.contains("MB/s"))
        .unwrap_or_else(|| panic!("no progress within 200 bursts:\n{shown}"));
    assert!(line.starts_with(&format!("file 1/1 {}, ", log.display())), "{line}");
    assert_eq!(
        shown.matches("MB/s").count(),
        1,
        "refreshed in place, one line:\n{shown}"
    );
    let end = until_screen(&t, "lines: ");
    assert!(
        !end.contains("MB/s"),
        "the progress is erased before the report:\n{end}"
    );
    assert!(end.contains("FILE "), "{end}");
}

#[test]
fn with_json_or_stderr_not_a_terminal_no_progress_is_written() {
    // --json on a terminal: the screen never shows it.
    let (c, log) = rig();
    let bin = fleetban_bin();
    let t = Tmux::run(&[
        bin.to_str().unwrap(),
        "test",
        "--json",
        "-c",
        c.cfg.to_str().unwrap(),
        log.to_str().unwrap(),
    ]);
    let mut screens = Vec::new();
    feed(&log, |k| {
        screens.push(t.screen());
        k >= 20
    });
    let end = until_screen(&t, "\"event\":\"summary\"");
    screens.push(end);
    assert!(
        screens.iter().all(|s| !s.contains("MB/s")),
        "{}",
        screens.join("\n---\n")
    );

    // stderr a pipe: nothing on it but what fails.
    let (c, log) = rig();
    let child = Command::new(&bin)
        .args(["test", "-c"])
        .arg(&c.cfg)
        .arg(&log)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    feed(&log, |k| k >= 20);
    let out = child.wait_with_output().unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("MB/s") && !stderr.contains('\r'), "{stderr:?}");
    assert!(
        String::from_utf8_lossy(&out.stdout).contains("lines: 63000"),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
}
