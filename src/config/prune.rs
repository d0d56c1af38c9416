//! Every error of a file in one run: serde stops at the first error of a
//! document, so after each one the entry holding it is blanked out of a
//! copy of the text and the copy is read again, until it deserializes.
//!
//! Blanking writes spaces over the entry (its key and value, the `,` of a
//! flow collection, the `-` of a block sequence's item), never over a line
//! end, so every other line and column stays those of the file and each
//! error names its real place. A block collection left without entries
//! becomes `{}` or `[]` where its entry stood. What deserializes at the end
//! is the file minus its bad entries: its sections are then validated as
//! usual (`Pruned::hides` drops what a blanked entry would make them say,
//! `Pruned::touches` which items lost an entry, so that they are not used).
//! A document the YAML parser refuses is reported by its first error.

use std::path::Path;

use serde::de::DeserializeOwned;
use serde_saphyr::granit_parser::{Event, Parser};
use serde_saphyr::Location;

use super::ConfigError;

/// At most this many errors are reported per file (each costs a re-read).
const MAX_ERRORS: usize = 200;
/// At most this many re-reads per file, whatever they find.
const MAX_ROUNDS: usize = 1000;

/// A place in the text: 1-based line, 1-based column (as errors print
/// them) and the character index.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
struct Pos {
    line: u64,
    column: u64,
    index: usize,
}

impl Pos {
    fn at(&self) -> (u64, u64) {
        (self.line, self.column)
    }
}

/// A node of the YAML tree with its span; a mapping's children alternate
/// key and value.
#[derive(Debug)]
struct Node {
    start: Pos,
    end: Pos,
    /// A scalar's text (a mapping key's name), empty for a collection.
    text: String,
    kind: Kind,
    children: Vec<Node>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Scalar,
    Map { block: bool },
    Seq { block: bool },
}

/// One entry of a collection: a mapping's key and value, or a sequence's item.
struct Entry<'a> {
    start: Pos,
    end: Pos,
    key: Option<&'a str>,
    value: &'a Node,
}

impl Node {
    fn entries(&self) -> Vec<Entry<'_>> {
        match self.kind {
            Kind::Scalar => Vec::new(),
            Kind::Seq { .. } => self
                .children
                .iter()
                .map(|c| Entry {
                    start: c.start,
                    end: c.end,
                    key: None,
                    value: c,
                })
                .collect(),
            Kind::Map { .. } => self
                .children
                .chunks(2)
                .filter_map(|kv| match kv {
                    [k, v] => Some(Entry {
                        start: k.start,
                        end: k.end.max(v.end),
                        key: Some(k.text.as_str()),
                        value: v,
                    }),
                    _ => None,
                })
                .collect(),
        }
    }

    /// Where serde places an error about this collection as a whole: its
    /// first key or item in block style, its bracket in flow style.
    fn starts(&self) -> Vec<(u64, u64)> {
        let mut out = vec![self.start.at()];
        if let Some(first) = self.children.first() {
            out.push(first.start.at());
        }
        out
    }
}

/// What was blanked: for [`Pruned::hides`] and [`Pruned::touches`].
#[derive(Debug, Default)]
pub(super) struct Pruned {
    /// Where each collection that lost an entry starts (before and after):
    /// a check of that section as a whole would speak of what was blanked.
    starts: Vec<(u64, u64)>,
    /// The spans of the sequence items an entry was blanked from (or that
    /// were blanked): those items are not what the file says.
    items: Vec<(Pos, Pos)>,
    /// Keys blanked, with where they stood: a `missing field` error about
    /// one of them is not reported (its own error was).
    keys: Vec<(String, Pos)>,
}

impl Pruned {
    /// Whether a later check's error is about a section an entry was
    /// blanked from: it would report the absence of what was invalid.
    pub(super) fn hides(&self, e: &ConfigError) -> bool {
        self.starts.contains(&(e.line, e.column))
    }

    /// Whether `loc` is inside a sequence item that lost an entry.
    pub(super) fn touches(&self, loc: Location) -> bool {
        let at = (loc.line(), loc.column());
        self.items.iter().any(|(s, e)| s.at() <= at && at <= e.at())
    }
}

