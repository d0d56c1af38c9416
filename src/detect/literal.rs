//! Exact literal tests derived from a `match:`/`ignore:` regex, used instead
//! of running the regex when it has one of the shapes rules actually use:
//!
//! ```text
//! \.(css|js|mjs|map|png|jpe?g|gif|webp|avif|ico|svg|woff2?|ttf)(\?|$)   ends with one of, before `?` or the end
//! ^/(favicon\.ico|robots\.txt)$                                          is one of
//! (?i)^/(admin|login)(\?|$)                                              starts with one of, then `?` or the end
//! ```
//!
//! i.e. `[^] CORE [TAIL]` (or an alternation of such branches), where CORE
//! denotes a small finite set of strings (literals, alternations, bounded
//! repetitions, small classes, `(?i)`) and TAIL is `$`, or `$` or one byte
//! (`(\?|$)`); without `^` a TAIL is required (an unanchored "contains" is
//! left to the regex, whose automaton does that well). Anything else (`*`,
//! `+`, `.`, large classes, `\b`, `(?m)`) gives `None` and the regex serves.
//!
//! Whether a regex matches does not depend on greediness or on which
//! alternative the engine prefers, only on the language: `X$` matches iff the
//! text ends with a string of X, `X(\?|$)` iff a string of X ends at the end
//! or right before a `?`, `^X...` the same at the start. The language is
//! computed from the regex's own HIR (parsed with the configuration the regex
//! is built with), so `(?i)` brings exactly the regex's case folding,
//! non-ASCII variants included (`k` also matches U+212A); the proptests below
//! compare the two on random patterns and texts and on real paths.

use memchr::memchr_iter;
use regex_syntax::hir::{Class, Hir, HirKind, Look};

/// Most strings a CORE may denote.
const MAX_STRINGS: usize = 128;
/// Longest string of a CORE, in bytes.
const MAX_LEN: usize = 64;
/// Most non-ASCII characters one class may hold (each becomes a string).
const MAX_WIDE: u32 = 16;
/// Most copies a bounded repetition may ask for (`x{0,8}`).
const MAX_REPEAT: u32 = 8;

/// A set of bytes: the alternatives at one position of a string.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct ByteSet([u64; 4]);

impl ByteSet {
    const EMPTY: ByteSet = ByteSet([0; 4]);

    fn single(b: u8) -> ByteSet {
        let mut s = ByteSet::EMPTY;
        s.insert(b);
        s
    }

    fn insert(&mut self, b: u8) {
        self.0[usize::from(b >> 6)] |= 1 << (b & 63);
    }

    #[inline]
    fn contains(&self, b: u8) -> bool {
        self.0[usize::from(b >> 6)] >> (b & 63) & 1 == 1
    }

    fn is_empty(&self) -> bool {
        self.0 == [0; 4]
    }

    fn bytes(&self) -> impl Iterator<Item = u8> + '_ {
        (0..=255u8).filter(|&b| self.contains(b))
    }

    fn as_single(&self) -> Option<u8> {
        let mut it = self.bytes();
        match (it.next(), it.next()) {
            (Some(b), None) => Some(b),
            _ => None,
        }
    }

    /// `(m, v)` when this set is exactly `{b : b & m == v}`.
    fn as_cube(&self) -> Option<(u8, u8)> {
        let (mut all, mut any, mut n) = (0xffu8, 0u8, 0u32);
        for b in self.bytes() {
            (all, any, n) = (all & b, any | b, n + 1);
        }
        let free = all ^ any;
        (n > 0 && n == 1 << free.count_ones()).then_some((!free, all & !free))
    }
}

/// One string of a CORE's language: a set of bytes per position.
type Units = Vec<ByteSet>;

/// A string of the language, stored for matching.
#[derive(Clone, Debug)]
struct Pat {
    units: Box<[ByteSet]>,
    /// When the string is at most 8 bytes and every position's set is
    /// `{b : b & m == v}` (one byte, or an ASCII letter in both cases): masks
    /// and values of the 8-byte window the text is compared in, right-aligned
    /// (`ends_at`) and left-aligned (`starts`).
    packed: Option<Packed>,
}

