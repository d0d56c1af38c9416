//! JSON access logs: nginx `log_format NAME escape=json '{...}'`, one object
//! per line, read through a mapping from nginx variables to the object's keys
//! (`format: { json: { remote_addr: client, time_iso8601: ts } }`).
//!
//! A small hand scanner, not a JSON library: it walks the top-level object
//! once, compares each key with the mapped ones and keeps the values of those
//! (strings and numbers; nested objects and arrays are skipped, and a mapped
//! key holding one makes the line unparsed). A value is borrowed from the
//! line unless it holds an escape (`\"`, `\\`, `\u0041`); then it is decoded
//! into the caller's scratch buffer, so that `match:` and `ignore:` see the
//! characters the client sent, not their JSON spelling. No allocation per
//! line once the scratch buffer has grown to the longest escaped values.
//!
//! Escaping is what keeps the address honest here: nginx writes a `"` inside
//! a value as `\"`, so a client-written value can never close its string and
//! add a key; and the first occurrence of a key wins, as nginx writes the
//! template's keys before nothing a client controls. A line that is not one
//! JSON object, or lacks the client (or, when a time is mapped, the time), is
//! unparsed.

use super::fields::split_request;
use super::log_format::Found;
use super::target::{self, Located};
use super::variables::Field;
use super::{FormatError, Request};
use crate::addr::NetSet;

/// Most keys a mapping may name (the variables fleetban reads are fewer).
pub(crate) const MAX_KEYS: usize = 24;

/// The nginx variables a JSON mapping may name, in the order `check` lists
/// them; `format: json` alone maps each but the forwarded ones to a key of
/// its own name.
pub const JSON_VARIABLES: &[&str] = &[
    "remote_addr",
    "time_iso8601",
    "time_local",
    "msec",
    "request",
    "request_method",
    "request_uri",
    "uri",
    "status",
    "http_referer",
    "http_user_agent",
    "host",
    "http_host",
    "server_name",
    "limit_req_status",
    "http_x_forwarded_for",
    "proxy_protocol_addr",
];

/// The mapping of `format: json` written alone: every variable but the
/// forwarded ones under its own name.
pub fn default_json_mapping() -> Vec<(String, String)> {
    JSON_VARIABLES
        .iter()
        .filter(|v| !Field::of(v).is_forwarded())
        .map(|v| ((*v).to_owned(), (*v).to_owned()))
        .collect()
}

/// A compiled mapping.
#[derive(Debug)]
pub(crate) struct JsonFormat {
    /// The object's key (as logged, unescaped) and the field it fills.
    keys: Vec<(Box<[u8]>, Field)>,
    has_time: bool,
    forwarded: Option<Field>,
}

/// Where the request's path is.
enum At {
    Line(usize, usize),
    Scratch(usize, usize),
    Root,
    /// Read from the request's target as the other formats do (no scratch
    /// buffer, or no target: then `$uri`, if logged).
    Target,
}

/// Where one kept value is: in the line, or decoded in the scratch buffer.
#[derive(Clone, Copy, Default)]
struct Span {
    key: u8,
    in_scratch: bool,
    start: u32,
    end: u32,
}

impl Span {
    /// Key `k`'s value at `start..end` of the line, or of the scratch
    /// buffer where it was unescaped (lines and keys fit: `MAX_LINE`, 64 keys).
    fn new(k: usize, in_scratch: bool, start: usize, end: usize) -> Span {
        Span {
            key: k as u8,
            in_scratch,
            start: start as u32,
            end: end as u32,
        }
    }
}

