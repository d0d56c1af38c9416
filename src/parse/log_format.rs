//! nginx `log_format` strings, compiled once into a scanning program.
//!
//! `'$remote_addr [$time_iso8601] "$request" $status'` becomes a list of
//! steps: variable, literal ` [`, variable, literal `] "`, ... A line is read
//! left to right: a literal must be there, and a variable extends to the first
//! occurrence of the literal that follows it (or to the end of the line when
//! it is last). `$time_local` and `$time_iso8601` have a fixed width, so they
//! may contain the text that follows them. Before a literal that starts with a
//! quote, a backslash-escaped quote (`escape=json`) does not end the value.
//!
//! Variables that name a [`Request`] field fill it (the first occurrence wins;
//! `$request_method` and `$request_uri` win over what `$request` gives;
//! `$uri` is the path only when no target is logged, since it is nginx's
//! URI after rewrites and internal redirects); any other variable is an
//! opaque field, skipped. Compile-time checks keep the
//! address honest: `$remote_addr` is required, two variables need text between
//! them, and a free-text variable may precede `$remote_addr` only in quotes:
//! a space-delimited user agent or `X-Forwarded-For` in front of the address
//! would let a client choose which text lands in the address's place. Quotes
//! are trusted because nginx escapes a `"` inside a value (`escape=default` or
//! `escape=json`); with `escape=none` nothing client-written is safe there.

use memchr::memmem::Finder;
use memchr::{memchr, memchr2};

use super::addr::parse_addr;
use super::fields::{is_byte_count, is_escaped, is_trailer, parse_status, split_request};
use super::forwarded::resolve;
use super::time::{parse_epoch, parse_iso8601, parse_time_local};
use super::variables::{is_token_var, Field};
use super::{FormatError, Request};
use crate::addr::NetSet;

/// A compiled `log_format`.
#[derive(Debug)]
pub(crate) struct Program {
    steps: Vec<Step>,
    /// Whether some variable gives the time.
    has_time: bool,
    /// The variable a forwarded client comes from, if any.
    forwarded: Option<Field>,
}

/// A `Finder` is a few hundred bytes; a program has a handful of steps in one
/// `Vec`, so keeping them inline is cheaper than a box per variable.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum Step {
    Literal(Box<[u8]>),
    Var { field: Field, end: End },
}

/// Where a variable's value ends.
#[allow(clippy::large_enum_variant)]
#[derive(Debug)]
enum End {
    /// After this many bytes.
    Fixed(usize),
    /// At the first occurrence of the next literal. `quoted`: the literal starts
    /// with `"`, and an escaped quote is skipped. `lenient`: that literal is
    /// the format's closing `"`; a line that ends before it (truncated inside
    /// the last quoted field) still parses, as on the `combined` fast path.
    Before {
        literal: Finder<'static>,
        quoted: bool,
        lenient: bool,
    },
    /// At the end of the line (a free-text variable that comes last).
    Eol,
    /// At the next space or tab, or the end of the line: a token variable that
    /// comes last, so fields a site appends after it are ignored (`common`
    /// spelled out reads a `combined` line as its prefix, like the fast path).
    Word,
}

/// One piece of a format string before compilation.
enum Token<'f> {
    Literal(Vec<u8>),
    Var { name: &'f str, position: usize },
}

impl Program {
    pub(crate) fn compile(format: &str) -> Result<Program, FormatError> {
        if format.is_empty() {
            return Err(FormatError::Empty);
        }
        let tokens = tokenize(format)?;
        check(&tokens)?;
        let mut steps = Vec::with_capacity(tokens.len());
        for (k, token) in tokens.iter().enumerate() {
            steps.push(match token {
                Token::Literal(bytes) => Step::Literal(bytes.clone().into_boxed_slice()),
                Token::Var { name, .. } => {
                    let field = Field::of(name);
                    let end = match (field.fixed_width(), tokens.get(k + 1)) {
                        (Some(width), _) => End::Fixed(width),
                        (None, Some(Token::Literal(next))) => End::Before {
                            literal: Finder::new(next).into_owned(),
                            quoted: next.starts_with(b"\""),
                            lenient: k + 2 == tokens.len()
                                && next.as_slice() == b"\""
                                && ends_with_quote(k.checked_sub(1).and_then(|j| tokens.get(j))),
                        },
                        (None, _) if is_token_var(name) => End::Word,
                        (None, _) => End::Eol,
                    };
                    Step::Var { field, end }
                }
            });
        }
        let has_time = steps
            .iter()
            .any(|step| matches!(step, Step::Var { field, .. } if field.is_time()));
        let forwarded = steps.iter().find_map(|step| match step {
            Step::Var { field, .. } if field.is_forwarded() => Some(*field),
            _ => None,
        });
        Ok(Program {
            steps,
            has_time,
            forwarded,
        })
    }

    pub(crate) fn has_time(&self) -> bool {
        self.has_time
    }

