//! Rule files: each rule's logs, format, match/ignore, limit and ban,
//! validated with the location of every error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_saphyr::Location;

use super::{absolute, schema, Algorithm, Clock, ConfigError, Distinct, Dur, MatchSpec, Scope};
use crate::parse::Format;

/// One rule: which requests of which logs count, the limit, and the ban.
#[derive(Debug)]
pub struct Rule {
    pub name: String,
    /// The rule file it came from.
    pub file: PathBuf,
    /// Absolute paths or globs.
    pub logs: Vec<String>,
    pub format: Format,
    pub matches: MatchSpec,
    pub ignore: MatchSpec,
    pub limit: Limit,
    pub ban: BanPolicy,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Limit {
    pub algorithm: Algorithm,
    /// Hits allowed within one window; the next one bans. For
    /// `token_bucket`: the burst (bucket capacity).
    pub hits: u32,
    /// For `token_bucket`: the time an empty bucket takes to fill again
    /// (`burst` x interval), which bounds how long a hit matters.
    pub window_ms: i64,
    /// `token_bucket`: microseconds between two tokens (1 / rate).
    pub interval_us: i64,
    /// `sliding_window` with `prefilter`: the fraction of `hits` counted by
    /// the cheap fixed window before the exact window is consulted.
    pub prefilter: Option<f64>,
    /// `distinct:`: the field whose distinct values are counted (a sliding
    /// window of values, at most `MAX_DISTINCT_HITS` of them).
    pub distinct: Option<Distinct>,
    pub scope: Scope,
    pub clock: Clock,
    /// What a client is counted and banned as (`key`, `ipv4_prefix`,
    /// `ipv6_prefix`).
    pub keying: crate::addr::Keying,
}

/// `sliding_window`, `distinct path`, ...: an algorithm as the commands name it.
pub fn algorithm_name(algorithm: Algorithm, distinct: Option<Distinct>) -> String {
    match distinct {
        Some(d) => format!("distinct {}", d.name()),
        None => algorithm.name().to_owned(),
    }
}

impl Limit {
    /// Why a client went over this limit with `hits` in its window, as the
    /// ban's reason says it: `101 hits within 1m`, `6 distinct paths
    /// within 5m`, `the first matching request (hits: 0)`.
    pub fn reason(&self, hits: u32) -> String {
        let window = crate::duration_text(self.window_ms);
        match (self.hits, self.distinct) {
            (0, _) => "the first matching request (hits: 0)".to_owned(),
            (_, Some(d)) => {
                let what = match d {
                    Distinct::Path => "paths",
                    Distinct::UserAgent => "user agents",
                    Distinct::Host => "hosts",
                    Distinct::Status => "statuses",
                };
                format!("{hits} distinct {what} within {window}")
            }
            _ if self.keying != crate::addr::Keying::Address => {
                format!("{hits} hits of the network within {window}")
            }
            _ => format!("{hits} hits within {window}"),
        }
    }

