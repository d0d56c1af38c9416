//! `fleetban top` against a daemon under load: `--once` prints the rules'
//! rates, the client nearest its limit and the followed file, without
//! colour off a terminal; and the live view in a real terminal (tmux, a
//! private server), read back with `capture-pane`, redraws, is coloured
//! (not with NO_COLOR) and quits on `q`.

mod common;

use std::path::Path;
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread;
use std::time::Duration;

use common::{append, cli, combined_line, combined_lines, now_ms, require, wait_until, ConfigDir, Daemon, Rule};

const WAIT: Duration = Duration::from_secs(30);

/// A daemon whose rule allows 100 hits a minute, with 203.0.113.70 at 70
/// of them, and a writer adding lines of fresh clients until dropped.
struct Loaded {
    c: ConfigDir,
    _d: Daemon,
    stop: Arc<AtomicBool>,
    writer: Option<thread::JoinHandle<()>>,
}

impl Loaded {
    fn start() -> Loaded {
        let c = ConfigDir::new();
        c.write(
            &c.main_config().host_id("top-host").log_firewall(),
            &[Rule::new("scraper", &c.log, "{ hits: 100, window: 60s }").ban("1h")],
        );
        let d = Daemon::start(None, &c.cfg, &c.control);
        append(&c.log, &combined_lines("203.0.113.70", 70, "/", 200));
        wait_until(WAIT, "the 70 hits counted", || {
            d.status()["nearest"][0]["count"].as_u64() == Some(70)
        });
        let stop = Arc::new(AtomicBool::new(false));
        let (log, s) = (c.log.clone(), stop.clone());
        // Bounded: at most 10 minutes of 20 lines every 20 ms.
        let writer = thread::spawn(move || {
            for i in 0..30_000u32 {
                if s.load(Ordering::Relaxed) {
                    return;
                }
                let lines: String = (0..20)
                    .map(|j| combined_line(&format!("10.20.{}.{}", i % 250, j + 1), now_ms(), "/", 200))
                    .collect();
                append(&log, &lines);
                thread::sleep(Duration::from_millis(20));
            }
        });
        Loaded {
            c,
            _d: d,
            stop,
            writer: Some(writer),
        }
    }
}

impl Drop for Loaded {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Relaxed);
        if let Some(w) = self.writer.take() {
            let _ = w.join();
        }
    }
}

/// The number in `column` of the table row starting with `first`.
fn cell(text: &str, first: &str, column: usize) -> String {
    let line = text
        .lines()
        .find(|l| l.split_whitespace().next() == Some(first))
        .unwrap_or_else(|| panic!("a row {first} in\n{text}"));
    line.split_whitespace().nth(column).unwrap().to_owned()
}

#[test]
fn top_once_shows_rates_the_nearest_client_and_the_file_under_load() {
    let l = Loaded::start();
    let out = cli(&l.c.cfg, &["top", "--once", "--interval", "1s"]);
    assert_eq!(out.code, 0, "{}", out.text());
    let text = out.stdout;
    assert!(text.starts_with("fleetban top top-host "), "{text}");
    assert!(!text.contains('\x1b'), "no colour off a terminal: {text:?}");
    // rules: RULE BANS/S HITS/S LINES/S BANS; the writer adds ~1000 lines/s.
    let hits: f64 = cell(&text, "scraper", 2).parse().unwrap();
    let lines: f64 = cell(&text, "scraper", 3).parse().unwrap();
    assert!(hits > 0.0 && lines > 0.0, "{text}");
    // nearest: CLIENT RULE COUNT LIMIT OF-LIMIT.
    assert_eq!(
        ["scraper", "70", "100", "70%"].map(str::to_owned).to_vec(),
        (1..=4).map(|i| cell(&text, "203.0.113.70", i)).collect::<Vec<_>>(),
        "{text}"
    );
    // files: FILE STATE LINES/S LAG BEHIND.
    let log = l.c.log.display().to_string();
    assert_eq!(cell(&text, &log, 1), "following", "{text}");
    assert!(text.contains("redis:  embedded"), "{text}");
}

/// A tmux server of the test's own (its socket in `dir`).
fn tmux(dir: &Path, args: &[&str]) -> std::process::Output {
    Command::new(require("tmux"))
        .arg("-S")
        .arg(dir.join("tmux.sock"))
        .args(args)
        .output()
        .expect("run tmux")
}

fn screen(dir: &Path, escapes: bool) -> String {
    let args: &[&str] = match escapes {
        true => &["capture-pane", "-p", "-e", "-t", "top"],
        false => &["capture-pane", "-p", "-t", "top"],
    };
    String::from_utf8_lossy(&tmux(dir, args).stdout).into_owned()
}

fn live_view(no_color: bool) {
    let l = Loaded::start();
    let dir = tempfile::tempdir().unwrap();
    let bin = common::fleetban_bin();
    let cfg = l.c.cfg.display().to_string();
    let mut args = vec!["new-session", "-d", "-s", "top", "-x", "140", "-y", "50"];
    if no_color {
        args.extend(["-e", "NO_COLOR=1"]);
    }
    let program = bin.to_str().unwrap();
    args.extend([program, "top", "-c", &cfg, "--interval", "200ms"]);
    let out = tmux(dir.path(), &args);
    assert!(out.status.success(), "{}", String::from_utf8_lossy(&out.stderr));
    wait_until(WAIT, "the live view drawn", || {
        let s = screen(dir.path(), false);
        s.contains("fleetban top top-host") && s.contains("203.0.113.70") && s.contains("following")
    });
    // It redraws: the clock in its first line moves.
    let first = screen(dir.path(), false).lines().next().unwrap_or("").to_owned();
    wait_until(WAIT, "a redraw", || {
        screen(dir.path(), false).lines().next().unwrap_or("") != first
    });
    let coloured = screen(dir.path(), true);
    assert_eq!(
        coloured.contains("\x1b["),
        !no_color,
        "colour on a terminal unless NO_COLOR: {coloured:?}"
    );
    let out = tmux(dir.path(), &["send-keys", "-t", "top", "q"]);
    assert!(out.status.success());
    wait_until(WAIT, "q quits", || {
        !tmux(dir.path(), &["has-session", "-t", "top"]).status.success()
    });
    let _ = tmux(dir.path(), &["kill-server"]);
}

#[test]
fn the_live_view_redraws_in_a_terminal_in_colour_and_q_quits() {
    live_view(false);
}

#[test]
fn no_color_turns_the_colour_off() {
    live_view(true);
}