    /// Whether a variable gives the request target (`$request`, `$request_uri`).
    pub(crate) fn has_target(&self) -> bool {
        self.steps.iter().any(|step| {
            matches!(
                step,
                Step::Var {
                    field: Field::Request | Field::RequestUri,
                    ..
                }
            )
        })
    }

    /// `http_x_forwarded_for` or `proxy_protocol_addr` when the client may
    /// come from one of them.
    pub(crate) fn forwarded(&self) -> Option<&'static str> {
        self.forwarded.map(Field::name)
    }

    /// Parses one line; `proxies` (when not empty) are the hops whose
    /// forwarded list is believed.
    pub(crate) fn parse<'a>(&self, line: &'a [u8], proxies: &NetSet) -> Option<Request<'a>> {
        let mut found = Found::default();
        let mut at = 0;
        for step in &self.steps {
            match step {
                Step::Literal(literal) => {
                    if !line.get(at..)?.starts_with(literal) {
                        return None;
                    }
                    at += literal.len();
                }
                Step::Var { field, end } => {
                    let stop = match end {
                        End::Fixed(width) => Some(at + width).filter(|&stop| stop <= line.len())?,
                        End::Eol => line.len(),
                        End::Word => memchr2(b' ', b'\t', &line[at..]).map_or(line.len(), |n| at + n),
                        End::Before {
                            literal,
                            quoted,
                            lenient,
                        } => match find_literal(line, at, literal, *quoted) {
                            Some(stop) => stop,
                            None if *lenient => {
                                found.set(*field, &line[at..])?;
                                at = line.len();
                                break;
                            }
                            None => return None,
                        },
                    };
                    found.set(*field, &line[at..stop])?;
                    at = stop;
                }
            }
        }
        if !is_trailer(line.get(at..)?) {
            return None;
        }
        found.into_request(proxies)
    }
}

/// Splits a format string into literals and variables (`$name`, `${name}`).
fn tokenize(format: &str) -> Result<Vec<Token<'_>>, FormatError> {
    let bytes = format.as_bytes();
    let mut tokens = Vec::new();
    let mut literal = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] != b'$' {
            literal.push(bytes[i]);
            i += 1;
            continue;
        }
        let position = i;
        let (start, end, next) = if bytes.get(i + 1) == Some(&b'{') {
            let start = i + 2;
            let close = memchr(b'}', &bytes[start..])
                .map(|n| start + n)
                .ok_or(FormatError::UnclosedBrace { position })?;
            if let Some(bad) = (start..close).find(|&j| !is_name_byte(bytes[j])) {
                // Everything before `bad` is ASCII, so it is a char boundary.
                let found = format[bad..].chars().next().unwrap_or('?');
                return Err(FormatError::BadVariableChar { found, position: bad });
            }
            (start, close, close + 1)
        } else {
            let start = i + 1;
            let len = bytes[start..].iter().take_while(|&&b| is_name_byte(b)).count();
            (start, start + len, start + len)
        };
        if start == end {
            return Err(FormatError::BadVariable { position });
        }
        if !literal.is_empty() {
            tokens.push(Token::Literal(std::mem::take(&mut literal)));
        }
        tokens.push(Token::Var {
            name: &format[start..end],
            position,
        });
        i = next;
    }
    if !literal.is_empty() {
        tokens.push(Token::Literal(literal));
    }
    Ok(tokens)
}

