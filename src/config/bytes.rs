//! A size in bytes as the configuration writes it (`128MiB`, `512MB`,
//! `64kB`): always with its unit, since a bare number could be bytes or
//! megabytes (`safety.max_client_state`).

use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer};

use super::values::FromStrVisitor;

/// Bytes, parsed from a number and a unit: B, kB/KB, MB, GB (powers of
/// 1000) or KiB, MiB, GiB (powers of 1024). Shown in the binary units.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct ByteSize(pub u64);

const UNITS: &[(&str, u64)] = &[
    ("B", 1),
    ("kB", 1000),
    ("KB", 1000),
    ("MB", 1000 * 1000),
    ("GB", 1000 * 1000 * 1000),
    ("KiB", 1 << 10),
    ("MiB", 1 << 20),
    ("GiB", 1 << 30),
];

impl FromStr for ByteSize {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let split = t.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(t.len());
        let (number, unit) = (&t[..split], t[split..].trim());
        let hint = "expected a size with its unit, such as 128MiB, 512MB or 64KiB";
        let Ok(n) = number.parse::<f64>() else {
            return Err(format!("invalid size `{s}`: {hint}"));
        };
        if unit.is_empty() {
            return Err(format!("`{s}`: add a unit, e.g. {number}MiB or {number}MB"));
        }
        let Some((_, scale)) = UNITS.iter().find(|(u, _)| *u == unit) else {
            return Err(format!("invalid size `{s}`: unknown unit `{unit}`; {hint}"));
        };
        let bytes = n * *scale as f64;
        if !bytes.is_finite() || bytes >= u64::MAX as f64 {
            return Err(format!("invalid size `{s}`: too large"));
        }
        Ok(ByteSize(bytes as u64))
    }
}

impl fmt::Display for ByteSize {
    /// The largest binary unit it reaches, one decimal where it has one.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let n = self.0;
        let (scale, unit) = match n {
            n if n >= 1 << 30 => (1u64 << 30, "GiB"),
            n if n >= 1 << 20 => (1 << 20, "MiB"),
            n if n >= 1 << 10 => (1 << 10, "KiB"),
            _ => return write!(f, "{n}B"),
        };
        match n % scale {
            0 => write!(f, "{}{unit}", n / scale),
            _ => write!(f, "{:.1}{unit}", n as f64 / scale as f64),
        }
    }
}

impl<'de> Deserialize<'de> for ByteSize {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<ByteSize>::new("a size such as 128MiB"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sizes_take_their_unit() {
        assert_eq!("128MiB".parse::<ByteSize>().unwrap().0, 128 << 20);
        assert_eq!("512MB".parse::<ByteSize>().unwrap().0, 512_000_000);
        assert_eq!("64 KiB".parse::<ByteSize>().unwrap().0, 64 << 10);
        assert_eq!("1.5GiB".parse::<ByteSize>().unwrap().0, 3 << 29);
        assert_eq!("4096B".parse::<ByteSize>().unwrap().0, 4096);
        let bare = "128".parse::<ByteSize>().unwrap_err();
        assert!(bare.contains("add a unit, e.g. 128MiB"), "{bare}");
        assert!("lots".parse::<ByteSize>().is_err());
        assert!("12furlongs".parse::<ByteSize>().unwrap_err().contains("unknown unit"));
        assert!("1e30GiB".parse::<ByteSize>().is_err());
    }

    #[test]
    fn sizes_are_shown_in_binary_units() {
        assert_eq!(ByteSize(128 << 20).to_string(), "128MiB");
        assert_eq!(ByteSize(3 << 29).to_string(), "1.5GiB");
        assert_eq!(ByteSize(1000).to_string(), "1000B");
        assert_eq!(ByteSize(1536).to_string(), "1.5KiB");
    }
}
