//! How `fleetban bans` writes what it read (docs/design.md §6): a table
//! for people (its columns widened page by page once the list streams)
//! ended by the count and, for a long list, its ends or its summary; or
//! JSON lines. Holds at most [`SORTED_UP_TO`] bans to sort, or the bans
//! ending last it keeps, never the list.

use std::io::Write;

use serde::Serialize;

use fleetban::addr::AddrText;
use fleetban::bans::{BanRecord, Span};
use fleetban::verdict::NeverBanned;

use super::summary::{ending, EndingLast, Summary};
use super::{Context, SORTED_UP_TO, TERMINAL_LIMIT};
use crate::commands::human::{local, relative, Table};

/// One line of `bans --json`, fields in this order (docs/design.md §6).
#[derive(Serialize)]
struct BanLine<'a> {
    addr: String,
    rule: &'a str,
    reason: &'a str,
    host: &'a str,
    /// RFC 3339; null when not known (Redis down: this host's view).
    since: Option<String>,
    /// RFC 3339; null for a permanent ban.
    until: Option<String>,
    /// Whole seconds left; null for a permanent ban.
    left_s: Option<i64>,
    count: u32,
    hits: u32,
    /// False: the daemon holds it but the kernel does not (yet); null
    /// when not known (read from Redis, not from the daemon).
    enforced: Option<bool>,
    /// Decided while Redis is down, not written to it yet (from the
    /// daemon's queue); absent otherwise.
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    queued: bool,
    /// The never-banned networks it holds or lies in (loopback, `allow:`,
    /// `proxies:`, this host's addresses): not dropped, whatever the ban
    /// says (`verdict::cover`).
    spared: Vec<String>,
}

/// How the bans are printed.
#[derive(Clone, Copy, PartialEq)]
pub enum Plan {
    /// Every ban: sorted oldest first while the list is short, then
    /// streamed.
    Every,
    /// This many of the bans ending last (shown oldest first), and the
    /// count and ends when there are more.
    Last(usize),
}

/// Writes the bans as the plan says, holding at most [`SORTED_UP_TO`]
/// rows (or the plan's bans ending last) at a time.
pub struct Printer<'a> {
    plan: Plan,
    json: bool,
    ctx: &'a Context,
    never: &'a NeverBanned,
    now: i64,
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    /// Entries read from the list, matching or not.
    pub total: u64,
    /// Over every matching ban.
    summary: Summary,
    /// `Plan::Every`: the bans held to sort, until there are too many;
    /// then those of the page being read.
    held: Vec<BanRecord>,
    /// `Plan::Every`: past [`SORTED_UP_TO`], written as they come.
    streaming: bool,
    /// `Plan::Last`: those ending last so far.
    last: EndingLast,
    /// Print the summary whatever the list's length.
    summary_asked: bool,
    /// The streamed table's column widths so far.
    widths: Vec<usize>,
    /// A write failed: stdout's reader is gone.
    pub closed: bool,
}

