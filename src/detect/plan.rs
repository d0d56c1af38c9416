//! Which rules read which log. A file is read once, whatever the number of
//! rules naming it (by path or by glob); rules that also share a format
//! share one parse of each line.

use std::path::Path;

use ipnet::IpNet;

use crate::addr::NetSet;
use crate::config::{Clock, Distinct, Rule};
use crate::parse::{Format, FormatError, Parser};

use super::RuleFilter;

/// Rules reading one log with one format.
#[derive(Clone)]
pub struct Group {
    pub parser: Parser,
    /// Indexes into the rule list.
    pub rules: Vec<usize>,
}

/// The rules' formats, filters and log patterns; [`Plan::groups_for`] says
/// which groups read a given file.
pub struct Plan {
    pub filters: Vec<RuleFilter>,
    /// Per rule: its window (ms) and where its hits take their time from.
    pub times: Vec<(i64, Clock)>,
    /// Per rule: what a client is counted as (`limit.key`).
    pub keys: Vec<crate::addr::Keying>,
    /// Per rule: the field whose values are its hits' members (`distinct:`).
    pub distinct: Vec<Option<Distinct>>,
    /// Per rule: whether it bans on the first match (`hits: 0`).
    pub first: Vec<bool>,
    formats: Vec<Format>,
    /// Hops trusted to name the client in a forwarded list.
    proxies: NetSet,
    /// Per rule: its `logs:` entries as glob patterns (a plain path matches itself).
    globs: Vec<Vec<(String, Option<glob::Pattern>)>>,
}

const MATCH: glob::MatchOptions = glob::MatchOptions {
    case_sensitive: true,
    require_literal_separator: true,
    require_literal_leading_dot: false,
};

impl Plan {
    /// `proxies`: the hops whose `X-Forwarded-For` or PROXY protocol
    /// address is believed (`proxies:`).
    pub fn new(rules: &[Rule], proxies: &[IpNet]) -> Result<Plan, FormatError> {
        let proxies = NetSet::new(proxies);
        for r in rules {
            Parser::trusting(&r.format, &proxies)?;
        }
        Ok(Plan {
            filters: rules.iter().map(|r| RuleFilter::new(&r.matches, &r.ignore)).collect(),
            times: rules.iter().map(|r| (r.limit.window_ms, r.limit.clock)).collect(),
            keys: rules.iter().map(|r| r.limit.keying).collect(),
            distinct: rules.iter().map(|r| r.limit.distinct).collect(),
            first: rules.iter().map(|r| r.limit.hits == 0).collect(),
            formats: rules.iter().map(|r| r.format.clone()).collect(),
            proxies,
            globs: rules
                .iter()
                .map(|r| r.logs.iter().map(|l| (l.clone(), glob::Pattern::new(l).ok())).collect())
                .collect(),
        })
    }

    /// No rules.
    pub fn empty() -> Plan {
        Plan {
            filters: Vec::new(),
            times: Vec::new(),
            keys: Vec::new(),
            distinct: Vec::new(),
            first: Vec::new(),
            formats: Vec::new(),
            proxies: NetSet::default(),
            globs: Vec::new(),
        }
    }

    /// The groups of the rules that name `path` (by path or glob).
    pub fn groups_for(&self, path: &Path) -> Vec<Group> {
        let text = path.to_string_lossy();
        self.group((0..self.formats.len()).filter(|&i| {
            self.globs[i]
                .iter()
                .any(|(lit, pat)| *lit == text || pat.as_ref().is_some_and(|p| p.matches_path_with(path, MATCH)))
        }))
    }

    /// The groups of the rules `rules` (indexes): what `fleetban test`
    /// routes a file to.
    pub fn groups_of(&self, rules: &[usize]) -> Vec<Group> {
        self.group(rules.iter().copied().filter(|&i| i < self.formats.len()))
    }

    /// Every rule in groups: a file `fleetban test` did not route.
    pub fn all(&self) -> Vec<Group> {
        self.group(0..self.formats.len())
    }

    fn group(&self, rules: impl Iterator<Item = usize>) -> Vec<Group> {
        let mut out: Vec<(&Format, Group)> = Vec::new();
        for i in rules {
            let f = &self.formats[i];
            match out.iter_mut().find(|(g, _)| *g == f) {
                Some((_, g)) => g.rules.push(i),
                // Compiled once in `new`, so this cannot fail here.
                None => match Parser::trusting(f, &self.proxies) {
                    Ok(parser) => out.push((f, Group { parser, rules: vec![i] })),
                    Err(_) => continue,
                },
            }
        }
        out.into_iter().map(|(_, g)| g).collect()
    }
}
