//! The records a host remembers to write back after Redis lost the list
//! (`lost.rs`), held compactly: a million records as JSON text took ~150
//! bytes each beside the list. The rule, host and reason of a record are
//! interned as one triple (few: a rule's bans from a host share their
//! reason's text, the hits apart), the numbers kept inline: 20 bytes a
//! record. Written back as the JSON `ban.lua` reads.

use std::collections::HashMap;

use crate::enforce::Until;

/// Distinct (rule, host, reason) triples kept at most (they are never
/// forgotten while the daemon runs); past it a record keeps its numbers
/// and is written back as restored (no rule, no reason).
const MAX_NAMES: usize = 1 << 20;

/// One record: its triple and numbers.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Kept {
    /// Index into [`Names`]; `u32::MAX`: the triple was not kept.
    names: u32,
    /// When the ban started, unix ms (split for 4-byte alignment).
    since: [u32; 2],
    count: u32,
    hits: u32,
}

impl Kept {
    /// A record read but not understood: written back as restored.
    pub const UNREADABLE: Kept = Kept {
        names: u32::MAX,
        since: [0, 0],
        count: 0,
        hits: 0,
    };

    /// No record read yet (an `Option<Kept>` would take 24 bytes, not 20:
    /// a million table entries).
    pub const UNREAD: Kept = Kept {
        names: u32::MAX - 1,
        ..Kept::UNREADABLE
    };

    /// Whether a record was read (understood or not).
    pub fn is_read(&self) -> bool {
        self.names != Kept::UNREAD.names
    }
}

/// The triples records share.
#[derive(Default)]
pub struct Names {
    list: Vec<[Box<str>; 3]>,
    index: HashMap<[Box<str>; 3], u32>,
}

/// A record as ban.lua writes it (fields this host writes back).
#[derive(serde::Deserialize, serde::Serialize)]
struct Json {
    #[serde(default)]
    rule: String,
    #[serde(default)]
    reason: String,
    #[serde(default)]
    host: String,
    #[serde(default)]
    since: i64,
    #[serde(default)]
    until: Option<i64>,
    #[serde(default)]
    count: u32,
    #[serde(default)]
    hits: u32,
}

impl Names {
    /// The record `text` (JSON), kept; None if it does not parse.
    pub fn keep(&mut self, text: &str) -> Option<Kept> {
        let j: Json = serde_json::from_str(text).ok()?;
        let triple: [Box<str>; 3] = [j.rule.into(), j.host.into(), j.reason.into()];
        let names = match self.index.get(&triple) {
            Some(&i) => i,
            None if self.list.len() < MAX_NAMES => {
                let i = self.list.len() as u32;
                self.list.push(triple.clone());
                self.index.insert(triple, i);
                i
            }
            None => u32::MAX,
        };
        let since = j.since as u64;
        Some(Kept {
            names,
            since: [(since >> 32) as u32, since as u32],
            count: j.count,
            hits: j.hits,
        })
    }

    /// `kept` as the JSON record of a ban ending `until`; None when its
    /// triple was not kept or no record was read (written back as
    /// restored).
    pub fn text(&self, kept: &Kept, until: Until) -> Option<String> {
        let [rule, host, reason] = self.list.get(kept.names as usize)?;
        let since = ((u64::from(kept.since[0]) << 32) | u64::from(kept.since[1])) as i64;
        serde_json::to_string(&Json {
            rule: rule.to_string(),
            reason: reason.to_string(),
            host: host.to_string(),
            since,
            until: match until {
                Until::At(t) => Some(t),
                Until::Permanent => None,
            },
            count: kept.count,
            hits: kept.hits,
        })
        .ok()
    }

    /// Triples kept.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.list.len()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_record_comes_back_as_it_was_read() {
        let mut names = Names::default();
        let text = r#"{"rule":"scraper","reason":"120 requests in 1m","host":"web-1","since":1764000000123,"until":1764003600123,"count":2,"hits":120}"#;
        let kept = names.keep(text).unwrap();
        let again = names.keep(text).unwrap();
        assert_eq!(kept, again);
        assert_eq!(names.len(), 1, "one triple for both");
        let back = names.text(&kept, Until::At(1_764_003_600_123)).unwrap();
        let a: serde_json::Value = serde_json::from_str(text).unwrap();
        let b: serde_json::Value = serde_json::from_str(&back).unwrap();
        assert_eq!(a, b);
        let permanent = names.text(&kept, Until::Permanent).unwrap();
        assert!(permanent.contains(r#""until":null"#), "{permanent}");
        assert_eq!(names.keep("not json"), None);
    }
}
