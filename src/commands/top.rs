//! `fleetban top`: a live view of the running daemon, like `top`: bans
//! per second by rule, the clients nearest their limits, lines per second
//! and lag per followed file, Redis, the decision endpoint and the
//! notification targets. It reads `status` over the control socket once
//! per interval (the daemon answers it from counters, never from the
//! pipeline) and turns two readings into rates. On a terminal it redraws
//! in place and quits on `q` (or Ctrl-C); `--once` prints one snapshot
//! (two readings an interval apart) as plain text. Colour only on a
//! terminal, and never with `NO_COLOR` set.

use std::io::{IsTerminal, Write};
use std::path::Path;
use std::time::{Duration, Instant};

use fleetban::control::{Client, Status};

use super::human::{local, Table};
use super::status::redis_words;
use super::{failed, load_for_cli, Outcome};

/// Longest run of the live view (a forgotten `top` in a session ends).
const MAX_RUN: Duration = Duration::from_secs(24 * 3600);

pub fn top(path: &Path, once: bool, interval: Duration) -> Outcome {
    let config = load_for_cli(path)?;
    let client = Client::new(&config.control);
    let interval = interval.max(Duration::from_millis(100));
    let tty = std::io::stdout().is_terminal();
    let colour = Colour(tty && std::env::var_os("NO_COLOR").is_none_or(|v| v.is_empty()));
    let mut before = client.status().map_err(failed)?;
    let mut at = Instant::now();
    if once {
        std::thread::sleep(interval);
        let now = client.status().map_err(failed)?;
        let text = render(&before, &now, at.elapsed(), &config.host_id, colour);
        return super::write_stdout(text.as_bytes());
    }
    let mut screen = Screen::open(tty);
    let started = Instant::now();
    while started.elapsed() < MAX_RUN {
        if screen.wait_for_quit(interval) {
            break;
        }
        let now = match client.status() {
            Ok(s) => s,
            Err(e) => {
                drop(screen);
                return Err(failed(e));
            }
        };
        let text = render(&before, &now, at.elapsed(), &config.host_id, colour);
        screen.show(&text);
        (before, at) = (now, Instant::now());
    }
    Ok(())
}

/// ANSI colour, or none.
#[derive(Clone, Copy)]
struct Colour(bool);

impl Colour {
    fn paint(self, code: &str, text: &str) -> String {
        match self.0 {
            true => format!("\x1b[{code}m{text}\x1b[0m"),
            false => text.to_owned(),
        }
    }
    fn bold(self, t: &str) -> String {
        self.paint("1", t)
    }
    fn red(self, t: &str) -> String {
        self.paint("1;31", t)
    }
}

/// Per second, from two counter readings `elapsed` apart.
fn rate(before: u64, now: u64, elapsed: Duration) -> f64 {
    now.saturating_sub(before) as f64 / elapsed.as_secs_f64().max(0.001)
}

