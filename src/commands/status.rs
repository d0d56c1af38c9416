//! `fleetban status`: the running daemon's state, through its control
//! socket: a summary, the Redis line (`embedded`, `connected`, `down since
//! T (deciding locally|paused)`), the firewall line, then the rules and
//! the sources as aligned tables.

use std::path::Path;

use fleetban::config::ByteSize;
use fleetban::control::{Client, RedisStatus, Status};

use super::human::{local, relative, Table};
use super::{failed, load_for_cli, say, Outcome};

pub fn status(path: &Path, json: bool) -> Outcome {
    let config = load_for_cli(path)?;
    let status = Client::new(&config.control).status().map_err(failed)?;
    if json {
        say!("{}", serde_json::to_string(&status).map_err(failed)?);
    } else {
        say!("{}", render(&status, fleetban::now_ms()).trim_end_matches('\n'));
    }
    Ok(())
}

/// The Redis line's words, from `state` (or, from an older daemon, from
/// `connected` and `used`).
pub fn redis_words(r: &RedisStatus, now: i64) -> String {
    let state = match r.state.as_str() {
        "" if !r.used => "embedded",
        "" if r.connected => "connected",
        "" => "down",
        s => s,
    };
    match state {
        "embedded" => "embedded (single host, no Redis)".to_owned(),
        "down" => {
            let since = r
                .down_since
                .as_deref()
                .and_then(parse_time)
                .map_or("?".to_owned(), |t| format!("{} ({})", local(t), relative(t, now)));
            let mode = match r.on_down.as_deref() {
                Some("pause") => "paused",
                _ => "deciding locally",
            };
            format!("down since {since} ({mode})")
        }
        other => other.to_owned(),
    }
}

/// `fleetban status` for people.
fn render(s: &Status, now: i64) -> String {
    let mut out = String::new();
    out += &format!("redis:     {}", redis_words(&s.redis, now));
    if s.redis.used {
        out += &format!(
            "; {} error(s), {} round trip(s), {} decided locally, {} ban(s) queued",
            s.redis.errors, s.redis.round_trips, s.redis.local_decisions, s.redis.queued_bans
        );
        if s.redis.dropped_bans > 0 {
            out += &format!(", {} dropped (queue full)", s.redis.dropped_bans);
        }
    }
    out.push('\n');
    let f = &s.firewall;
    out += "firewall:  ";
    if f.failing {
        out += &format!("failing ({})", f.error.as_deref().unwrap_or("nft failed"));
    } else {
        out += "ok";
    }
    if f.not_enforced > 0 {
        out += &format!(
            "; {} ban(s) not enforced (retried): {}",
            f.not_enforced,
            f.not_enforced_sample.join(", ")
        );
    }
    if f.recreated > 0 {
        out += &format!("; table re-created {} time(s)", f.recreated);
    }
    if f.split > 0 {
        out += &format!("; {} ban(s) applied around never-banned addresses", f.split);
    }
    if f.spared > 0 {
        out += &format!("; {} ban(s) of never-banned addresses not applied", f.spared);
    }
    out.push('\n');
    out += &format!(
        "bans:      {} active, {} decided here; safety valve: {} ({} refused, limit {}/min)\n",
        s.bans_active, s.bans, s.safety.state, s.safety.refused, s.safety.max_bans_per_minute
    );
    out += &format!(
        "lines:     {} read, {} unparsed, {} stale, {} future, {} longer than 64 KiB; lag {} ms\n",
        s.lines, s.unparsed, s.stale, s.future, s.skipped_long, s.lag_ms
    );
    let c = &s.client_state;
    out += &format!(
        "memory:    client state {} of {}, {} window(s); {} shed in {} shed(s)\n",
        ByteSize(c.bytes),
        ByteSize(c.max),
        c.keys,
        c.shed_keys,
        c.sheds
    );
    // Every SIGHUP, the refused ones among them.
    out += &format!(
        "reloads:   {} ({} refused)\n",
        s.reloads + s.reload_errors,
        s.reload_errors
    );
    if let Some(h) = &s.http {
        out += &format!(
            "http:      {}; {} checks, {} denials, {} malformed; answered within p50 {}, p99 {}\n",
            h.listen,
            h.checks,
            h.denials,
            h.malformed,
            within(h.p50_us),
            within(h.p99_us)
        );
    }
    out += "\nrules:\n";
    let mut rules = Table::new(&["RULE", "LINES", "UNPARSED", "HITS", "BANS"]).right_range(1..=4);
    for r in &s.rules {
        rules.row(vec![
            r.name.clone(),
            r.lines.to_string(),
            r.unparsed.to_string(),
            r.hits.to_string(),
            r.bans.to_string(),
        ]);
    }
    out += &indent(&rules.render());
    // A rule that read lines and parsed none of them is the silent failure
    // the counts exist for: say it in words too.
    for r in s.rules.iter().filter(|r| r.lines > 0 && r.unparsed == r.lines) {
        out += &format!(
            "warning: rule {} parsed none of the {} line(s) it read: check its format (fleetban test --print unparsed --rule {})\n",
            r.name, r.lines, r.name
        );
    }
    out += "\nsources:\n";
    if s.sources.is_empty() {
        out += "  (none followed)\n";
    } else {
        let mut t = Table::new(&["FILE", "STATE", "OFFSET", "LINES", "LINES/S", "LAG", "BEHIND"]).right_range(2..=6);
        for src in &s.sources {
            t.row(vec![
                src.path.clone(),
                match &src.error {
                    Some(e) if src.state != "following" => format!("{} ({e})", src.state),
                    _ => src.state.clone(),
                },
                src.offset.to_string(),
                src.lines.to_string(),
                format!("{:.1}", src.lines_per_s),
                src.lag_ms.map_or("-".to_owned(), |l| format!("{l} ms")),
                src.bytes_behind.map_or("-".to_owned(), |b| format!("{b} B")),
            ]);
        }
        out += &indent(&t.render());
    }
    out += &blocklists(s, now);
    out
}

/// The `blocklists:` files, when any is configured.
fn blocklists(s: &Status, now: i64) -> String {
    if s.blocklists.is_empty() {
        return String::new();
    }
    let mut t = Table::new(&["FILE", "ENTRIES", "SKIPPED", "SPLIT", "REFRESHED", "ERROR"]).right_range(1..=3);
    for b in &s.blocklists {
        t.row(vec![
            b.file.clone(),
            b.entries.to_string(),
            b.skipped_lines.to_string(),
            b.split_entries.to_string(),
            b.last_refresh
                .as_deref()
                .and_then(parse_time)
                .map_or("never".to_owned(), |t| relative(t, now)),
            b.error.clone().unwrap_or_else(|| "-".to_owned()),
        ]);
    }
    format!("\nblocklists:\n{}", indent(&t.render()))
}

/// An RFC 3339 time as unix ms.
fn parse_time(s: &str) -> Option<i64> {
    let t = humantime::parse_rfc3339(s).ok()?;
    let d = t.duration_since(std::time::UNIX_EPOCH).ok()?;
    i64::try_from(d.as_millis()).ok()
}

fn indent(text: &str) -> String {
    text.lines().map(|l| format!("  {l}\n")).collect()
}

/// `20 µs`, or `-` before the first check (or past the last bucket).
fn within(us: Option<u64>) -> String {
    us.map_or("-".to_owned(), |us| format!("{us} µs"))
}
