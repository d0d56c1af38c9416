//! `fleetban check`: the configuration, validated, what each rule does,
//! and a `warning:` line for everything that would make the daemon quietly
//! do less than the files say: a log missing or unreadable, a glob matching
//! nothing, a log its rule's format cannot read. Exit 0 with warnings, 2
//! with configuration errors; with `--online` (Redis and the firewall
//! asked, `check/online.rs`), 1 when either fails.

/// `writeln!` into the report, which `check` prints whole at its end: a
/// reader that closed the pipe (`check | head -1`) is no panic.
macro_rules! report {
    ($out:expr, $($arg:tt)*) => {{
        use std::fmt::Write as _;
        let _ = writeln!($out, $($arg)*);
    }};
}

mod online;

use std::path::Path;
use std::time::Duration;

use fleetban::addr::AddrText;
use fleetban::bans::BanList;
use fleetban::config::{Backend, Config, Limit, Rule};
use fleetban::parse::{Format, Parser};
use fleetban::source::LogFile;

use super::{load, runtime, Failure, Outcome};

/// Lines of each log `check` tries its rules' formats on.
pub const SAMPLE_LINES: usize = 1000;

pub fn check(path: &Path, online: bool, notify_test: bool, json: bool) -> Outcome {
    let config = match load(path) {
        Ok(c) => c,
        // stdout has the JSON; stderr the errors for people, exit 2.
        Err(Failure::Config(errs)) if json => {
            let line = CheckJson::failed(path, &errs);
            super::write_stdout(format!("{}\n", to_json(&line)).as_bytes())?;
            return Err(Failure::Config(errs));
        }
        Err(e) => return Err(e),
    };
    let mut report = String::new();
    let result = report_on(&config, path, online, notify_test, &mut report);
    if json {
        let failures = match &result {
            Err(Failure::Runtime(e)) => vec![super::once(e)],
            _ => Vec::new(),
        };
        let line = CheckJson::of(path, &config, &report, failures);
        super::write_stdout(format!("{}\n", to_json(&line)).as_bytes())?;
    } else {
        super::write_stdout(report.as_bytes())?;
    }
    result
}

/// `check --json`, fields in this order (docs/design.md §6).
#[derive(serde::Serialize)]
struct CheckJson<'a> {
    config: String,
    /// No configuration error (warnings allowed; `--online` failures too:
    /// see `failures`).
    ok: bool,
    errors: Vec<ErrorJson>,
    rules: Vec<RuleJson>,
    /// The `warning:` lines' text.
    warnings: Vec<&'a str>,
    /// What `--online` found failing (exit 1).
    failures: Vec<String>,
    /// The report as `check` prints it, line by line.
    lines: Vec<&'a str>,
}

#[derive(serde::Serialize)]
struct ErrorJson {
    file: String,
    /// 1-based; 0 when the error has no position.
    line: u64,
    column: u64,
    message: String,
}

#[derive(serde::Serialize)]
struct RuleJson {
    name: String,
    file: String,
    /// As the report says it: `100 hits per 1m (sliding_window)`.
    limit: String,
    ban: String,
    format: &'static str,
    logs: Vec<String>,
}

impl<'a> CheckJson<'a> {
    fn failed(path: &Path, errs: &fleetban::config::ConfigErrors) -> CheckJson<'a> {
        CheckJson {
            config: path.display().to_string(),
            ok: false,
            errors: errs
                .0
                .iter()
                .map(|e| ErrorJson {
                    file: e.file.display().to_string(),
                    line: e.line,
                    column: e.column,
                    message: e.message.clone(),
                })
                .collect(),
            rules: Vec::new(),
            warnings: Vec::new(),
            failures: Vec::new(),
            lines: Vec::new(),
        }
    }

    fn of(path: &Path, config: &Config, report: &'a str, failures: Vec<String>) -> CheckJson<'a> {
        CheckJson {
            config: path.display().to_string(),
            ok: true,
            errors: Vec::new(),
            rules: config
                .rules
                .iter()
                .map(|r| RuleJson {
                    name: r.name.clone(),
                    file: r.file.display().to_string(),
                    limit: describe_limit(&r.limit) + &describe_keying(r.limit.keying),
                    ban: duration(r.ban.duration_ms),
                    format: format_name(&r.format),
                    logs: r.logs.clone(),
                })
                .collect(),
            warnings: report.lines().filter_map(|l| l.strip_prefix("warning: ")).collect(),
            failures,
            lines: report.lines().collect(),
        }
    }
}

