//! `fleetban status`: the running daemon's counters, through its control socket.

use std::path::Path;

use fleetban::control::{Client, Status};

use super::{failed, load, Outcome};

pub fn status(path: &Path, json: bool) -> Outcome {
    let config = load(path)?;
    let status = Client::new(&config.control).status().map_err(failed)?;
    if json {
        println!("{}", serde_json::to_string(&status).map_err(failed)?);
    } else {
        print!("{}", render(&status));
    }
    Ok(())
}

/// `fleetban status` for people. An unknown value shows as `null`.
fn render(s: &Status) -> String {
    let opt = |v: Option<i64>| v.map_or("null".to_owned(), |v| v.to_string());
    let mut out = String::new();
    out += &format!(
        "redis: {}   bans active: {}   lag: {} ms   lines: {}   unparsed: {}   stale: {}   future: {}\n",
        if s.redis.connected {
            "connected"
        } else {
            "not connected / embedded"
        },
        s.bans_active,
        s.lag_ms,
        s.lines,
        s.unparsed,
        s.stale,
        s.future
    );
    out += &format!(
        "safety valve: {} ({} refused, limit {}/min)   reloads: {} ({} refused)\n",
        s.safety.state, s.safety.refused, s.safety.max_bans_per_minute, s.reloads, s.reload_errors
    );
    if let Some(h) = &s.http {
        out += &format!(
            "http: {}   checks: {}   denials: {}   malformed: {}   answered within: p50 {}, p99 {}\n",
            h.listen,
            h.checks,
            h.denials,
            h.malformed,
            within(h.p50_us),
            within(h.p99_us)
        );
    }
    out += "sources:\n";
    for src in s.sources.iter().filter(|src| src.state != "following") {
        out += &format!(
            "  {}  {} ({})\n",
            src.path,
            src.state,
            src.error.as_deref().unwrap_or("-")
        );
    }
    for src in s.sources.iter().filter(|src| src.state == "following") {
        out += &format!(
            "  {}  offset {}  lines {}  {} lines/s  lag {} ms  {} bytes behind\n",
            src.path,
            src.offset,
            src.lines,
            serde_json::Number::from_f64(src.lines_per_s).map_or("null".to_owned(), |n| n.to_string()),
            opt(src.lag_ms),
            opt(src.bytes_behind.map(|b| b as i64)),
        );
    }
    out += "rules:\n";
    for r in &s.rules {
        out += &format!("  {}  hits {}  bans {}\n", r.name, r.hits, r.bans);
    }
    out
}

/// `20 µs`, or `-` before the first check (or past the last bucket).
fn within(us: Option<u64>) -> String {
    us.map_or("-".to_owned(), |us| format!("{us} µs"))
}
