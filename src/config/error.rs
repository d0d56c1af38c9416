//! Configuration errors: every one names the file, line and column and says
//! what was expected. Loading collects as many as it can find in one pass so
//! that `fleetban check` shows them all at once.

use std::fmt;
use std::path::{Path, PathBuf};

use serde_saphyr::Location;

/// One problem in one configuration file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigError {
    pub file: PathBuf,
    /// 1-based; 0 when the problem has no position (a file that cannot be read).
    pub line: u64,
    pub column: u64,
    pub message: String,
}

impl ConfigError {
    pub fn at(file: &Path, loc: Location, message: impl Into<String>) -> ConfigError {
        let (line, column) = if loc == Location::UNKNOWN {
            (0, 0)
        } else {
            (loc.line(), loc.column())
        };
        ConfigError {
            file: file.to_path_buf(),
            line,
            column,
            message: message.into(),
        }
    }

    pub fn whole_file(file: &Path, message: impl Into<String>) -> ConfigError {
        ConfigError {
            file: file.to_path_buf(),
            line: 0,
            column: 0,
            message: message.into(),
        }
    }

    /// Turns a YAML/serde error into our form, keeping its position and
    /// dropping the library's own rendering of it.
    pub fn from_yaml(file: &Path, err: &serde_saphyr::Error) -> ConfigError {
        let loc = err.location().unwrap_or(Location::UNKNOWN);
        let mut message = err.without_snippet().to_string();
        // The library prefixes positions itself ("line 3 column 5: ..."); we print our own.
        if let Some(rest) = strip_position(&message) {
            message = rest.to_owned();
        }
        if let Some(i) = message.rfind(" at line ") {
            if message[i + 9..].starts_with(|c: char| c.is_ascii_digit()) {
                message.truncate(i);
            }
        }
        ConfigError::at(file, loc, message.trim().to_owned())
    }
}

fn strip_position(message: &str) -> Option<&str> {
    let idx = message.find(": ")?;
    let head = &message[..idx];
    (head.contains("line") && head.chars().any(|c| c.is_ascii_digit())).then(|| &message[idx + 2..])
}

impl fmt::Display for ConfigError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.file.display(), self.message)
        } else {
            write!(
                f,
                "{}:{}:{}: {}",
                self.file.display(),
                self.line,
                self.column,
                self.message
            )
        }
    }
}

/// All the problems found while loading a configuration.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ConfigErrors(pub Vec<ConfigError>);

impl fmt::Display for ConfigErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, e) in self.0.iter().enumerate() {
            if i > 0 {
                writeln!(f)?;
            }
            write!(f, "{e}")?;
        }
        Ok(())
    }
}

impl std::error::Error for ConfigErrors {}
