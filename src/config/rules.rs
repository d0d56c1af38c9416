//! Rule files: each rule's logs, format, match/ignore, limit and ban,
//! validated with the location of every error.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use serde_saphyr::Location;

use super::{absolute, schema, Algorithm, Clock, ConfigError, Dur, MatchSpec, Scope};
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
    pub scope: Scope,
    pub clock: Clock,
}

#[derive(Debug, Clone, Copy, PartialEq)]
pub struct BanPolicy {
    pub duration_ms: i64,
    /// Repeat offenders get `duration * factor^(n-1)`, capped at `max_ms`.
    pub factor: f64,
    pub max_ms: i64,
    /// Bans older than this no longer count towards `n`.
    pub forget_after_ms: i64,
}

pub(super) fn load_rule_file(
    file: &Path,
    proxies: &[ipnet::IpNet],
    rules: &mut Vec<Rule>,
    seen: &mut HashMap<String, (PathBuf, Location)>,
    errors: &mut Vec<ConfigError>,
) {
    let text = match std::fs::read_to_string(file) {
        Ok(t) => t,
        Err(e) => return errors.push(ConfigError::whole_file(file, format!("cannot read: {e}"))),
    };
    let parsed: schema::RuleFile = match serde_saphyr::from_str(&text) {
        Ok(p) => p,
        Err(e) => return errors.push(ConfigError::from_yaml(file, &e)),
    };
    let base = file.parent().map(Path::to_path_buf).unwrap_or_default();
    for spec in parsed.rules {
        let name = spec.name.value.trim().to_owned();
        if name.is_empty() || !name.bytes().all(|b| b.is_ascii_alphanumeric() || b"_-.".contains(&b)) {
            errors.push(ConfigError::at(
                file,
                spec.name.referenced,
                format!("invalid rule name `{name}`: expected letters, digits, `_`, `-` or `.`"),
            ));
            continue;
        }
        if let Some((other, loc)) = seen.get(&name) {
            let first = ConfigError::at(other, *loc, "");
            errors.push(ConfigError::at(
                file,
                spec.name.referenced,
                format!(
                    "duplicate rule name `{name}` (first defined at {}:{}:{})",
                    other.display(),
                    first.line,
                    first.column
                ),
            ));
            continue;
        }
        seen.insert(name.clone(), (file.to_path_buf(), spec.name.referenced));
        if spec.logs.value.0.is_empty() {
            errors.push(ConfigError::at(
                file,
                spec.logs.referenced,
                "`logs` is empty: expected at least one path",
            ));
            continue;
        }
        if let Some(bad) = spec
            .logs
            .value
            .0
            .iter()
            .find_map(|l| glob::Pattern::new(l).err().map(|e| (l, e)))
        {
            errors.push(ConfigError::at(
                file,
                spec.logs.referenced,
                format!("invalid log path or glob `{}`: {}", bad.0, bad.1),
            ));
            continue;
        }
        let format = spec.format.as_ref().map_or(Format::Combined, |f| f.value.0.clone());
        if proxies.is_empty() {
            if let (Some(f), Some(field)) = (&spec.format, crate::parse::forwarded_field(&format)) {
                errors.push(ConfigError::at(
                    file,
                    f.referenced,
                    format!(
                        "the format reads the client from `${field}`, which anyone can write: list the \
                         balancers or CDN ranges allowed to set it in `proxies:` (main file), or log \
                         `$remote_addr` after nginx's realip module"
                    ),
                ));
                continue;
            }
        }
        let l = &spec.limit.value;
        let limit = match limit_of(l) {
            Ok(limit) => limit,
            Err(msg) => {
                errors.push(ConfigError::at(file, spec.limit.referenced, msg));
                continue;
            }
        };
        let esc = spec.ban.escalate.as_ref();
        let duration_ms = spec.ban.duration.as_ms().max(1000);
        let factor = esc.map_or(1.0, |e| e.factor);
        if !(factor.is_finite() && (1.0..=1000.0).contains(&factor)) {
            errors.push(ConfigError::at(
                file,
                spec.limit.referenced,
                "`escalate.factor` must be between 1 and 1000",
            ));
            continue;
        }
        let week = 7 * 86_400_000;
        rules.push(Rule {
            name,
            file: file.to_path_buf(),
            logs: spec.logs.value.0.iter().map(|l| absolute(&base, l)).collect(),
            format,
            matches: spec.match_,
            ignore: spec.ignore,
            limit,
            ban: BanPolicy {
                duration_ms,
                factor,
                max_ms: esc
                    .and_then(|e| e.max)
                    .map_or(if esc.is_some() { week } else { duration_ms }, Dur::as_ms)
                    .max(duration_ms),
                forget_after_ms: esc.and_then(|e| e.forget_after).map_or(week, Dur::as_ms),
            },
        });
    }
}

