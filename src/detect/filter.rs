//! A rule's `match:` and `ignore:` conditions, compiled. Every condition
//! given must hold (AND); the values of one condition are alternatives (OR).
//! A request counts for the rule when it matches `match` and not `ignore`
//! (an empty `ignore` ignores nothing).

use regex::bytes::Regex;

use crate::config::{MatchSpec, StatusPat};
use crate::parse::Request;

#[derive(Clone, Debug)]
struct Conditions {
    methods: Option<Vec<Vec<u8>>>,
    statuses: Option<Vec<StatusPat>>,
    path: Option<Regex>,
    user_agent: Option<Regex>,
    host: Option<Regex>,
    limit_req_status: Option<Vec<Vec<u8>>>,
}

impl Conditions {
    fn new(spec: &MatchSpec) -> Conditions {
        Conditions {
            methods: spec
                .method
                .as_ref()
                .map(|l| l.0.iter().map(|m| m.0.as_bytes().to_vec()).collect()),
            statuses: spec.status.as_ref().map(|l| l.0.clone()),
            path: spec.path.as_ref().map(|r| r.0.clone()),
            user_agent: spec.user_agent.as_ref().map(|r| r.0.clone()),
            host: spec.host.as_ref().map(|r| r.0.clone()),
            limit_req_status: spec
                .limit_req_status
                .as_ref()
                .map(|l| l.0.iter().map(|s| s.as_bytes().to_vec()).collect()),
        }
    }

    fn is_empty(&self) -> bool {
        self.methods.is_none()
            && self.statuses.is_none()
            && self.path.is_none()
            && self.user_agent.is_none()
            && self.host.is_none()
            && self.limit_req_status.is_none()
    }

    fn matches(&self, r: &Request<'_>) -> bool {
        if let Some(ms) = &self.methods {
            if !ms.iter().any(|m| m.eq_ignore_ascii_case(r.method)) {
                return false;
            }
        }
        if let Some(ss) = &self.statuses {
            if !ss.iter().any(|s| s.matches(r.status)) {
                return false;
            }
        }
        if let Some(l) = &self.limit_req_status {
            if !l.iter().any(|v| v.as_slice() == r.limit_req_status) {
                return false;
            }
        }
        if let Some(re) = &self.path {
            if !re.is_match(r.path) {
                return false;
            }
        }
        if let Some(re) = &self.host {
            if !re.is_match(r.host) {
                return false;
            }
        }
        if let Some(re) = &self.user_agent {
            if !re.is_match(r.user_agent) {
                return false;
            }
        }
        true
    }
}

/// Whether a request is a hit for one rule.
#[derive(Clone, Debug)]
pub struct RuleFilter {
    matches: Conditions,
    ignore: Option<Conditions>,
}

impl RuleFilter {
    pub fn new(matches: &MatchSpec, ignore: &MatchSpec) -> RuleFilter {
        let ignore = Conditions::new(ignore);
        RuleFilter {
            matches: Conditions::new(matches),
            ignore: (!ignore.is_empty()).then_some(ignore),
        }
    }

    pub fn accepts(&self, r: &Request<'_>) -> bool {
        self.matches.matches(r) && !self.ignore.as_ref().is_some_and(|i| i.matches(r))
    }
}
