//! Pending hits, grouped per (rule, client key) in arrival order, so that one
//! script call carries every hit of one key and processes them in order.

use std::collections::HashMap;

use ipnet::IpNet;

/// One counted request.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Hit {
    /// Time of the request in unix ms (log time, or arrival time for `clock: redis`).
    pub time_ms: i64,
    /// Deterministic member (see [`super::member`]).
    pub member: u64,
}

/// All pending hits of one (rule, key), in log order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Batch {
    pub rule: usize,
    pub key: IpNet,
    pub hits: Vec<Hit>,
}

/// Hits waiting for the next flush.
#[derive(Default)]
pub struct Pending {
    index: HashMap<(usize, IpNet), usize, foldhash::fast::RandomState>,
    batches: Vec<Batch>,
    hits: usize,
}

impl Pending {
    pub fn push(&mut self, rule: usize, key: IpNet, hit: Hit) {
        let next = self.batches.len();
        let i = *self.index.entry((rule, key)).or_insert(next);
        if i == next {
            self.batches.push(Batch {
                rule,
                key,
                hits: Vec::with_capacity(4),
            });
        }
        self.batches[i].hits.push(hit);
        self.hits += 1;
    }

    pub fn hits(&self) -> usize {
        self.hits
    }

    pub fn is_empty(&self) -> bool {
        self.hits == 0
    }

    /// Takes every pending batch, leaving the buffer empty (its memory kept).
    pub fn take(&mut self) -> Vec<Batch> {
        self.index.clear();
        self.hits = 0;
        std::mem::take(&mut self.batches)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn groups_per_rule_and_key_in_order() {
        let mut p = Pending::default();
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        for (i, (rule, key)) in [(0, a), (0, b), (1, a), (0, a)].into_iter().enumerate() {
            p.push(
                rule,
                key,
                Hit {
                    time_ms: i as i64,
                    member: i as u64,
                },
            );
        }
        assert_eq!(p.hits(), 4);
        let bs = p.take();
        assert_eq!(bs.len(), 3);
        assert_eq!(bs[0].hits.iter().map(|h| h.time_ms).collect::<Vec<_>>(), vec![0, 3]);
        assert!(p.is_empty());
    }
}
