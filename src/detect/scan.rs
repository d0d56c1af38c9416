//! The one per-line loop, of `fleetban run` and `fleetban test` alike: each
//! line of a chunk is parsed once per format group, its client checked
//! against the allow list and keyed ([`crate::addr::client_key`]), and for
//! each rule whose filter accepts the request, a [`Hit`] goes to a [`Sink`]
//! unless the client is banned at the hit's time. Where the two commands
//! differ is [`Mode`], stated once here. The hot path: no allocation per
//! line, no lock, no I/O.

use std::collections::HashMap;
use std::path::Path;
use std::sync::Arc;

use ipnet::IpNet;

use super::{Group, Hit, Plan};
use crate::config::Clock;
use crate::source::Chunk;
use crate::verdict::NeverBanned;

/// Where `fleetban run` and `fleetban test` read lines differently.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Mode {
    /// `fleetban run`: a file is read by the rules that name it; each rule
    /// takes its time from its `clock`; a hit older than its rule's window
    /// at arrival cannot end any current window: counted as stale, skipped.
    /// A line dated more than [`FUTURE_SKEW_MS`] after the wall clock was
    /// written at the latest when it was read: counted at the wall clock,
    /// and as `future`.
    Live,
    /// `fleetban test`: a file is read by the rules it was routed to
    /// ([`Scanner::route`]; by every rule when it was not), with log time
    /// (wall time for a line without one), and nothing is stale; a line
    /// dated outside [`Scanner::set_bounds`] is skipped.
    Replay,
}

/// How far a line's time may be ahead of the wall clock in [`Mode::Live`]
/// before it is taken for a wrong clock (docs/design.md §2, "Time out of
/// order"): nginx writes `$time_local` in whole seconds, at the latest when
/// the line is read.
pub const FUTURE_SKEW_MS: i64 = 5_000;

/// Where hits go.
pub trait Sink {
    /// Whether `key` is banned at `time_ms`: its hit is then not counted.
    fn is_banned(&self, key: &IpNet, time_ms: i64) -> bool;
    /// One counted hit of rule `rule` (an index into the rules).
    fn hit(&mut self, rule: usize, key: IpNet, hit: Hit);
    /// The path of the hit about to be given, for a rule that bans on the
    /// first match (`hits: 0`): its ban's reason names it (the daemon keeps
    /// it; the call compiles away elsewhere).
    #[inline]
    fn first(&mut self, _rule: usize, _key: IpNet, _path: &[u8]) {}
    /// The line at `offset` parsed for no group reading it (`fleetban test
    /// --print unparsed`; the daemon's sink ignores it, and the call
    /// compiles away).
    #[inline]
    fn unparsed(&mut self, _offset: u64) {}
    /// Rule `rule`'s filter accepted the line at `offset` (`--print matched`).
    #[inline]
    fn matched(&mut self, _rule: usize, _offset: u64) {}
}

/// What one chunk held.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Scanned {
    /// Lines read (empty ones not counted).
    pub lines: u64,
    /// Lines no rule's format could parse.
    pub unparsed: u64,
    /// Hits older than their window at arrival ([`Mode::Live`]).
    pub stale: u64,
    /// Hits dated more than [`FUTURE_SKEW_MS`] after the wall clock,
    /// counted at the wall clock ([`Mode::Live`]).
    pub future: u64,
    /// The time of the last request a rule accepted.
    pub last_time: Option<i64>,
    /// Lines dated outside the bounds ([`Scanner::set_bounds`]): not
    /// counted in `lines`, nor read by any rule.
    pub outside: u64,
}

/// Per rule, since the last [`Scanner::take_counts`].
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RuleCount {
    /// Requests its filter accepted.
    pub matched: u64,
    /// Hits it counted (not stale, client not banned).
    pub hits: u64,
    /// Lines it read (of the files it reads; empty ones not counted).
    pub lines: u64,
    /// Of those, the lines its format could not parse: a rule whose
    /// format fits none of its log's lines shows here, whatever the other
    /// rules reading that log parse.
    pub unparsed: u64,
}

pub struct Scanner {
    mode: Mode,
    plan: Plan,
    /// Never counted (`verdict::never`).
    allow: std::sync::Arc<NeverBanned>,
    ipv6_prefix: u8,
    /// Which groups read each file seen so far ([`Mode::Live`]: a file
    /// matched by several rules' paths or globs is read once and fanned out
    /// to all of them).
    routes: HashMap<Arc<Path>, Vec<Group>>,
    /// Every rule's groups ([`Mode::Replay`]).
    all: Vec<Group>,
    counts: Vec<RuleCount>,
    /// Per group of the chunk being read: lines it could not parse
    /// (scratch space, kept to allocate nothing per chunk). Counted on the
    /// failure path only, which ordinary lines do not take.
    unparsed: Vec<u64>,
    /// [`Mode::Replay`]: the log times read, `[since, until)`.
    bounds: (i64, i64),
    /// Where JSON values with escapes are decoded, reused line after line.
    scratch: Vec<u8>,
}

impl Scanner {
    pub fn new(mode: Mode, plan: Plan, allow: std::sync::Arc<NeverBanned>, ipv6_prefix: u8) -> Scanner {
        let mut s = Scanner {
            mode,
            plan: Plan::empty(),
            allow,
            ipv6_prefix,
            routes: HashMap::new(),
            all: Vec::new(),
            counts: Vec::new(),
            unparsed: Vec::new(),
            bounds: (i64::MIN, i64::MAX),
            scratch: Vec::new(),
        };
        s.set_plan(plan);
        s
    }