/// The compile-time rules: text between variables, an address, and nothing
/// ambiguous in front of the address.
fn check(tokens: &[Token<'_>]) -> Result<(), FormatError> {
    for pair in tokens.windows(2) {
        if let [Token::Var { name: first, .. }, Token::Var { name: second, position }] = pair {
            return Err(FormatError::AdjacentVariables {
                first: first.to_string(),
                second: second.to_string(),
                position: *position,
            });
        }
    }
    let addr_index = tokens
        .iter()
        .position(|t| matches!(t, Token::Var { name, .. } if Field::of(name) == Field::Addr));
    let Some(addr_index) = addr_index else {
        return Err(
            match tokens.iter().find_map(|t| match t {
                Token::Var { name, .. } if Field::of(name).is_forwarded() => Some(Field::of(name)),
                _ => None,
            }) {
                Some(field) => FormatError::ForwardedWithoutPeer { name: field.name() },
                None => FormatError::MissingAddr,
            },
        );
    };
    // A forwarded list holds client-written text: only quotes (nginx
    // escapes a `"` inside a value) or the end of the line bound it.
    for (k, token) in tokens.iter().enumerate() {
        let Token::Var { name, position } = token else {
            continue;
        };
        if Field::of(name) != Field::Forwarded {
            continue;
        }
        let before = k.checked_sub(1).and_then(|j| tokens.get(j));
        let quoted =
            ends_with_quote(before) && matches!(tokens.get(k + 1), Some(Token::Literal(l)) if l.starts_with(b"\""));
        if !quoted && k + 1 != tokens.len() {
            return Err(FormatError::UnquotedForwarded {
                name: name.to_string(),
                position: *position,
            });
        }
    }
    for (k, token) in tokens[..addr_index].iter().enumerate() {
        let Token::Var { name, position } = token else {
            continue;
        };
        if Field::of(name).fixed_width().is_some() || is_token_var(name) || Field::of(name) == Field::Forwarded {
            continue;
        }
        // A variable before the address is always followed by a literal.
        let next = match tokens.get(k + 1) {
            Some(Token::Literal(next)) => next.as_slice(),
            _ => b"",
        };
        let before = k.checked_sub(1).and_then(|j| tokens.get(j));
        if ends_with_quote(before) && next.starts_with(b"\"") {
            continue;
        }
        return Err(FormatError::AmbiguousBeforeAddr {
            name: name.to_string(),
            position: *position,
            delimiter: String::from_utf8_lossy(next).into_owned(),
        });
    }
    Ok(())
}

fn ends_with_quote(token: Option<&Token<'_>>) -> bool {
    matches!(token, Some(Token::Literal(l)) if l.ends_with(b"\""))
}

fn is_name_byte(b: u8) -> bool {
    b.is_ascii_alphanumeric() || b == b'_'
}

/// First occurrence of `literal` in `line` at or after `from`, skipping
/// backslash-escaped quotes when `quoted`.
fn find_literal(line: &[u8], from: usize, literal: &Finder<'_>, quoted: bool) -> Option<usize> {
    let mut at = from;
    loop {
        let hit = at + literal.find(line.get(at..)?)?;
        if !quoted || !is_escaped(line, from, hit) {
            return Some(hit);
        }
        at = hit + 1;
    }
}

/// Raw values seen on one line, first occurrence of each field (also what
/// the JSON format fills, `json.rs`).
#[derive(Default)]
pub(crate) struct Found<'a> {
    addr: Option<&'a [u8]>,
    forwarded: Option<&'a [u8]>,
    time: Option<(Field, &'a [u8])>,
    request: Option<&'a [u8]>,
    method: Option<&'a [u8]>,
    request_uri: Option<&'a [u8]>,
    uri: Option<&'a [u8]>,
    status: Option<&'a [u8]>,
    referer: Option<&'a [u8]>,
    user_agent: Option<&'a [u8]>,
    host: Option<&'a [u8]>,
    limit_req_status: Option<&'a [u8]>,
}

impl<'a> Found<'a> {
    /// Records a value; `None` when it can already be seen to be invalid.
    pub(crate) fn set(&mut self, field: Field, value: &'a [u8]) -> Option<()> {
        let slot = match field {
            Field::Addr => &mut self.addr,
            Field::Forwarded | Field::ProxyProtocol => &mut self.forwarded,
            Field::TimeLocal | Field::TimeIso | Field::Msec => {
                self.time.get_or_insert((field, value));
                return Some(());
            }
            Field::Request => &mut self.request,
            Field::Method => &mut self.method,
            Field::RequestUri => &mut self.request_uri,
            Field::Uri => &mut self.uri,
            Field::Status => &mut self.status,
            Field::Bytes => return is_byte_count(value).then_some(()),
            Field::Referer => &mut self.referer,
            Field::UserAgent => &mut self.user_agent,
            Field::Host => &mut self.host,
            Field::LimitReqStatus => &mut self.limit_req_status,
            Field::Other => return Some(()),
        };
        slot.get_or_insert(value);
        Some(())
    }

    pub(crate) fn into_request(self, proxies: &NetSet) -> Option<Request<'a>> {
        let peer = parse_addr(self.addr?)?;
        let addr = match self.forwarded {
            Some(list) if !proxies.is_empty() => resolve(peer, list, proxies)?,
            _ => peer,
        };
        let mut request = Request::with_addr(addr);
        if let Some((field, text)) = self.time {
            request.time_ms = Some(match field {
                Field::TimeLocal => parse_time_local(text)?,
                Field::TimeIso => parse_iso8601(text)?,
                _ => parse_epoch(text)?,
            });
        }
        if let Some(status) = self.status {
            request.status = parse_status(status)?;
        }
        let (method, target) = self.request.map_or((&b""[..], &b""[..]), split_request);
        request.method = self.method.unwrap_or(method);
        request.target = self.request_uri.unwrap_or(target);
        // Already nginx's path; the caller reads the path from the target
        // instead when there is one (`$uri` is the URI after rewrites and
        // internal redirects, not the client's).
        request.path = self.uri.unwrap_or_default();
        request.referer = self.referer.unwrap_or_default();
        request.user_agent = self.user_agent.unwrap_or_default();
        request.host = self.host.unwrap_or_default();
        request.limit_req_status = self.limit_req_status.unwrap_or_default();
        Some(request)
    }
}
