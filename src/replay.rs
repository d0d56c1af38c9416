//! `fleetban test`: replays log files through the rules with log time and the
//! embedded store, exactly as docs/design.md §2 defines the decisions: hits
//! in log order, one at a time, a banned client's hits not counted. It is
//! the reference the daemon's batched path is compared with. It reads lines
//! as the daemon does (`source::read_file`, `detect::Scanner` in
//! `Mode::Replay`) and bans through the same owner (`bans::Bans`). Which
//! rules read which file is `inputs.rs`'s; what is printed of the lines
//! (`--print`) and the bans goes to the caller as [`Event`]s, in log order,
//! while the replay runs.

mod inputs;

use std::path::{Path, PathBuf};

use ipnet::IpNet;

pub use inputs::{of_args, of_rules, Input, Inputs};

use crate::bans::{BanList, BanRequest, Bans, Mode};
use crate::config::Rule;
use crate::detect::{self, Hit, Plan, Scanner, Sink};
use crate::enforce::Changes;
use crate::limit::{MemoryLimiter, RuleLimit, Verdict};
use crate::source::ReadError;
use crate::verdict::NeverBanned;

/// One ban decided by the replay.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Decision {
    pub addr: IpNet,
    pub rule: String,
    /// Log time of the hit that crossed the limit.
    pub at_ms: i64,
    pub until_ms: Option<i64>,
    /// Hits in the window counting the one that crossed (limit + 1).
    pub hits: u32,
    /// The file of that hit's line (an index into [`Report::files`]) and
    /// its line number there (from 1, after decompression).
    pub file: usize,
    pub line: u64,
    /// A network's ban triggered by its banned addresses
    /// (`escalate_network:`): what triggered it; empty otherwise.
    pub reason: String,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleStats {
    pub name: String,
    /// Lines it read (of the files routed to it).
    pub lines: u64,
    /// Of those, the lines its format could not parse.
    pub unparsed: u64,
    pub matched: u64,
    /// Its bans of the clients it counts (as `status` counts a rule's).
    pub bans: u64,
    /// The networks its bans escalated to (`escalate_network:`), apart.
    pub network_bans: u64,
    /// The clients never banned by this rule whose window came closest to
    /// its limit, fullest first (at most [`Options::closest`]): what
    /// learning mode looks at to choose a limit (the banned ones are the
    /// ban decisions).
    pub closest: Vec<Closest>,
}

/// How many clients per rule [`RuleStats::closest`] keeps by default.
pub const CLOSEST: usize = 10;

/// One client's fullest window under one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closest {
    pub addr: IpNet,
    /// Most hits its window held at once.
    pub peak: u32,
}

/// One file read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FileStats {
    pub path: PathBuf,
    /// The rules that read it (indexes into the rules).
    pub rules: Vec<usize>,
    /// Whether a rule's `logs:` names it (else every rule read it).
    pub named: bool,
    pub gzip: bool,
    pub lines: u64,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    /// Lines read, each counted once whatever the number of rules reading it.
    pub lines: u64,
    /// Lines that no rule reading them could parse.
    pub unparsed: u64,
    /// Lines longer than [`crate::source::MAX_LINE`], skipped as `run` skips them.
    pub skipped_long: u64,
    /// Lines dated outside `--since`/`--until`: not read.
    pub outside: u64,
    /// Lines without a newline at the end of a file are still read.
    pub rules: Vec<RuleStats>,
    pub files: Vec<FileStats>,
    pub decisions: Vec<Decision>,
}

/// Which lines the caller is shown as [`Event::Line`] (`--print`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Print {
    pub unparsed: bool,
    pub matched: bool,
    pub banned: bool,
}

impl Print {
    pub fn any(self) -> bool {
        self.unparsed || self.matched || self.banned
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Kind {
    /// No rule reading it could parse it.
    Unparsed,
    /// A rule's filter accepted it (counted or not).
    Matched,
    /// Its hit crossed a rule's limit.
    Banned,
}

/// What the replay tells its caller as it goes, in log order.
pub enum Event<'a> {
    Line {
        kind: Kind,
        file: &'a Path,
        /// From 1, in the file after decompression.
        line: u64,
        /// For `Matched` and `Banned`: the rule.
        rule: Option<&'a str>,
        text: &'a [u8],
    },
    Ban {
        decision: &'a Decision,
        file: &'a Path,
    },
    /// After each chunk read: how far the replay is (`fleetban test`'s
    /// progress line).
    Progress {
        /// The input being read (an index into the inputs).
        file: usize,
        /// Of that input, the bytes read as stored (compressed for gzip).
        bytes: u64,
        /// Lines read so far, every file.
        lines: u64,
    },
}

#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Options {
    /// Log times read: `[since, until)`.
    pub since_ms: Option<i64>,
    pub until_ms: Option<i64>,
    pub print: Print,
    /// How many clients per rule [`RuleStats::closest`] keeps.
    pub closest: usize,
}