    /// The algorithm as `check`, `explain` and `status` name it:
    /// `sliding_window`, or `distinct path` (a sliding window of values).
    pub fn algorithm_name(&self) -> String {
        crate::config::algorithm_name(self.algorithm, self.distinct)
    }
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BanPolicy {
    pub duration_ms: i64,
    /// Repeat offenders get `duration * factor^(n-1)`, capped at `max_ms`.
    pub factor: f64,
    pub max_ms: i64,
    /// Bans older than this no longer count towards `n`.
    pub forget_after_ms: i64,
    /// `escalate_network:`: the network of enough banned addresses is banned.
    pub network: Option<NetworkEscalation>,
}

/// `escalate_network:` validated: when `bans` distinct addresses of one
/// network (`/ipv4_prefix`, `/ipv6_prefix`) have been banned by the rule
/// within `within_ms`, fleet-wide, the network is banned for `duration_ms`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct NetworkEscalation {
    pub ipv4_prefix: u8,
    pub ipv6_prefix: u8,
    pub bans: u32,
    pub within_ms: i64,
    pub duration_ms: i64,
}

pub(super) fn load_rule_file(
    file: &Path,
    proxies: &[ipnet::IpNet],
    ipv6_prefix: u8,
    rules: &mut Vec<Rule>,
    seen: &mut HashMap<String, (PathBuf, Location)>,
    errors: &mut Vec<ConfigError>,
) {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => return errors.push(ConfigError::whole_file(file, format!("cannot read: {e}"))),
    };
    let before = errors.len();
    // A bad entry must not hide the next: each is blanked out and the file
    // read again, so that every error is reported (`prune.rs`).
    let Some((parsed, pruned)) = super::prune::every_error::<schema::RuleFile>(file, &text, errors) else {
        return;
    };
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    for spec in parsed.rules {
        // A rule that lost an entry is not the rule written: its name still
        // counts for duplicates, its other checks still run, it is not used.
        let touched = pruned.touches(spec.name.referenced);
        let mut found = Vec::new();
        let rule = rule_of(file, &base, spec, proxies, ipv6_prefix, seen, &mut found);
        found.retain(|e| !pruned.hides(e));
        errors.extend(found);
        if let Some(rule) = rule.filter(|_| !touched) {
            rules.push(rule);
        }
    }
    // In the order of the file, whichever pass found them.
    errors[before..].sort_by_key(|e| (e.line, e.column));
}