#[derive(Clone, Copy, Debug)]
struct Packed {
    right: (u64, u64),
    left: (u64, u64),
}

impl Pat {
    fn new(units: &[ByteSet]) -> Pat {
        let cubes: Option<Vec<(u8, u8)>> = units.iter().map(ByteSet::as_cube).collect();
        let packed = cubes.filter(|c| c.len() <= 8).map(|cubes| {
            let (mut right, mut left) = ((0, 0), (0, 0));
            let shift = 8 - cubes.len();
            for (j, &(m, v)) in cubes.iter().enumerate() {
                let (m, v) = (u64::from(m), u64::from(v));
                right.0 |= m << (8 * (shift + j));
                right.1 |= v << (8 * (shift + j));
                left.0 |= m << (8 * j);
                left.1 |= v << (8 * j);
            }
            Packed { right, left }
        });
        Pat {
            units: units.into(),
            packed,
        }
    }

    #[inline]
    fn len(&self) -> usize {
        self.units.len()
    }

    /// Whether `text` (of the pattern's length) is this string.
    #[inline]
    fn is(&self, text: &[u8]) -> bool {
        self.units.iter().zip(text).all(|(set, &b)| set.contains(b))
    }

    /// The bytes the pattern may have at position `i` (counted from the end
    /// when `from_end`).
    fn at(&self, i: usize, from_end: bool) -> ByteSet {
        let i = if from_end { self.len() - 1 - i } else { i };
        self.units[i]
    }
}

/// The 8 bytes of `text` that end at `end` as a little-endian word, zeros
/// in front when there are fewer.
#[inline]
fn window_before(text: &[u8], end: usize) -> u64 {
    match end.checked_sub(8).and_then(|start| text.get(start..end)) {
        Some(w) => u64::from_le_bytes(w.try_into().unwrap_or_default()),
        None => {
            let mut w = [0u8; 8];
            let head = &text[..end.min(text.len()).min(8)];
            w[8 - head.len()..].copy_from_slice(head);
            u64::from_le_bytes(w)
        }
    }
}

/// The first 8 bytes of `text`, zeros after when there are fewer.
#[inline]
fn window_start(text: &[u8]) -> u64 {
    match text.get(..8) {
        Some(w) => u64::from_le_bytes(w.try_into().unwrap_or_default()),
        None => {
            let mut w = [0u8; 8];
            w[..text.len()].copy_from_slice(text);
            u64::from_le_bytes(w)
        }
    }
}

/// What must follow CORE.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Tail {
    /// Nothing (only with `^`).
    Any,
    /// `$`: the end of the text.
    End,
    /// `(\?|$)`: the end of the text or this byte.
    EndOr(u8),
}

/// One branch: `[^] CORE [TAIL]`.
#[derive(Clone, Debug)]
struct Shape {
    anchored: bool,
    tail: Tail,
    /// The empty string is in CORE.
    empty: bool,
    /// The non-empty strings of CORE.
    pats: Vec<Pat>,
    /// Per byte: the indices in `pats` of the strings that can end (or, when
    /// anchored, start) with it, as a range of `order`.
    index: Box<[(u16, u16); 256]>,
    order: Vec<u16>,
}

impl Shape {
    fn new(anchored: bool, tail: Tail, core: Vec<Units>) -> Shape {
        let empty = core.iter().any(Vec::is_empty);
        let pats: Vec<Pat> = core.iter().filter(|u| !u.is_empty()).map(|u| Pat::new(u)).collect();
        let mut index = Box::new([(0u16, 0u16); 256]);
        let mut order = Vec::new();
        for b in 0..=255u8 {
            let start = order.len();
            for (i, p) in pats.iter().enumerate() {
                if p.at(0, !anchored).contains(b) {
                    // At most MAX_STRINGS patterns: fits in u16.
                    order.push(i as u16);
                }
            }
            index[usize::from(b)] = (start as u16, (order.len() - start) as u16);
        }
        Shape {
            anchored,
            tail,
            empty,
            pats,
            index,
            order,
        }
    }