fn to_json(v: &impl serde::Serialize) -> String {
    serde_json::to_string(v).unwrap_or_else(|e| format!("{{\"error\":\"{e}\"}}"))
}

/// Everything `check` prints, into `out`; a failure of `--online` after it.
fn report_on(config: &Config, path: &Path, online: bool, notify_test: bool, out: &mut String) -> Outcome {
    report!(out, "{}: ok, {} rule(s)", path.display(), config.rules.len());
    for r in &config.rules {
        report!(
            out,
            "  {}: {}, scope {}, ban {}{}{}; format {}; logs {}",
            r.name,
            describe_limit(&r.limit) + &describe_keying(r.limit.keying),
            scope_name(r.limit.scope),
            duration(r.ban.duration_ms),
            if r.ban.factor > 1.0 {
                format!(
                    " (x{} for repeat offenders, at most {}, offences forgotten after {})",
                    r.ban.factor,
                    duration(r.ban.max_ms),
                    duration(r.ban.forget_after_ms)
                )
            } else {
                String::new()
            },
            r.ban.network.map_or(String::new(), |n| format!(
                "; escalate_network: {} addresses of one /{} (IPv6 /{}) banned within {} ban the network for {}",
                n.bans,
                n.ipv4_prefix,
                n.ipv6_prefix,
                duration(n.within_ms),
                duration(n.duration_ms)
            )),
            format_name(&r.format),
            r.logs.join(", ")
        );
    }
    let mut failures = match online {
        true => online::contact(config, out),
        false => {
            offline_lines(config, out);
            Vec::new()
        }
    };
    failures.extend(online::notify(config, notify_test, out));
    if !config.proxies.is_empty() {
        let nets: Vec<String> = config.proxies.iter().map(|n| n.to_string()).collect();
        report!(
            out,
            "  proxies: {} (never counted nor banned; their X-Forwarded-For is believed)",
            nets.join(", ")
        );
    }
    if let Some(h) = &config.http {
        report!(out, "  http: {} (banned clients get {})", h.listen, h.deny_status);
    }
    // Without --online the listpack warning assumes Redis's default; with
    // it, `online` warned with the server's own setting.
    if config.redis.is_some() && !online {
        for r in &config.rules {
            if let Some(w) = fleetban::limit::listpack_warning(&r.limit, fleetban::limit::LISTPACK_DEFAULT) {
                report!(out, "warning: {}: {}: {w}", r.file.display(), r.name);
            }
        }
    }
    for w in config.warnings() {
        report!(out, "warning: {}: {w}", path.display());
    }
    warn_logs(config, out);
    warn_blocklists(config, out);
    if !config.proxies.is_empty() {
        proxies_in_the_list(config, out);
    }
    match failures.is_empty() {
        true => Ok(()),
        false => Err(Failure::Runtime(anyhow::anyhow!(
            "check --online failed: {}",
            failures.join("; ")
        ))),
    }
}