/// One rule validated; every problem found in it is pushed to `errors`
/// (not only the first), and then it is `None`.
fn rule_of(
    file: &Path,
    base: &Path,
    spec: schema::RuleSpec,
    proxies: &[ipnet::IpNet],
    ipv6_prefix: u8,
    seen: &mut HashMap<String, (PathBuf, Location)>,
    errors: &mut Vec<ConfigError>,
) -> Option<Rule> {
    let before = errors.len();
    let mut error = |loc: Location, msg: String| errors.push(ConfigError::at(file, loc, msg));
    let name = spec.name.value.trim().to_owned();
    if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
        error(
            spec.name.referenced,
            format!("invalid rule name `{name}`: expected letters, digits, `_`, `-` or `.`"),
        );
    } else if let Some((other, loc)) = seen.get(&name) {
        let first = ConfigError::at(other, *loc, "");
        error(
            spec.name.referenced,
            format!(
                "duplicate rule name `{name}` (first defined at {}:{}:{})",
                other.display(),
                first.line,
                first.column
            ),
        );
    } else {
        seen.insert(name.clone(), (file.to_path_buf(), spec.name.referenced));
    }
    if spec.logs.value.0.is_empty() {
        error(
            spec.logs.referenced,
            "`logs` is empty: expected at least one path".into(),
        );
    }
    if let Some(bad) = spec
        .logs
        .value
        .0
        .iter()
        .find_map(|l| glob::Pattern::new(l).err().map(|e| (l, e)))
    {
        error(
            spec.logs.referenced,
            format!("invalid log path or glob `{}`: {}", bad.0, bad.1),
        );
    }
    let format = spec.format.as_ref().map_or(Format::Combined, |f| f.value.0.clone());
    let format_at = spec.format.as_ref().map_or(spec.name.referenced, |f| f.referenced);
    if proxies.is_empty() {
        if let (Some(f), Some(field)) = (&spec.format, crate::parse::forwarded_field(&format)) {
            error(
                f.referenced,
                format!(
                    "the format reads the client from `${field}`, which anyone can write: list the \
                     balancers or CDN ranges allowed to set it in `proxies:` (main file), or log \
                     `$remote_addr` after nginx's realip module"
                ),
            );
        }
    }
    if format != Format::NginxError {
        for (what, m) in [("match", &spec.match_), ("ignore", &spec.ignore)] {
            if let Some(key) = m.error_log_keys() {
                error(
                    format_at,
                    format!("`{what}: {{ {key}: ... }}` reads nginx's error log: it needs `format: nginx_error`"),
                );
            }
        }
    }
    let l = &spec.limit.value;
    let limit = limit_of(l).map_err(|msg| error(spec.limit.referenced, msg)).ok();
    let parser = crate::parse::Parser::new(&format).ok();
    let timed = parser.as_ref().is_some_and(|p| p.has_time());
    if parser.is_some_and(|p| !p.has_target()) {
        for (what, m) in [("match", &spec.match_), ("ignore", &spec.ignore)] {
            if m.target.is_some() {
                error(
                    format_at,
                    format!(
                        "`{what}: {{ target: ... }}` reads the request target, which the format does not log: \
                         log `$request` or `$request_uri` (a regex: a `path` group)"
                    ),
                );
            }
        }
    }
    if l.clock == Clock::Log && !timed {
        error(
            format_at,
            "the format gives no time (`$time_local`, `$time_iso8601` or `$msec`; a regex's `time` \
             group), and `clock: log` (the default) takes each hit's time from its line: log a time, \
             or set `limit: { clock: redis }` to count at arrival"
                .into(),
        );
    }
    let ban_at = spec.ban.as_ref().map_or(spec.name.referenced, |b| b.referenced);
    let ban = spec.ban.map(|b| b.value).unwrap_or_default();
    let esc = ban.escalate.as_ref();
    let duration_ms = ban.duration.as_ms();
    // A ban's length, wherever it is written: from a second to the longest
    // timeout nft holds (the bound `fleetban ban --for` keeps too).
    let at_least_a_second = |what: &str, d: Dur, error: &mut dyn FnMut(Location, String)| {
        if let Err(why) = ban_length(d) {
            error(ban_at, format!("`{what}` is {why}"));
        }
    };
    at_least_a_second("ban.duration", ban.duration, &mut error);
    let factor = esc.map_or(1.0, |e| e.factor);
    if !(factor.is_finite() && (1.0..=1000.0).contains(&factor)) {
        error(ban_at, "`escalate.factor` must be between 1 and 1000".into());
    }
    let week = 7 * 86_400_000;
    let max_ms = match esc.and_then(|e| e.max) {
        Some(max) => {
            at_least_a_second("escalate.max", max, &mut error);
            if max.as_ms() < duration_ms {
                error(
                    ban_at,
                    format!(
                        "`escalate.max` ({}) is shorter than `ban.duration` ({}): a repeat offender's ban \
                         would be shorter than a first one's",
                        humantime::format_duration(max.0),
                        humantime::format_duration(ban.duration.0)
                    ),
                );
            }
            max.as_ms()
        }
        None if esc.is_some() => week.max(duration_ms),
        None => duration_ms,
    };
    if let Some(f) = esc.and_then(|e| e.forget_after) {
        at_least_a_second("escalate.forget_after", f, &mut error);
    }
    let network = spec.escalate_network.as_ref().and_then(|n| {
        network_of(&n.value, ipv6_prefix)
            .map_err(|all| all.into_iter().for_each(|msg| error(n.referenced, msg)))
            .ok()
    });
    if errors.len() > before {
        return None;
    }
    Some(Rule {
        name,
        file: file.to_path_buf(),
        logs: spec.logs.value.0.iter().map(|l| absolute(base, l)).collect(),
        format,
        matches: spec.match_,
        ignore: spec.ignore,
        limit: limit?,
        ban: BanPolicy {
            duration_ms,
            factor,
            max_ms,
            forget_after_ms: esc.and_then(|e| e.forget_after).map_or(week, Dur::as_ms),
            network,
        },
    })
}

/// Whether `d` may be a ban's length: at least a second, at most
/// [`crate::enforce::MAX_TIMEOUT_MS`] (3650 days, nft's longest timeout).
/// The error says what it is and why not.
fn ban_length(d: Dur) -> Result<(), String> {
    const DAY_MS: i64 = 86_400_000;
    match d.as_ms() {
        ms if ms < 1000 => Err(format!(
            "{}, below a second: a ban lasts at least 1s (write e.g. `1s`)",
            humantime::format_duration(d.0)
        )),
        ms if ms > crate::enforce::MAX_TIMEOUT_MS => Err(format!(
            "{}, above {}d, the longest ban (nft's longest timeout)",
            humantime::format_duration(d.0),
            crate::enforce::MAX_TIMEOUT_MS / DAY_MS
        )),
        _ => Ok(()),
    }
}