impl<'a> Printer<'a> {
    pub fn new(
        plan: Plan,
        json: bool,
        summary: bool,
        ctx: &'a Context,
        never: &'a NeverBanned,
        now: i64,
    ) -> Printer<'a> {
        Printer {
            plan,
            json,
            ctx,
            never,
            now,
            out: std::io::BufWriter::with_capacity(1 << 16, std::io::stdout().lock()),
            total: 0,
            summary: Summary::default(),
            held: Vec::new(),
            streaming: false,
            last: EndingLast::new(match plan {
                Plan::Last(n) => n,
                Plan::Every => 0,
            }),
            summary_asked: summary,
            widths: Vec::new(),
            closed: false,
        }
    }

    pub fn add(&mut self, r: BanRecord) {
        self.summary.add(&r);
        match self.plan {
            Plan::Last(_) => self.last.add(r),
            Plan::Every if self.streaming => self.held.push(r),
            Plan::Every => {
                self.held.push(r);
                if self.held.len() > SORTED_UP_TO {
                    self.streaming = true;
                    let held = std::mem::take(&mut self.held);
                    self.write(&held);
                }
            }
        }
    }

    /// A page was read: once streaming, its bans are written.
    pub fn page_done(&mut self) {
        if self.streaming {
            let held = std::mem::take(&mut self.held);
            self.write(&held);
        }
    }

    /// Writes `rows` as JSON lines or as table rows (the header first).
    fn write(&mut self, rows: &[BanRecord]) {
        if self.closed {
            return;
        }
        if self.json {
            for r in rows {
                if let Ok(line) = serde_json::to_string(&self.line(r)) {
                    self.closed |= writeln!(self.out, "{line}").is_err();
                }
            }
            return;
        }
        let mut t = table();
        for r in rows {
            t.row(self.cells(r));
        }
        let header = self.widths.is_empty();
        let text = t.render_with(&mut self.widths, header);
        self.closed |= write!(self.out, "{text}").is_err();
    }

    /// Writes what is held and the closing lines; how many bans matched.
    pub fn finish(mut self, filtered: bool) -> u64 {
        let shown = match self.plan {
            Plan::Every => {
                let held = std::mem::take(&mut self.held);
                if self.streaming {
                    self.write(&held);
                } else {
                    self.write_sorted(held);
                }
                self.summary.bans
            }
            Plan::Last(_) => {
                let last = std::mem::replace(&mut self.last, EndingLast::new(0)).into_vec();
                self.write_sorted(last)
            }
        };
        if !self.json {
            let matched = self.summary.bans;
            self.headline(filtered.then_some(self.total), matched, shown);
            if self.summary_asked || shown < matched || matched > TERMINAL_LIMIT as u64 {
                let text = self.summary.render(self.now);
                self.closed |= write!(self.out, "{text}").is_err();
            }
        }
        let _ = self.out.flush();
        self.summary.bans
    }

    /// Writes `rows` oldest first (as a short list is); how many.
    fn write_sorted(&mut self, mut rows: Vec<BanRecord>) -> u64 {
        rows.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.addr.cmp(&b.addr)));
        if !rows.is_empty() {
            self.write(&rows);
        }
        rows.len() as u64
    }

    /// `M active ban(s)` (`K of M active ban(s) match` when filtered from
    /// `of`), and what was left out.
    fn headline(&mut self, of: Option<u64>, matched: u64, shown: u64) {
        let mut line = match of {
            Some(total) => format!("{matched} of {total} active ban(s) match"),
            None => format!("{matched} active ban(s)"),
        };
        if shown == 0 && matched > 0 {
            line += "; list them with --all, --json or --limit N";
        } else if shown < matched {
            line += &format!("; the {shown} ending last shown (every one: --all or --json; another number: --limit N)");
        }
        self.closed |= writeln!(self.out, "{line}").is_err();
    }

    /// A long list seen without reading it: `last` (the bans ending last),
    /// then the count and ends of `span`.
    pub fn finish_span(mut self, span: Span, last: Vec<BanRecord>) {
        let shown = if self.json {
            let mut last = last;
            last.sort_by(|a, b| a.since.cmp(&b.since).then_with(|| a.addr.cmp(&b.addr)));
            self.write(&last);
            last.len() as u64
        } else {
            self.write_sorted(last)
        };
        if !self.json {
            self.headline(None, span.active, shown);
            let text = ending(span.soonest, span.latest, span.permanent, self.now)
                + "  kinds, rules and hosts: --summary (reads every ban's record)\n";
            self.closed |= write!(self.out, "{text}").is_err();
        }
        let _ = self.out.flush();
    }

    fn enforced(&self, r: &BanRecord) -> Option<bool> {
        self.ctx
            .not_enforced
            .as_ref()
            .map(|n| !n.contains(&AddrText(&r.addr).to_string()))
    }

    fn queued(&self, r: &BanRecord) -> bool {
        !self.ctx.queued.is_empty() && self.ctx.queued.contains(&AddrText(&r.addr).to_string())
    }

    fn line<'r>(&self, r: &'r BanRecord) -> BanLine<'r> {
        BanLine {
            addr: AddrText(&r.addr).to_string(),
            rule: &r.rule,
            reason: &r.reason,
            host: &r.host,
            since: (r.since > 0).then(|| fleetban::rfc3339(r.since)),
            until: r.until.map(fleetban::rfc3339),
            left_s: r.until.map(|t| (t - self.now).max(0) / 1000),
            count: r.count,
            hits: r.hits,
            enforced: self.enforced(r),
            queued: self.queued(r),
            spared: self
                .never
                .overlapping(&r.addr)
                .map(|w| AddrText(&w.net).to_string())
                .collect(),
        }
    }

    fn cells(&self, r: &BanRecord) -> Vec<String> {
        let mut addr = AddrText(&r.addr).to_string();
        if self.enforced(r) == Some(false) {
            addr += " (not enforced)";
        }
        if self.queued(r) {
            addr += " (queued)";
        }
        let spared: Vec<fleetban::verdict::Why> = self.never.overlapping(&r.addr).collect();
        match (self.never.holding(&r.addr), spared.as_slice()) {
            (_, []) => {}
            (Some(w), _) => addr += &format!(" (never banned: {w})"),
            (None, some) => {
                let nets: Vec<String> = some.iter().map(|w| AddrText(&w.net).to_string()).collect();
                addr += &format!(" (sparing {})", nets.join(", "));
            }
        }
        let or_unknown = |s: &str| if s.is_empty() { "?".to_owned() } else { s.to_owned() };
        vec![
            addr,
            or_unknown(&r.rule),
            if r.since > 0 { local(r.since) } else { "-".to_owned() },
            r.until.map_or("forever".to_owned(), local),
            r.until.map_or("-".to_owned(), |u| relative(u, self.now)),
            r.count.to_string(),
            or_unknown(&r.host),
            r.reason.clone(),
        ]
    }
}

fn table() -> Table {
    Table::new(&["ADDRESS", "RULE", "SINCE", "UNTIL", "LEFT", "COUNT", "HOST", "REASON"]).right(5)
}

/// On stderr (the JSON lines stay JSON): the bans are this host's view.
/// Queued bans are not in Redis.
pub fn local_view_note(ctx: &Context, listed: u64) {
    let others = listed.saturating_sub(ctx.queued.len() as u64);
    let mut said = "Redis is down: these are the bans this host enforces, from its daemon".to_owned();
    if !ctx.queued.is_empty() {
        said += &format!(
            "; {} decided while it is down, queued: written to Redis when it answers",
            ctx.queued.len()
        );
    }
    if others > 0 {
        said += &format!(
            "; {} from before, whose rule, reason, start and offence count are in Redis",
            others
        );
    }
    eprintln!("{said}");
}
