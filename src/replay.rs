//! `fleetban test`: replays log files through the rules with log time and the
//! embedded store, exactly as docs/design.md §2 defines the decisions: hits
//! in log order, one at a time, a banned client's hits not counted. It is
//! the reference the daemon's batched path is compared with. It reads lines
//! as the daemon does (`source::read_file`, `detect::Scanner` in
//! `Mode::Replay`) and bans through the same owner (`bans::Bans`).

use std::path::Path;

use ipnet::IpNet;

use crate::bans::{BanList, BanRequest, Bans, Mode};
use crate::config::Rule;
use crate::detect::{self, AllowList, Hit, Plan, Scanner, Sink};
use crate::enforce::Changes;
use crate::limit::{MemoryLimiter, RuleLimit, Verdict};

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
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct RuleStats {
    pub name: String,
    pub matched: u64,
    pub bans: u64,
    /// The clients never banned by this rule whose window came closest to
    /// its limit, fullest first (at most [`CLOSEST`]): what learning mode
    /// looks at to choose a limit (the banned ones are the ban decisions).
    pub closest: Vec<Closest>,
}

/// How many clients per rule [`RuleStats::closest`] keeps.
pub const CLOSEST: usize = 10;

/// One client's fullest window under one rule.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Closest {
    pub addr: IpNet,
    /// Most hits its window held at once.
    pub peak: u32,
}

#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Report {
    pub lines: u64,
    pub unparsed: u64,
    /// Lines longer than [`crate::source::MAX_LINE`], skipped as `run` skips them.
    pub skipped_long: u64,
    /// Lines without a newline at the end of a file are still read.
    pub rules: Vec<RuleStats>,
    pub decisions: Vec<Decision>,
}

/// Replays `files` through `rules`; `allow` is never counted, `proxies`
/// name the client in forwarded lists.
pub fn replay(
    rules: &[Rule],
    files: &[&Path],
    allow: &AllowList,
    proxies: &[ipnet::IpNet],
    ipv6_prefix: u8,
) -> std::io::Result<Report> {
    let plan = Plan::new(rules, proxies).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut scanner = Scanner::new(detect::Mode::Replay, plan, allow.clone(), ipv6_prefix);
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
    for (i, f) in files.iter().enumerate() {
        let origin = detect::origin_seed("replay", &[i as u64]);
        crate::source::read_file(f, |chunk| {
            let seen = scanner.scan(chunk, origin, wall, &mut r);
            r.report.lines += seen.lines;
            r.report.unparsed += seen.unparsed;
            r.report.skipped_long += chunk.skipped_long;
        })?;
    }
    for (stats, count) in r.report.rules.iter_mut().zip(scanner.take_counts()) {
        stats.matched = count.matched;
    }
    for (stats, peaks) in r.report.rules.iter_mut().zip(&r.peaks) {
        let mut all: Vec<Closest> = peaks
            .iter()
            .filter(|(_, &(_, banned))| !banned)
            .map(|(addr, &(peak, _))| Closest { addr: *addr, peak })
            .collect();
        // A total order (peak down, then address): selecting the first
        // CLOSEST then sorting them gives what sorting all of them gave,
        // without sorting every client of a large log (callgrind: 4%).
        let order = |a: &Closest, b: &Closest| b.peak.cmp(&a.peak).then(a.addr.cmp(&b.addr));
        if all.len() > CLOSEST {
            all.select_nth_unstable_by(CLOSEST, order);
            all.truncate(CLOSEST);
        }
        all.sort_by(order);
        stats.closest = all;
    }
    Ok(r.report)
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
            self.decide(rule, key, hit.time_ms, peak);
        }
    }
}

impl Replay<'_> {
    fn decide(&mut self, rule: usize, key: IpNet, at_ms: i64, hits: u32) {
        let req = BanRequest {
            addr: key,
            rule: self.rules[rule].name.clone(),
            reason: String::new(),
            host: "replay".into(),
            hits,
            mode: Mode::Auto(self.rules[rule].ban),
        };
        if let Some(rec) = self.bans.ban_embedded(&req, at_ms) {
            self.report.rules[rule].bans += 1;
            self.report.decisions.push(Decision {
                addr: key,
                rule: req.rule,
                at_ms,
                until_ms: rec.until,
                hits,
            });
        }
    }
}
