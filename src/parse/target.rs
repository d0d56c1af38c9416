//! A request target as nginx serves it: the path that `match.path`,
//! `ignore.path` and `distinct: path` see (docs/design.md §5, "The path").
//!
//! This follows nginx's own reading of the request line
//! (`ngx_http_parse_request_line`, then `ngx_http_parse_complex_uri` with
//! `merge_slashes on`, its default), on Linux:
//! - the path ends at the first `?` (the query) or `#` as sent; an
//!   absolute-form target (`http://host:port/path`) is read from the `/`
//!   after the authority, and one with no path (`http://host`,
//!   `http://host?q`) is `/`;
//! - `%XX` is decoded, and the byte it gives is read as if sent so: `%2F` is
//!   a slash and `%2e` a dot for what follows (dot segments, merged
//!   slashes); only `%25`, `%23` and `%3F` give a literal `%`, `#` and `?`;
//! - `/./` and `/x/../` segments are resolved, a trailing `/.` and `/..`
//!   too; runs of slashes become one;
//! - `+` stays `+`, case is kept, `\` is an ordinary byte.
//!
//! nginx answers 400 (and so serves nothing) for `%00`, an invalid or
//! truncated `%` escape, a `..` above the root, and a target that is neither
//! origin-form (`/...`) nor absolute-form (`*`, `OPTIONS *`, `index.html`,
//! `host:443`). For such a target the rules see the raw path as logged, the
//! target's text before its first `?`: a rule written against that spelling
//! still matches it, and nothing else is made up.
//!
//! The common path needs none of it: a target that starts with `/` and has
//! no `%`, `//`, `/.` or `#` before its query is its own path, returned as a
//! slice of the line ([`scan`]). Otherwise the path is resolved in the
//! caller's scratch buffer, in place: every step writes at most one byte
//! per byte it reads, so the output never overtakes the input.

use memchr::memchr;
#[cfg(test)]
use memchr::{memchr2, memchr_iter};

/// Where the path of a target is, without copying anything.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Located {
    /// `target[start..end]` is the path as it stands: a plain path, or the
    /// raw path of a target nginx refuses.
    Slice(usize, usize),
    /// `/`: an absolute-form target without a path.
    Root,
    /// `target[start..end]` must be resolved ([`resolve_in_place`]); when
    /// that fails (nginx's 400), the raw path is `target[..raw_end]`.
    Resolve { start: usize, end: usize, raw_end: usize },
}

/// Where the path of `target` is and whether it needs resolving.
#[inline]
pub(crate) fn locate(target: &[u8]) -> Located {
    let start = match target.first() {
        Some(b'/') => 0,
        Some(b) if b.is_ascii_alphabetic() => match after_authority(target) {
            Some(at) if at == target.len() || target[at] == b'?' => return Located::Root,
            Some(at) => at,
            None => return Located::Slice(0, raw_end(target)),
        },
        _ => return Located::Slice(0, raw_end(target)),
    };
    let (len, plain) = scan(&target[start..]);
    let end = start + len;
    if plain {
        Located::Slice(start, end)
    } else {
        Located::Resolve {
            start,
            end,
            raw_end: raw_end(target),
        }
    }
}

/// Where the raw path of `target` ends: at its first `?`.
fn raw_end(target: &[u8]) -> usize {
    memchr(b'?', target).unwrap_or(target.len())
}

/// One pass over a path and what follows: where the path ends (the first
/// `?` or `#`) and whether it is plain (no `%`, no `/` before a `/` or a
/// `.`). Paths are short: a byte loop beats several memchr calls with their
/// set-up, and a class table keeps the usual byte (a letter, a digit) to
/// one predictable branch.
#[inline]
fn scan(rest: &[u8]) -> (usize, bool) {
    let mut plain = true;
    let mut i = 0;
    while i < rest.len() {
        match CLASS[usize::from(rest[i])] {
            USUAL => {}
            END => return (i, plain),
            PERCENT => plain = false,
            // SLASH: a `/` before a `/` or a `.` needs nginx's pass.
            _ => plain &= !matches!(rest.get(i + 1), Some(b'/' | b'.')),
        }
        i += 1;
    }
    (rest.len(), plain)
}

const USUAL: u8 = 0;
const END: u8 = 1;
const PERCENT: u8 = 2;
const SLASH: u8 = 3;