    fn candidates(&self, b: u8) -> impl Iterator<Item = &Pat> {
        let (start, len) = self.index[usize::from(b)];
        let start = usize::from(start);
        self.order[start..start + usize::from(len)]
            .iter()
            .map(|&i| &self.pats[usize::from(i)])
    }

    #[inline]
    fn is_match(&self, text: &[u8]) -> bool {
        if self.anchored {
            self.starts(text)
        } else {
            match self.tail {
                Tail::End => self.ends_at(text, text.len()),
                Tail::EndOr(d) => self.ends_at(text, text.len()) || memchr_iter(d, text).any(|e| self.ends_at(text, e)),
                // Not built (see `shape`), and "contains" would be its meaning.
                Tail::Any => false,
            }
        }
    }

    /// `^ CORE TAIL`.
    fn starts(&self, text: &[u8]) -> bool {
        let follows = |len: usize| match self.tail {
            Tail::Any => true,
            Tail::End => len == text.len(),
            Tail::EndOr(d) => len == text.len() || text[len] == d,
        };
        if self.empty && follows(0) {
            return true;
        }
        let Some(&first) = text.first() else {
            return false;
        };
        let w = window_start(text);
        self.candidates(first).any(|p| {
            p.len() <= text.len()
                && match p.packed {
                    Some(k) => w & k.left.0 == k.left.1,
                    None => p.is(&text[..p.len()]),
                }
                && follows(p.len())
        })
    }

    /// A string of CORE ends at `end`.
    #[inline]
    fn ends_at(&self, text: &[u8], end: usize) -> bool {
        if self.empty {
            return true;
        }
        let Some(&last) = end.checked_sub(1).and_then(|i| text.get(i)) else {
            return false;
        };
        // Most texts end with a byte no string ends with.
        if self.index[usize::from(last)].1 == 0 {
            return false;
        }
        let w = window_before(text, end);
        self.candidates(last).any(|p| {
            p.len() <= end
                && match p.packed {
                    Some(k) => w & k.right.0 == k.right.1,
                    None => p.is(&text[end - p.len()..end]),
                }
        })
    }
}

/// An exact replacement for a regex of one of the shapes above.
#[derive(Clone, Debug)]
pub(crate) struct LiteralTest {
    branches: Vec<Shape>,
}

impl LiteralTest {
    /// The test equivalent to `hir` (as parsed for the regex that runs), or
    /// `None` when it does not have a supported shape.
    pub(crate) fn new(hir: &Hir) -> Option<LiteralTest> {
        let hir = peel(hir);
        let branches = match (shape(hir), hir.kind()) {
            (Some(shape), _) => vec![shape],
            (None, HirKind::Alternation(alts)) => alts.iter().map(shape).collect::<Option<Vec<_>>>()?,
            (None, _) => return None,
        };
        Some(LiteralTest { branches })
    }

    #[inline]
    pub(crate) fn is_match(&self, text: &[u8]) -> bool {
        self.branches.iter().any(|s| s.is_match(text))
    }
}

/// Captures do not change what matches.
fn peel(mut hir: &Hir) -> &Hir {
    while let HirKind::Capture(c) = hir.kind() {
        hir = &c.sub;
    }
    hir
}

fn shape(hir: &Hir) -> Option<Shape> {
    let hir = peel(hir);
    let mut items: Vec<&Hir> = match hir.kind() {
        HirKind::Concat(items) => items.iter().collect(),
        _ => vec![hir],
    };
    let anchored = matches!(items.first().map(|h| peel(h).kind()), Some(HirKind::Look(Look::Start)));
    if anchored {
        items.remove(0);
    }
    let tail = match items.last().map(|h| tail(h)) {
        Some(Some(t)) => {
            items.pop();
            t
        }
        _ => Tail::Any,
    };
    if !anchored && tail == Tail::Any {
        return None;
    }
    let mut core = vec![Vec::new()];
    for item in items {
        core = product(&core, &language(item)?)?;
    }
    Some(Shape::new(anchored, tail, core))
}

