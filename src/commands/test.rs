//! `fleetban test`: the offline replay (`fleetban::replay`) and its report,
//! for people or as JSON Lines. Output order, both ways: the lines asked
//! for with `--print` and the bans as the replay meets them, then the files
//! and rules read, then the summary, last.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use fleetban::addr::AddrText;
use fleetban::replay::{Event, Inputs, Kind, Options, Print, Report};
use serde::Serialize;

use super::human::{local, relative, span, Table};
use super::progress::Progress;
use super::{load, Failure, Outcome};

/// What `--print` shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq, clap::ValueEnum)]
pub enum PrintKind {
    /// Lines no selected rule reading them could parse.
    Unparsed,
    /// Lines a rule's filter accepted.
    Matched,
    /// Lines whose hit crossed a rule's limit.
    Banned,
}

/// The command line of `fleetban test` (main.rs).
pub struct TestArgs {
    pub rules: Vec<String>,
    pub print: Vec<PrintKind>,
    pub since: Option<String>,
    pub until: Option<String>,
    pub top: usize,
    pub json: bool,
    pub logs: Vec<PathBuf>,
}

// Every JSON object's fields are in alphabetical order (docs/design.md §6).

#[derive(Serialize)]
struct LineLine<'a> {
    event: &'static str,
    file: String,
    kind: &'static str,
    line: u64,
    rule: Option<&'a str>,
    text: String,
}

/// One line per ban decided.
#[derive(Serialize)]
struct BanLine<'a> {
    addr: String,
    at: String,
    event: &'static str,
    file: String,
    hits: u32,
    line: u64,
    /// A network's ban triggered by its banned addresses: what triggered it.
    #[serde(skip_serializing_if = "str::is_empty")]
    reason: &'a str,
    rule: &'a str,
    until: Option<String>,
}

/// The last line.
#[derive(Serialize)]
struct SummaryLine {
    event: &'static str,
    files: Vec<FileLine>,
    lines: u64,
    outside: u64,
    rules: BTreeMap<String, RuleLine>,
    since: Option<String>,
    skipped_long: u64,
    unparsed: u64,
    until: Option<String>,
    warnings: Vec<String>,
}

#[derive(Serialize)]
struct FileLine {
    file: String,
    gzip: bool,
    lines: u64,
    named: bool,
    rules: Vec<String>,
}

#[derive(Serialize)]
struct RuleLine {
    bans: u64,
    closest: Vec<ClosestLine>,
    lines: u64,
    matched: u64,
    /// The networks its bans escalated to, not in `bans`.
    network_bans: u64,
    unparsed: u64,
}

#[derive(Serialize)]
struct ClosestLine {
    addr: String,
    peak: u32,
}

pub fn test(path: &Path, args: &TestArgs) -> Outcome {
    let mut config = load(path)?;
    if !args.rules.is_empty() {
        let names: Vec<String> = config.rules.iter().map(|r| r.name.clone()).collect();
        if let Some(unknown) = args.rules.iter().find(|n| !names.contains(n)) {
            return Err(Failure::Usage(format!(
                "no rule named `{unknown}`; the rules are: {}",
                names.join(", ")
            )));
        }
        config.rules.retain(|r| args.rules.contains(&r.name));
    }
    let now = fleetban::now_ms();
    let options = Options {
        since_ms: args.since.as_deref().map(|t| time_arg("--since", t, now)).transpose()?,
        until_ms: args.until.as_deref().map(|t| time_arg("--until", t, now)).transpose()?,
        print: Print {
            unparsed: args.print.contains(&PrintKind::Unparsed),
            matched: args.print.contains(&PrintKind::Matched),
            banned: args.print.contains(&PrintKind::Banned),
        },
        closest: args.top,
    };
    let inputs = if args.logs.is_empty() {
        fleetban::replay::of_rules(&config.rules)
    } else {
        fleetban::replay::of_args(&config.rules, &args.logs).map_err(|e| Failure::Runtime(e.into()))?
    };
    if inputs.files.is_empty() {
        return Err(Failure::Runtime(anyhow::anyhow!(
            "no log to read{}",
            inputs.missing.iter().map(|m| format!("\n{m}")).collect::<String>()
        )));
    }
    let allow = config.never_banned();
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    // The first write error (a reader that went away) stops the writing,
    // not the replay: its errors still count.
    let mut written: std::io::Result<()> = Ok(());
    // On a terminal: a progress line on stderr (not amid `--print` lines
    // on the same terminal).
    let paths: Vec<&Path> = inputs.files.iter().map(|i| i.path.as_path()).collect();
    let printing = options.print.any() && std::io::IsTerminal::is_terminal(&std::io::stdout());
    let mut progress = Progress::on_terminal(&paths, args.json || printing);
    let report = fleetban::replay::replay(
        &config.rules,
        &inputs.files,
        &allow,
        &config.proxies,
        config.ipv6_prefix,
        &options,
        |event| {
            if let Event::Progress { file, bytes, lines } = event {
                if let Some(p) = &mut progress {
                    p.update(file, bytes, lines);
                }
                return;
            }
            if written.is_ok() {
                written = if args.json {
                    event_json(&mut out, &event)
                } else {
                    event_human(&mut out, &event)
                };
            }
        },
    )
    .map_err(|e| Failure::Runtime(e.into()))?;
    if let Some(p) = &mut progress {
        p.finish();
    }
    let limit = |name: &str| config.rules.iter().find(|c| c.name == name).map_or(0, |c| c.limit.hits);
    let warnings = warnings(&report, &inputs);
    let written = written
        .and_then(|()| {
            if args.json {
                summary_json(&mut out, &report, &options, warnings)
            } else {
                summary_human(&mut out, &report, &options, warnings, limit)
            }
        })
        .and_then(|()| out.flush());
    match written {
        // A reader that stopped early (`| head`) is no failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the report").into())
        }
        _ => Ok(()),
    }
}