/// What [`scan`] makes of each byte.
static CLASS: [u8; 256] = {
    let mut c = [USUAL; 256];
    c[b'?' as usize] = END;
    c[b'#' as usize] = END;
    c[b'%' as usize] = PERCENT;
    c[b'/' as usize] = SLASH;
    c
};

/// Whether `path` (starting with `/`, without its query) is its own
/// normal form: no `%`, and no `/` followed by `/` or `.`. nginx takes such
/// a path as it is, without its complex-URI pass. The definition [`scan`]
/// is tested against.
#[cfg(test)]
fn is_plain(path: &[u8]) -> bool {
    memchr(b'%', path).is_none() && !memchr_iter(b'/', path).any(|i| matches!(path.get(i + 1), Some(b'/' | b'.')))
}

/// The path of `target` as nginx serves it. Plain paths are slices of
/// `target`; others are resolved into `scratch` (appended: what it holds
/// stays); without a scratch buffer such a path is given raw (its text
/// before `?`), as for a target nginx refuses.
#[inline]
pub(crate) fn path<'a>(target: &'a [u8], scratch: Option<&'a mut Vec<u8>>) -> &'a [u8] {
    match locate(target) {
        Located::Slice(start, end) => &target[start..end],
        Located::Root => b"/",
        Located::Resolve { start, end, raw_end } => {
            let Some(scratch) = scratch else {
                return &target[..raw_end];
            };
            let at = scratch.len();
            scratch.extend_from_slice(&target[start..end]);
            match resolve_tail(scratch, at) {
                Some(()) => {
                    let resolved: &'a Vec<u8> = scratch;
                    &resolved[at..]
                }
                None => &target[..raw_end],
            }
        }
    }
}

/// Resolves `scratch[at..]` in place and truncates it to the result;
/// `None` (and `scratch` truncated to `at`) when nginx would refuse it.
pub(crate) fn resolve_tail(scratch: &mut Vec<u8>, at: usize) -> Option<()> {
    match resolve_in_place(&mut scratch[at..]) {
        Some(len) => {
            scratch.truncate(at + len);
            Some(())
        }
        None => {
            scratch.truncate(at);
            None
        }
    }
}

/// Where the path of an absolute-form target starts: after
/// `scheme://host[:port]` as nginx reads them (scheme: a letter, then
/// letters, digits, `+`, `-`, `.`; host: letters, digits, `.`, `-`, or an
/// IP literal in brackets; port: digits). `None` when nginx answers 400.
fn after_authority(target: &[u8]) -> Option<usize> {
    let scheme = target
        .iter()
        .position(|&b| !(b.is_ascii_alphanumeric() || matches!(b, b'+' | b'-' | b'.')))?;
    if target.get(scheme..scheme + 3) != Some(b"://") {
        return None;
    }
    let mut at = scheme + 3;
    if target.get(at) == Some(&b'[') {
        let close = at + memchr(b']', &target[at..])?;
        let literal_ok = target[at + 1..close]
            .iter()
            .all(|&b| b.is_ascii_alphanumeric() || b"-._~!$&'()*+,;=:".contains(&b));
        if !literal_ok {
            return None;
        }
        at = close + 1;
    } else {
        at += target[at..]
            .iter()
            .take_while(|&&b| b.is_ascii_alphanumeric() || b == b'.' || b == b'-')
            .count();
    }
    if target.get(at) == Some(&b':') {
        at += 1;
        at += target[at..].iter().take_while(|b| b.is_ascii_digit()).count();
    }
    match target.get(at) {
        None | Some(b'/' | b'?') => Some(at),
        Some(_) => None,
    }
}

/// The states of nginx's complex-URI pass.
#[derive(Clone, Copy, PartialEq, Eq)]
enum State {
    Usual,
    Slash,
    Dot,
    DotDot,
    Quoted,
    QuotedSecond,
}

