//! From lines to hits: which requests count for which rule, under which
//! client key, at which time.
//!
//! `scan` is the one per-line loop (the daemon's and `fleetban test`'s),
//! `filter` holds the compiled `match:`/`ignore:` conditions (`literal`: the
//! exact literal tests that replace their regexes when they have that shape),
//! `plan` which rules
//! read which log (each log is parsed once per distinct format, whatever the
//! number of rules). Nothing here talks to Redis or knows of bans but
//! through [`Sink`].

mod filter;
mod literal;
mod plan;
mod scan;

pub use filter::RuleFilter;
pub use plan::{Group, Plan};
pub use scan::{Mode, RuleCount, Scanned, Scanner, Sink};

/// One counted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Time of the request in unix ms (log time, or arrival time for `clock: redis`).
    pub time_ms: i64,
    /// Deterministic member (see [`member`]): what a sliding window, a
    /// bucket and a counter recognise a line read twice by.
    pub member: u64,
    /// The file the line was read from on this host ([`origin_seed`]) and
    /// its byte offset there: the fixed-window counters recognise a line
    /// read twice by its offset, at or before the last one they counted
    /// from that origin (docs/design.md §2).
    pub origin: u64,
    pub offset: u64,
}

impl Hit {
    /// The hit of the line at `offset` in the file `origin`, at `time_ms`.
    pub fn of_line(time_ms: i64, origin: u64, offset: u64) -> Hit {
        Hit {
            time_ms,
            member: member(origin, offset),
            origin,
            offset,
        }
    }
}

/// A deterministic member for one hit, from where its line was read: the
/// same line read again after a crash gives the same member, which the
/// window then recognises instead of counting twice. `origin` identifies the
/// file on this host ([`origin_seed`]), `offset` is the line's byte offset.
/// Kept below 2^63 so that Redis stores it as an integer in a listpack.
pub fn member(origin: u64, offset: u64) -> u64 {
    splitmix(origin ^ splitmix(offset)) & (i64::MAX as u64)
}

/// The member of a hit of a `distinct:` rule: a hash of the request's
/// `field`, the same on every host, so that the window counts values, not
/// lines (docs/design.md §2, "Distinct values"). `path` is the path as
/// nginx serves it ([`crate::parse::Request::path`]: no query string,
/// decoded and resolved); a field the line lacks (`-`, empty, status 0)
/// is one value like any other. Below 2^63, as [`member`].
pub fn value_member(field: crate::config::Distinct, req: &crate::parse::Request<'_>) -> u64 {
    use crate::config::Distinct;
    let status;
    let bytes: &[u8] = match field {
        Distinct::Path => req.path,
        Distinct::UserAgent => req.user_agent,
        Distinct::Host => req.host,
        Distinct::Status => {
            status = req.status.to_be_bytes();
            &status
        }
    };
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for &b in bytes {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    splitmix(h ^ bytes.len() as u64) & (i64::MAX as u64)
}

/// Seed for [`member`] from the host and the file identity.
pub fn origin_seed(host: &str, parts: &[u64]) -> u64 {
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in host.bytes() {
        h = (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3);
    }
    for p in parts {
        h = splitmix(h ^ *p);
    }
    h
}

fn splitmix(mut x: u64) -> u64 {
    x = x.wrapping_add(0x9e37_79b9_7f4a_7c15);
    x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    x ^ (x >> 31)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn members_are_stable_and_distinct() {
        let o = origin_seed("web-01", &[1, 2, 3]);
        assert_eq!(member(o, 10), member(o, 10));
        assert_ne!(member(o, 10), member(o, 11));
        assert_ne!(member(o, 10), member(origin_seed("web-02", &[1, 2, 3]), 10));
        assert!(member(o, 10) <= i64::MAX as u64);
    }

    /// The member of the path of a `combined` line whose target is `target`.
    fn path_member(target: &str) -> u64 {
        let parser = crate::parse::Parser::new(&crate::parse::Format::Combined).unwrap();
        let line = format!("192.0.2.1 - - [30/Nov/2026:10:00:01 +0000] \"GET {target} HTTP/1.1\" 404 0 \"-\" \"-\"");
        let mut scratch = Vec::new();
        let req = parser.parse_in(line.as_bytes(), &mut scratch).unwrap();
        value_member(crate::config::Distinct::Path, &req)
    }

    #[test]
    fn value_members_count_paths_as_nginx_serves_them_and_tell_fields_apart() {
        use crate::config::Distinct;
        let login = path_member("/wp-login.php");
        for same in [
            "/wp-login.php?x=1",
            "/wp-login.php?y=2",
            "/wp-login%2ephp",
            "//x/../wp-login.php",
        ] {
            assert_eq!(path_member(same), login, "{same}");
        }
        for other in ["/wp-login.php/", "/WP-login.php", "/wp-login.php%3F"] {
            assert_ne!(path_member(other), login, "{other}");
        }
        let mut a = crate::parse::Request::with_addr("192.0.2.1".parse().unwrap());
        let mut b = a;
        a.status = 404;
        b.status = 403;
        assert_ne!(value_member(Distinct::Status, &a), value_member(Distinct::Status, &b));
        a.user_agent = b"-";
        b.user_agent = b"-";
        assert_eq!(
            value_member(Distinct::UserAgent, &a),
            value_member(Distinct::UserAgent, &b)
        );
        a.host = b"a.example";
        assert_ne!(value_member(Distinct::Host, &a), value_member(Distinct::Host, &b));
        assert!(value_member(Distinct::Host, &a) <= i64::MAX as u64);
    }
}
