//! `fleetban test`: the offline replay (`fleetban::replay`) and its report,
//! for people or as JSON Lines.

use std::collections::BTreeMap;
use std::io::Write;
use std::path::{Path, PathBuf};

use anyhow::Context;
use fleetban::addr::AddrText;
use fleetban::detect::AllowList;
use fleetban::replay::Report;
use serde::Serialize;

use super::{load, Failure, Outcome};

// The JSON lines' fields are in the order they have always been printed in.

/// One line per ban decided.
#[derive(Serialize)]
struct BanLine<'a> {
    addr: String,
    at: String,
    event: &'static str,
    hits: u32,
    rule: &'a str,
    until: Option<String>,
}

/// The last line.
#[derive(Serialize)]
struct SummaryLine {
    event: &'static str,
    lines: u64,
    rules: BTreeMap<String, RuleLine>,
    skipped_long: u64,
    unparsed: u64,
}

#[derive(Serialize)]
struct RuleLine {
    bans: u64,
    closest: Vec<ClosestLine>,
    matched: u64,
}

#[derive(Serialize)]
struct ClosestLine {
    addr: String,
    peak: u32,
}

pub fn test(path: &Path, rule: Option<&str>, json: bool, logs: &[PathBuf]) -> Outcome {
    let mut config = load(path)?;
    if let Some(name) = rule {
        config.rules.retain(|r| r.name == name);
        if config.rules.is_empty() {
            return Err(Failure::Usage(format!("no rule named `{name}`")));
        }
    }
    let files: Vec<&Path> = logs.iter().map(PathBuf::as_path).collect();
    let allow = AllowList::fleet(&config.never_banned());
    let report = fleetban::replay::replay(&config.rules, &files, &allow, &config.proxies, config.ipv6_prefix)
        .context("reading logs")?;
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    let written = if json {
        print_json(&mut out, &report)
    } else {
        let limit = |name: &str| config.rules.iter().find(|c| c.name == name).map_or(0, |c| c.limit.hits);
        print_human(&mut out, &report, limit)
    }
    .and_then(|()| out.flush());
    match written {
        // A reader that stopped early (`| head`) is no failure.
        Err(e) if e.kind() != std::io::ErrorKind::BrokenPipe => {
            Err(anyhow::Error::new(e).context("writing the report").into())
        }
        _ => Ok(()),
    }
}

fn print_json(out: &mut impl Write, report: &Report) -> std::io::Result<()> {
    for d in &report.decisions {
        let line = BanLine {
            addr: AddrText(&d.addr).to_string(),
            at: fleetban::rfc3339(d.at_ms),
            event: "ban",
            hits: d.hits,
            rule: &d.rule,
            until: d.until_ms.map(fleetban::rfc3339),
        };
        writeln!(out, "{}", serde_json::to_string(&line)?)?;
    }
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
                matched: r.matched,
            };
            (r.name.clone(), line)
        })
        .collect();
    let summary = SummaryLine {
        event: "summary",
        lines: report.lines,
        rules,
        skipped_long: report.skipped_long,
        unparsed: report.unparsed,
    };
    writeln!(out, "{}", serde_json::to_string(&summary)?)
}

fn print_human(out: &mut impl Write, report: &Report, limit: impl Fn(&str) -> u32) -> std::io::Result<()> {
    write!(out, "lines: {}  unparsed: {}", report.lines, report.unparsed)?;
    if report.skipped_long > 0 {
        write!(
            out,
            "  longer than 64 KiB (skipped, as run does): {}",
            report.skipped_long
        )?;
    }
    writeln!(out)?;
    for r in &report.rules {
        writeln!(out, "rule {}: {} matched, {} ban(s)", r.name, r.matched, r.bans)?;
        if !r.closest.is_empty() {
            let limit = limit(&r.name);
            let top: Vec<String> = r
                .closest
                .iter()
                .map(|c| format!("{} {}/{limit}", AddrText(&c.addr), c.peak))
                .collect();
            writeln!(out, "  closest to the limit, not banned: {}", top.join(", "))?;
        }
    }
    for d in &report.decisions {
        writeln!(
            out,
            "ban {} by {} at {} until {} ({} hits)",
            AddrText(&d.addr),
            d.rule,
            fleetban::rfc3339(d.at_ms),
            d.until_ms.map_or("forever".to_owned(), fleetban::rfc3339),
            d.hits
        )?;
    }
    Ok(())
}
