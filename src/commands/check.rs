//! `fleetban check`: the configuration, validated, and what each rule does.

use std::path::Path;
use std::time::Duration;

use fleetban::addr::AddrText;
use fleetban::bans::BanList;
use fleetban::config::{Algorithm, Config, Limit};
use fleetban::parse::Format;

use super::{load, runtime, Outcome};

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
    if !config.proxies.is_empty() {
        proxies_in_the_list(&config);
    }
    Ok(())
}

/// Bans of a trusted proxy (typically made before `proxies:` was set, when
/// the proxy's address was read as the client's): never enforced while it
/// is trusted, said so with the way out. The list is read as `bans` reads
/// it; a list that cannot be read is said so, not an error of the file.
fn proxies_in_the_list(config: &Config) {
    let now = fleetban::now_ms();
    let active = match &config.redis {
        Some(r) => runtime().block_on(async {
            let read = async {
                let mut list = BanList::connect(r).await.map_err(|e| e.to_string())?;
                list.active(now).await.map_err(|e| e.to_string())
            };
            tokio::time::timeout(Duration::from_secs(3), read)
                .await
                .unwrap_or_else(|_| Err("no answer within 3s".to_owned()))
        }),
        None => {
            let mut list = BanList::memory(Some(config.state_dir.join("bans.json")));
            runtime().block_on(list.active(now)).map_err(|e| e.to_string())
        }
    };
    match active {
        Ok(bans) => {
            for (net, _) in bans {
                if let Some(proxy) = config.proxies.iter().find(|p| p.contains(&net) || net.contains(*p)) {
                    println!(
                        "warning: {} is banned but overlaps the trusted proxy network {proxy}: the ban is not \
                         enforced while `proxies` lists it; lift it with `fleetban unban {}`",
                        AddrText(&net),
                        AddrText(&net)
                    );
                }
            }
        }
        Err(e) => println!("  ban list: not read ({e}), so bans of trusted proxies were not looked for"),
    }
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
        Format::Json(_) => "json",
        Format::NginxError => "nginx_error",
        Format::Regex(_) => "regex",
    }
}