/// The view, from two readings `elapsed` apart.
fn render(before: &Status, now: &Status, elapsed: Duration, host: &str, c: Colour) -> String {
    let mut out = String::new();
    let t = fleetban::now_ms();
    let valve = match now.safety.state.as_str() {
        "tripped" => c.red("tripped"),
        s => s.to_owned(),
    };
    out += &format!(
        "{} {host}  {}  (every {:.1}s; q quits)\n",
        c.bold("fleetban top"),
        local(t),
        elapsed.as_secs_f64()
    );
    out += &format!(
        "bans:   {} active, {:.1}/s by this host ({} since start); safety valve {valve}\n",
        now.bans_active,
        rate(before.bans, now.bans, elapsed),
        now.bans
    );
    let redis = redis_words(&now.redis, t);
    let redis = match now.redis.state.as_str() {
        "down" => c.red(&redis),
        _ => redis,
    };
    out += &format!("redis:  {redis}");
    if now.redis.used {
        out += &format!(
            "; {:.0} round trips/s, {:.1} errors/s, {} host(s), {} hot client(s), {} ban(s) queued",
            rate(before.redis.round_trips, now.redis.round_trips, elapsed),
            rate(before.redis.errors, now.redis.errors, elapsed),
            now.redis.fleet_hosts,
            now.redis.hot_clients,
            now.redis.queued_bans
        );
    }
    out += "\n";
    if let (Some(h), b) = (&now.http, before.http.as_ref()) {
        let (checks, denials) = b.map_or((h.checks, h.denials), |b| (b.checks, b.denials));
        out += &format!(
            "/check: {:.0}/s, {:.0} denied/s, p99 {}\n",
            rate(checks, h.checks, elapsed),
            rate(denials, h.denials, elapsed),
            h.p99_us.map_or("-".to_owned(), |us| format!("{us} µs"))
        );
    }
    out += &format!("\n{}\n", c.bold("rules"));
    let mut rules = Table::new(&["RULE", "BANS/S", "HITS/S", "LINES/S", "BANS"]).right_range(1..=4);
    for r in &now.rules {
        let b = before.rules.iter().find(|x| x.name == r.name);
        let (bans, hits, lines) = b.map_or((r.bans, r.hits, r.lines), |b| (b.bans, b.hits, b.lines));
        rules.row(vec![
            r.name.clone(),
            format!("{:.1}", rate(bans, r.bans, elapsed)),
            format!("{:.0}", rate(hits, r.hits, elapsed)),
            format!("{:.0}", rate(lines, r.lines, elapsed)),
            r.bans.to_string(),
        ]);
    }
    out += &indent(&rules.render());
    out += &format!("\n{}\n", c.bold("nearest their limits"));
    if now.nearest.is_empty() {
        out += "  (no client at half a limit or more)\n";
    } else {
        let mut near = Table::new(&["CLIENT", "RULE", "COUNT", "LIMIT", "OF LIMIT"]).right_range(2..=4);
        for n in &now.nearest {
            near.row(vec![
                n.addr.clone(),
                n.rule.clone(),
                n.count.to_string(),
                n.limit.to_string(),
                format!("{:.0}%", f64::from(n.count) * 100.0 / f64::from(n.limit.max(1))),
            ]);
        }
        out += &indent(&near.render());
    }
    out += &format!("\n{}\n", c.bold("files"));
    let mut files = Table::new(&["FILE", "STATE", "LINES/S", "LAG", "BEHIND"]).right_range(2..=4);
    for s in &now.sources {
        files.row(vec![
            s.path.clone(),
            s.state.clone(),
            format!("{:.1}", s.lines_per_s),
            s.lag_ms.map_or("-".to_owned(), |l| format!("{l} ms")),
            s.bytes_behind.map_or("-".to_owned(), |b| format!("{b} B")),
        ]);
    }
    out += &indent(&files.render());
    if !now.notify.is_empty() {
        out += &format!("\n{}\n", c.bold("notify"));
        let mut t = Table::new(&["TARGET", "SENT", "FAILED", "DROPPED", "QUEUED"]).right_range(1..=4);
        for n in &now.notify {
            t.row(vec![
                n.target.clone(),
                n.sent.to_string(),
                n.failed.to_string(),
                n.dropped.to_string(),
                n.queued.to_string(),
            ]);
        }
        out += &indent(&t.render());
    }
    out
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// The terminal while the live view runs: the alternate screen, no
/// cursor, keys read one by one; all put back on drop.
struct Screen {
    tty: bool,
    /// The terminal's settings before, restored on drop (stdin a terminal).
    saved: Option<libc::termios>,
}

impl Screen {
    fn open(tty: bool) -> Screen {
        let saved = raw_stdin();
        if tty {
            print!("\x1b[?1049h\x1b[?25l");
            let _ = std::io::stdout().flush();
        }
        Screen { tty, saved }
    }

    fn show(&mut self, text: &str) {
        let mut out = std::io::stdout().lock();
        let _ = match self.tty {
            // Home, the text with each line's rest cleared, then the rest of the screen.
            true => write!(out, "\x1b[H{}\x1b[J", text.replace('\n', "\x1b[K\r\n")),
            false => writeln!(out, "{text}"),
        };
        let _ = out.flush();
    }

    /// Waits up to `d` for a key on stdin: true for `q`, `Q` or Ctrl-C.
    fn wait_for_quit(&mut self, d: Duration) -> bool {
        if self.saved.is_none() {
            std::thread::sleep(d);
            return false;
        }
        let deadline = Instant::now() + d;
        loop {
            let left = deadline.saturating_duration_since(Instant::now());
            if left.is_zero() {
                return false;
            }
            let mut fd = libc::pollfd {
                fd: 0,
                events: libc::POLLIN,
                revents: 0,
            };
            // SAFETY: one valid pollfd, its count 1.
            let n = unsafe { libc::poll(&mut fd, 1, left.as_millis().min(60_000) as libc::c_int) };
            if n <= 0 {
                continue;
            }
            let mut byte = 0u8;
            // SAFETY: reads at most one byte into `byte`.
            let r = unsafe { libc::read(0, (&mut byte as *mut u8).cast(), 1) };
            if r == 0 {
                // stdin closed: nothing will quit us but the deadline.
                self.saved = None;
                std::thread::sleep(left);
                return false;
            }
            if r == 1 && matches!(byte, b'q' | b'Q' | 3) {
                return true;
            }
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        if let Some(t) = &self.saved {
            // SAFETY: restores the settings read by tcgetattr on fd 0.
            unsafe { libc::tcsetattr(0, libc::TCSANOW, t) };
        }
        if self.tty {
            print!("\x1b[?25h\x1b[?1049l");
            let _ = std::io::stdout().flush();
        }
    }
}

/// stdin one key at a time, without echo or signals; the settings before,
/// or None when stdin is no terminal.
fn raw_stdin() -> Option<libc::termios> {
    if !std::io::stdin().is_terminal() {
        return None;
    }
    // SAFETY: tcgetattr fills the zeroed termios for fd 0.
    let mut t: libc::termios = unsafe { std::mem::zeroed() };
    if unsafe { libc::tcgetattr(0, &mut t) } != 0 {
        return None;
    }
    let saved = t;
    t.c_lflag &= !(libc::ICANON | libc::ECHO | libc::ISIG);
    t.c_cc[libc::VMIN] = 1;
    t.c_cc[libc::VTIME] = 0;
    // SAFETY: sets fd 0's settings from a termios tcgetattr filled.
    if unsafe { libc::tcsetattr(0, libc::TCSANOW, &t) } != 0 {
        return None;
    }
    Some(saved)
}