impl JsonFormat {
    /// `mapping`: (nginx variable, JSON key) pairs.
    pub(crate) fn compile(mapping: &[(String, String)]) -> Result<JsonFormat, FormatError> {
        if mapping.len() > MAX_KEYS {
            return Err(FormatError::JsonTooManyKeys { max: MAX_KEYS });
        }
        let mut keys: Vec<(Box<[u8]>, Field)> = Vec::with_capacity(mapping.len());
        let mut names: Vec<&str> = Vec::with_capacity(mapping.len());
        for (variable, key) in mapping {
            let field = Field::of(variable);
            if !JSON_VARIABLES.contains(&variable.to_ascii_lowercase().as_str()) {
                return Err(FormatError::JsonUnknownVariable {
                    name: variable.clone(),
                    known: JSON_VARIABLES.join(", "),
                });
            }
            if key.is_empty() {
                return Err(FormatError::JsonEmptyKey { name: variable.clone() });
            }
            if let Some(k) = keys.iter().position(|(b, _)| **b == *key.as_bytes()) {
                return Err(FormatError::JsonDuplicateKey {
                    key: key.clone(),
                    first: names[k].to_owned(),
                    second: variable.clone(),
                });
            }
            keys.push((key.as_bytes().into(), field));
            names.push(variable);
        }
        if !keys.iter().any(|(_, f)| *f == Field::Addr) {
            return Err(match keys.iter().find(|(_, f)| f.is_forwarded()) {
                Some((_, f)) => FormatError::ForwardedWithoutPeer { name: f.name() },
                None => FormatError::JsonNoAddr,
            });
        }
        Ok(JsonFormat {
            has_time: keys.iter().any(|(_, f)| f.is_time()),
            forwarded: keys.iter().map(|(_, f)| *f).find(|f| f.is_forwarded()),
            keys,
        })
    }

    pub(crate) fn has_time(&self) -> bool {
        self.has_time
    }

    /// Whether a key gives the request target (`request`, `request_uri`).
    pub(crate) fn has_target(&self) -> bool {
        self.keys
            .iter()
            .any(|(_, f)| matches!(f, Field::Request | Field::RequestUri))
    }