/// Deserializes `text` (the contents of `file`), reporting every error it
/// finds to `errors` in the order of the file; `None` when nothing could
/// be read (a YAML syntax error, an error at the root).
pub(super) fn every_error<T: DeserializeOwned>(
    file: &Path,
    text: &str,
    errors: &mut Vec<ConfigError>,
) -> Option<(T, Pruned)> {
    let mut chars: Vec<char> = text.chars().collect();
    let mut pruned = Pruned::default();
    let mut found: Vec<ConfigError> = Vec::new();
    let mut rounds = 0;
    let result = loop {
        rounds += 1;
        let current: String = chars.iter().collect();
        let e = match serde_saphyr::from_str::<T>(&current) {
            Ok(value) => break Some(value),
            Err(e) => e,
        };
        let mut error = ConfigError::from_yaml(file, &e);
        let Some(root) = tree(&current) else {
            found.push(error);
            break None;
        };
        let missing = missing_field(&error.message);
        let at = (error.line, error.column);
        let mut path = Vec::new();
        let target = match missing {
            Some(_) => holding_map(&root, at, &mut path),
            None => deepest(&root, at, &mut path),
        };
        let Some((parent, index)) = target else {
            found.push(error);
            break None;
        };
        let span = {
            let entry = &parent.entries()[index];
            if missing.is_some() {
                // Serde says where it stopped reading; the mapping starts here.
                (error.line, error.column) = entry.value.start.at();
            }
            (entry.start, entry.end)
        };
        let blanked_key = missing.is_some_and(|key| {
            pruned
                .keys
                .iter()
                .any(|(k, p)| k == key && span.0 <= *p && *p <= span.1)
        });
        if !blanked_key && !found.contains(&error) {
            found.push(error);
        }
        if found.len() >= MAX_ERRORS || rounds >= MAX_ROUNDS {
            break None;
        }
        let before = chars.clone();
        note(&mut pruned, &path, parent, index);
        blank(&mut chars, parent, index);
        if chars == before {
            break None;
        }
    };
    found.sort_by_key(|e| (e.line, e.column));
    errors.extend(found);
    result.map(|value| (value, pruned))
}

/// The key of a `missing field` error.
fn missing_field(message: &str) -> Option<&str> {
    message.strip_prefix("missing field `")?.split('`').next()
}

/// The innermost entry whose span holds `at`: its collection and index;
/// `path` gets the collections above it.
fn deepest<'a>(node: &'a Node, at: (u64, u64), path: &mut Vec<&'a Node>) -> Option<(&'a Node, usize)> {
    let entries = node.entries();
    // The last: a block collection ends where the next entry starts.
    let i = entries.iter().rposition(|e| e.start.at() <= at && at <= e.end.at())?;
    path.push(node);
    if let Some(inner) = deepest(entries[i].value, at, path) {
        return Some(inner);
    }
    path.pop();
    Some((node, i))
}

/// The entry whose value is the mapping a `missing field` error at `at`
/// speaks of: the innermost one holding `at` (serde places the error at
/// the last key it read, or at the `{` of an empty mapping).
fn holding_map<'a>(node: &'a Node, at: (u64, u64), path: &mut Vec<&'a Node>) -> Option<(&'a Node, usize)> {
    let entries = node.entries();
    path.push(node);
    for (i, e) in entries.iter().enumerate().rev() {
        if !(e.start.at() <= at && at <= e.end.at()) {
            continue;
        }
        if let Some(inner) = holding_map(e.value, at, path) {
            return Some(inner);
        }
        if matches!(e.value.kind, Kind::Map { .. }) && e.value.start.at() <= at && at <= e.value.end.at() {
            path.pop();
            return Some((node, i));
        }
    }
    path.pop();
    None
}

/// Records what blanking entry `index` of `parent` changes (`path`: the
/// collections above `parent`, outermost first).
fn note(pruned: &mut Pruned, path: &[&Node], parent: &Node, index: usize) {
    let entries = parent.entries();
    let entry = &entries[index];
    pruned.starts.extend(parent.starts());
    if index == 0 {
        match entries.get(1) {
            Some(next) => pruned.starts.push(next.start.at()),
            None => pruned.starts.push(entry.start.at()),
        }
    }
    if let Some(key) = entry.key {
        pruned.keys.push((key.to_owned(), entry.start));
    }
    let mut above: Vec<&Node> = path.to_vec();
    above.push(parent);
    for collection in above {
        if matches!(collection.kind, Kind::Seq { .. }) {
            let item = collection
                .children
                .iter()
                .find(|c| c.start <= entry.start && entry.end <= c.end);
            if let Some(item) = item {
                pruned.items.push((item.start, item.end));
            }
        }
    }
}

/// Writes spaces over entry `index` of `parent` (line ends kept), with the
/// `,` that separates it in a flow collection or the `-` that opens it in
/// a block sequence; an emptied block collection becomes `{}` or `[]`.
fn blank(chars: &mut [char], parent: &Node, index: usize) {
    let entries = parent.entries();
    let entry = &entries[index];
    let (mut from, to) = (entry.start.index, entry.end.index.min(chars.len()));
    let space = |c: &mut char| {
        if *c != '\n' && *c != '\r' {
            *c = ' ';
        }
    };
    let flow = matches!(parent.kind, Kind::Map { block: false } | Kind::Seq { block: false });
    if matches!(parent.kind, Kind::Seq { block: true }) {
        let mut i = from;
        while i > 0 && chars[i - 1] == ' ' {
            i -= 1;
        }
        if i > 0 && chars[i - 1] == '-' {
            from = i - 1;
        }
    }
    chars[from..to].iter_mut().for_each(space);
    if flow {
        let mut i = to;
        while i < chars.len() && chars[i].is_whitespace() {
            i += 1;
        }
        if chars.get(i) == Some(&',') {
            chars[i] = ' ';
        } else {
            let mut j = from;
            while j > 0 && chars[j - 1].is_whitespace() {
                j -= 1;
            }
            if j > 0 && chars[j - 1] == ',' {
                chars[j - 1] = ' ';
            }
        }
    } else if entries.len() == 1 && from + 1 < chars.len() {
        let empty = match parent.kind {
            Kind::Seq { .. } => ['[', ']'],
            _ => ['{', '}'],
        };
        chars[from] = empty[0];
        chars[from + 1] = empty[1];
    }
}

