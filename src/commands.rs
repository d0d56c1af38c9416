//! What each subcommand does, for `main.rs`. Each returns the process exit
//! code: 0 ok, 1 runtime failure, 2 usage or configuration error.

use std::io::Write;
use std::path::{Path, PathBuf};

use ipnet::IpNet;

use crate::bans::{BanList, BanRecord, BanRequest, Mode, Outcome};
use crate::config::{Config, Dur};
use crate::daemon::control;
use crate::detect::AllowList;
use crate::addr::AddrText;
use crate::store::{self, Keys};

pub const OK: u8 = 0;
pub const FAILURE: u8 = 1;
pub const USAGE: u8 = 2;

fn load(path: &Path) -> Result<Config, u8> {
    Config::load(path).map_err(|errs| {
        eprintln!("{errs}");
        eprintln!("{} error(s) in the configuration", errs.0.len());
        USAGE
    })
}

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("tokio runtime")
}

/// Logs to stderr (the journal captures it under systemd); RUST_LOG overrides the level.
/// Logs to the journal, with native fields (`RULE=`, `ADDR=`, `HITS=`, ...),
/// when stderr is connected to it (systemd sets `JOURNAL_STREAM` to the
/// device:inode of that stream) or `FLEETBAN_LOG=journal`; to stderr
/// otherwise or with `FLEETBAN_LOG=stderr`. `RUST_LOG` filters (default info).
pub fn init_logging() {
    use tracing_subscriber::layer::SubscriberExt;
    use tracing_subscriber::util::SubscriberInitExt;
    let filter = tracing_subscriber::EnvFilter::try_from_default_env()
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    let choice = std::env::var("FLEETBAN_LOG").ok();
    if wants_journal(
        choice.as_deref(),
        std::env::var("JOURNAL_STREAM").ok().as_deref(),
        stderr_id(),
    ) {
        match tracing_journald::layer() {
            Ok(layer) => {
                let layer = layer
                    .with_field_prefix(None)
                    .with_syslog_identifier("fleetban".to_owned());
                let _ = tracing_subscriber::registry().with(filter).with(layer).try_init();
                return;
            }
            Err(e) => eprintln!("fleetban: journal unavailable ({e}); logging to stderr"),
        }
    }
    // Colours only on a terminal: a file or a pipe gets plain `key=value`.
    let _ = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .with_writer(std::io::stderr)
        .try_init();
}

/// Whether to log to the journal: `FLEETBAN_LOG` decides when set, else
/// whether `JOURNAL_STREAM` (`DEV:INO`) names the stream stderr is.
pub fn wants_journal(choice: Option<&str>, journal_stream: Option<&str>, stderr: Option<(u64, u64)>) -> bool {
    match choice {
        Some("journal") => return true,
        Some("stderr") => return false,
        _ => {}
    }
    let Some((dev, ino)) = journal_stream.and_then(|s| s.split_once(':')) else {
        return false;
    };
    match (dev.parse::<u64>(), ino.parse::<u64>(), stderr) {
        (Ok(d), Ok(i), Some(id)) => (d, i) == id,
        _ => false,
    }
}

/// Device and inode of stderr.
fn stderr_id() -> Option<(u64, u64)> {
    use std::os::fd::AsFd;
    use std::os::unix::fs::MetadataExt;
    let fd = std::io::stderr().as_fd().try_clone_to_owned().ok()?;
    let m = std::fs::File::from(fd).metadata().ok()?;
    Some((m.dev(), m.ino()))
}

pub fn run(path: &Path, dry_run: bool, bench_one_call_per_hit: bool) -> u8 {
    init_logging();
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rt = runtime();
    match rt.block_on(crate::daemon::run(
        config,
        crate::daemon::Options {
            dry_run,
            config_path: path.to_path_buf(),
            bench_one_call_per_hit,
        },
        crate::daemon::signals(),
    )) {
        Ok(()) => OK,
        Err(e) => {
            tracing::error!(error = %e, "fleetban stopped.");
            FAILURE
        }
    }
}

pub fn check(path: &Path) -> u8 {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    println!("{}: ok, {} rule(s)", path.display(), config.rules.len());
    for r in &config.rules {
        let ban = humantime::format_duration(std::time::Duration::from_millis(r.ban.duration_ms as u64));
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
        if let Some(w) = crate::limit::listpack_warning(&r.limit, crate::limit::LISTPACK_DEFAULT) {
            println!("warning: {}: {}: {w}", r.file.display(), r.name);
        }
    }
    match &config.redis {
        Some(r) => println!("  redis: {} (prefix {})", r.url, r.prefix),
        None => println!("  redis: none (single host, embedded store)"),
    }
    OK
}