/// `$`, or `(\?|$)` with any single byte for `?`.
fn tail(hir: &Hir) -> Option<Tail> {
    match peel(hir).kind() {
        HirKind::Look(Look::End) => Some(Tail::End),
        HirKind::Alternation(alts) if alts.len() == 2 => {
            let (a, b) = (peel(&alts[0]), peel(&alts[1]));
            let (end, other) = match (a.kind(), b.kind()) {
                (HirKind::Look(Look::End), _) => (a, b),
                (_, HirKind::Look(Look::End)) => (b, a),
                _ => return None,
            };
            debug_assert!(matches!(end.kind(), HirKind::Look(Look::End)));
            match language(other)?.as_slice() {
                [units] if units.len() == 1 => units[0].as_single().map(Tail::EndOr),
                _ => None,
            }
        }
        _ => None,
    }
}

/// The finite language of `hir`, or `None` when it is not small and finite
/// or holds an assertion.
fn language(hir: &Hir) -> Option<Vec<Units>> {
    match hir.kind() {
        HirKind::Empty => Some(vec![Vec::new()]),
        HirKind::Literal(lit) => {
            (lit.0.len() <= MAX_LEN).then(|| vec![lit.0.iter().map(|&b| ByteSet::single(b)).collect()])
        }
        HirKind::Class(Class::Bytes(class)) => {
            let mut set = ByteSet::EMPTY;
            for r in class.ranges() {
                for b in r.start()..=r.end() {
                    set.insert(b);
                }
            }
            Some(if set.is_empty() { Vec::new() } else { vec![vec![set]] })
        }
        HirKind::Class(Class::Unicode(class)) => {
            // ASCII characters are one byte each: one position. Any other
            // character is its UTF-8 bytes: a string of its own.
            let mut ascii = ByteSet::EMPTY;
            let mut strings = Vec::new();
            let mut wide = 0u32;
            for r in class.ranges() {
                let (start, end) = (u32::from(r.start()), u32::from(r.end()));
                if end >= 0x80 {
                    wide += end - start.max(0x80) + 1;
                    if wide > MAX_WIDE {
                        return None;
                    }
                }
                for c in r.start()..=r.end() {
                    let mut buf = [0u8; 4];
                    let bytes = c.encode_utf8(&mut buf).as_bytes();
                    match bytes {
                        [b] => ascii.insert(*b),
                        _ => strings.push(bytes.iter().map(|&b| ByteSet::single(b)).collect()),
                    }
                }
            }
            if !ascii.is_empty() {
                strings.push(vec![ascii]);
            }
            Some(strings)
        }
        HirKind::Look(_) => None,
        HirKind::Repetition(rep) => {
            let max = rep.max?;
            if max > MAX_REPEAT {
                return None;
            }
            let sub = language(&rep.sub)?;
            let mut out = Vec::new();
            let mut power = vec![Vec::new()];
            for k in 0..=max {
                if k >= rep.min {
                    out.extend(power.iter().cloned());
                    if out.len() > MAX_STRINGS {
                        return None;
                    }
                }
                if k < max {
                    power = product(&power, &sub)?;
                }
            }
            Some(out)
        }
        HirKind::Capture(c) => language(&c.sub),
        HirKind::Concat(items) => {
            let mut out = vec![Vec::new()];
            for item in items {
                out = product(&out, &language(item)?)?;
            }
            Some(out)
        }
        HirKind::Alternation(alts) => {
            let mut out = Vec::new();
            for alt in alts {
                out.extend(language(alt)?);
                if out.len() > MAX_STRINGS {
                    return None;
                }
            }
            Some(out)
        }
    }
}

