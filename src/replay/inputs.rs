//! Which files `fleetban test` reads, in which order, and which rules read
//! each (docs/design.md §6, "What `test` reads"):
//! - no file given: the rules' own `logs:` (paths and globs), each file
//!   read by the rules that name it;
//! - files given: each read by the rules whose `logs:` name it, by its path
//!   or as a rotated sibling of it (`access.log.1`, `access.log.2.gz`,
//!   `access.log-20261130.gz`); a file no rule names (and `-`, standard
//!   input) by every selected rule;
//! - a directory given: its regular files, each family of rotated logs in
//!   the order it was written (dated ones oldest first, then the highest
//!   rotation number first, then the live file), families by name.

use std::path::{Path, PathBuf};

use crate::config::Rule;

/// One file to read and the rules that read it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Input {
    /// As given or as a glob expanded it; `-` is standard input.
    pub path: PathBuf,
    /// Indexes into the rules.
    pub rules: Vec<usize>,
    /// Whether some rule's `logs:` names it; if not, every rule reads it.
    pub named: bool,
}

/// What to read, and what was looked for and not found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Inputs {
    pub files: Vec<Input>,
    /// `rule R: logs: PATH: ...`: a rule's log that is missing or matches nothing.
    pub missing: Vec<String>,
}

/// How a log file stands in its rotation family.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
enum Rotation {
    /// `-20261130` (logrotate's `dateext`): oldest first.
    Dated(String),
    /// `.3`: `Reverse` so that the highest (oldest) comes first; a bare
    /// `.gz` counts as 0, after `.1`.
    Numbered(std::cmp::Reverse<u64>),
    /// The file nginx writes now: last.
    Live,
}

/// `name` without its rotation suffix, and its place in its family:
/// `access.log.2.gz` is (`access.log`, 2). Only names are read here; what
/// a file holds is told by its bytes when it is read.
fn rotation(name: &str) -> (&str, Rotation) {
    let (stem, compressed) = [".gz", ".zst", ".xz", ".bz2", ".lz4"]
        .iter()
        .find_map(|ext| name.strip_suffix(ext).map(|s| (s, true)))
        .unwrap_or((name, false));
    if let Some((base, n)) = stem.rsplit_once('.') {
        if !base.is_empty() && !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
            if let Ok(n) = n.parse() {
                return (base, Rotation::Numbered(std::cmp::Reverse(n)));
            }
        }
    }
    if let Some((base, date)) = stem.split_once('-').filter(|(b, _)| !b.is_empty()) {
        let digits = date.bytes().take_while(u8::is_ascii_digit).count();
        if digits >= 8 && date.bytes().all(|b| b.is_ascii_digit() || b == b'-' || b == b'_') {
            return (base, Rotation::Dated(date.to_owned()));
        }
    }
    if compressed {
        return (stem, Rotation::Numbered(std::cmp::Reverse(0)));
    }
    (name, Rotation::Live)
}

/// Sorts `paths` family by family (same directory and base name), each
/// in the order it was written.
fn order(paths: &mut [PathBuf]) {
    paths.sort_by_cached_key(|p| {
        let name = p
            .file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default();
        let (base, rot) = rotation(&name);
        (p.parent().map(Path::to_path_buf), base.to_owned(), rot)
    });
}

fn is_glob(pattern: &str) -> bool {
    pattern.contains(['*', '?', '[']) && glob::Pattern::new(pattern).is_ok()
}

/// No file given: every rule's own logs, each file read by the rules naming it.
pub fn of_rules(rules: &[Rule]) -> Inputs {
    let mut out = Inputs::default();
    for (i, rule) in rules.iter().enumerate() {
        for log in &rule.logs {
            let mut found: Vec<PathBuf> = if is_glob(log) {
                glob::glob(log)
                    .map(|paths| paths.filter_map(Result::ok).filter(|p| p.is_file()).collect())
                    .unwrap_or_default()
            } else {
                vec![PathBuf::from(log)]
            };
            order(&mut found);
            if found.is_empty() {
                out.missing
                    .push(format!("rule {}: logs: {log}: matches no file", rule.name));
            }
            for path in found {
                if let Err(e) = std::fs::metadata(&path) {
                    out.missing
                        .push(format!("rule {}: logs: {}: {e}", rule.name, path.display()));
                    continue;
                }
                match out.files.iter_mut().find(|f| f.path == path) {
                    Some(f) if !f.rules.contains(&i) => f.rules.push(i),
                    Some(_) => {}
                    None => out.files.push(Input {
                        path,
                        rules: vec![i],
                        named: true,
                    }),
                }
            }
        }
    }
    out
}

