//! Which rules read which log. Rules that name the same log share one read
//! of it; rules that also share a format share one parse of each line.

use crate::config::Rule;
use crate::parse::{FormatError, Parser};

use super::RuleFilter;

/// Rules reading one log with one format.
pub struct Group {
    pub parser: Parser,
    /// Indexes into the rule list.
    pub rules: Vec<usize>,
}

/// For each log pattern, the groups that read it; for each rule, its filter.
pub struct Plan {
    pub patterns: Vec<String>,
    pub groups: Vec<Vec<Group>>,
    pub filters: Vec<RuleFilter>,
}

impl Plan {
    /// The plan of the daemon: each rule reads the logs it names.
    pub fn new(rules: &[Rule], patterns: &[String]) -> Result<Plan, FormatError> {
        let groups = patterns
            .iter()
            .map(|p| group(rules, |r| r.logs.iter().any(|l| l == p)))
            .collect::<Result<_, _>>()?;
        Ok(Plan { patterns: patterns.to_vec(), groups, filters: filters(rules) })
    }

    /// The plan of `fleetban test`: every selected rule reads every given file.
    pub fn replay(rules: &[Rule], files: &[String]) -> Result<Plan, FormatError> {
        let groups = files.iter().map(|_| group(rules, |_| true)).collect::<Result<_, _>>()?;
        Ok(Plan { patterns: files.to_vec(), groups, filters: filters(rules) })
    }
}

fn filters(rules: &[Rule]) -> Vec<RuleFilter> {
    rules.iter().map(|r| RuleFilter::new(&r.matches, &r.ignore)).collect()
}

fn group(rules: &[Rule], reads: impl Fn(&Rule) -> bool) -> Result<Vec<Group>, FormatError> {
    let mut out: Vec<(crate::parse::Format, Group)> = Vec::new();
    for (i, r) in rules.iter().enumerate().filter(|(_, r)| reads(r)) {
        match out.iter_mut().find(|(f, _)| *f == r.format) {
            Some((_, g)) => g.rules.push(i),
            None => out.push((r.format.clone(), Group { parser: Parser::new(&r.format)?, rules: vec![i] })),
        }
    }
    Ok(out.into_iter().map(|(_, g)| g).collect())
}