    pub(crate) fn forwarded(&self) -> Option<&'static str> {
        self.forwarded.map(Field::name)
    }

    /// Parses one line; escaped values are decoded into `scratch` (cleared
    /// first), or given as logged without one.
    pub(crate) fn parse<'a>(
        &self,
        line: &'a [u8],
        mut scratch: Option<&'a mut Vec<u8>>,
        proxies: &NetSet,
    ) -> Option<Request<'a>> {
        if let Some(s) = scratch.as_deref_mut() {
            s.clear();
        }
        let mut spans = [Span::default(); MAX_KEYS];
        let mut kept = 0usize;
        let mut seen = 0u32;
        let mut i = skip_ws(line, 0);
        if line.get(i) != Some(&b'{') {
            return None;
        }
        i = skip_ws(line, i + 1);
        if line.get(i) == Some(&b'}') {
            return None; // no client
        }
        loop {
            if line.get(i) != Some(&b'"') {
                return None;
            }
            let (kstart, kend, kesc) = string(line, i + 1)?;
            i = skip_ws(line, kend + 1);
            if line.get(i) != Some(&b':') {
                return None;
            }
            i = skip_ws(line, i + 1);
            let slot = self.lookup(&line[kstart..kend], kesc).filter(|&k| seen & (1 << k) == 0);
            match *line.get(i)? {
                b'"' => {
                    let (vstart, vend, vesc) = string(line, i + 1)?;
                    if let Some(k) = slot {
                        spans[kept] = if let (true, Some(scratch)) = (vesc, scratch.as_deref_mut()) {
                            let start = scratch.len();
                            unescape(&line[vstart..vend], scratch)?;
                            Span::new(k, true, start, scratch.len())
                        } else {
                            Span::new(k, false, vstart, vend)
                        };
                        kept += 1;
                        seen |= 1 << k;
                    }
                    i = vend + 1;
                }
                b'{' | b'[' => {
                    if slot.is_some() {
                        return None;
                    }
                    i = skip_nested(line, i)?;
                }
                _ => {
                    let end = i + line[i..]
                        .iter()
                        .position(|&b| !is_scalar_byte(b))
                        .unwrap_or(line.len() - i);
                    let word = &line[i..end];
                    let number = word.first().is_some_and(|&b| b == b'-' || b.is_ascii_digit());
                    if !(number || word == b"true" || word == b"false" || word == b"null") {
                        return None;
                    }
                    if let Some(k) = slot.filter(|_| word != b"null") {
                        spans[kept] = Span::new(k, false, i, end);
                        kept += 1;
                        seen |= 1 << k;
                    }
                    i = end;
                }
            }
            i = skip_ws(line, i);
            match line.get(i) {
                Some(b',') => i = skip_ws(line, i + 1),
                Some(b'}') => break,
                _ => return None,
            }
        }
        if skip_ws(line, i + 1) != line.len() {
            return None;
        }
        // The path is resolved into `scratch` too, before it is frozen.
        let path_at = match scratch.as_deref_mut() {
            Some(scratch) => self.path_at(line, &spans[..kept], scratch),
            None => At::Target,
        };
        let buf: &'a [u8] = scratch.map_or(&[][..], |s| &s[..]);
        let mut found = Found::default();
        let mut timed = false;
        for s in &spans[..kept] {
            let (start, end) = (s.start as usize, s.end as usize);
            let value = if s.in_scratch {
                &buf[start..end]
            } else {
                &line[start..end]
            };
            let field = self.keys[usize::from(s.key)].1;
            timed |= field.is_time();
            found.set(field, value)?;
        }
        if self.has_time && !timed {
            return None;
        }
        let mut request = found.into_request(proxies)?;
        match path_at {
            At::Line(start, end) => request.path = &line[start..end],
            At::Scratch(start, end) => request.path = &buf[start..end],
            At::Root => request.path = b"/",
            At::Target if !request.target.is_empty() => request.path = target::path(request.target, None),
            At::Target => {}
        }
        Some(request)
    }

    /// Where the path of the line's target is: in the line, or resolved
    /// into `scratch` (appended, after the decoded values). The target is
    /// `$request_uri`'s value, else the target of `$request`'s.
    fn path_at(&self, line: &[u8], spans: &[Span], scratch: &mut Vec<u8>) -> At {
        let find = |field: Field| spans.iter().find(|s| self.keys[usize::from(s.key)].1 == field);
        let (span, whole) = match (find(Field::RequestUri), find(Field::Request)) {
            (Some(span), _) => (span, true),
            (None, Some(span)) => (span, false),
            (None, None) => return At::Target,
        };
        let in_scratch = span.in_scratch;
        let (mut start, mut end) = (span.start as usize, span.end as usize);
        let value = if in_scratch {
            &scratch[start..end]
        } else {
            &line[start..end]
        };
        if !whole {
            let (_, target) = split_request(value);
            if target.is_empty() {
                return At::Target;
            }
            // A slice of `value`: its offset there.
            start += target.as_ptr() as usize - value.as_ptr() as usize;
            end = start + target.len();
        }
        let value = if in_scratch {
            &scratch[start..end]
        } else {
            &line[start..end]
        };
        let at = |a: usize, b: usize| {
            if in_scratch {
                At::Scratch(start + a, start + b)
            } else {
                At::Line(start + a, start + b)
            }
        };
        match target::locate(value) {
            Located::Slice(a, b) => at(a, b),
            Located::Root => At::Root,
            Located::Resolve {
                start: a,
                end: b,
                raw_end,
            } => {
                let from = scratch.len();
                if in_scratch {
                    scratch.extend_from_within(start + a..start + b);
                } else {
                    scratch.extend_from_slice(&line[start + a..start + b]);
                }
                match target::resolve_tail(scratch, from) {
                    Some(()) => At::Scratch(from, scratch.len()),
                    None => at(0, raw_end),
                }
            }
        }
    }

    /// The index of the mapped key `raw` (a key as logged, `escaped` when it
    /// holds a backslash).
    fn lookup(&self, raw: &[u8], escaped: bool) -> Option<usize> {
        if !escaped {
            return self.keys.iter().position(|(k, _)| **k == *raw);
        }
        let mut decoded = Vec::with_capacity(raw.len());
        unescape(raw, &mut decoded)?;
        self.keys.iter().position(|(k, _)| **k == *decoded)
    }
}

fn skip_ws(line: &[u8], mut i: usize) -> usize {
    while matches!(line.get(i), Some(b' ' | b'\t' | b'\n' | b'\r')) {
        i += 1;
    }
    i
}

fn is_scalar_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || matches!(b, b'-' | b'+' | b'.')
}