/// The validated limit of one rule: each algorithm takes its own parameters
/// and refuses the others'.
fn limit_of(l: &schema::LimitSpec) -> Result<Limit, String> {
    let algo = l.algorithm.name();
    let mut limit = Limit {
        algorithm: l.algorithm,
        hits: 0,
        window_ms: 0,
        interval_us: 0,
        prefilter: None,
        scope: l.scope,
        clock: l.clock,
    };
    if l.prefilter.is_some() && l.algorithm != Algorithm::SlidingWindow {
        return Err(format!("`prefilter` applies to `sliding_window` only, not to `{algo}`"));
    }
    if l.algorithm == Algorithm::TokenBucket {
        if l.hits.is_some() || l.window.is_some() {
            return Err("`token_bucket` takes `burst` and `rate`, not `hits` and `window`: e.g. `{ algorithm: token_bucket, burst: 20, rate: 5/s }`".into());
        }
        let (Some(burst), Some(rate)) = (l.burst, l.rate) else {
            return Err(
                "`token_bucket` needs `burst` and `rate`: e.g. `{ algorithm: token_bucket, burst: 20, rate: 5/s }`"
                    .into(),
            );
        };
        let interval_us = (1e6 / rate.0).round();
        if !(1.0..=86_400e6).contains(&interval_us) {
            return Err("`rate` must be between 1/d and 1000000/s".into());
        }
        // Times are µs in Lua doubles (exact up to 2^53); a full bucket spans
        // burst x interval.
        if f64::from(burst.0) * interval_us >= (1u64 << 50) as f64 {
            return Err("`token_bucket` needs burst / rate below ~35 years: lower `burst` or raise `rate`".into());
        }
        limit.hits = burst.0;
        limit.interval_us = interval_us as i64;
        limit.window_ms = ((i64::from(burst.0) * limit.interval_us + 999) / 1000).max(1);
        return Ok(limit);
    }
    if l.burst.is_some() || l.rate.is_some() {
        return Err(format!(
            "`burst` and `rate` apply to `token_bucket` only; `{algo}` takes `hits` and `window`"
        ));
    }
    let (Some(hits), Some(window)) = (l.hits, l.window) else {
        return Err(format!(
            "`{algo}` needs `hits` and `window`: e.g. `{{ hits: 100, window: 60s }}`"
        ));
    };
    if window.as_ms() < 1 {
        return Err("`window` must be at least 1ms".into());
    }
    limit.hits = hits.0;
    limit.window_ms = window.as_ms();
    // The sliding counter weighs counts by time in exact integers; Lua's
    // numbers are doubles, exact up to 2^53, and the estimate reaches 2 x hits x window.
    if l.algorithm == Algorithm::SlidingCounter && (i128::from(hits.0) * i128::from(limit.window_ms)) >= 1 << 52 {
        return Err("`sliding_counter` needs hits x window (in ms) below 2^52: lower `hits` or `window`".into());
    }
    limit.prefilter = l.prefilter.map(|f| f.0);
    Ok(limit)
}