/// Resolves the path `buf` (starting with `/`, without its query) in place:
/// percent-decoding, dot segments, merged slashes, exactly as nginx's
/// `ngx_http_parse_complex_uri` with `merge_slashes on`. The new length, or
/// `None` where nginx answers 400 (`%00`, a bad or truncated escape, `..`
/// above the root).
pub(crate) fn resolve_in_place(buf: &mut [u8]) -> Option<usize> {
    let mut state = State::Usual;
    // The state a `%` was met in, which the byte it decodes to is read in.
    let mut quoted = State::Usual;
    let mut high = 0u8;
    let mut w = 0usize;
    let mut r = 0usize;
    while r < buf.len() {
        let mut ch = buf[r];
        r += 1;
        // A decoded byte is read again in the state its `%` was met in.
        loop {
            state = match (state, ch) {
                (State::Quoted, _) => {
                    high = hex(ch)?;
                    State::QuotedSecond
                }
                (State::QuotedSecond, _) => match (high << 4) | hex(ch)? {
                    0 => return None,
                    // Written as they are, never read as syntax.
                    decoded @ (b'%' | b'#' | b'?') => put(buf, &mut w, decoded, State::Usual),
                    decoded => {
                        state = quoted;
                        ch = decoded;
                        continue;
                    }
                },
                (_, b'%') => {
                    quoted = state;
                    State::Quoted
                }
                // Slashes merged.
                (State::Slash, b'/') => State::Slash,
                // `/./`: drop the dot, keep the slash before it.
                (State::Dot, b'/') => {
                    w -= 1;
                    State::Slash
                }
                // `/../`: drop the segment before it.
                (State::DotDot, b'/') => {
                    w = up(buf, w)?;
                    State::Slash
                }
                (_, b'/') => put(buf, &mut w, ch, State::Slash),
                (State::Slash, b'.') => put(buf, &mut w, ch, State::Dot),
                (State::Dot, b'.') => put(buf, &mut w, ch, State::DotDot),
                _ => put(buf, &mut w, ch, State::Usual),
            };
            break;
        }
    }
    match state {
        State::Quoted | State::QuotedSecond => None,
        State::Dot => Some(w - 1),
        State::DotDot => up(buf, w),
        State::Usual | State::Slash => Some(w),
    }
}

/// Writes `ch` at `w` (never past the byte being read) and moves on to `next`.
fn put(buf: &mut [u8], w: &mut usize, ch: u8, next: State) -> State {
    buf[*w] = ch;
    *w += 1;
    next
}

/// `buf[..w]` ends with `/..`: the length once the segment before it is
/// gone, ending with its `/`; `None` above the root.
fn up(buf: &[u8], w: usize) -> Option<usize> {
    let mut at = w.checked_sub(4)?;
    loop {
        if buf[at] == b'/' {
            return Some(at + 1);
        }
        at = at.checked_sub(1)?;
    }
}