/// Every `a` followed by every `b`, within the limits.
fn product(a: &[Units], b: &[Units]) -> Option<Vec<Units>> {
    if a.len().saturating_mul(b.len()) > MAX_STRINGS {
        return None;
    }
    let mut out = Vec::with_capacity(a.len() * b.len());
    for x in a {
        for y in b {
            if x.len() + y.len() > MAX_LEN {
                return None;
            }
            let mut s = x.clone();
            s.extend_from_slice(y);
            out.push(s);
        }
    }
    Some(out)
}

#[cfg(test)]
mod tests {
    use std::path::PathBuf;
    use std::sync::OnceLock;

    use proptest::prelude::*;
    use proptest::strategy::ValueTree;
    use regex::bytes::Regex;

    use super::*;

    /// The HIR exactly as `detect::filter` parses it for the regex.
    fn hir(pattern: &str) -> Hir {
        let config = regex_automata::util::syntax::Config::new().utf8(false);
        regex_automata::util::syntax::parse_with(pattern, &config).unwrap()
    }

    fn literal(pattern: &str) -> Option<LiteralTest> {
        LiteralTest::new(&hir(pattern))
    }

    /// Every `match:`/`ignore:` path of the shipped rules that has a
    /// literal shape, and variants of them.
    const SHAPED: &[&str] = &[
        r"\.(css|js|mjs|map|png|jpe?g|gif|webp|avif|ico|svg|woff2?|ttf)(\?|$)",
        r"(?i)\.(css|js|mjs|map|png|jpe?g|gif|webp|avif|ico|svg|woff2?|ttf)(\?|$)",
        r"\.(css|js)$",
        r"(?:$|\?)",
        r"\.(?:css|js)(?:#|$)",
        r"^/(favicon\.ico|robots\.txt|ads\.txt|sitemap\.xml)(\?|$)|\.map(\?|$)",
        r"^/(favicon\.ico|robots\.txt)$",
        r"(?i)^/(login|signin|logon|auth|token|admin)(/|\.php|\.html?)?(\?|$)",
        r"^/api/v[0-9]/",
        r"^",
        r"$",
        r"^$",
        r"(?i)\.(K|é|ſ)$",
        r"(?-u:\xff)[\x00-\x10]{0,2}$",
        r"(?i)^/wp-(admin|login)",
    ];

    /// Shapes the literal test leaves to the regex.
    const UNSHAPED: &[&str] = &[
        r"(?i)\b(sqlmap|nikto)\b",
        r"(?i)(bot|crawl|spider)",
        r"^/(favicon\.ico|apple-touch-icon[^/]*\.png)(\?|$)",
        r"(?i)^/([^?]*/)?(login|admin)(\?|$)",
        r"(?m)\.css$",
        r"\.css.*$",
        r"\.css(\?|#|$)",
        r"\.css(\?x|$)",
        r"\.cs+$",
        // 136 strings once `(?i)` has its `ſ` for every `s`: over MAX_STRINGS.
        r"(?i)^/(login|signin|sign_in|logon|auth|session|sessions|token|admin)(/|\.php|\.html?)?(\?|$)",
    ];

    #[test]
    fn shipped_shapes_are_recognised_and_others_are_not() {
        for p in SHAPED {
            assert!(literal(p).is_some(), "{p}");
        }
        for p in UNSHAPED {
            assert!(literal(p).is_none(), "{p}");
        }
    }

    /// The shipped rules' paths that have a literal shape, read from the
    /// files, so a change to a rule is seen here.
    #[test]
    fn the_shipped_scraper_rule_takes_the_literal_test() {
        let text = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/rules/nginx-scraper.yaml")).unwrap();
        let line = text.lines().find(|l| l.contains("ignore:")).unwrap();
        let pattern = line.split('\'').nth(1).unwrap();
        assert!(literal(pattern).is_some(), "{pattern}");
    }

