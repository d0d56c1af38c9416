//! The `blocklists:` section: local files of networks to drop
//! (`crate::blocklist`), each with its format, refresh period and cap.

use std::path::Path;

use serde::Deserialize;
use serde_saphyr::Spanned;

use super::values::Dur;
use super::ConfigError;
use crate::blocklist::{Format, Spec, DEFAULT_MAX_ENTRIES};

/// Shortest `refresh`: a file re-read more often than this is a mistake.
const MIN_REFRESH: std::time::Duration = std::time::Duration::from_secs(1);
/// Largest `max_entries`: the kernel holds every element in memory.
const MAX_CAP: usize = 5_000_000;

/// One entry as written.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BlocklistSection {
    /// The file (relative: to the main file's directory).
    pub file: Spanned<std::path::PathBuf>,
    pub format: FormatSpec,
    /// How often the file is re-read (default 1h).
    pub refresh: Option<Spanned<Dur>>,
    /// Networks taken from the file, in file order (default 200,000).
    pub max_entries: Option<Spanned<usize>>,
}

#[derive(Debug, Clone, Copy, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum FormatSpec {
    Netset,
    Drop,
}

/// The validated entries; errors name the value's line and column.
pub(super) fn blocklists(
    file: &Path,
    base: &Path,
    list: &[BlocklistSection],
    errors: &mut Vec<ConfigError>,
) -> Vec<Spec> {
    let mut out: Vec<Spec> = Vec::new();
    for b in list {
        let path = base.join(&b.file.value);
        if out.iter().any(|s| s.file == path) {
            errors.push(ConfigError::at(
                file,
                b.file.referenced,
                format!("blocklist {} is listed twice", path.display()),
            ));
            continue;
        }
        let refresh = match &b.refresh {
            None => std::time::Duration::from_secs(3600),
            Some(r) if r.value.0 < MIN_REFRESH => {
                errors.push(ConfigError::at(
                    file,
                    r.referenced,
                    "blocklist refresh must be at least 1s",
                ));
                MIN_REFRESH
            }
            Some(r) => r.value.0,
        };
        let max_entries = match &b.max_entries {
            None => DEFAULT_MAX_ENTRIES,
            Some(m) if (1..=MAX_CAP).contains(&m.value) => m.value,
            Some(m) => {
                errors.push(ConfigError::at(
                    file,
                    m.referenced,
                    format!("blocklist max_entries must be between 1 and {MAX_CAP}"),
                ));
                DEFAULT_MAX_ENTRIES
            }
        };
        out.push(Spec {
            file: path,
            format: match b.format {
                FormatSpec::Netset => Format::Netset,
                FormatSpec::Drop => Format::Drop,
            },
            refresh,
            max_entries,
        });
    }
    out
}
