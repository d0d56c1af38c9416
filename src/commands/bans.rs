//! `fleetban bans`: the fleet's active bans, from Redis when the
//! configuration names it (read a page at a time: one page of records in
//! memory however long the list), from the daemon otherwise and while
//! Redis is down, from the list it saved when it is stopped.
//!
//! What is printed depends on the list's length and where it goes
//! (docs/design.md §6): a short list whole, oldest first; on a terminal a
//! list past [`TERMINAL_LIMIT`] (or `--limit N`) as the bans ending last
//! and its count and ends, found without reading the list (`--summary`,
//! or a filter, reads every record for the counts by kind, rule and host);
//! `--all`, `--json` and a pipe every ban, streamed in the list's order
//! once past [`SORTED_UP_TO`].

mod summary;

use std::io::{IsTerminal, Write};
use std::path::Path;

use ipnet::IpNet;
use serde::Serialize;

use fleetban::addr::AddrText;
use fleetban::bans::{BanList, BanRecord, Cursor, Span};
use fleetban::config::Config;
use fleetban::control::{Client, Request, Response};
use fleetban::verdict::NeverBanned;

use super::human::{local, relative, Table};
use super::list::target;
use super::{failed, load_for_cli, runtime, Failure, Outcome};
use summary::{ending, EndingLast, Summary};

/// On a terminal, without `--all`, `--limit` or `--json`: past this many
/// bans, this many of those ending last, and the list's count and ends.
pub const TERMINAL_LIMIT: usize = 1000;

/// A list printed whole is sorted oldest first up to this many bans;
/// past it, it streams in the list's order (ending soonest first), so that
/// memory stays bounded.
const SORTED_UP_TO: usize = 10_000;

/// Entries per page read from Redis.
const PAGE: usize = 4096;

pub struct BansArgs {
    /// JSON Lines, every ban (the `limit` ending last with `--limit`).
    pub json: bool,
    /// Every ban, even on a terminal.
    pub all: bool,
    /// This many of the bans ending last, with the count and ends when
    /// there are more.
    pub limit: Option<usize>,
    /// Every record read for the counts by kind, rule and host.
    pub summary: bool,
    /// Only bans of these rules (any of them).
    pub rules: Vec<String>,
    /// Only bans decided by these hosts (any of them).
    pub hosts: Vec<String>,
    /// Only bans of this address or network or inside it.
    pub within: Option<String>,
}

/// Which bans the operator asked for.
struct Filter {
    rules: Vec<String>,
    hosts: Vec<String>,
    within: Option<IpNet>,
}

impl Filter {
    fn any(&self) -> bool {
        !self.rules.is_empty() || !self.hosts.is_empty() || self.within.is_some()
    }

    /// Whether a ban of `net` may match: decided before its record is read.
    fn net(&self, net: &IpNet) -> bool {
        self.within.is_none_or(|w| w.contains(net))
    }

    fn record(&self, r: &BanRecord) -> bool {
        self.net(&r.addr)
            && (self.rules.is_empty() || self.rules.contains(&r.rule))
            && (self.hosts.is_empty() || self.hosts.contains(&r.host))
    }
}

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

/// Where the bans come from.
enum Source {
    /// The fleet's list, a page at a time.
    Redis { list: Box<BanList>, cursor: Cursor },
    /// The daemon's answer or the list it saved, whole (taken once).
    Whole(Option<Vec<BanRecord>>),
}

impl Source {
    /// The next page: how many entries it read, and those that match.
    async fn next(&mut self, f: &Filter) -> Result<Option<(usize, Vec<BanRecord>)>, Failure> {
        match self {
            Source::Redis { list, cursor } => list.records_page(cursor, |n| f.net(n)).await.map_err(failed),
            Source::Whole(w) => Ok(w.take().map(|all| (all.len(), all))),
        }
        .map(|p| p.map(|(n, page)| (n, page.into_iter().filter(|r| f.record(r)).collect())))
    }
}

/// What the daemon said beside its bans.
#[derive(Default)]
struct Context {
    /// The bans the kernel does not hold (None: read from Redis).
    not_enforced: Option<Vec<String>>,
    /// Redis is down: this host's view.
    local_view: bool,
    /// Bans decided while Redis is down, queued.
    queued: Vec<String>,
}

fn from_daemon(config: &Config) -> Result<(Vec<BanRecord>, Context), Failure> {
    match Client::new(&config.control).call(&Request::Bans).map_err(failed)? {
        Response::Bans {
            bans,
            not_enforced,
            local,
            queued,
        } => Ok((
            bans,
            Context {
                not_enforced: Some(not_enforced),
                local_view: local,
                queued,
            },
        )),
        other => Err(Failure::Runtime(anyhow::anyhow!(
            "bad answer from the daemon: {other:?}"
        ))),
    }
}