fn hex(b: u8) -> Option<u8> {
    match b {
        b'0'..=b'9' => Some(b - b'0'),
        b'a'..=b'f' => Some(b - b'a' + 10),
        b'A'..=b'F' => Some(b - b'A' + 10),
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn served(target: &str) -> String {
        let mut scratch = Vec::new();
        String::from_utf8_lossy(path(target.as_bytes(), Some(&mut scratch))).into_owned()
    }

    fn resolved(p: &str) -> Option<String> {
        let mut buf = p.as_bytes().to_vec();
        let n = resolve_in_place(&mut buf)?;
        Some(String::from_utf8_lossy(&buf[..n]).into_owned())
    }

    #[test]
    fn the_probes_of_issue_24_are_the_paths_nginx_serves() {
        for t in [
            "/.env",
            "/%2eenv",
            "//.env",
            "/./.env",
            "/x/../.env",
            "/.e%6ev",
            "/%2Eenv",
            "///.env?x=1",
            "/x/./y/../../.env",
            "/%2fx/..%2f.env",
        ] {
            assert_eq!(served(t), "/.env", "{t}");
        }
        assert_eq!(served("/.git/%63onfig"), "/.git/config");
        assert_eq!(served("/%2egit/config"), "/.git/config");
        assert_eq!(served("/wp-login%2ephp"), "/wp-login.php");
        assert_eq!(served("/wp-login.ph%70?a=b"), "/wp-login.php");
        assert_eq!(served("/logi%6e"), "/login");
    }

    #[test]
    fn nginx_edges() {
        // Literal %, # and ? from their escapes; the query and fragment cut.
        assert_eq!(served("/a%25b"), "/a%b");
        assert_eq!(served("/a%2541"), "/a%41");
        assert_eq!(served("/a%23b#c"), "/a#b");
        assert_eq!(served("/a%3Fb?c"), "/a?b");
        assert_eq!(served("/a%3fb"), "/a?b");
        assert_eq!(served("/a#b?c"), "/a");
        // + is not a space, case is kept, backslash is a byte.
        assert_eq!(served("/a+b/%2B"), "/a+b/+");
        assert_eq!(served("/A/.Env"), "/A/.Env");
        assert_eq!(served("/a\\..\\b"), "/a\\..\\b");
        // Trailing dot segments; dots inside a name stay.
        assert_eq!(served("/a/."), "/a/");
        assert_eq!(served("/a/b/.."), "/a/");
        assert_eq!(served("/a/..?x"), "/");
        assert_eq!(served("/a..b/.c/..d"), "/a..b/.c/..d");
        assert_eq!(served("/a/.../b"), "/a/.../b");
        // Decoded bytes other than NUL are kept.
        assert_eq!(served("/caf%C3%A9"), "/café");
        assert_eq!(served("/a%0Ab"), "/a\nb");
        // Absolute form.
        assert_eq!(served("http://example.com/.env"), "/.env");
        assert_eq!(served("HTTP://Example.com:8080//%2eenv?x"), "/.env");
        assert_eq!(served("http://[2001:db8::1]:80/a"), "/a");
        assert_eq!(served("http://example.com"), "/");
        assert_eq!(served("http://example.com?q=1"), "/");
        // What nginx refuses (400): the raw path, before the query.
        for (t, raw) in [
            ("/.env%00", "/.env%00"),
            ("/a%zz", "/a%zz"),
            ("/a%4", "/a%4"),
            ("/a%?x=1", "/a%"),
            ("/..", "/.."),
            ("/../.env", "/../.env"),
            (
                "/cgi-bin/.%2e/.%2e/.%2e/.%2e/etc/passwd",
                "/cgi-bin/.%2e/.%2e/.%2e/.%2e/etc/passwd",
            ),
            ("/a/%2e%2e/%2e%2e/x?y", "/a/%2e%2e/%2e%2e/x"),
            ("*", "*"),
            ("index.html", "index.html"),
            ("example.com:443", "example.com:443"),
            ("http://a_b/x", "http://a_b/x"),
            ("", ""),
        ] {
            assert_eq!(served(t), raw, "{t}");
        }
        assert_eq!(resolved("/a/%2e%2e/%2e%2e/x"), None);
    }

    #[test]
    fn a_plain_path_is_a_slice_of_the_target() {
        let target = b"/products/42.html?page=2";
        let mut scratch = Vec::new();
        let p = path(target, Some(&mut scratch));
        assert_eq!(p, b"/products/42.html");
        assert!(std::ptr::eq(p.as_ptr(), target.as_ptr()));
        assert!(scratch.is_empty());
    }

    #[test]
    fn without_a_scratch_buffer_a_path_to_resolve_is_raw() {
        assert_eq!(path(b"/%2eenv?x", None), b"/%2eenv");
        assert_eq!(path(b"/a/b?x", None), b"/a/b");
    }

    #[test]
    fn what_the_scratch_buffer_held_stays() {
        let mut scratch = b"kept".to_vec();
        assert_eq!(path(b"//a", Some(&mut scratch)), b"/a");
        let mut scratch = b"kept".to_vec();
        assert_eq!(path(b"/..", Some(&mut scratch)), b"/..");
        assert_eq!(scratch, b"kept");
    }

    /// A straightforward reading of nginx's rules, with no state machine:
    /// decode first (remembering which bytes came from `%25`, `%23`,
    /// `%3F`: those are never syntax), then walk the segments.
    fn reference(path: &[u8]) -> Option<Vec<u8>> {
        // (byte, literal)
        let mut decoded: Vec<(u8, bool)> = Vec::new();
        let mut i = 0;
        while i < path.len() {
            if path[i] == b'%' {
                let h = hex(*path.get(i + 1)?)?;
                let l = hex(*path.get(i + 2)?)?;
                let b = h * 16 + l;
                if b == 0 {
                    return None;
                }
                decoded.push((b, matches!(b, b'%' | b'#' | b'?')));
                i += 3;
            } else {
                decoded.push((path[i], false));
                i += 1;
            }
        }
        // Segments between syntactic slashes; the first is empty (leading /).
        let mut segments: Vec<Vec<(u8, bool)>> = vec![Vec::new()];
        for c in decoded {
            if c == (b'/', false) {
                segments.push(Vec::new());
            } else {
                segments.last_mut().unwrap().push(c);
            }
        }
        let ends_open = segments.len() > 1;
        let mut out: Vec<Vec<u8>> = Vec::new();
        let last = segments.len() - 1;
        let mut trailing_slash = false;
        for (k, seg) in segments.into_iter().enumerate().skip(1) {
            let dot = |s: &[(u8, bool)], n: usize| s.len() == n && s.iter().all(|&c| c == (b'.', false));
            if seg.is_empty() {
                // Merged slash (or the final one).
                trailing_slash = k == last;
                continue;
            }
            if dot(&seg, 1) {
                trailing_slash = true;
                continue;
            }
            if dot(&seg, 2) {
                out.pop()?;
                trailing_slash = true;
                continue;
            }
            trailing_slash = false;
            out.push(seg.iter().map(|&(b, _)| b).collect());
        }
        let mut text = Vec::new();
        for seg in &out {
            text.push(b'/');
            text.extend_from_slice(seg);
        }
        if (trailing_slash || out.is_empty()) && ends_open {
            text.push(b'/');
        }
        Some(text)
    }

    fn path_text() -> impl Strategy<Value = Vec<u8>> {
        let piece = prop::sample::select(vec![
            "/", "//", ".", "..", "a", "B", "%2e", "%2E", "%2f", "%2F", "%25", "%23", "%3f", "%3F", "%00", "%", "%4",
            "%zz", "%41", "+", "\\", "env", "%2e%2e", "/./", "/../", "?", "#", "é",
        ]);
        prop::collection::vec(piece, 0..10).prop_map(|v| {
            let mut p = b"/".to_vec();
            p.extend(v.concat().into_bytes());
            p
        })
    }

    /// Paths with no `%` and no `/` before a `/` or a `.`.
    fn plain_text() -> impl Strategy<Value = Vec<u8>> {
        let segment = prop::sample::select(vec!["/a", "/B.c", "/x..y", "/+", "/é", "/a\\b", "/~u", "/a.", "/-"]);
        (prop::collection::vec(segment, 0..6), any::<bool>()).prop_map(|(v, slash)| {
            let mut p = v.concat().into_bytes();
            if slash || p.is_empty() {
                p.push(b'/');
            }
            p
        })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(5_000))]

        /// nginx's state machine, in place, agrees with the plain reading.
        #[test]
        fn resolving_agrees_with_the_reference(p in path_text()) {
            let cut = memchr2(b'?', b'#', &p).unwrap_or(p.len());
            let mut buf = p[..cut].to_vec();
            let got = resolve_in_place(&mut buf).map(|n| buf[..n].to_vec());
            prop_assert_eq!(got, reference(&p[..cut]), "{}", String::from_utf8_lossy(&p));
        }

        /// The output of resolving resolves to itself (unless it holds a
        /// `%`, which came from `%25` and would be decoded again).
        #[test]
        fn resolving_is_idempotent(p in path_text()) {
            let cut = memchr2(b'?', b'#', &p).unwrap_or(p.len());
            let mut buf = p[..cut].to_vec();
            if let Some(n) = resolve_in_place(&mut buf) {
                let once = buf[..n].to_vec();
                let mut again = once.clone();
                let m = resolve_in_place(&mut again);
                if !once.contains(&b'%') {
                    prop_assert_eq!(m.map(|m| again[..m].to_vec()), Some(once));
                }
            }
        }

        /// A plain path is returned unchanged, as the same slice.
        #[test]
        fn a_plain_path_is_itself(p in plain_text(), query in "[a-z=&%./]{0,8}") {
            let path_part = &p[..];
            prop_assert!(is_plain(path_part));
            let mut target = path_part.to_vec();
            target.push(b'?');
            target.extend(query.bytes());
            let mut scratch = Vec::new();
            let got = path(&target, Some(&mut scratch));
            prop_assert!(std::ptr::eq(got.as_ptr(), target.as_ptr()));
            prop_assert_eq!(got, path_part);
            let mut buf = path_part.to_vec();
            prop_assert_eq!(resolve_in_place(&mut buf), Some(path_part.len()));
        }

        /// The one-pass scan agrees with its definition.
        #[test]
        fn scan_is_the_end_then_is_plain(p in path_text()) {
            let end = memchr2(b'?', b'#', &p).unwrap_or(p.len());
            prop_assert_eq!(scan(&p), (end, is_plain(&p[..end])));
        }

        /// No bytes panic, and the result is a slice of the target or of the scratch buffer.
        #[test]
        fn any_target_is_read_without_panic(t in prop::collection::vec(any::<u8>(), 0..60)) {
            let mut scratch = Vec::new();
            let _ = path(&t, Some(&mut scratch));
            let _ = path(&t, None);
        }
    }
}