/// `100 hits per 1m (sliding_window)`, `burst 20, rate 5/s (token_bucket)`.
fn describe_limit(l: &crate::config::Limit) -> String {
    use crate::config::Algorithm;
    let window = humantime::format_duration(std::time::Duration::from_millis(l.window_ms as u64));
    match l.algorithm {
        Algorithm::TokenBucket => format!(
            "burst {}, one token every {} ({})",
            l.hits,
            humantime::format_duration(std::time::Duration::from_micros(l.interval_us as u64)),
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

fn format_name(f: &crate::parse::Format) -> &'static str {
    match f {
        crate::parse::Format::Combined => "combined",
        crate::parse::Format::Common => "common",
        crate::parse::Format::LogFormat(_) => "log_format",
        crate::parse::Format::Regex(_) => "regex",
    }
}

pub fn test(path: &Path, rule: Option<&str>, json: bool, logs: &[PathBuf]) -> u8 {
    let mut config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    if let Some(name) = rule {
        config.rules.retain(|r| r.name == name);
        if config.rules.is_empty() {
            eprintln!("no rule named `{name}`");
            return USAGE;
        }
    }
    let files: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let report = match crate::replay::replay(&config.rules, &files, &AllowList::fleet(&config.allow), config.ipv6_prefix) {
        Ok(r) => r,
        Err(e) => {
            eprintln!("reading logs: {e}");
            return FAILURE;
        }
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    if json {
        for d in &report.decisions {
            let line = serde_json::json!({
                "event": "ban",
                "addr": AddrText(&d.addr).to_string(),
                "rule": d.rule,
                "at": crate::rfc3339(d.at_ms),
                "until": d.until_ms.map(crate::rfc3339),
                "hits": d.hits,
            });
            let _ = writeln!(out, "{line}");
        }
        let rules: serde_json::Map<String, serde_json::Value> = report
            .rules
            .iter()
            .map(|r| {
                (
                    r.name.clone(),
                    serde_json::json!({"matched": r.matched, "bans": r.bans,
                        "closest": r.closest.iter().map(|c| serde_json::json!({
                            "addr": AddrText(&c.addr).to_string(), "peak": c.peak,
                        })).collect::<Vec<_>>()}),
                )
            })
            .collect();
        let _ = writeln!(
            out,
            "{}",
            serde_json::json!({"event": "summary", "lines": report.lines, "unparsed": report.unparsed, "rules": rules})
        );
    } else {
        let _ = writeln!(out, "lines: {}  unparsed: {}", report.lines, report.unparsed);
        for r in &report.rules {
            let _ = writeln!(out, "rule {}: {} matched, {} ban(s)", r.name, r.matched, r.bans);
            if !r.closest.is_empty() {
                let limit = config
                    .rules
                    .iter()
                    .find(|c| c.name == r.name)
                    .map_or(0, |c| c.limit.hits);
                let top: Vec<String> = r
                    .closest
                    .iter()
                    .map(|c| format!("{} {}/{limit}", AddrText(&c.addr), c.peak))
                    .collect();
                let _ = writeln!(out, "  closest to the limit, not banned: {}", top.join(", "));
            }
        }
        for d in &report.decisions {
            let _ = writeln!(
                out,
                "ban {} by {} at {} until {} ({} hits)",
                AddrText(&d.addr),
                d.rule,
                crate::rfc3339(d.at_ms),
                d.until_ms.map_or("forever".to_owned(), crate::rfc3339),
                d.hits
            );
        }
    }
    OK
}

pub fn status(path: &Path, json: bool) -> u8 {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match control::request(&config.control, &serde_json::json!({"cmd": "status"})) {
        Ok(v) => {
            if json {
                println!("{v}");
            } else {
                print!("{}", control::render_status(&v));
            }
            OK
        }
        Err(e) => {
            eprintln!("cannot reach the daemon at {}: {e}", config.control.display());
            FAILURE
        }
    }
}

/// The shared ban list: Redis when configured.
fn redis_list(config: &Config, rt: &tokio::runtime::Runtime) -> Option<Result<BanList, String>> {
    let r = config.redis.as_ref()?;
    Some(rt.block_on(async {
        let con = store::connect(r, Some(r.timeout.max(std::time::Duration::from_secs(2))))
            .await
            .map_err(|e| format!("redis {}: {e}", r.url))?;
        Ok(BanList::redis(con, Keys::new(&r.prefix)))
    }))
}

pub fn bans(path: &Path, json: bool) -> u8 {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rt = runtime();
    let records: Vec<BanRecord> = match redis_list(&config, &rt) {
        Some(Ok(mut list)) => match rt.block_on(list.records(crate::now_ms())) {
            Ok(r) => r,
            Err(e) => {
                eprintln!("{e}");
                return FAILURE;
            }
        },
        Some(Err(e)) => {
            eprintln!("{e}");
            return FAILURE;
        }
        None => match control::request(&config.control, &serde_json::json!({"cmd": "bans"})) {
            Ok(v) => serde_json::from_value(v["bans"].clone()).unwrap_or_default(),
            Err(e) => {
                eprintln!("cannot reach the daemon at {}: {e}", config.control.display());
                return FAILURE;
            }
        },
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for r in &records {
        if json {
            let _ = writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            let _ = writeln!(
                out,
                "{:<40} {:<20} until {:<22} by {} on {}{}",
                AddrText(&r.addr).to_string(),
                r.rule,
                r.until.map_or("forever".to_owned(), crate::rfc3339),
                if r.host.is_empty() { "?" } else { &r.host },
                crate::rfc3339(r.since),
                if r.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.reason)
                }
            );
        }
    }
    if !json {
        let _ = writeln!(out, "{} active ban(s)", records.len());
    }
    OK
}

pub struct BanArgs {
    pub target: String,
    pub duration: Option<String>,
    pub permanent: bool,
    pub reason: String,
}

fn target(s: &str) -> Result<IpNet, u8> {
    crate::addr::parse_member(s.trim()).ok_or_else(|| {
        eprintln!("`{s}` is not an address or a network (CIDR with no host bits set)");
        USAGE
    })
}

pub fn ban(path: &Path, args: &BanArgs) -> u8 {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let net = match target(&args.target) {
        Ok(n) => n,
        Err(c) => return c,
    };
    if AllowList::fleet(&config.allow).overlaps(&net) {
        eprintln!(
            "{} overlaps the allow list (loopback or `allow:`): not banned",
            AddrText(&net)
        );
        return USAGE;
    }
    let mode = if args.permanent {
        Mode::Permanent
    } else {
        match args.duration.as_deref().unwrap_or("1h").parse::<Dur>() {
            Ok(d) if d.as_ms() >= 1000 => Mode::For(d.as_ms()),
            Ok(_) => {
                eprintln!("--for must be at least 1s");
                return USAGE;
            }
            Err(e) => {
                eprintln!("--for: {e}");
                return USAGE;
            }
        }
    };
    let req = BanRequest {
        addr: net,
        rule: "manual".into(),
        reason: args.reason.clone(),
        host: config.host_id.clone(),
        hits: 0,
        mode,
    };
    let rt = runtime();
    let result = match redis_list(&config, &rt) {
        Some(Ok(mut list)) => rt
            .block_on(list.ban(&req, crate::now_ms()))
            .map_err(|e| e.to_string())
            .map(|o| match o {
                Outcome::Banned(r) => r.until,
                Outcome::AlreadyBanned(_) => None,
            }),
        Some(Err(e)) => Err(e),
        None => control::request(&config.control, &control::ban_request(&req))
            .map_err(|e| format!("cannot reach the daemon at {}: {e}", config.control.display()))
            .map(|v| v["until"].as_i64()),
    };
    match result {
        Ok(until) => {
            println!(
                "banned {} until {}",
                AddrText(&net),
                until.map_or("unbanned".to_owned(), crate::rfc3339)
            );
            OK
        }
        Err(e) => {
            eprintln!("{e}");
            FAILURE
        }
    }
}

pub fn unban(path: &Path, t: &str) -> u8 {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let net = match target(t) {
        Ok(n) => n,
        Err(c) => return c,
    };
    let rt = runtime();
    let result = match redis_list(&config, &rt) {
        Some(Ok(mut list)) => rt
            .block_on(async {
                // Windows first: once the unban event is out, a host counting
                // the next request must find them empty.
                let keys = Keys::new(config.redis.as_ref().map_or("fleetban", |r| r.prefix.as_str()));
                let rules = config.rules.iter().map(|r| (r.name.as_str(), r.limit.window_ms));
                let windows = keys.of_address(&net, rules, &config.host_id, crate::now_ms());
                list.forget_windows(&windows).await?;
                list.unban(&net, &config.host_id).await
            })
            .map_err(|e| e.to_string()),
        Some(Err(e)) => Err(e),
        None => control::request(
            &config.control,
            &serde_json::json!({"cmd": "unban", "addr": AddrText(&net).to_string()}),
        )
        .map_err(|e| format!("cannot reach the daemon at {}: {e}", config.control.display()))
        .map(|v| v["removed"].as_bool().unwrap_or(false)),
    };
    match result {
        Ok(true) => {
            println!("unbanned {}", AddrText(&net));
            OK
        }
        Ok(false) => {
            println!("{} was not banned", AddrText(&net));
            OK
        }
        Err(e) => {
            eprintln!("{e}");
            FAILURE
        }
    }
}

pub fn flush(path: &Path) -> u8 {
    let config = match load(path) {
        Ok(c) => c,
        Err(code) => return code,
    };
    let rt = runtime();
    let mut enforcer = match crate::daemon::enforcer_for(&config, false) {
        Ok(e) => e,
        Err(e) => {
            eprintln!("{e}");
            return FAILURE;
        }
    };
    match rt.block_on(enforcer.flush()) {
        Ok(()) => {
            println!("removed table inet {}", config.firewall.table);
            OK
        }
        Err(e) => {
            eprintln!("{e}");
            FAILURE
        }
    }
}