/// Each blocklist file read as the daemon reads it (never-banned networks
/// taken out): a line with what it yields, and a `warning:` for a file
/// missing or unreadable, one that yields nothing, each network refused
/// as too wide and each line that is no network (`FILE:LINE`).
fn warn_blocklists(config: &Config, out: &mut String) {
    let never = config.never_banned();
    for spec in &config.blocklists {
        let file = spec.file.display();
        let format = match spec.format {
            fleetban::blocklist::Format::Netset => "netset",
            fleetban::blocklist::Format::Drop => "drop",
        };
        let refresh = duration(i64::try_from(spec.refresh.as_millis()).unwrap_or(i64::MAX));
        let l = match fleetban::blocklist::load(spec, never.nets()) {
            Ok(l) => l,
            Err(e) => {
                let what = match e.source.kind() {
                    std::io::ErrorKind::NotFound => "missing (no such file)".to_owned(),
                    _ => format!("unreadable ({})", e.source),
                };
                report!(
                    out,
                    "warning: blocklist {file}: {what}; the daemon drops nothing from it until it can read it"
                );
                continue;
            }
        };
        let mut refused = Vec::new();
        for (n, what) in [
            (l.too_wide, "too wide"),
            (l.garbage, "not a network"),
            (l.over_cap, "over max_entries"),
        ] {
            if n > 0 {
                refused.push(format!("{n} {what}"));
            }
        }
        let mut spared = Vec::new();
        if l.split > 0 {
            spared.push(format!("{} split around never-banned networks", l.split));
        }
        if l.dropped > 0 {
            spared.push(format!("{} wholly never banned", l.dropped));
        }
        report!(
            out,
            "  blocklist {file} ({format}, refresh {refresh}): {} networks listed{}{}, yields {} network(s) to drop",
            l.listed,
            match refused.is_empty() {
                true => String::new(),
                false => format!(", refused {}", refused.join(", ")),
            },
            match spared.is_empty() {
                true => String::new(),
                false => format!(" ({})", spared.join(", ")),
            },
            l.nets.len()
        );
        if l.nets.is_empty() {
            report!(
                out,
                "warning: blocklist {file}: yields no network: the daemon drops nothing from it"
            );
        }
        for (line, net) in &l.too_wide_lines {
            report!(
                out,
                "warning: {file}:{line}: {} is {}: refused",
                fleetban::addr::AddrText(net),
                fleetban::addr::WIDEST_TEXT
            );
        }
        for (line, text) in &l.garbage_lines {
            report!(out, "warning: {file}:{line}: {text:?} is not a network: skipped");
        }
        let unnamed = (l.too_wide - l.too_wide_lines.len()) + (l.garbage - l.garbage_lines.len());
        if unnamed > 0 {
            report!(out, "warning: {file}: {unnamed} more lines refused or skipped");
        }
    }
}

/// Redis and the firewall as configured, not contacted.
fn offline_lines(config: &Config, out: &mut String) {
    match &config.redis {
        Some(r) => report!(
            out,
            "  redis: {} (prefix {}; {}): not contacted (--online checks it)",
            online::masked(&r.url),
            r.prefix,
            redis_durations(r)
        ),
        None => report!(out, "  redis: none (single host, embedded store)"),
    }
    match config.firewall.backend {
        Backend::Log => report!(out, "  firewall: log backend (bans are logged, nft is never run)"),
        _ => report!(
            out,
            "  firewall: nftables, table inet {}: not contacted (--online checks it)",
            config.firewall.table
        ),
    }
}

/// One `warning:` per log path that is missing, unreadable or a glob
/// matching nothing (naming every rule that reads it), and per rule and
/// readable file whose first lines its format parses none of.
fn warn_logs(config: &Config, out: &mut String) {
    // A file two patterns name (a path and a glob) is tried once per rule.
    let mut tried: Vec<(&str, std::path::PathBuf)> = Vec::new();
    for pattern in config.log_patterns() {
        let rules: Vec<&Rule> = config.rules.iter().filter(|r| r.logs.contains(&pattern)).collect();
        let names: Vec<&str> = rules.iter().map(|r| r.name.as_str()).collect();
        for file in fleetban::source::inspect(&pattern) {
            match &file {
                LogFile::Readable(p) => {
                    for r in &rules {
                        if tried.contains(&(r.name.as_str(), p.clone())) {
                            continue;
                        }
                        tried.push((r.name.as_str(), p.clone()));
                        if let Some(w) = parses_nothing(r, p, &config.proxies) {
                            report!(out, "warning: {w}");
                        }
                    }
                }
                LogFile::Missing(_) => report!(
                    out,
                    "warning: log {} ({}): missing (no such file); the daemon follows it once it appears",
                    file.path(),
                    rules_named(&names)
                ),
                LogFile::NoMatch(_) => report!(
                    out,
                    "warning: log {} ({}): the glob matches no file; the daemon follows the files it matches later",
                    file.path(),
                    rules_named(&names)
                ),
                LogFile::Unreadable(_, e) => report!(
                    out,
                    "warning: log {} ({}): unreadable ({e}); the daemon retries it",
                    file.path(),
                    rules_named(&names)
                ),
            }
        }
    }
}

