//! `fleetban test`: replays log files through the rules with log time and the
//! embedded store, exactly as DESIGN §2 defines the decisions: hits in log
//! order, one at a time, a banned client's hits not counted. It is the
//! reference the daemon's batched path is compared with.

use std::io::Read;
use std::path::Path;

use ipnet::IpNet;

use crate::bans::{BanCache, BanRequest, Mode, Outcome};
use crate::config::Rule;
use crate::detect::{self, AllowList, Hit, Plan};
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
    /// Lines without a newline at the end of a file are still read.
    pub rules: Vec<RuleStats>,
    pub decisions: Vec<Decision>,
}

/// Replays `files` through `rules`; `allow` is never counted.
pub fn replay(rules: &[Rule], files: &[&Path], allow: &AllowList, ipv6_prefix: u8) -> std::io::Result<Report> {
    let plan = Plan::new(rules).map_err(|e| std::io::Error::other(e.to_string()))?;
    let mut r = Replay {
        rules,
        groups: plan.all(),
        plan: &plan,
        allow,
        ipv6_prefix,
        limiter: MemoryLimiter::new(RuleLimit::of(rules)),
        bans: crate::bans::BanList::memory(None),
        cache: BanCache::default(),
        wall: crate::now_ms(),
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
        r.file(i, f)?;
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

struct Replay<'a> {
    rules: &'a [Rule],
    plan: &'a Plan,
    groups: Vec<crate::detect::Group>,
    allow: &'a AllowList,
    ipv6_prefix: u8,
    limiter: MemoryLimiter,
    bans: crate::bans::BanList,
    cache: BanCache,
    wall: i64,
    /// Per rule: each client's fullest window and whether it was banned.
    peaks: Vec<foldhash::HashMap<IpNet, (u32, bool)>>,
    report: Report,
}

impl Replay<'_> {
    fn file(&mut self, index: usize, path: &Path) -> std::io::Result<()> {
        let mut f = std::fs::File::open(path)?;
        let origin = detect::origin_seed("replay", &[index as u64]);
        let mut buf: Vec<u8> = Vec::with_capacity(4 << 20);
        let mut base: u64 = 0; // file offset of buf[0]
        loop {
            // Straight into `buf`'s spare room (no copy from a second buffer).
            let n = (&mut f).take(4 << 20).read_to_end(&mut buf)?;
            let eof = n == 0;
            let mut start = 0;
            while let Some(nl) = memchr::memchr(b'\n', &buf[start..]) {
                self.line(origin, base + start as u64, &buf[start..start + nl]);
                start += nl + 1;
            }
            if eof {
                if start < buf.len() {
                    let tail = buf[start..].to_vec();
                    self.line(origin, base + start as u64, &tail);
                }
                return Ok(());
            }
            buf.drain(..start);
            base += start as u64;
        }
    }

    fn line(&mut self, origin: u64, offset: u64, line: &[u8]) {
        let line = line.strip_suffix(b"\r").unwrap_or(line);
        if line.is_empty() {
            return;
        }
        self.report.lines += 1;
        let mut parsed_any = false;
        // Taken out for the loop so that `decide` may borrow `self` mutably.
        let groups = std::mem::take(&mut self.groups);
        for g in &groups {
            let Some(req) = g.parser.parse(line) else { continue };
            parsed_any = true;
            if self.allow.contains(req.addr) {
                continue;
            }
            let time = req.time_ms.unwrap_or(self.wall);
            let key = crate::addr::client_key(req.addr, self.ipv6_prefix);
            for &ri in &g.rules {
                if !self.plan.filters[ri].accepts(&req) {
                    continue;
                }
                self.report.rules[ri].matched += 1;
                if self.cache.is_banned(&key, time) {
                    continue;
                }
                let hit = Hit {
                    time_ms: time,
                    member: detect::member(origin, offset),
                };
                let (peak, over) = match self.limiter.check(ri, key, &[hit], self.wall) {
                    Verdict::Over { count, .. } => (count + 1, true),
                    Verdict::Under { count } => (count, false),
                };
                let p = self.peaks[ri].entry(key).or_insert((0, false));
                p.0 = p.0.max(peak);
                p.1 |= over;
                if over {
                    self.decide(ri, key, time, peak);
                }
            }
        }
        self.groups = groups;
        if !parsed_any {
            self.report.unparsed += 1;
        }
    }

    fn decide(&mut self, rule: usize, key: IpNet, at_ms: i64, hits: u32) {
        let req = BanRequest {
            addr: key,
            rule: self.rules[rule].name.clone(),
            reason: String::new(),
            host: "replay".into(),
            hits,
            mode: Mode::Auto(self.rules[rule].ban),
        };
        let crate::bans::BanList::Memory(m) = &mut self.bans else {
            return;
        };
        if let Outcome::Banned(rec) = m.ban(&req, at_ms) {
            self.cache.insert(key, rec.until());
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
