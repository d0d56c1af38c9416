//! What a configured log pattern names right now, without following it:
//! the readable files, and every path that is missing or unreadable, or a
//! glob that matches nothing. `fleetban check` prints these, the daemon
//! warns about them at start and `status` lists them, so that a log that
//! is not read is never silent. Also the first lines of a file, for
//! `check`'s "parses none of the first N lines".

use std::fs::File;
use std::io::{self, BufRead, BufReader, Read};
use std::path::{Path, PathBuf};

use super::patterns::Pattern;

/// One path (or a glob with no match) as a configured pattern names it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum LogFile {
    /// A regular file that opens for reading.
    Readable(PathBuf),
    /// Nothing at the path (the follower picks it up when it appears).
    Missing(PathBuf),
    /// Something at the path that cannot be read as a log: a directory, a
    /// path through a file, a permission refused. The error says which.
    Unreadable(PathBuf, String),
    /// A glob that matches no regular file.
    NoMatch(String),
}

impl LogFile {
    /// The path, or the glob for [`LogFile::NoMatch`].
    pub fn path(&self) -> String {
        match self {
            LogFile::Readable(p) | LogFile::Missing(p) | LogFile::Unreadable(p, _) => p.display().to_string(),
            LogFile::NoMatch(g) => g.clone(),
        }
    }

    /// `following`, `missing` or `unreadable` (a glob without a match is
    /// `missing`): the `state` of `status --json`'s sources.
    pub fn state(&self) -> &'static str {
        match self {
            LogFile::Readable(_) => "following",
            LogFile::Missing(_) | LogFile::NoMatch(_) => "missing",
            LogFile::Unreadable(..) => "unreadable",
        }
    }

    /// Why it is not read, for people; `None` when it is readable.
    pub fn problem(&self) -> Option<String> {
        match self {
            LogFile::Readable(_) => None,
            LogFile::Missing(_) => Some("no such file".to_owned()),
            LogFile::Unreadable(_, e) => Some(e.clone()),
            LogFile::NoMatch(_) => Some("the glob matches no file".to_owned()),
        }
    }
}

/// What `pattern` (a path or a glob, as in a rule's `logs:`) names now:
/// one entry for a path, one per matching file for a glob (or one
/// [`LogFile::NoMatch`]).
pub fn inspect(pattern: &str) -> Vec<LogFile> {
    let parsed = Pattern::new(pattern.to_owned());
    if parsed.is_glob() {
        let files: Vec<LogFile> = parsed.expand().into_iter().map(|p| inspect_path(&p)).collect();
        if files.is_empty() {
            return vec![LogFile::NoMatch(pattern.to_owned())];
        }
        return files;
    }
    vec![inspect_path(Path::new(pattern))]
}

/// One plain path: stat it, then open it (a permission refused shows only
/// there).
pub fn inspect_path(path: &Path) -> LogFile {
    let p = path.to_path_buf();
    match std::fs::metadata(path) {
        Ok(m) if m.is_file() => match File::open(path) {
            Ok(_) => LogFile::Readable(p),
            Err(e) => LogFile::Unreadable(p, e.to_string()),
        },
        Ok(m) if m.is_dir() => LogFile::Unreadable(p, "a directory, not a file".to_owned()),
        Ok(_) => LogFile::Unreadable(p, "not a regular file".to_owned()),
        Err(e) if e.kind() == io::ErrorKind::NotFound => LogFile::Missing(p),
        Err(e) => LogFile::Unreadable(p, e.to_string()),
    }
}

/// Up to `n` first lines of `path` (without their `\n` or a trailing
/// `\r`), each cut to [`super::MAX_LINE`] bytes.
pub fn first_lines(path: &Path, n: usize) -> io::Result<Vec<Vec<u8>>> {
    let mut reader = BufReader::new(File::open(path)?);
    let mut lines = Vec::new();
    while lines.len() < n {
        let mut line = Vec::new();
        let read = (&mut reader)
            .take(super::MAX_LINE as u64 + 1)
            .read_until(b'\n', &mut line)?;
        if read == 0 {
            break;
        }
        if line.last() == Some(&b'\n') {
            line.pop();
        } else if line.len() > super::MAX_LINE {
            // The rest of an overlong line is skipped, as the follower skips it.
            reader.skip_until(b'\n')?;
        }
        if line.last() == Some(&b'\r') {
            line.pop();
        }
        line.truncate(super::MAX_LINE);
        lines.push(line);
    }
    Ok(lines)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_kind_of_path_is_named_for_what_it_is() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.log");
        std::fs::write(&file, "x\n").unwrap();
        assert_eq!(inspect(file.to_str().unwrap()), vec![LogFile::Readable(file.clone())]);
        let missing = dir.path().join("none.log");
        assert_eq!(inspect(missing.to_str().unwrap()), vec![LogFile::Missing(missing)]);
        let through = file.join("b.log");
        assert!(
            matches!(&inspect(through.to_str().unwrap())[0], LogFile::Unreadable(_, e) if e.contains("Not a directory"))
        );
        assert!(
            matches!(&inspect(dir.path().to_str().unwrap())[0], LogFile::Unreadable(_, e) if e.contains("directory"))
        );
        let glob = format!("{}/*.gone", dir.path().display());
        assert_eq!(inspect(&glob), vec![LogFile::NoMatch(glob.clone())]);
        let glob = format!("{}/*.log", dir.path().display());
        assert_eq!(inspect(&glob), vec![LogFile::Readable(file)]);
    }

    #[test]
    fn first_lines_stops_at_n_and_strips_line_ends() {
        let dir = tempfile::tempdir().unwrap();
        let file = dir.path().join("a.log");
        std::fs::write(&file, "one\r\ntwo\nthree\nfour").unwrap();
        assert_eq!(
            first_lines(&file, 3).unwrap(),
            vec![b"one".to_vec(), b"two".to_vec(), b"three".to_vec()]
        );
        assert_eq!(first_lines(&file, 10).unwrap().len(), 4);
    }
}
