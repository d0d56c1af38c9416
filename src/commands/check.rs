//! `fleetban check`: the configuration, validated, and what each rule does.

use std::path::Path;
use std::time::Duration;

use fleetban::config::{Algorithm, Limit};
use fleetban::parse::Format;

use super::{load, Outcome};

pub fn check(path: &Path) -> Outcome {
    let config = load(path)?;
    println!("{}: ok, {} rule(s)", path.display(), config.rules.len());
    for r in &config.rules {
        let ban = humantime::format_duration(Duration::from_millis(r.ban.duration_ms as u64));
        println!(
            "  {}: {}, ban {}{}; format {}; logs {}",
            r.name,
            describe_limit(&r.limit),
            ban,
            if r.ban.factor > 1.0 {
                format!(" (x{} for repeat offenders)", r.ban.factor)
            } else {
                String::new()
            },
            format_name(&r.format),
            r.logs.join(", ")
        );
    }
    for r in &config.rules {
        if let Some(w) = fleetban::limit::listpack_warning(&r.limit, fleetban::limit::LISTPACK_DEFAULT) {
            println!("warning: {}: {}: {w}", r.file.display(), r.name);
        }
    }
    match &config.redis {
        Some(r) => println!("  redis: {} (prefix {})", r.url, r.prefix),
        None => println!("  redis: none (single host, embedded store)"),
    }
    if !config.proxies.is_empty() {
        let nets: Vec<String> = config.proxies.iter().map(|n| n.to_string()).collect();
        println!(
            "  proxies: {} (never counted nor banned; their X-Forwarded-For is believed)",
            nets.join(", ")
        );
    }
    if let Some(h) = &config.http {
        println!("  http: {} (banned clients get {})", h.listen, h.deny_status);
    }
    for w in config.warnings() {
        println!("warning: {}: {w}", path.display());
    }
    Ok(())
}

/// `100 hits per 1m (sliding_window)`, `burst 20, rate 5/s (token_bucket)`.
fn describe_limit(l: &Limit) -> String {
    let window = humantime::format_duration(Duration::from_millis(l.window_ms as u64));
    match l.algorithm {
        Algorithm::TokenBucket => format!(
            "burst {}, one token every {} ({})",
            l.hits,
            humantime::format_duration(Duration::from_micros(l.interval_us as u64)),
            l.algorithm.name()
        ),
        a => format!(
            "{} hits per {}{} ({})",
            l.hits,
            window,
            l.prefilter.map_or(String::new(), |f| format!(", prefilter {f}")),
            a.name()
        ),
    }
}

fn format_name(f: &Format) -> &'static str {
    match f {
        Format::Combined => "combined",
        Format::Common => "common",
        Format::LogFormat(_) => "log_format",
        Format::Regex(_) => "regex",
    }
}
