//! A rule's `match:` and `ignore:` conditions, compiled. Every condition
//! given must hold (AND); the values of one condition are alternatives (OR).
//! `path` reads the path as nginx serves it ([`Request::path`]), `target`
//! the raw target as logged ([`Request::target`]).
//! A request counts for the rule when it matches `match` and not `ignore`
//! (an empty `ignore` ignores nothing).

use regex::bytes::Regex;
use regex_automata::meta;

use super::literal::LiteralTest;
use crate::config::{MatchSpec, StatusPat};
use crate::parse::Request;

/// A condition's regex, matched against one short field (a path, a host, a
/// user agent). `regex::bytes::Regex` is regex-automata's meta engine with a
/// literal prefilter that, on haystacks this short, costs more than it saves
/// (on the shipped rule's `ignore: path`: ~80 -> ~55 ns per path). This is the
/// same engine built exactly as `regex::bytes::Regex::new` builds it, minus
/// the prefilter; a prefilter never changes whether a regex matches. Should
/// that build ever fail, the `regex` one serves.
///
/// When the regex has a literal shape (`\.(css|js|png)$`: the shipped
/// scraper rule's `ignore: path`), the exact [`LiteralTest`] derived from it
/// runs instead (~10x cheaper on paths; `detect::literal`).
#[derive(Clone, Debug)]
enum Field {
    Literal(LiteralTest),
    Plain(meta::Regex),
    Regex(Regex),
}

impl Field {
    fn new(re: &Regex) -> Field {
        let syntax = regex_automata::util::syntax::Config::new().utf8(false);
        if let Some(test) = regex_automata::util::syntax::parse_with(re.as_str(), &syntax)
            .ok()
            .and_then(|hir| LiteralTest::new(&hir))
        {
            return Field::Literal(test);
        }
        let config = meta::Config::new()
            .nfa_size_limit(Some(10 * (1 << 20)))
            .hybrid_cache_capacity(2 * (1 << 20))
            .match_kind(regex_automata::MatchKind::LeftmostFirst)
            .utf8_empty(false)
            .auto_prefilter(false);
        meta::Builder::new()
            .configure(config)
            .syntax(syntax)
            .build(re.as_str())
            .map_or_else(|_| Field::Regex(re.clone()), Field::Plain)
    }

    fn is_match(&self, field: &[u8]) -> bool {
        match self {
            Field::Literal(test) => test.is_match(field),
            Field::Plain(re) => re.is_match(field),
            Field::Regex(re) => re.is_match(field),
        }
    }
}

#[derive(Clone, Debug)]
struct Conditions {
    methods: Option<Vec<Vec<u8>>>,
    statuses: Option<Vec<StatusPat>>,
    path: Option<Field>,
    target: Option<Field>,
    user_agent: Option<Field>,
    host: Option<Field>,
    limit_req_status: Option<Vec<Vec<u8>>>,
    /// `format: nginx_error`'s message and level.
    message: Option<Field>,
    levels: Option<Vec<Vec<u8>>>,
}

impl Conditions {
    fn new(spec: &MatchSpec) -> Conditions {
        Conditions {
            methods: spec
                .method
                .as_ref()
                .map(|l| l.0.iter().map(|m| m.0.as_bytes().to_vec()).collect()),
            statuses: spec.status.as_ref().map(|l| l.0.clone()),
            path: spec.path.as_ref().map(|r| Field::new(&r.0)),
            target: spec.target.as_ref().map(|r| Field::new(&r.0)),
            user_agent: spec.user_agent.as_ref().map(|r| Field::new(&r.0)),
            host: spec.host.as_ref().map(|r| Field::new(&r.0)),
            limit_req_status: spec
                .limit_req_status
                .as_ref()
                .map(|l| l.0.iter().map(|s| s.as_bytes().to_vec()).collect()),
            message: spec.message.as_ref().map(|r| Field::new(&r.0)),
            levels: spec
                .level
                .as_ref()
                .map(|l| l.0.iter().map(|s| s.0.as_bytes().to_vec()).collect()),
        }
    }

    fn is_empty(&self) -> bool {
        self.methods.is_none()
            && self.statuses.is_none()
            && self.path.is_none()
            && self.target.is_none()
            && self.user_agent.is_none()
            && self.host.is_none()
            && self.limit_req_status.is_none()
            && self.message.is_none()
            && self.levels.is_none()
    }

    /// Every condition present holds (the order: cheapest first).
    #[inline]
    fn matches(&self, r: &Request<'_>) -> bool {
        #[inline(always)]
        fn any<T>(set: &Option<Vec<T>>, holds: impl Fn(&T) -> bool) -> bool {
            set.as_ref().is_none_or(|set| set.iter().any(holds))
        }
        #[inline(always)]
        fn bytes(set: &Option<Vec<Vec<u8>>>, field: &[u8]) -> bool {
            any(set, |v| v.as_slice() == field)
        }
        #[inline(always)]
        fn re(re: &Option<Field>, field: &[u8]) -> bool {
            re.as_ref().is_none_or(|re| re.is_match(field))
        }
        any(&self.methods, |m| m.eq_ignore_ascii_case(r.method))
            && any(&self.statuses, |s| s.matches(r.status))
            && bytes(&self.limit_req_status, r.limit_req_status)
            && re(&self.path, r.path)
            && re(&self.target, r.target)
            && re(&self.host, r.host)
            && re(&self.user_agent, r.user_agent)
            && bytes(&self.levels, r.level)
            && re(&self.message, r.message)
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

#[cfg(test)]
mod tests {
    use super::*;

    /// The prefilter-free build decides exactly as `regex::bytes::Regex`,
    /// including Unicode classes and case folding on bytes that are not UTF-8.
    #[test]
    fn field_regex_decides_as_the_regex_crate() {
        let patterns = [
            r"\.(css|js|mjs|map|png|jpe?g|gif|webp|avif|ico|svg|woff2?|ttf)(\?|$)",
            r"(?i)(bot|crawl|spider|python-requests|curl)",
            r"^/(api|admin)/",
            r"\bwp-login\.php$",
            r"^\w+$",
            r"(?-u:\xff)",
            r"é",
            r"",
            r"^$",
            r"[[:upper:]]{3}",
        ];
        let fields: [&[u8]; 16] = [
            b"/",
            b"",
            b"/static/app.css",
            b"/static/app.css?v=3",
            b"/static/app.cssx",
            b"/img/a.JPG",
            b"/api/users",
            b"/x/api/users",
            b"/wp-login.php",
            b"Mozilla/5.0 (compatible; Googlebot/2.1)",
            b"python-requests/2.31",
            b"CURL/8",
            b"\xff\xfe/bad\xc3",
            b"caf\xc3\xa9",
            b"abc_DEF",
            b"ABC",
        ];
        for p in patterns {
            let re = Regex::new(p).unwrap();
            let field = Field::new(&re);
            assert!(matches!(field, Field::Plain(_) | Field::Literal(_)), "{p}");
            for f in fields {
                assert_eq!(
                    field.is_match(f),
                    re.is_match(f),
                    "{p} on {}",
                    String::from_utf8_lossy(f)
                );
            }
        }
    }
}