/// `rule a` or `rules a, b`.
fn rules_named(names: &[&str]) -> String {
    match names {
        [one] => format!("rule {one}"),
        many => format!("rules {}", many.join(", ")),
    }
}

/// The warning when rule `r`'s format parses none of the first lines of
/// `file` (an empty file is no evidence either way: nothing).
fn parses_nothing(r: &Rule, file: &Path, proxies: &[ipnet::IpNet]) -> Option<String> {
    let lines = match fleetban::source::first_lines(file, SAMPLE_LINES) {
        Ok(l) => l,
        Err(e) => return Some(format!("log {}: reading it failed: {e}", file.display())),
    };
    if lines.first().is_some_and(|l| l.starts_with(&[0x1f, 0x8b])) {
        return Some(format!(
            "rule {}: {}: gzip-compressed, not log lines (a glob matching rotated .gz files?)",
            r.name,
            file.display()
        ));
    }
    let lines: Vec<&[u8]> = lines.iter().map(Vec::as_slice).filter(|l| !l.is_empty()).collect();
    if lines.is_empty() {
        return None;
    }
    // Config::load built this parser already: it cannot fail here.
    let parser = Parser::trusting(&r.format, &fleetban::addr::NetSet::new(proxies)).ok()?;
    if lines.iter().any(|l| parser.parse(l).is_some()) {
        return None;
    }
    Some(format!(
        "rule {}: {}: parses none of the first {} lines with format {} (first line: {})",
        r.name,
        file.display(),
        lines.len(),
        format_name(&r.format),
        fleetban::ratelog::cap(&String::from_utf8_lossy(lines[0]))
    ))
}

/// Bans of a trusted proxy (typically made before `proxies:` was set, when
/// the proxy's address was read as the client's): never enforced while it
/// is trusted, said so with the way out. The list is read as `bans` reads
/// it; a list that cannot be read is said so, not an error of the file.
fn proxies_in_the_list(config: &Config, out: &mut String) {
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
                    report!(
                        out,
                        "warning: {} is banned but overlaps the trusted proxy network {proxy}: the ban is not \
                         enforced while `proxies` lists it; lift it with `fleetban unban {}`",
                        AddrText(&net),
                        AddrText(&net)
                    );
                }
            }
        }
        Err(e) => report!(
            out,
            "  ban list: not read ({e}), so bans of trusted proxies were not looked for"
        ),
    }
}

/// A duration exactly as the configuration holds it, in the largest unit
/// that divides it (`90s`, `1500ms`, `7d`): never rounded.
pub fn duration(ms: i64) -> String {
    fleetban::duration_text(ms)
}

/// The durations of `redis:` as derived, defaults included: `timeout
/// 250ms, hold 1s, reconcile every 1m`.
pub fn redis_durations(r: &fleetban::config::RedisConfig) -> String {
    let ms = |d: Duration| duration(i64::try_from(d.as_millis()).unwrap_or(i64::MAX));
    format!(
        "timeout {}, hold {}, reconcile every {}",
        ms(r.timeout),
        ms(r.hold),
        ms(r.reconcile_every)
    )
}

/// `fleet` or `host`: where a rule's window is counted.
fn scope_name(s: fleetban::config::Scope) -> &'static str {
    match s {
        fleetban::config::Scope::Fleet => "fleet",
        fleetban::config::Scope::Host => "host",
    }
}

/// `, per network (/24, /48)` for a rule counting networks.
fn describe_keying(k: fleetban::addr::Keying) -> String {
    match k {
        fleetban::addr::Keying::Address => String::new(),
        fleetban::addr::Keying::Network { v4, v6 } => format!(", per network (/{v4}, /{v6})"),
    }
}

/// `100 hits per 1m (sliding_window)`, `burst 20, one token every 200ms (token_bucket)`.
fn describe_limit(l: &Limit) -> String {
    if l.hits == 0 {
        // No window is read: the limiter bans on the hit itself.
        return "hits 0: the first matching request bans".to_owned();
    }
    fleetban::limit::algorithm::of(l.algorithm, l.distinct).describe(l, duration)
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