/// Files (or directories, or `-`) given: each read by the rules naming it.
pub fn of_args(rules: &[Rule], args: &[PathBuf]) -> std::io::Result<Inputs> {
    let mut out = Inputs::default();
    for arg in args {
        let mut paths = if arg.is_dir() {
            let entries = std::fs::read_dir(arg).map_err(|e| named(arg, e))?;
            let mut files = Vec::new();
            for entry in entries {
                let path = entry.map_err(|e| named(arg, e))?.path();
                if path.is_file() {
                    files.push(path);
                }
            }
            order(&mut files);
            files
        } else {
            vec![arg.clone()]
        };
        for path in paths.drain(..) {
            let rules_naming: Vec<usize> = if path == Path::new("-") {
                Vec::new()
            } else {
                (0..rules.len()).filter(|&i| names(&rules[i], &path)).collect()
            };
            let named = !rules_naming.is_empty();
            out.files.push(Input {
                rules: if named {
                    rules_naming
                } else {
                    (0..rules.len()).collect()
                },
                path,
                named,
            });
        }
    }
    Ok(out)
}

fn named(path: &Path, e: std::io::Error) -> std::io::Error {
    std::io::Error::new(e.kind(), format!("{}: {e}", path.display()))
}

/// Whether `rule`'s `logs:` name `path` or the live file it was rotated from.
fn names(rule: &Rule, path: &Path) -> bool {
    let mut candidates = vec![path.to_path_buf()];
    if let Ok(abs) = std::path::absolute(path) {
        candidates.push(abs);
    }
    if let (Some(dir), Some(name)) = (path.parent(), path.file_name()) {
        let dir = if dir.as_os_str().is_empty() {
            Path::new(".")
        } else {
            dir
        };
        if let Ok(dir) = dir.canonicalize() {
            candidates.push(dir.join(name));
        }
    }
    let live: Vec<PathBuf> = candidates
        .iter()
        .filter_map(|c| {
            let name = c.file_name()?.to_str()?;
            let (base, rot) = rotation(name);
            (rot != Rotation::Live).then(|| c.with_file_name(base))
        })
        .collect();
    candidates.extend(live);
    rule.logs.iter().any(|log| {
        if is_glob(log) {
            let Ok(pattern) = glob::Pattern::new(log) else {
                return false;
            };
            candidates.iter().any(|c| pattern.matches_path(c))
        } else {
            let log = Path::new(log);
            let canonical = log.canonicalize().ok();
            candidates.iter().any(|c| {
                c == log
                    || canonical
                        .as_deref()
                        .is_some_and(|l| c.canonicalize().is_ok_and(|c| c == l))
            })
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rotated_names_and_their_families() {
        use std::cmp::Reverse;
        assert_eq!(rotation("access.log"), ("access.log", Rotation::Live));
        assert_eq!(rotation("access.log.1"), ("access.log", Rotation::Numbered(Reverse(1))));
        assert_eq!(
            rotation("access.log.2.gz"),
            ("access.log", Rotation::Numbered(Reverse(2)))
        );
        assert_eq!(
            rotation("access.log-20261130.gz"),
            ("access.log", Rotation::Dated("20261130".into()))
        );
        assert_eq!(
            rotation("access.log.gz"),
            ("access.log", Rotation::Numbered(Reverse(0)))
        );
        assert_eq!(rotation("error-log"), ("error-log", Rotation::Live));
        let mut paths: Vec<PathBuf> = [
            "d/access.log",
            "d/access.log.1",
            "d/error.log",
            "d/access.log.10.gz",
            "d/access.log.2.gz",
            "d/access.log-20261129.gz",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        order(&mut paths);
        let names: Vec<&str> = paths.iter().map(|p| p.to_str().unwrap()).collect();
        assert_eq!(
            names,
            [
                "d/access.log-20261129.gz",
                "d/access.log.10.gz",
                "d/access.log.2.gz",
                "d/access.log.1",
                "d/access.log",
                "d/error.log"
            ]
        );
    }
}