/// `key: network` and its lengths. A network shorter than /8 (IPv4) or /16
/// (IPv6) is refused: one ban would cover a country's worth of clients.
fn keying_of(l: &schema::LimitSpec) -> Result<crate::addr::Keying, String> {
    match l.key {
        schema::KeyKind::Address => match (l.ipv4_prefix, l.ipv6_prefix) {
            (None, None) => Ok(crate::addr::Keying::Address),
            _ => Err("`ipv4_prefix` and `ipv6_prefix` apply with `key: network` only".into()),
        },
        schema::KeyKind::Network => {
            let v4 = l.ipv4_prefix.unwrap_or(24);
            let v6 = l.ipv6_prefix.unwrap_or(56);
            if !(8..=32).contains(&v4) {
                return Err(format!("`ipv4_prefix` must be between 8 and 32, not {v4}"));
            }
            if !(16..=128).contains(&v6) {
                return Err(format!("`ipv6_prefix` must be between 16 and 128, not {v6}"));
            }
            Ok(crate::addr::Keying::Network { v4, v6 })
        }
    }
}

/// `escalate_network:` validated. The network must be wider than the
/// rule's clients (an IPv4 address, an IPv6 `/ipv6_prefix`): a network of
/// one client is that client's own ban. Every problem is said, not only
/// the first.
fn network_of(n: &schema::EscalateNetworkSpec, ipv6_prefix: u8) -> Result<NetworkEscalation, Vec<String>> {
    let what = "escalate_network";
    let mut errors = Vec::new();
    if !(8..=31).contains(&n.ipv4_prefix) {
        errors.push(format!(
            "`{what}.ipv4_prefix` is {}: expected 8 to 31 (wider than one address)",
            n.ipv4_prefix
        ));
    }
    if !(16..ipv6_prefix).contains(&n.ipv6_prefix) {
        errors.push(format!(
            "`{what}.ipv6_prefix` is {}: expected 16 to {}, shorter than `ipv6_prefix` ({ipv6_prefix}, the length of an IPv6 client)",
            n.ipv6_prefix,
            ipv6_prefix.saturating_sub(1)
        ));
    }
    if n.bans < 2 {
        errors.push(format!(
            "`{what}.bans` is {}: expected at least 2 distinct addresses",
            n.bans
        ));
    }
    match n.within {
        None => errors.push(format!("missing field `within` in `{what}` (e.g. `within: 1h`)")),
        Some(w) if w.as_ms() < 1000 => errors.push(format!(
            "`{what}.within` is {}, below a second (write e.g. `1h`)",
            humantime::format_duration(w.0)
        )),
        Some(_) => {}
    }
    match n.duration {
        None => errors.push(format!("missing field `duration` in `{what}` (e.g. `duration: 1d`)")),
        Some(d) => {
            if let Err(why) = ban_length(d) {
                errors.push(format!("`{what}.duration` is {why}"));
            }
        }
    }
    match (n.within, n.duration) {
        (Some(within), Some(duration)) if errors.is_empty() => Ok(NetworkEscalation {
            ipv4_prefix: n.ipv4_prefix,
            ipv6_prefix: n.ipv6_prefix,
            bans: n.bans,
            within_ms: within.as_ms(),
            duration_ms: duration.as_ms(),
        }),
        _ => Err(errors),
    }
}

/// The validated limit of one rule: each algorithm takes its own parameters
/// and refuses the others' (`limit::algorithm`, `limit_of`).
fn limit_of(l: &schema::LimitSpec) -> Result<Limit, String> {
    let mut limit = Limit {
        algorithm: l.algorithm,
        hits: 0,
        window_ms: 0,
        interval_us: 0,
        prefilter: None,
        distinct: None,
        scope: l.scope,
        clock: l.clock,
        keying: keying_of(l)?,
    };
    crate::limit::algorithm::of(l.algorithm, l.distinct).limit_of(l, &mut limit)?;
    Ok(limit)
}