/// The document's tree, or `None` when the YAML parser refuses the text.
fn tree(text: &str) -> Option<Node> {
    let mut events = Vec::new();
    for event in Parser::new_from_str(text) {
        let (event, span) = event.ok()?;
        let pos = |m: serde_saphyr::granit_parser::Marker| Pos {
            line: m.line() as u64,
            column: m.col() as u64 + 1,
            index: m.index(),
        };
        events.push((event, pos(span.start), pos(span.end)));
    }
    let mut at = 0;
    while at < events.len() && !matches!(events[at].0, Event::DocumentStart(..)) {
        at += 1;
    }
    at += 1;
    let root = node(&events, &mut at)?;
    Some(root)
}

/// The node starting at `events[*at]`, advancing `at` past it.
fn node(events: &[(Event<'_>, Pos, Pos)], at: &mut usize) -> Option<Node> {
    let (event, start, end) = events.get(*at)?;
    *at += 1;
    let kind = match event {
        Event::Scalar(text, ..) => {
            return Some(Node {
                start: *start,
                end: *end,
                text: text.to_string(),
                kind: Kind::Scalar,
                children: Vec::new(),
            })
        }
        Event::Alias(..) => {
            return Some(Node {
                start: *start,
                end: *end,
                text: String::new(),
                kind: Kind::Scalar,
                children: Vec::new(),
            })
        }
        Event::MappingStart(style, ..) => Kind::Map {
            block: *style == serde_saphyr::granit_parser::StructureStyle::Block,
        },
        Event::SequenceStart(style, ..) => Kind::Seq {
            block: *style == serde_saphyr::granit_parser::StructureStyle::Block,
        },
        _ => return None,
    };
    let mut children = Vec::new();
    loop {
        match events.get(*at)? {
            (Event::MappingEnd | Event::SequenceEnd, _, close) => {
                *at += 1;
                return Some(Node {
                    start: *start,
                    end: *close,
                    text: String::new(),
                    kind,
                    children,
                });
            }
            _ => children.push(node(events, at)?),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Doc {
        a: Option<Inner>,
        b: Option<Vec<u8>>,
        c: Option<u8>,
    }

    #[derive(Debug, serde::Deserialize)]
    #[serde(deny_unknown_fields)]
    #[allow(dead_code)]
    struct Inner {
        x: Option<u8>,
        y: Option<u8>,
    }

    fn run(text: &str) -> (Vec<String>, bool) {
        let mut errors = Vec::new();
        let ok = every_error::<Doc>(Path::new("f"), text, &mut errors).is_some();
        (errors.iter().map(|e| format!("{}:{}", e.line, e.column)).collect(), ok)
    }

    #[test]
    fn every_error_of_flow_and_block_collections() {
        assert_eq!(
            run("a: { x: 300, z: 1, y: -1 }\nb: [1, x, 2, 999]\nc: 7\n"),
            (
                vec!["1:9".into(), "1:14".into(), "1:23".into(), "2:8".into(), "2:14".into()],
                true
            )
        );
        assert_eq!(
            run("a:\n  x: 300\n  y: 1\nb:\n  - 1\n  - x\nd: 1\nc: 900\n"),
            (vec!["2:6".into(), "6:5".into(), "7:1".into(), "8:4".into()], true)
        );
        assert_eq!(run("a:\n  z: 1\nc: 1\n"), (vec!["2:3".into()], true));
        // An emptied block sequence or mapping becomes `[]` or `{}`.
        assert_eq!(run("b:\n  - x\nc: 1\n"), (vec!["2:5".into()], true));
        assert_eq!(run("a:\n  x: 999\n"), (vec!["2:6".into()], true));
        // A bad value inside a flow list inside a block mapping.
        assert_eq!(
            run("a: { x: 1 }\nb: [1, 2, 256]\nc: x\n"),
            (vec!["2:11".into(), "3:4".into()], true)
        );
    }

    #[test]
    fn a_syntax_error_is_reported_once() {
        let (errors, ok) = run("a: { x: 1\n");
        assert_eq!(errors.len(), 1);
        assert!(!ok);
    }
}