/// The string whose content starts at `from` (after its `"`): (start, end of
/// content = the closing quote's index, whether it holds an escape).
fn string(line: &[u8], from: usize) -> Option<(usize, usize, bool)> {
    let mut at = from;
    let mut escaped = false;
    loop {
        let q = at + find_quote_or_backslash(line.get(at..)?)?;
        if line[q] == b'"' {
            return Some((from, q, escaped));
        }
        escaped = true;
        at = q + 2;
    }
}

/// The first `"` or `\\` in `s`. Keys and most values are a few bytes
/// long, where a plain loop beats memchr's vector set-up (a third of the
/// format's time, measured with `benches/parse.rs`); longer ones go to memchr.
#[inline]
fn find_quote_or_backslash(s: &[u8]) -> Option<usize> {
    let head = s.len().min(16);
    if let Some(n) = s[..head].iter().position(|&b| b == b'"' || b == b'\\') {
        return Some(n);
    }
    memchr::memchr2(b'"', b'\\', &s[head..]).map(|n| head + n)
}

/// Skips a nested object or array starting at `from`; the index after it.
fn skip_nested(line: &[u8], from: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut i = from;
    while i < line.len() {
        match line[i] {
            b'"' => i = string(line, i + 1)?.1,
            b'{' | b'[' => depth += 1,
            b'}' | b']' => {
                depth -= 1;
                if depth == 0 {
                    return Some(i + 1);
                }
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Appends the JSON string content `raw` decoded to `out`; `None` on an
/// invalid escape. A lone surrogate becomes U+FFFD.
pub(crate) fn unescape(raw: &[u8], out: &mut Vec<u8>) -> Option<()> {
    let mut i = 0;
    while i < raw.len() {
        let Some(n) = memchr::memchr(b'\\', &raw[i..]) else {
            out.extend_from_slice(&raw[i..]);
            break;
        };
        out.extend_from_slice(&raw[i..i + n]);
        i += n;
        let c = *raw.get(i + 1)?;
        i += 2;
        let byte = match c {
            b'"' => b'"',
            b'\\' => b'\\',
            b'/' => b'/',
            b'b' => 8,
            b'f' => 12,
            b'n' => b'\n',
            b'r' => b'\r',
            b't' => b'\t',
            b'u' => {
                let hi = hex4(raw.get(i..i + 4)?)?;
                i += 4;
                let cp = if (0xD800..0xDC00).contains(&hi) && raw.get(i..i + 2) == Some(b"\\u") {
                    match raw.get(i + 2..i + 6).and_then(hex4) {
                        Some(lo) if (0xDC00..0xE000).contains(&lo) => {
                            i += 6;
                            0x10000 + ((hi - 0xD800) << 10) + (lo - 0xDC00)
                        }
                        _ => 0xFFFD,
                    }
                } else {
                    hi
                };
                let ch = char::from_u32(cp).unwrap_or('\u{FFFD}');
                out.extend_from_slice(ch.encode_utf8(&mut [0; 4]).as_bytes());
                continue;
            }
            _ => return None,
        };
        out.push(byte);
    }
    Some(())
}

fn hex4(s: &[u8]) -> Option<u32> {
    s.iter()
        .try_fold(0u32, |acc, &b| Some(acc * 16 + char::from(b).to_digit(16)?))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn decoded(raw: &str) -> Option<String> {
        let mut out = Vec::new();
        unescape(raw.as_bytes(), &mut out)?;
        Some(String::from_utf8(out).unwrap())
    }

    #[test]
    fn escapes_decode_to_their_characters() {
        assert_eq!(decoded(r#"a\"b\\c\/d"#).as_deref(), Some(r#"a"b\c/d"#));
        assert_eq!(decoded(r"\u0041\u00e9\n").as_deref(), Some("Aé\n"));
        assert_eq!(decoded(r"\ud83d\ude00").as_deref(), Some("😀"));
        assert_eq!(decoded(r"\ud83dx").as_deref(), Some("\u{FFFD}x"));
        assert_eq!(decoded(r"\q"), None);
        assert_eq!(decoded(r"\u00g1"), None);
        assert_eq!(decoded("trailing\\"), None);
    }

    #[test]
    fn nested_values_are_skipped_whole() {
        let line = br#"{"a":[1,{"b":"]}"}],"c":2}"#;
        assert_eq!(skip_nested(line, 5), Some(19));
    }
}