/// `--since`/`--until`: RFC 3339 (`2026-11-30T08:00:00Z`, a zone required),
/// or a duration before `now` (`90m`, `2h`, `7d`).
fn time_arg(flag: &str, text: &str, now: i64) -> Result<i64, Failure> {
    if let Some(ms) = fleetban::parse::parse_iso8601(text.as_bytes()) {
        return Ok(ms);
    }
    match humantime::parse_duration(text) {
        Ok(d) => Ok(now - i64::try_from(d.as_millis()).unwrap_or(i64::MAX / 2)),
        Err(_) => Err(Failure::Usage(format!(
            "{flag} {text}: neither an RFC 3339 time with a zone (2026-11-30T08:00:00Z) nor a duration before now (2h)"
        ))),
    }
}

/// What the operator must not miss: a rule that read lines and parsed
/// none, a rule that read nothing, a rule's log that is missing.
fn warnings(report: &Report, inputs: &Inputs) -> Vec<String> {
    let mut w: Vec<String> = inputs.missing.clone();
    for (i, r) in report.rules.iter().enumerate() {
        let files: Vec<String> = report
            .files
            .iter()
            .filter(|f| f.rules.contains(&i))
            .map(|f| f.path.display().to_string())
            .collect();
        if r.lines > 0 && r.unparsed == r.lines {
            w.push(format!(
                "rule {} read {} line(s) and parsed none of them: its format does not fit {} \
                 (`fleetban test --rule {} --print unparsed` shows them)",
                r.name,
                r.lines,
                files.join(", "),
                r.name
            ));
        } else if r.lines == 0 && report.outside == 0 {
            w.push(format!("rule {} read no line", r.name));
        }
    }
    w
}

/// A line as text for a terminal: invalid UTF-8 replaced, control
/// characters escaped (a log line is written by its clients).
fn printable(text: &[u8]) -> String {
    String::from_utf8_lossy(text)
        .chars()
        .flat_map(|c| match c {
            '\t' => vec!['\t'],
            c if c.is_control() => format!("\\x{:02x}", c as u32).chars().collect(),
            c => vec![c],
        })
        .collect()
}

fn kind_name(kind: Kind) -> &'static str {
    match kind {
        Kind::Unparsed => "unparsed",
        Kind::Matched => "matched",
        Kind::Banned => "banned",
    }
}

/// `--print` lines as `FILE:LINE: KIND[ RULE]: TEXT`; bans are kept for
/// the table.
fn event_human(out: &mut impl Write, event: &Event<'_>) -> std::io::Result<()> {
    match event {
        Event::Line {
            kind,
            file,
            line,
            rule,
            text,
        } => {
            let rule = rule.map_or(String::new(), |r| format!(" {r}"));
            writeln!(
                out,
                "{}:{line}: {}{rule}: {}",
                file.display(),
                kind_name(*kind),
                printable(text)
            )
        }
        Event::Ban { .. } | Event::Progress { .. } => Ok(()),
    }
}

fn event_json(out: &mut impl Write, event: &Event<'_>) -> std::io::Result<()> {
    let text = match event {
        Event::Line {
            kind,
            file,
            line,
            rule,
            text,
        } => serde_json::to_string(&LineLine {
            event: "line",
            file: file.display().to_string(),
            kind: kind_name(*kind),
            line: *line,
            rule: *rule,
            text: String::from_utf8_lossy(text).into_owned(),
        }),
        Event::Ban { decision: d, file } => serde_json::to_string(&BanLine {
            addr: AddrText(&d.addr).to_string(),
            at: fleetban::rfc3339(d.at_ms),
            event: "ban",
            file: file.display().to_string(),
            hits: d.hits,
            line: d.line,
            reason: &d.reason,
            rule: &d.rule,
            until: d.until_ms.map(fleetban::rfc3339),
        }),
        Event::Progress { .. } => return Ok(()),
    }?;
    writeln!(out, "{text}")
}

fn rule_names(report: &Report, rules: &[usize]) -> Vec<String> {
    rules.iter().map(|&i| report.rules[i].name.clone()).collect()
}

