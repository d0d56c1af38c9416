//! [`Nearest`]: the clients nearest their limits, for `fleetban top` (and
//! `status --json`'s `nearest`). Fed by the verdicts the pipeline already
//! has (a count Redis or the embedded store reported for a batch), never by
//! a request of its own: per verdict one comparison, and only a client at
//! half its limit or more touches the short list ([`SHOWN`] rows). Rows
//! older than their rule's window are dropped; a ban removes its row. The
//! list is published to `Stats` once a second.

use ipnet::IpNet;

use crate::control::NearStatus;

/// Rows kept and shown.
pub const SHOWN: usize = 10;

struct Row {
    rule: usize,
    key: IpNet,
    count: u32,
    limit: u32,
    at_ms: i64,
}

impl Row {
    /// count / limit, compared without division: a/b > c/d as a*d > c*b.
    fn above(&self, other: &Row) -> bool {
        u64::from(self.count) * u64::from(other.limit.max(1)) > u64::from(other.count) * u64::from(self.limit.max(1))
    }
}

#[derive(Default)]
pub struct Nearest {
    rows: Vec<Row>,
}

impl Nearest {
    /// A batch of `rule` for `key` fitted, leaving `count` of `limit`.
    #[inline]
    pub fn under(&mut self, rule: usize, key: IpNet, count: u32, limit: u32, at_ms: i64) {
        if limit == 0 || u64::from(count) * 2 < u64::from(limit) {
            return;
        }
        let row = Row {
            rule,
            key,
            count,
            limit,
            at_ms,
        };
        if let Some(r) = self.rows.iter_mut().find(|r| r.rule == rule && r.key == key) {
            *r = row;
            return;
        }
        if self.rows.len() < SHOWN {
            self.rows.push(row);
            return;
        }
        let lowest = (0..self.rows.len()).min_by(|&a, &b| {
            if self.rows[b].above(&self.rows[a]) {
                std::cmp::Ordering::Less
            } else {
                std::cmp::Ordering::Greater
            }
        });
        if let Some(i) = lowest.filter(|&i| row.above(&self.rows[i])) {
            self.rows[i] = row;
        }
    }

    /// `key` was banned under `rule`: it is no longer near.
    pub fn banned(&mut self, rule: usize, key: &IpNet) {
        self.rows.retain(|r| !(r.rule == rule && r.key == *key));
    }

    /// The rows, nearest first, without those older than their rule's
    /// window (`window_ms` by rule index) or of a rule gone (`names`).
    pub fn report(&mut self, names: &[(String, i64)], now_ms: i64) -> Vec<NearStatus> {
        self.rows
            .retain(|r| names.get(r.rule).is_some_and(|(_, window)| now_ms - r.at_ms <= *window));
        let mut rows: Vec<&Row> = self.rows.iter().collect();
        rows.sort_by(|a, b| {
            if a.above(b) {
                std::cmp::Ordering::Less
            } else if b.above(a) {
                std::cmp::Ordering::Greater
            } else {
                a.key.cmp(&b.key)
            }
        });
        rows.iter()
            .map(|r| NearStatus {
                rule: names[r.rule].0.clone(),
                addr: crate::addr::AddrText(&r.key).to_string(),
                count: r.count,
                limit: r.limit,
                at: crate::rfc3339(r.at_ms),
            })
            .collect()
    }

    /// The rules changed (reload): indexes mean other rules now.
    pub fn clear(&mut self) {
        self.rows.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keeps_the_ten_nearest_at_half_their_limit_or_more() {
        let mut n = Nearest::default();
        let names = vec![("r".to_owned(), 60_000)];
        n.under(0, "10.0.0.1/32".parse().unwrap(), 4, 10, 0);
        assert!(n.report(&names, 0).is_empty(), "below half");
        for i in 0..20u32 {
            n.under(0, format!("10.0.1.{i}/32").parse().unwrap(), 5 + i % 5, 10, 0);
        }
        n.under(0, "10.0.2.1/32".parse().unwrap(), 99, 100, 0);
        let rows = n.report(&names, 1000);
        assert_eq!(rows.len(), SHOWN);
        assert_eq!((rows[0].addr.as_str(), rows[0].count), ("10.0.2.1", 99));
        // Of the twenty at 5..=9 of 10 (four of each), the nine nearest.
        let counts: Vec<u32> = rows[1..].iter().map(|r| r.count).collect();
        assert_eq!(counts, [9, 9, 9, 9, 8, 8, 8, 8, 7], "{rows:?}");
        n.banned(0, &"10.0.2.1/32".parse().unwrap());
        assert_eq!(n.report(&names, 1000).len(), SHOWN - 1);
        assert!(n.report(&names, 61_000).is_empty(), "older than the window");
    }
}
