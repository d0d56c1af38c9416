//! Output for people: aligned tables with a header, times in the local
//! time zone, and how far a time is from now ("in 52m", "3h ago"). JSON
//! output never goes through here: it carries RFC 3339 UTC times
//! (`fleetban::rfc3339`).

/// Unix ms in the host's local time zone, `2026-12-01 18:20:05 CET`
/// (`localtime_r`: `TZ` and /etc/localtime decide, as for `date`).
pub fn local(ms: i64) -> String {
    let secs = ms.div_euclid(1000) as libc::time_t;
    // SAFETY: `localtime_r` fills the `tm` it is given and reads only `secs`.
    let mut tm: libc::tm = unsafe { std::mem::zeroed() };
    if unsafe { libc::localtime_r(&secs, &mut tm) }.is_null() {
        return fleetban::rfc3339(ms);
    }
    let zone = if tm.tm_zone.is_null() {
        String::new()
    } else {
        // SAFETY: a non-null `tm_zone` is a NUL-terminated static name.
        unsafe { std::ffi::CStr::from_ptr(tm.tm_zone) }
            .to_string_lossy()
            .into_owned()
    };
    let zone = if zone.is_empty() {
        let off = tm.tm_gmtoff / 60;
        format!(
            "{}{:02}{:02}",
            if off < 0 { '-' } else { '+' },
            off.abs() / 60,
            off.abs() % 60
        )
    } else {
        zone
    };
    format!(
        "{:04}-{:02}-{:02} {:02}:{:02}:{:02} {zone}",
        tm.tm_year + 1900,
        tm.tm_mon + 1,
        tm.tm_mday,
        tm.tm_hour,
        tm.tm_min,
        tm.tm_sec
    )
}

/// How far `at` is from `now`: `in 52m`, `3h 5m ago`, `now` (under a second).
pub fn relative(at: i64, now: i64) -> String {
    let d = at - now;
    if d.abs() < 1000 {
        "now".to_owned()
    } else if d > 0 {
        format!("in {}", span(d))
    } else {
        format!("{} ago", span(-d))
    }
}

/// A length of time in its two largest units: `45s`, `52m`, `3h 5m`, `2d 4h`.
pub fn span(ms: i64) -> String {
    let s = ms.max(0) / 1000;
    let (d, h, m, sec) = (s / 86_400, s / 3600 % 24, s / 60 % 60, s % 60);
    let parts: Vec<String> = [(d, 'd'), (h, 'h'), (m, 'm'), (sec, 's')]
        .iter()
        .skip_while(|(n, _)| *n == 0)
        .take(2)
        .filter(|(n, _)| *n > 0)
        .map(|(n, u)| format!("{n}{u}"))
        .collect();
    if parts.is_empty() {
        "0s".to_owned()
    } else {
        parts.join(" ")
    }
}

/// Rows under a header, each column as wide as its widest cell (counted in
/// characters), two spaces apart; the last column is not padded.
pub struct Table {
    header: Vec<String>,
    rows: Vec<Vec<String>>,
    /// Columns aligned to the right (numbers).
    right: Vec<bool>,
}

impl Table {
    pub fn new(header: &[&str]) -> Table {
        Table {
            header: header.iter().map(|h| (*h).to_owned()).collect(),
            rows: Vec::new(),
            right: vec![false; header.len()],
        }
    }

    /// Aligns column `i` to the right.
    pub fn right(mut self, i: usize) -> Table {
        self.right[i] = true;
        self
    }

    /// Columns `cols` aligned right (numbers).
    pub fn right_range(self, cols: std::ops::RangeInclusive<usize>) -> Table {
        cols.fold(self, Table::right)
    }

    /// One row, as many cells as the header (missing ones are empty).
    pub fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    pub fn is_empty(&self) -> bool {
        self.rows.is_empty()
    }

    pub fn render(&self) -> String {
        self.render_with(&mut vec![0; self.header.len()], true)
    }

    /// The rows (and the header when `header`), each column at least as
    /// wide as `widths` says, which grow to this table's: a long listing
    /// printed a page at a time keeps its columns as aligned as it can
    /// without holding every row.
    pub fn render_with(&self, widths: &mut Vec<usize>, header: bool) -> String {
        let n = self.header.len();
        widths.resize(n, 0);
        for (i, w) in widths.iter_mut().enumerate() {
            let own = std::iter::once(&self.header)
                .chain(&self.rows)
                .map(|r| r.get(i).map_or(0, |c| c.chars().count()))
                .max()
                .unwrap_or(0);
            *w = (*w).max(own);
        }
        let mut out = String::new();
        for r in std::iter::once(&self.header)
            .skip(usize::from(!header))
            .chain(&self.rows)
        {
            let mut line = String::new();
            for (i, w) in widths.iter().enumerate() {
                let cell = r.get(i).map_or("", String::as_str);
                let pad = w - cell.chars().count();
                if i > 0 {
                    line += "  ";
                }
                if self.right[i] {
                    line.extend(std::iter::repeat_n(' ', pad));
                    line += cell;
                } else {
                    line += cell;
                    if i + 1 < n {
                        line.extend(std::iter::repeat_n(' ', pad));
                    }
                }
            }
            out += line.trim_end();
            out.push('\n');
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spans_and_relative_times() {
        assert_eq!(span(45_000), "45s");
        assert_eq!(span(52 * 60_000 + 30_000), "52m 30s");
        assert_eq!(span(3 * 3_600_000 + 5 * 60_000 + 9_000), "3h 5m");
        assert_eq!(span(2 * 86_400_000 + 4 * 3_600_000), "2d 4h");
        assert_eq!(span(86_400_000 + 30_000), "1d");
        assert_eq!(span(0), "0s");
        assert_eq!(relative(10_000 + 52 * 60_000, 10_000), "in 52m");
        assert_eq!(relative(0, 3 * 3_600_000), "3h ago");
        assert_eq!(relative(500, 0), "now");
    }

    #[test]
    fn tables_align_their_columns_under_the_header() {
        let mut t = Table::new(&["ADDRESS", "HITS", "RULE"]).right(1);
        t.row(vec!["192.0.2.1".into(), "5".into(), "scraper".into()]);
        t.row(vec!["2001:db8::/64".into(), "120".into(), "login".into()]);
        assert_eq!(
            t.render(),
            "ADDRESS        HITS  RULE\n\
             192.0.2.1         5  scraper\n\
             2001:db8::/64   120  login\n"
        );
    }

    #[test]
    fn local_time_has_a_date_a_time_and_a_zone() {
        let s = local(1_431_857_103_000);
        let (date, rest) = s.split_once(' ').unwrap();
        assert_eq!(date.len(), 10, "{s}");
        assert!(date.starts_with("2015-05-1"), "{s}");
        let (time, zone) = rest.split_once(' ').unwrap();
        assert_eq!(time.len(), 8, "{s}");
        assert!(!zone.is_empty(), "{s}");
    }
}