impl Default for Options {
    fn default() -> Self {
        Options {
            since_ms: None,
            until_ms: None,
            print: Print::default(),
            closest: CLOSEST,
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum ReplayError {
    #[error(transparent)]
    Read(#[from] ReadError),
    #[error("{0}")]
    Format(String),
}

/// Replays `inputs` (in order, each through its rules) through `rules`;
/// `never` is never counted, `proxies` name the client in forwarded lists.
pub fn replay(
    rules: &[Rule],
    inputs: &[Input],
    never: &NeverBanned,
    proxies: &[ipnet::IpNet],
    ipv6_prefix: u8,
    options: &Options,
    mut events: impl FnMut(Event<'_>),
) -> Result<Report, ReplayError> {
    let plan = Plan::new(rules, proxies).map_err(|e| ReplayError::Format(e.to_string()))?;
    let mut scanner = Scanner::new(
        detect::Mode::Replay,
        plan,
        std::sync::Arc::new(never.clone()),
        ipv6_prefix,
    );
    scanner.set_bounds(options.since_ms, options.until_ms);
    let wall = crate::now_ms();
    // Every rule takes its hits' log time: `clock: redis` has no server to
    // ask in a replay (docs/design.md §2, "Time out of order").
    let limits = RuleLimit::of(rules)
        .into_iter()
        .map(|l| RuleLimit {
            clock: crate::config::Clock::Log,
            ..l
        })
        .collect();
    let mut r = Replay {
        rules,
        limiter: MemoryLimiter::new(limits),
        bans: Bans::new(BanList::memory(None), "replay", Changes::default()),
        wall,
        peaks: (0..rules.len()).map(|_| Default::default()).collect(),
        print: options.print,
        pending: Vec::new(),
        file: 0,
        report: Report {
            rules: rules
                .iter()
                .map(|r| RuleStats {
                    name: r.name.clone(),
                    ..Default::default()
                })
                .collect(),
            ..Default::default()
        },
    };
    for (i, input) in inputs.iter().enumerate() {
        let origin = detect::origin_seed("replay", &[i as u64]);
        scanner.route(input.path.as_path().into(), &input.rules);
        r.file = i;
        r.report.files.push(FileStats {
            path: input.path.clone(),
            rules: input.rules.clone(),
            named: input.named,
            ..Default::default()
        });
        // Line numbers: the lines of the chunks before, long ones included.
        let mut before = 0u64;
        let framer = input
            .rules
            .iter()
            .any(|&ri| rules[ri].format == crate::parse::Format::NginxError)
            .then_some(crate::parse::split_records as crate::source::Framer);
        let gzip = crate::source::read_file(&input.path, framer, |chunk, bytes| {
            let seen = scanner.scan(chunk, origin, wall, &mut r);
            r.report.lines += seen.lines;
            r.report.unparsed += seen.unparsed;
            r.report.outside += seen.outside;
            r.report.skipped_long += chunk.skipped_long;
            r.report.files[i].lines += seen.lines;
            r.tell(chunk, before, &input.path, &mut events);
            before += chunk.lines + chunk.skipped_long;
            events(Event::Progress {
                file: i,
                bytes,
                lines: r.report.lines,
            });
        })?;
        r.report.files[i].gzip = gzip;
    }
    for (stats, count) in r.report.rules.iter_mut().zip(scanner.take_counts()) {
        stats.matched = count.matched;
        stats.lines = count.lines;
        stats.unparsed = count.unparsed;
    }
    for (stats, peaks) in r.report.rules.iter_mut().zip(&r.peaks) {
        stats.closest = closest(peaks, options.closest);
    }
    Ok(r.report)
}

/// The `n` clients never banned with the fullest windows, fullest first.
fn closest(peaks: &foldhash::HashMap<IpNet, (u32, bool)>, n: usize) -> Vec<Closest> {
    let mut all: Vec<Closest> = peaks
        .iter()
        .filter(|(_, &(_, banned))| !banned)
        .map(|(addr, &(peak, _))| Closest { addr: *addr, peak })
        .collect();
    // A total order (peak down, then address): selecting the first n then
    // sorting them gives what sorting all of them gave, without sorting
    // every client of a large log (callgrind: 4%).
    let order = |a: &Closest, b: &Closest| b.peak.cmp(&a.peak).then(a.addr.cmp(&b.addr));
    if all.len() > n {
        all.select_nth_unstable_by(n, order);
        all.truncate(n);
    }
    all.sort_by(order);
    all
}

/// What happened at one line of the chunk being read, told after it.
#[derive(Clone, Copy, Debug)]
enum Pending {
    Unparsed,
    Matched(usize),
    /// An index into the decisions.
    Ban(usize),
}

/// The replay's sink: each hit decided at once, in log order, by the
/// embedded store; a crossing is banned before the next hit is read.
struct Replay<'a> {
    rules: &'a [Rule],
    limiter: MemoryLimiter,
    bans: Bans,
    /// The limiter's wall clock (key expiry): the replay's start, so no key
    /// expires during a replay.
    wall: i64,
    /// Per rule: each client's fullest window and whether it was banned.
    peaks: Vec<foldhash::HashMap<IpNet, (u32, bool)>>,
    print: Print,
    /// This chunk's events by line offset, in order: told with their line
    /// numbers and text once the chunk is read.
    pending: Vec<(u64, Pending)>,
    /// The file being read (an index into the report's files).
    file: usize,
    report: Report,
}

impl Sink for Replay<'_> {
    fn is_banned(&self, key: &IpNet, time_ms: i64) -> bool {
        self.bans.is_banned(key, time_ms)
    }

    fn hit(&mut self, rule: usize, key: IpNet, hit: Hit) {
        let (peak, over) = match self.limiter.check(rule, key, &[hit], self.wall) {
            Verdict::Over { count, .. } => (count + 1, true),
            Verdict::Under { count } => (count, false),
        };
        let p = self.peaks[rule].entry(key).or_insert((0, false));
        p.0 = p.0.max(peak);
        p.1 |= over;
        if over {
            self.decide(rule, key, hit, peak);
        }
    }

    fn unparsed(&mut self, offset: u64) {
        if self.print.unparsed {
            self.pending.push((offset, Pending::Unparsed));
        }
    }

    fn matched(&mut self, rule: usize, offset: u64) {
        if self.print.matched {
            self.pending.push((offset, Pending::Matched(rule)));
        }
    }
}

impl Replay<'_> {
    fn decide(&mut self, rule: usize, key: IpNet, hit: Hit, hits: u32) {
        let req = BanRequest {
            addr: key,
            rule: self.rules[rule].name.clone(),
            reason: String::new(),
            host: "replay".into(),
            hits,
            mode: Mode::Auto(self.rules[rule].ban),
        };
        if let Some((rec, network)) = self.bans.ban_embedded(&req, hit.time_ms) {
            self.report.rules[rule].bans += 1;
            self.pending
                .push((hit.offset, Pending::Ban(self.report.decisions.len())));
            self.report.decisions.push(Decision {
                addr: key,
                rule: req.rule,
                at_ms: hit.time_ms,
                until_ms: rec.until,
                hits,
                file: self.file,
                // Filled in by `tell`.
                line: 0,
                reason: String::new(),
            });
            // `escalate_network:`: the network, at the same line.
            if let Some(net) = network {
                self.report.rules[rule].network_bans += 1;
                self.pending
                    .push((hit.offset, Pending::Ban(self.report.decisions.len())));
                self.report.decisions.push(Decision {
                    addr: net.addr,
                    rule: net.rule,
                    at_ms: hit.time_ms,
                    until_ms: net.until,
                    hits: 0,
                    file: self.file,
                    line: 0,
                    reason: net.reason,
                });
            }
        }
    }

    /// Tells the chunk's pending events with their line numbers (`before`:
    /// the file's lines before the chunk) and text.
    fn tell(&mut self, chunk: &crate::source::Chunk, before: u64, file: &Path, events: &mut impl FnMut(Event<'_>)) {
        if self.pending.is_empty() {
            return;
        }
        let mut pending = std::mem::take(&mut self.pending);
        let mut next = 0;
        for (n, (offset, text)) in chunk.lines().enumerate() {
            while let Some(&(_, what)) = pending.get(next).filter(|&&(o, _)| o == offset) {
                next += 1;
                let line = before + n as u64 + 1;
                let (kind, rule) = match what {
                    Pending::Unparsed => (Kind::Unparsed, None),
                    Pending::Matched(r) => (Kind::Matched, Some(r)),
                    Pending::Ban(d) => {
                        self.report.decisions[d].line = line;
                        let d = &self.report.decisions[d];
                        if self.print.banned {
                            let rule = Some(d.rule.as_str());
                            events(Event::Line {
                                kind: Kind::Banned,
                                file,
                                line,
                                rule,
                                text,
                            });
                        }
                        events(Event::Ban { decision: d, file });
                        continue;
                    }
                };
                let rule = rule.map(|r| self.rules[r].name.as_str());
                events(Event::Line {
                    kind,
                    file,
                    line,
                    rule,
                    text,
                });
            }
            if next == pending.len() {
                break;
            }
        }
        // Kept: no allocation per chunk.
        pending.clear();
        self.pending = pending;
    }
}
