//! Blocklists: networks from local files (FireHOL netset, Spamhaus DROP)
//! dropped by their own nftables sets (one per prefix length, `block4_24`,
//! `enforce::block`), apart from the fleet's bans.
//!
//! This module is the pure part: read a file ([`parse`]), cap it, merge it
//! and take the never-banned networks out ([`subtract`]), and compute what a
//! refresh changes ([`diff`]). It knows nothing of nft or of the daemon; the
//! daemon (`daemon::blocklist`) reads the files on its schedule and hands the
//! result to the enforcer. Each host reads its own files: the same file is
//! shipped to every host by configuration management.

mod parse;
mod subtract;

use std::path::{Path, PathBuf};

use ipnet::IpNet;

pub use self::parse::{parse, Format, Parsed, NAMED_GARBAGE};
pub use self::subtract::{overlaps, subtract, Subtracted};

/// Entries one file may list when `max_entries` is not given.
pub const DEFAULT_MAX_ENTRIES: usize = 200_000;

/// One `blocklists:` entry, validated.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Spec {
    /// The file, absolute (relative paths are resolved against the main file).
    pub file: PathBuf,
    pub format: Format,
    /// How often the file is re-read.
    pub refresh: std::time::Duration,
    /// Networks taken from the file, in file order; the rest are refused.
    pub max_entries: usize,
}

/// Why a file could not be read.
#[derive(Debug, thiserror::Error)]
#[error("cannot read blocklist {}: {source}", file.display())]
pub struct ReadError {
    pub file: PathBuf,
    #[source]
    pub source: std::io::Error,
}

/// One file, read and ready for nft.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Loaded {
    /// Networks to drop: merged, never-banned ones taken out, sorted.
    pub nets: Vec<IpNet>,
    /// Networks the file listed (valid lines), before the cap.
    pub listed: usize,
    /// Comment and blank lines.
    pub comments: usize,
    /// Garbage lines, skipped.
    pub garbage: usize,
    /// The first garbage lines (line, text).
    pub garbage_lines: Vec<(usize, String)>,
    /// Networks written with host bits set, normalized.
    pub host_bits: usize,
    /// Networks wider than the widest fleetban drops, refused (the first
    /// ones with their line).
    pub too_wide: usize,
    pub too_wide_lines: Vec<(usize, IpNet)>,
    /// Networks refused over `max_entries`.
    pub over_cap: usize,
    /// Listed networks split around an allowed one.
    pub split: usize,
    /// Listed networks wholly allowed, dropped.
    pub dropped: usize,
}

/// Reads, caps, merges and subtracts `allowed` from `spec`'s file.
pub fn load(spec: &Spec, allowed: &[IpNet]) -> Result<Loaded, ReadError> {
    let text = std::fs::read(&spec.file).map_err(|source| ReadError {
        file: spec.file.clone(),
        source,
    })?;
    Ok(from_text(&String::from_utf8_lossy(&text), spec, allowed))
}

/// [`load`] for text already read.
pub fn from_text(text: &str, spec: &Spec, allowed: &[IpNet]) -> Loaded {
    let mut p = parse(text, spec.format);
    let listed = p.nets.len();
    let over_cap = listed.saturating_sub(spec.max_entries);
    p.nets.truncate(spec.max_entries);
    let s = subtract(&p.nets, allowed);
    Loaded {
        nets: s.nets,
        listed,
        comments: p.comments + p.blank,
        garbage: p.garbage,
        garbage_lines: p.garbage_lines,
        host_bits: p.host_bits,
        too_wide: p.too_wide,
        too_wide_lines: p.too_wide_lines,
        over_cap,
        split: s.split,
        dropped: s.dropped,
    }
}

/// The garbage lines as `FILE:LINE: TEXT`, comma-separated, for one warning.
pub fn named_garbage(file: &Path, l: &Loaded) -> String {
    let named: Vec<String> = l
        .garbage_lines
        .iter()
        .map(|(n, t)| format!("{}:{n}: {t:?}", file.display()))
        .collect();
    named.join(", ")
}

/// The refused wide networks as `FILE:LINE: NET`, comma-separated.
pub fn named_too_wide(file: &Path, l: &Loaded) -> String {
    let named: Vec<String> = l
        .too_wide_lines
        .iter()
        .map(|(n, net)| format!("{}:{n}: {}", file.display(), crate::addr::AddrText(net)))
        .collect();
    named.join(", ")
}

/// What turns `old` into `new` (both sorted, as [`Loaded::nets`]):
/// (added, deleted).
pub fn diff(old: &[IpNet], new: &[IpNet]) -> (Vec<IpNet>, Vec<IpNet>) {
    let (mut add, mut del) = (Vec::new(), Vec::new());
    let (mut i, mut j) = (0, 0);
    while i < old.len() || j < new.len() {
        match (old.get(i), new.get(j)) {
            (Some(o), Some(n)) if o == n => {
                i += 1;
                j += 1;
            }
            (Some(o), Some(n)) if o < n => {
                del.push(*o);
                i += 1;
            }
            (Some(_), Some(n)) | (None, Some(n)) => {
                add.push(*n);
                j += 1;
            }
            (Some(o), None) => {
                del.push(*o);
                i += 1;
            }
            (None, None) => break,
        }
    }
    (add, del)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn spec(max: usize) -> Spec {
        Spec {
            file: PathBuf::from("/x"),
            format: Format::Netset,
            refresh: std::time::Duration::from_secs(3600),
            max_entries: max,
        }
    }

    #[test]
    fn cap_refuses_the_excess_in_file_order() {
        let l = from_text("1.0.0.0/8\n2.0.0.0/8\n3.0.0.0/8\nx\n", &spec(2), &[]);
        assert_eq!(
            l.nets,
            vec!["1.0.0.0/8".parse::<IpNet>().unwrap(), "2.0.0.0/8".parse().unwrap()]
        );
        assert_eq!((l.listed, l.over_cap, l.garbage), (3, 1, 1));
    }

    proptest! {
        #[test]
        fn diff_turns_old_into_new(a in prop::collection::btree_set(0u32..64, 0..40), b in prop::collection::btree_set(0u32..64, 0..40)) {
            let nets = |s: &std::collections::BTreeSet<u32>| -> Vec<IpNet> {
                s.iter().map(|x| IpNet::from(std::net::IpAddr::from(std::net::Ipv4Addr::from(*x)))).collect()
            };
            let (old, new) = (nets(&a), nets(&b));
            let (add, del) = diff(&old, &new);
            let mut got: Vec<IpNet> = old.iter().filter(|n| !del.contains(n)).copied().chain(add.iter().copied()).collect();
            got.sort();
            prop_assert_eq!(got, new);
            prop_assert_eq!(add.len() + del.len(), a.symmetric_difference(&b).count());
        }
    }
}