fn summary_json(
    out: &mut impl Write,
    report: &Report,
    options: &Options,
    warnings: Vec<String>,
) -> std::io::Result<()> {
    let rules = report
        .rules
        .iter()
        .map(|r| {
            let closest = r
                .closest
                .iter()
                .map(|c| ClosestLine {
                    addr: AddrText(&c.addr).to_string(),
                    peak: c.peak,
                })
                .collect();
            let line = RuleLine {
                bans: r.bans,
                closest,
                lines: r.lines,
                matched: r.matched,
                network_bans: r.network_bans,
                unparsed: r.unparsed,
            };
            (r.name.clone(), line)
        })
        .collect();
    let files = report
        .files
        .iter()
        .map(|f| FileLine {
            file: f.path.display().to_string(),
            gzip: f.gzip,
            lines: f.lines,
            named: f.named,
            rules: rule_names(report, &f.rules),
        })
        .collect();
    let summary = SummaryLine {
        event: "summary",
        files,
        lines: report.lines,
        outside: report.outside,
        rules,
        since: options.since_ms.map(fleetban::rfc3339),
        skipped_long: report.skipped_long,
        unparsed: report.unparsed,
        until: options.until_ms.map(fleetban::rfc3339),
        warnings,
    };
    writeln!(out, "{}", serde_json::to_string(&summary)?)
}

fn summary_human(
    out: &mut impl Write,
    report: &Report,
    options: &Options,
    warnings: Vec<String>,
    limit: impl Fn(&str) -> u32,
) -> std::io::Result<()> {
    if !report.decisions.is_empty() {
        let mut bans = Table::new(&["BANNED AT", "ADDRESS", "RULE", "HITS", "FOR", "UNTIL", "LINE"]).right(3);
        for d in &report.decisions {
            bans.row(vec![
                local(d.at_ms),
                AddrText(&d.addr).to_string(),
                d.rule.clone(),
                d.hits.to_string(),
                d.until_ms.map_or("permanent".to_owned(), |u| span(u - d.at_ms)),
                d.until_ms.map_or("-".to_owned(), local),
                format!("{}:{}", report.files[d.file].path.display(), d.line),
            ]);
        }
        write!(out, "{}", bans.render())?;
        // The networks banned for their banned addresses (`escalate_network:`),
        // under the table they belong to, a blank line before the next.
        for d in report.decisions.iter().filter(|d| !d.reason.is_empty()) {
            writeln!(out, "{}: {}", AddrText(&d.addr), d.reason)?;
        }
        writeln!(out)?;
    }
    let mut files = Table::new(&["FILE", "LINES", "READ BY"]).right(1);
    for f in &report.files {
        let gz = if f.gzip { " (gzip)" } else { "" };
        files.row(vec![
            format!("{}{gz}", f.path.display()),
            f.lines.to_string(),
            rule_names(report, &f.rules).join(", "),
        ]);
    }
    write!(out, "{}", files.render())?;
    let unnamed: Vec<String> = report
        .files
        .iter()
        .filter(|f| !f.named)
        .map(|f| f.path.display().to_string())
        .collect();
    if !unnamed.is_empty() {
        writeln!(
            out,
            "note: no rule's logs: name {}: read by every selected rule",
            unnamed.join(", ")
        )?;
    }
    writeln!(out)?;
    let mut rules = Table::new(&["RULE", "LINES", "UNPARSED", "MATCHED", "BANS"]).right_range(1..=4);
    for r in &report.rules {
        rules.row(vec![
            r.name.clone(),
            r.lines.to_string(),
            r.unparsed.to_string(),
            r.matched.to_string(),
            match r.network_bans {
                0 => r.bans.to_string(),
                n => format!("{} + {n} network", r.bans),
            },
        ]);
    }
    writeln!(out, "{}", rules.render())?;
    let mut near = Table::new(&["RULE", "ADDRESS", "PEAK", "LIMIT"]).right_range(2..=3);
    for r in &report.rules {
        for c in &r.closest {
            near.row(vec![
                r.name.clone(),
                AddrText(&c.addr).to_string(),
                c.peak.to_string(),
                limit(&r.name).to_string(),
            ]);
        }
    }
    if !near.is_empty() {
        writeln!(
            out,
            "closest to the limit, not banned (at most {} per rule):",
            options.closest
        )?;
        writeln!(out, "{}", near.render())?;
    }
    for w in &warnings {
        writeln!(out, "warning: {w}")?;
    }
    let networks: u64 = report.rules.iter().map(|r| r.network_bans).sum();
    write!(
        out,
        "lines: {}  unparsed: {}  bans: {}{}",
        report.lines,
        report.unparsed,
        report.decisions.len() as u64 - networks,
        match networks {
            0 => String::new(),
            n => format!(" + {n} network"),
        }
    )?;
    if options.since_ms.is_some() || options.until_ms.is_some() {
        let now = fleetban::now_ms();
        let bound = |t: Option<i64>| t.map_or("-".to_owned(), |t| format!("{} ({})", local(t), relative(t, now)));
        write!(
            out,
            "  outside {} .. {} (not read): {}",
            bound(options.since_ms),
            bound(options.until_ms),
            report.outside
        )?;
    }
    if report.skipped_long > 0 {
        write!(
            out,
            "  longer than 64 KiB (skipped, as run does): {}",
            report.skipped_long
        )?;
    }
    writeln!(out)
}