    /// Who is never counted, again (the host's addresses changed).
    pub fn set_allow(&mut self, allow: std::sync::Arc<NeverBanned>) {
        self.allow = allow;
    }

    /// [`Mode::Replay`]: the lines at `path` are read by the rules
    /// `rules` (indexes into the plan's rules) only.
    pub fn route(&mut self, path: std::sync::Arc<Path>, rules: &[usize]) {
        let groups = self.plan.groups_of(rules);
        self.routes.insert(path, groups);
    }

    /// [`Mode::Replay`]: only the lines dated in `[since, until)` are read
    /// (a line without a time is); the others count as `outside`.
    pub fn set_bounds(&mut self, since: Option<i64>, until: Option<i64>) {
        self.bounds = (since.unwrap_or(i64::MIN), until.unwrap_or(i64::MAX));
    }

    /// New rules (reload), with the counts of the old ones taken.
    pub fn set_plan(&mut self, plan: Plan) {
        self.routes.clear();
        self.all = match self.mode {
            Mode::Replay => plan.all(),
            Mode::Live => Vec::new(),
        };
        self.counts = vec![RuleCount::default(); plan.filters.len()];
        self.plan = plan;
    }

    /// The per-rule counts since the last call, which start again at zero.
    pub fn take_counts(&mut self) -> Vec<RuleCount> {
        let zero = vec![RuleCount::default(); self.counts.len()];
        std::mem::replace(&mut self.counts, zero)
    }

    /// Reads the lines of `chunk`: hits go to `sink`. `origin` identifies
    /// the file for hit members ([`super::origin_seed`]), `wall` is the
    /// wall clock in ms.
    pub fn scan(&mut self, chunk: &Chunk, origin: u64, wall: i64, sink: &mut impl Sink) -> Scanned {
        let Scanner {
            mode,
            plan,
            allow,
            ipv6_prefix,
            routes,
            all,
            counts,
            unparsed: unparsed_by,
            bounds,
            scratch,
        } = self;
        let (mode, ipv6_prefix, (since, until)) = (*mode, *ipv6_prefix, *bounds);
        let groups: &[Group] = match mode {
            Mode::Replay => routes.get(&chunk.path).unwrap_or(all),
            Mode::Live => routes
                .entry(chunk.path.clone())
                .or_insert_with(|| plan.groups_for(&chunk.path)),
        };
        unparsed_by.clear();
        unparsed_by.resize(groups.len(), 0);
        let mut out = Scanned::default();
        // Lines of a record split across lines (a framed error log): read by
        // no error-log rule, counted unparsed for them.
        let mut split = chunk.split.iter().peekable();
        'lines: for (i, (offset, line)) in chunk.lines().enumerate() {
            let in_split = split.next_if(|&&s| s as usize == i).is_some();
            if line.is_empty() && !in_split {
                continue;
            }
            let mut parsed = false;
            for (gi, g) in groups.iter().enumerate() {
                let read = match in_split && g.parser.is_error_log() {
                    true => None,
                    false => g.parser.parse_in(line, scratch),
                };
                let Some(req) = read else {
                    if let Some(u) = unparsed_by.get_mut(gi) {
                        *u += 1;
                    }
                    continue;
                };
                if !parsed {
                    // The first format that reads the line dates it.
                    if req.time_ms.is_some_and(|t| t < since || t >= until) {
                        // Not read: nor by the groups before, which failed.
                        for u in unparsed_by.iter_mut().take(gi) {
                            *u -= 1;
                        }
                        out.outside += 1;
                        continue 'lines;
                    }
                    out.lines += 1;
                }
                parsed = true;
                if allow.contains(req.addr) {
                    continue;
                }
                // Keyed once per line; a rule counting networks masks it.
                let address = crate::addr::client_key(req.addr, ipv6_prefix);
                for &ri in &g.rules {
                    if !plan.filters[ri].accepts(&req) {
                        continue;
                    }
                    let (window_ms, clock) = plan.times[ri];
                    let time = match (req.time_ms, mode, clock) {
                        (Some(t), Mode::Replay, _) => t,
                        (Some(t), Mode::Live, Clock::Log) if t > wall + FUTURE_SKEW_MS => {
                            out.future += 1;
                            wall
                        }
                        (Some(t), Mode::Live, Clock::Log) => t,
                        _ => wall,
                    };
                    out.last_time = Some(time);
                    counts[ri].matched += 1;
                    sink.matched(ri, offset);
                    if mode == Mode::Live && time <= wall - window_ms {
                        out.stale += 1;
                        continue;
                    }
                    let key = match plan.keys[ri] {
                        crate::addr::Keying::Address => address,
                        network => network.key(req.addr, ipv6_prefix),
                    };
                    // A ban of the client's network covers its address too.
                    if sink.is_banned(&address, time) {
                        continue;
                    }
                    counts[ri].hits += 1;
                    let mut hit = Hit::of_line(time, origin, offset);
                    if let Some(field) = plan.distinct[ri] {
                        // Counted by value: a line read again is its value again.
                        hit.member = super::value_member(field, &req);
                    }
                    if plan.first[ri] {
                        sink.first(ri, key, req.path);
                    }
                    sink.hit(ri, key, hit);
                }
            }
            if !parsed {
                out.lines += 1;
                out.unparsed += 1;
                sink.unparsed(offset);
            }
        }
        // Per rule once per chunk, not per line: what each read and parsed.
        for (g, &u) in groups.iter().zip(unparsed_by.iter()) {
            for &ri in &g.rules {
                counts[ri].lines += out.lines;
                counts[ri].unparsed += u;
            }
        }
        out
    }
}
