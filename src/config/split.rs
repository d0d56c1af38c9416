//! Reading the rules of a rule file one by one, when the file as a whole
//! does not deserialize: a bad rule must not hide the errors of the rules
//! after it (`fleetban check` reports every error of every rule).
//!
//! The `rules:` list is found in the text (block style: items starting with
//! `-` at one indentation), and each item is deserialized alone from a copy
//! of the file in which every other item's lines are blanked: lines and
//! columns stay those of the file, so each error names its real place. A
//! rule that does not deserialize is then read key by key the same way
//! (its other keys blanked), so that its every key's error is found. A
//! file this does not understand (a flow-style list, anchors shared between
//! rules) is reported as before, by its first error.

use std::path::Path;

use super::{schema, ConfigError};

/// The rules of `text` that deserialize on their own; the errors of the
/// others (and `whole`, the file's error, when no item accounts for it) go
/// to `errors`.
pub(super) fn each_rule(
    file: &Path,
    text: &str,
    whole: &serde_saphyr::Error,
    errors: &mut Vec<ConfigError>,
) -> Vec<schema::RuleSpec> {
    let whole = ConfigError::from_yaml(file, whole);
    let lines: Vec<&str> = text.split('\n').collect();
    let Some(items) = items(&lines) else {
        errors.push(whole);
        return Vec::new();
    };
    let mut specs = Vec::new();
    let mut found = Vec::new();
    for &(start, end) in &items {
        let doc: Vec<&str> = lines
            .iter()
            .enumerate()
            .map(|(i, l)| {
                let in_list = i >= items[0].0;
                let mine = (start..end).contains(&i);
                if in_list && !mine {
                    ""
                } else {
                    l
                }
            })
            .collect();
        match serde_saphyr::from_str::<schema::RuleFile>(&doc.join("\n")) {
            Ok(one) => specs.extend(one.rules),
            Err(e) => {
                let mut mine = key_errors(file, &doc, start, end);
                let e = ConfigError::from_yaml(file, &e);
                // A missing key is said by `key_errors`, at the rule's first key.
                if !e.message.starts_with("missing field")
                    && !mine.iter().any(|k| (k.line, k.column) == (e.line, e.column))
                {
                    mine.push(e);
                }
                for e in mine {
                    if !found.contains(&e) {
                        found.push(e);
                    }
                }
            }
        }
    }
    // The file's own error, unless an item's error already says it: one
    // outside every item (a top-level key), or one no item reproduces.
    let inside = |line: u64| items.iter().any(|&(s, e)| (s as u64 + 1..=e as u64).contains(&line));
    if found.is_empty() || !inside(whole.line) {
        found.insert(0, whole);
    }
    errors.extend(found);
    specs
}

/// The errors of each key of the item at lines `[start, end)` of `doc`
/// (where it is the only item), each key read with the others blanked.
fn key_errors(file: &Path, doc: &[&str], start: usize, end: usize) -> Vec<ConfigError> {
    let first = doc[start];
    let dash = first.len() - first.trim_start().len();
    let after = &first[dash + 1..];
    let key_col = dash + 1 + (after.len() - after.trim_start().len());
    let mut keys: Vec<usize> = vec![start];
    for (i, line) in doc.iter().enumerate().take(end).skip(start + 1) {
        let body = line.trim_start();
        if !body.is_empty() && !body.starts_with('#') && line.len() - body.len() == key_col {
            keys.push(i);
        }
    }
    let mut out = Vec::new();
    let names: Vec<&str> = keys
        .iter()
        .map(|&i| {
            doc[i][key_col.min(doc[i].len())..]
                .split(':')
                .next()
                .unwrap_or_default()
                .trim()
        })
        .collect();
    for required in ["name", "logs", "limit"] {
        if !names.contains(&required) {
            let message = format!("missing field `{required}`");
            out.push(ConfigError {
                file: file.to_path_buf(),
                line: start as u64 + 1,
                column: key_col as u64 + 1,
                message,
            });
        }
    }
    for (k, &from) in keys.iter().enumerate() {
        let to = keys.get(k + 1).copied().unwrap_or(end);
        let blank_first = format!("{}-", " ".repeat(dash));
        let one: Vec<&str> = doc
            .iter()
            .enumerate()
            .map(|(i, l)| match i {
                i if i == start && from != start => blank_first.as_str(),
                i if (start..end).contains(&i) && !(from..to).contains(&i) && i != start => "",
                _ => l,
            })
            .collect();
        if let Err(e) = serde_saphyr::from_str::<schema::RuleKeysFile>(&one.join("\n")) {
            out.push(ConfigError::from_yaml(file, &e));
        }
    }
    out
}

/// The line ranges `[start, end)` of the items of the top-level `rules:`
/// list, when it is written in block style.
fn items(lines: &[&str]) -> Option<Vec<(usize, usize)>> {
    let head = lines.iter().position(|l| {
        l.strip_prefix("rules:")
            .is_some_and(|rest| rest.trim().is_empty() || rest.trim_start().starts_with('#'))
    })?;
    let mut items: Vec<(usize, usize)> = Vec::new();
    let mut indent = None;
    for (i, line) in lines.iter().enumerate().skip(head + 1) {
        let body = line.trim_start();
        if body.is_empty() || body.starts_with('#') {
            continue;
        }
        let col = line.len() - body.len();
        let is_item = (body == "-" || body.starts_with("- ")) && indent.is_none_or(|c| c == col);
        match indent {
            None if is_item => indent = Some(col),
            None => return None,
            Some(c) if col < c || (col == c && !is_item) => {
                close(&mut items, i);
                break;
            }
            Some(_) => {}
        }
        if is_item {
            close(&mut items, i);
            items.push((i, usize::MAX));
        }
    }
    close(&mut items, lines.len());
    (!items.is_empty()).then_some(items)
}

/// Ends the open item (if any) before line `at`.
fn close(items: &mut [(usize, usize)], at: usize) {
    if let Some(last) = items.last_mut() {
        if last.1 == usize::MAX {
            last.1 = at;
        }
    }
}
