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

mod print;
mod summary;

use std::io::IsTerminal;
use std::path::Path;

use ipnet::IpNet;

use fleetban::bans::{BanList, BanRecord, Cursor};
use fleetban::config::Config;
use fleetban::control::{Client, Request, Response};
use fleetban::verdict::NeverBanned;

use super::list::target;
use super::{failed, load_for_cli, runtime, Failure, Outcome};
use print::{local_view_note, Plan, Printer};

/// On a terminal, without `--all`, `--limit` or `--json`: past this many
/// bans, this many of those ending last, and the list's count and ends.
pub const TERMINAL_LIMIT: usize = 1000;

/// A list printed whole is sorted oldest first up to this many bans;
/// past it, it streams in the list's order (ending soonest first), so that
/// memory stays bounded.
pub(super) const SORTED_UP_TO: usize = 10_000;

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

/// A page read: how many entries, and the bans of those that may match.
type Page = (usize, Vec<BanRecord>);

/// Where the bans come from.
enum Source {
    /// The fleet's list, read a page ahead by a task of its own (Redis
    /// answers the next page while this one is printed), at most
    /// [`AHEAD`] pages waiting.
    Redis(tokio::sync::mpsc::Receiver<Result<Page, fleetban::bans::BanListError>>),
    /// The daemon's answer or the list it saved, whole (taken once).
    Whole(Option<Vec<BanRecord>>),
}

/// Pages read ahead of the printing.
const AHEAD: usize = 2;

impl Source {
    /// Reads the rest of the list from `cursor` on a task of its own; the
    /// pages' entries outside `within` have no record read.
    fn ahead(mut list: BanList, mut cursor: Cursor, within: Option<IpNet>) -> Source {
        let (tx, rx) = tokio::sync::mpsc::channel(AHEAD);
        tokio::spawn(async move {
            loop {
                let page = list
                    .records_page(&mut cursor, |n| within.is_none_or(|w| w.contains(n)))
                    .await;
                let last = !matches!(page, Ok(Some(_)));
                let sent = match page {
                    Ok(Some(p)) => tx.send(Ok(p)).await,
                    Ok(None) => return,
                    Err(e) => tx.send(Err(e)).await,
                };
                // The reader went (a closed pipe) or the read ended.
                if sent.is_err() || last {
                    return;
                }
            }
        });
        Source::Redis(rx)
    }

    /// The next page: how many entries it read, and those that match.
    async fn next(&mut self, f: &Filter) -> Result<Option<Page>, Failure> {
        let page = match self {
            Source::Redis(rx) => rx.recv().await.transpose().map_err(failed)?,
            Source::Whole(w) => w.take().map(|all| (all.len(), all)),
        };
        Ok(page.map(|(n, page)| (n, page.into_iter().filter(|r| f.record(r)).collect())))
    }
}

/// What the daemon said beside its bans.
#[derive(Default)]
pub struct Context {
    /// The bans the kernel does not hold (None: read from Redis).
    pub(super) not_enforced: Option<Vec<String>>,
    /// Redis is down: this host's view.
    pub(super) local_view: bool,
    /// Bans decided while Redis is down, queued.
    pub(super) queued: Vec<String>,
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
async fn open(config: &Config, now: i64, f: &Filter) -> Result<(Source, Option<Page>, Context), Failure> {
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
                    Ok((Source::ahead(list, cursor, f.within), first, Context::default()))
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
