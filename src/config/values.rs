//! Scalar value types of the configuration, each with its own parser, so that
//! a bad value is reported by the YAML deserializer at the line and column
//! where it stands: durations (`60s`, `1h 30m`), lists that may be written as a
//! single scalar, regular expressions, networks (CIDR or bare address) and
//! status patterns (`404`, `"4xx"`).

use std::fmt;
use std::marker::PhantomData;
use std::str::FromStr;
use std::time::Duration;

use ipnet::IpNet;
use serde::de::{self, Deserializer, SeqAccess, Visitor};
use serde::Deserialize;

/// A duration written the human way: `60s`, `1h 30m`, `7d`, `250ms`.
/// A bare number is refused (is `250` milliseconds or seconds?), but `0`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Dur(pub Duration);

impl Dur {
    pub fn as_ms(self) -> i64 {
        i64::try_from(self.0.as_millis()).unwrap_or(i64::MAX)
    }
}

impl FromStr for Dur {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if !t.is_empty() && t.bytes().all(|b| b.is_ascii_digit() || b == b'.') {
            return match t.parse::<f64>() {
                Ok(0.0) => Ok(Dur(Duration::ZERO)),
                _ => Err(format!("{t}: add a unit, e.g. {t}ms or {t}s")),
            };
        }
        humantime::parse_duration(t)
            .map(Dur)
            .map_err(|e| format!("invalid duration `{s}` ({e}): expected e.g. 250ms, 60s, 1h 30m, 7d"))
    }
}

impl<'de> Deserialize<'de> for Dur {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Dur>::new("a duration such as 60s or 1h 30m"))
    }
}

/// Visitor for any value written as a scalar and parsed with `FromStr`
/// (numbers are turned back into their text first).
pub(super) struct FromStrVisitor<T> {
    expected: &'static str,
    _t: PhantomData<T>,
}

impl<T> FromStrVisitor<T> {
    pub(super) fn new(expected: &'static str) -> Self {
        FromStrVisitor {
            expected,
            _t: PhantomData,
        }
    }
}

impl<'de, T: FromStr> Visitor<'de> for FromStrVisitor<T>
where
    T::Err: fmt::Display,
{
    type Value = T;
    fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
        f.write_str(self.expected)
    }
    fn visit_str<E: de::Error>(self, v: &str) -> Result<T, E> {
        v.parse().map_err(E::custom)
    }
    fn visit_u64<E: de::Error>(self, v: u64) -> Result<T, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_i64<E: de::Error>(self, v: i64) -> Result<T, E> {
        self.visit_str(&v.to_string())
    }
    fn visit_f64<E: de::Error>(self, v: f64) -> Result<T, E> {
        self.visit_str(&v.to_string())
    }
}

/// A list that may also be written as one scalar: `status: 404` or
/// `status: [404, "5xx"]`.
#[derive(Clone, Debug, PartialEq)]
pub struct List<T>(pub Vec<T>);

impl<T> Default for List<T> {
    fn default() -> Self {
        List(Vec::new())
    }
}

impl<'de, T: FromStr> Deserialize<'de> for List<T>
where
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct ListVisitor<T>(PhantomData<T>);
        impl<'de, T: FromStr> Visitor<'de> for ListVisitor<T>
        where
            T::Err: fmt::Display,
        {
            type Value = List<T>;
            fn expecting(&self, f: &mut fmt::Formatter) -> fmt::Result {
                f.write_str("a value or a list of values")
            }
            fn visit_str<E: de::Error>(self, v: &str) -> Result<Self::Value, E> {
                Ok(List(vec![v.parse().map_err(E::custom)?]))
            }
            fn visit_u64<E: de::Error>(self, v: u64) -> Result<Self::Value, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_i64<E: de::Error>(self, v: i64) -> Result<Self::Value, E> {
                self.visit_str(&v.to_string())
            }
            fn visit_seq<A: SeqAccess<'de>>(self, mut seq: A) -> Result<Self::Value, A::Error> {
                let mut out = Vec::new();
                while let Some(Scalar(v)) = seq.next_element::<Scalar<T>>()? {
                    out.push(v);
                }
                Ok(List(out))
            }
        }
        d.deserialize_any(ListVisitor(PhantomData))
    }
}

/// One element of a [`List`]: a scalar parsed with `FromStr`.
struct Scalar<T>(T);

impl<'de, T: FromStr> Deserialize<'de> for Scalar<T>
where
    T::Err: fmt::Display,
{
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<T>::new("a scalar value"))
            .map(Scalar)
    }
}

/// A network: CIDR (`10.0.0.0/8`, `2001:db8::/32`) or a bare address, in
/// its one form (`addr::canonical`: `::ffff:10.0.0.0/104` is `10.0.0.0/8`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Net(pub IpNet);

impl FromStr for Net {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        if let Ok(n) = t.parse::<IpNet>() {
            return Ok(Net(crate::addr::canonical(n.trunc())));
        }
        t.parse::<std::net::IpAddr>()
            .map(|a| Net(crate::addr::canonical(IpNet::from(a))))
            .map_err(|_| format!("invalid network `{s}`: expected an address or CIDR such as 10.0.0.0/8"))
    }
}

/// An HTTP method name, upper-cased.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Method(pub String);

impl FromStr for Method {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        if s.is_empty() || !s.bytes().all(|b| b.is_ascii_alphabetic()) {
            return Err(format!("invalid HTTP method `{s}`: expected e.g. GET, POST"));
        }
        Ok(Method(s.to_ascii_uppercase()))
    }
}

/// A status pattern: an exact code (`404`) or a class (`"4xx"`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StatusPat {
    Code(u16),
    Class(u16),
}