/// The source and its first page: Redis (the daemon when Redis is down),
/// or the daemon (the list it saved when it is stopped).
async fn open(
    config: &Config,
    now: i64,
    f: &Filter,
) -> Result<(Source, Option<(usize, Vec<BanRecord>)>, Context), Failure> {
    let whole = |(records, ctx): (Vec<BanRecord>, Context)| async {
        let mut s = Source::Whole(Some(records));
        let first = s.next(f).await?;
        Ok((s, first, ctx))
    };
    match &config.redis {
        Some(r) => {
            let first = async {
                let mut list = BanList::connect(r).await.map_err(fleetban::bans::BanListError::from)?;
                let mut cursor = Cursor::new(now, PAGE);
                let first = list.records_page(&mut cursor, |n| f.net(n)).await?;
                Ok::<_, fleetban::bans::BanListError>((list, cursor, first))
            };
            match first.await {
                Ok((list, cursor, first)) => {
                    let first = first.map(|(n, page)| (n, page.into_iter().filter(|r| f.record(r)).collect()));
                    Ok((
                        Source::Redis {
                            list: Box::new(list),
                            cursor,
                        },
                        first,
                        Context::default(),
                    ))
                }
                Err(e) if e.is_outage() => {
                    eprintln!(
                        "Redis {} is down ({e}); asking the daemon for the bans this host enforces.",
                        r.url
                    );
                    let answer = from_daemon(config).map_err(|d| {
                        Failure::Runtime(anyhow::anyhow!(
                            "Redis is down ({e}) and the daemon could not answer ({})",
                            match d {
                                Failure::Runtime(e) => super::once(&e),
                                Failure::Usage(m) => m,
                                Failure::Config(c) => c.to_string(),
                            }
                        ))
                    })?;
                    whole(answer).await
                }
                Err(e) => Err(failed(e)),
            }
        }
        // A single host whose daemon is stopped: the list it saved.
        None => match Client::new(&config.control).call(&Request::Bans) {
            Err(e) if e.not_running() => {
                let saved = super::saved_list(config, &e)?.records(now).await.map_err(failed)?;
                whole((saved, Context::default())).await
            }
            Err(e) => Err(failed(e)),
            Ok(Response::Bans {
                bans,
                not_enforced,
                local,
                queued,
            }) => {
                whole((
                    bans,
                    Context {
                        not_enforced: Some(not_enforced),
                        local_view: local,
                        queued,
                    },
                ))
                .await
            }
            Ok(other) => Err(Failure::Runtime(anyhow::anyhow!(
                "bad answer from the daemon: {other:?}"
            ))),
        },
    }
}

/// How the bans are printed.
#[derive(Clone, Copy, PartialEq)]
enum Plan {
    /// Every ban: sorted oldest first while the list is short, then
    /// streamed.
    Every,
    /// This many of the bans ending last (shown oldest first), and the
    /// count and ends when there are more.
    Last(usize),
}

pub fn bans(path: &Path, args: &BansArgs) -> Outcome {
    let config = load_for_cli(path)?;
    let filter = Filter {
        rules: args.rules.clone(),
        hosts: args.hosts.clone(),
        within: args.within.as_deref().map(target).transpose()?,
    };
    let plan = match args.limit {
        _ if args.all => Plan::Every,
        Some(n) => Plan::Last(n),
        None if args.json || !std::io::stdout().is_terminal() => Plan::Every,
        None => Plan::Last(TERMINAL_LIMIT),
    };
    let now = fleetban::now_ms();
    // What each ban spares: the same set the daemon cuts its bans around.
    let never = NeverBanned::new(
        &config.allow,
        &config.proxies,
        &fleetban::verdict::never::local_addresses(),
    );
    runtime().block_on(async {
        // A long list on a terminal: its count, ends and the bans ending
        // last, without reading it (a short one is read and printed whole).
        if let (Plan::Last(n), false, false, Some(r)) = (plan, args.summary, filter.any(), &config.redis) {
            let seen = async {
                let mut list = BanList::connect(r).await.map_err(fleetban::bans::BanListError::from)?;
                let span = list.span(now).await?;
                if span.active <= n as u64 {
                    return Ok(None);
                }
                let last = list.ending_last(now, n).await?;
                Ok::<_, fleetban::bans::BanListError>(Some((span, last)))
            };
            match seen.await {
                Ok(Some((span, last))) => {
                    let ctx = Context::default();
                    Printer::new(plan, args.json, args.summary, &ctx, &never, now).finish_span(span, last);
                    return Ok(());
                }
                // Short, or Redis down (the read below asks the daemon).
                Ok(None) => {}
                Err(e) if e.is_outage() => {}
                Err(e) => return Err(failed(e)),
            }
        }
        let (mut source, first, ctx) = open(&config, now, &filter).await?;
        let mut p = Printer::new(plan, args.json, args.summary, &ctx, &never, now);
        let mut page = first;
        while let Some((n, bans)) = page {
            p.total += n as u64;
            for r in bans {
                p.add(r);
            }
            p.page_done();
            // The reader went (`| head`): nothing more to read for it.
            if p.closed {
                return Ok(());
            }
            page = source.next(&filter).await?;
        }
        let listed = p.finish(filter.any());
        if ctx.local_view {
            local_view_note(&ctx, listed);
        }
        Ok(())
    })
}

/// Writes the bans as the plan says, holding at most [`SORTED_UP_TO`]
/// rows (or the plan's bans ending last) at a time.
struct Printer<'a> {
    plan: Plan,
    json: bool,
    ctx: &'a Context,
    never: &'a NeverBanned,
    now: i64,
    out: std::io::BufWriter<std::io::StdoutLock<'static>>,
    /// Entries read from the list, matching or not.
    total: u64,
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
    closed: bool,
}

impl<'a> Printer<'a> {
    fn new(plan: Plan, json: bool, summary: bool, ctx: &'a Context, never: &'a NeverBanned, now: i64) -> Printer<'a> {
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

    fn add(&mut self, r: BanRecord) {
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
    fn page_done(&mut self) {
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
    fn finish(mut self, filtered: bool) -> u64 {
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
    fn finish_span(mut self, span: Span, last: Vec<BanRecord>) {
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
fn local_view_note(ctx: &Context, listed: u64) {
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