    fn assert_agrees(pattern: &str, texts: impl IntoIterator<Item = impl AsRef<[u8]>>) {
        let re = Regex::new(pattern).unwrap();
        let test = literal(pattern).unwrap_or_else(|| panic!("no literal test for {pattern}"));
        for t in texts {
            let t = t.as_ref();
            assert_eq!(
                test.is_match(t),
                re.is_match(t),
                "{pattern} on {:?}",
                String::from_utf8_lossy(t)
            );
        }
    }

    #[test]
    fn cubes() {
        let set = |bytes: &[u8]| {
            let mut s = ByteSet::EMPTY;
            bytes.iter().for_each(|&b| s.insert(b));
            s
        };
        assert_eq!(set(b"a").as_cube(), Some((0xff, b'a')));
        assert_eq!(set(b"aA").as_cube(), Some((!0x20, b'A')));
        assert_eq!(set(b"0123456789").as_cube(), None);
        assert_eq!(set(b"0123").as_cube(), Some((!0x03, b'0')));
        assert_eq!(set(b"abc").as_cube(), None);
        assert_eq!(ByteSet::EMPTY.as_cube(), None);
    }

    #[test]
    fn spot_checks() {
        let p = SHAPED[0];
        let re = literal(p).unwrap();
        for (t, m) in [
            (&b"/static/app.css"[..], true),
            (b"/static/app.css?v=3", true),
            (b"/a.jpeg?x.css", true),
            (b"/static/app.cssx", false),
            (b"/static/app.CSS", false),
            (b"/x.js/y", false),
            (b"/x.woff2", true),
            (b"/x.jpe", false),
            (b"/products", false),
            (b"", false),
            (b".css", true),
            (b"css", false),
            (b"/?a.png?", true),
        ] {
            assert_eq!(re.is_match(t), m, "{}", String::from_utf8_lossy(t));
        }
        assert!(literal(r"(?i)\.(K)$").unwrap().is_match("x.\u{212A}".as_bytes()));
    }

    /// The corpus kept in the repository (`tests/data/corpus`, its licence beside it).
    fn corpus_path() -> PathBuf {
        PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data/corpus/elastic-examples-access.log")
    }