impl StatusPat {
    pub fn matches(self, status: u16) -> bool {
        match self {
            StatusPat::Code(c) => status == c,
            StatusPat::Class(c) => status / 100 == c,
        }
    }
}

impl FromStr for StatusPat {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim();
        let bad = || format!("invalid status `{s}`: expected a code 100-599 such as 404, or a class such as \"4xx\"");
        let b = t.as_bytes();
        if b.len() == 3 && (b[1] == b'x' || b[1] == b'X') && (b[2] == b'x' || b[2] == b'X') {
            return match b[0] {
                d @ b'1'..=b'5' => Ok(StatusPat::Class(u16::from(d - b'0'))),
                _ => Err(bad()),
            };
        }
        match t.parse::<u16>() {
            Ok(c) if (100..=599).contains(&c) => Ok(StatusPat::Code(c)),
            _ => Err(bad()),
        }
    }
}

/// A compiled regular expression over raw bytes (log fields are not always UTF-8).
#[derive(Clone, Debug)]
pub struct Re(pub regex::bytes::Regex);

impl FromStr for Re {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        regex::bytes::Regex::new(s)
            .map(Re)
            .map_err(|e| format!("invalid regular expression: {}", crate::parse::regex_error_text(&e)))
    }
}

impl<'de> Deserialize<'de> for Re {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Re>::new("a regular expression"))
    }
}

impl<'de> Deserialize<'de> for Net {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Net>::new("an address or CIDR network"))
    }
}

/// The `hits` (or `burst`) of a limit: a whole number from 0 to 2^32 - 1.
/// 0 bans on the first matching request (fail2ban's `maxretry = 1`).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hits(pub u32);

impl FromStr for Hits {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.trim().parse::<u32>().map(Hits).map_err(|_| {
            format!(
                "invalid number `{s}`: expected a whole number from 0 to {} (0: ban on the first match)",
                u32::MAX
            )
        })
    }
}

impl<'de> Deserialize<'de> for Hits {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Hits>::new("a whole number from 0 to 4294967295"))
    }
}

/// A count written as a whole number (`max_bans_per_minute: 600`,
/// `escalate_network.bans: 5`): anything else is said as what it is.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Count(pub u32);

impl FromStr for Count {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        s.trim()
            .parse::<u32>()
            .map(Count)
            .map_err(|_| format!("invalid number `{s}`: expected a whole number from 0 to {}", u32::MAX))
    }
}

impl<'de> Deserialize<'de> for Count {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Count>::new("a whole number"))
    }
}

/// An nginx error-log level (`match: { level: [error, crit] }`).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Level(pub String);

impl FromStr for Level {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let t = s.trim().to_ascii_lowercase();
        if crate::parse::LEVELS.contains(&t.as_str()) {
            Ok(Level(t))
        } else {
            Err(format!(
                "invalid level `{s}`: expected one of nginx's: {}",
                crate::parse::LEVELS.join(", ")
            ))
        }
    }
}

/// A rate such as `5/s`, `100/m`, `1000/h`: events per second.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Rate(pub f64);

impl FromStr for Rate {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        let bad = || format!("invalid rate `{s}`: expected e.g. 5/s, 100/m, 1000/h");
        let (n, unit) = s.trim().split_once('/').ok_or_else(bad)?;
        let n: f64 = n.trim().parse().map_err(|_| bad())?;
        let per = match unit.trim() {
            "s" | "sec" | "second" => 1.0,
            "m" | "min" | "minute" => 60.0,
            "h" | "hour" => 3600.0,
            "d" | "day" => 86400.0,
            _ => return Err(bad()),
        };
        if !(n.is_finite() && n > 0.0) {
            return Err(bad());
        }
        Ok(Rate(n / per))
    }
}

impl<'de> Deserialize<'de> for Rate {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Rate>::new("a rate such as 5/s"))
    }
}

/// A fraction strictly between 0 and 1 (`prefilter: 0.8`).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fraction(pub f64);

impl FromStr for Fraction {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s.trim().parse::<f64>() {
            Ok(f) if f > 0.0 && f < 1.0 => Ok(Fraction(f)),
            _ => Err(format!(
                "invalid fraction `{s}`: expected a number between 0 and 1, such as 0.8"
            )),
        }
    }
}

impl<'de> Deserialize<'de> for Fraction {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        d.deserialize_any(FromStrVisitor::<Fraction>::new("a number between 0 and 1, such as 0.8"))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations() {
        assert_eq!("60s".parse::<Dur>().unwrap().as_ms(), 60_000);
        assert_eq!("1h 30m".parse::<Dur>().unwrap().as_ms(), 5_400_000);
        assert_eq!("90".parse::<Dur>().unwrap_err(), "90: add a unit, e.g. 90ms or 90s");
        assert_eq!("0".parse::<Dur>().unwrap().as_ms(), 0);
        assert!("soon".parse::<Dur>().is_err());
    }

    #[test]
    fn statuses() {
        assert!("4xx".parse::<StatusPat>().unwrap().matches(404));
        assert!(!"4xx".parse::<StatusPat>().unwrap().matches(500));
        assert!("404".parse::<StatusPat>().unwrap().matches(404));
        assert!("6xx".parse::<StatusPat>().is_err());
        assert!("99".parse::<StatusPat>().is_err());
    }

    #[test]
    fn nets_and_rates() {
        assert_eq!("10.1.2.3/8".parse::<Net>().unwrap().0.to_string(), "10.0.0.0/8");
        assert_eq!("::1".parse::<Net>().unwrap().0.to_string(), "::1/128");
        assert!((("5/s".parse::<Rate>().unwrap().0) - 5.0).abs() < 1e-9);
        assert!("5/fortnight".parse::<Rate>().is_err());
    }
}