    /// The request targets of the shared corpus (10,000 real lines) and of
    /// `bench/loggen.rs`, with case and query variants.
    fn real_paths() -> &'static [Vec<u8>] {
        static PATHS: OnceLock<Vec<Vec<u8>>> = OnceLock::new();
        PATHS.get_or_init(|| {
            let text = std::fs::read(corpus_path()).unwrap();
            let parser = crate::parse::Parser::new(&crate::parse::Format::Combined).unwrap();
            let mut paths: Vec<Vec<u8>> = text
                .split(|&b| b == b'\n')
                .filter_map(|l| parser.parse(l))
                .map(|r| r.path.to_vec())
                .collect();
            assert!(paths.len() > 9_000, "corpus: {} paths", paths.len());
            for p in [
                "/",
                "/products",
                "/products/42",
                "/blog/2026/11/redis",
                "/search?q=shoes",
                "/cart",
                "/static/app.js",
                "/static/site.css",
                "/img/logo.png",
                "/favicon.ico",
                "/fonts/x.woff2",
                "/robots.txt",
                "/sitemap.xml?x",
                "/login",
                "/LOGIN.php?next=/",
                "/Admin/",
                "/wp-login.php",
            ] {
                paths.push(p.as_bytes().to_vec());
            }
            let more: Vec<Vec<u8>> = paths
                .iter()
                .flat_map(|p| {
                    let mut q = p.clone();
                    q.extend_from_slice(b"?v=1");
                    [p.to_ascii_uppercase(), q]
                })
                .collect();
            paths.extend(more);
            paths
        })
    }

    #[test]
    fn literal_tests_agree_with_the_regex_on_real_paths() {
        let paths = real_paths();
        for p in SHAPED {
            assert_agrees(p, paths);
        }
        // The corpus does exercise both outcomes of the shipped rule.
        let re = literal(SHAPED[0]).unwrap();
        let hits = paths.iter().filter(|p| re.is_match(p)).count();
        assert!(hits > 1_000 && hits < paths.len() - 1_000, "{hits}");
    }

    /// Pieces texts are made of: what the patterns look for, near misses,
    /// case and non-ASCII variants.
    fn text() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop::sample::select(vec![
            "/",
            ".",
            "?",
            "#",
            "css",
            "CSS",
            "js",
            "mjs",
            "map",
            "png",
            "jpg",
            "jpeg",
            "jpe",
            "woff",
            "woff2",
            "x",
            "K",
            "k",
            "\u{212A}",
            "é",
            "É",
            "ſ",
            "s",
            "S",
            "admin",
            "login",
            "Login",
            "sessions",
            "api",
            "v1",
            "favicon.ico",
            "robots.txt",
            "=",
            "wp-",
            "\u{ff}",
            "\0",
        ]);
        let bytes = prop::collection::vec(
            prop_oneof![
                3 => piece.prop_map(|s| s.as_bytes().to_vec()),
                1 => prop::collection::vec(any::<u8>(), 1..3),
            ],
            0..8,
        );
        bytes.prop_map(|v| v.concat())
    }

    /// Random patterns of the supported grammar (and some outside it).
    fn pattern() -> impl Strategy<Value = String> {
        let word = prop::sample::select(vec![
            "css",
            "js",
            "jpe?g",
            "woff2?",
            "png",
            "k",
            "é",
            "s",
            "[0-9]",
            "[a-c]",
            "(?:x|)",
            "x{1,2}",
            "",
            r"\.",
            "/",
            "admin",
            "(?-u:\\xff)",
            "[Kk]",
            "\\?",
            "[^/]",
        ]);
        let core = prop::collection::vec(prop::collection::vec(word, 1..3), 1..5).prop_map(|alts| {
            let alts: Vec<String> = alts.into_iter().map(|w| w.concat()).collect();
            format!("({})", alts.join("|"))
        });
        (
            any::<bool>(),
            prop::sample::select(vec!["", r"\.", "/"]),
            core,
            prop::sample::select(vec!["", "$", r"(\?|$)", r"($|#)", r"\?"]),
            any::<bool>(),
        )
            .prop_map(|(anchor, lead, core, tail, ci)| {
                format!(
                    "{}{}{lead}{core}{tail}",
                    if ci { "(?i)" } else { "" },
                    if anchor { "^" } else { "" }
                )
            })
    }

    /// The random patterns below are mostly of a supported shape, so their
    /// comparison with the regex is not vacuous.
    #[test]
    fn most_random_patterns_take_the_literal_test() {
        let mut runner = proptest::test_runner::TestRunner::deterministic();
        let strategy = pattern();
        let n = 1_000;
        let shaped = (0..n)
            .filter(|_| literal(&strategy.new_tree(&mut runner).unwrap().current()).is_some())
            .count();
        assert!(shaped > n / 2, "{shaped} of {n}");
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(2_000))]

        #[test]
        fn literal_tests_agree_with_the_regex_on_random_texts(
            p in prop::sample::select(SHAPED),
            texts in prop::collection::vec(text(), 1..20),
        ) {
            assert_agrees(p, &texts);
        }

        #[test]
        fn random_patterns_agree_with_the_regex(
            p in pattern(),
            texts in prop::collection::vec(text(), 1..20),
        ) {
            let re = Regex::new(&p).unwrap();
            if let Some(test) = literal(&p) {
                for t in &texts {
                    prop_assert_eq!(test.is_match(t), re.is_match(t), "{} on {:?}", p, String::from_utf8_lossy(t));
                }
                for t in real_paths().iter().step_by(97) {
                    prop_assert_eq!(test.is_match(t), re.is_match(t), "{} on {:?}", p, String::from_utf8_lossy(t));
                }
            }
        }
    }
}
