//! What the compact tables share (`bans/netmap.rs`: the view and the
//! remembered list; `enforce/tree.rs`: the enforcer's book): entries in a
//! sorted, exactly sized vector, one allocation however long the list
//! (a block that large is mapped on its own and given back whole, where
//! a B-tree's million small nodes were spread over the heap between the
//! start's short-lived allocations and pinned it); those removed since the
//! vector's last rebuild marked in a bitset ([`Gone`]); and the rebuild
//! that merges the live entries with the changes kept beside them.

/// One bit per entry of a sorted vector: removed since its last rebuild.
#[derive(Clone, Debug, Default)]
pub(crate) struct Gone {
    bits: Vec<u64>,
    count: usize,
}

impl Gone {
    /// None of `len` entries removed.
    pub fn new(len: usize) -> Gone {
        Gone {
            bits: vec![0; len.div_ceil(64)],
            count: 0,
        }
    }

    /// Entries marked.
    pub fn count(&self) -> usize {
        self.count
    }

    /// Whether entry `i` is marked removed. With none marked since the
    /// rebuild the bits are not read (a cache miss a lookup spares).
    pub fn is(&self, i: usize) -> bool {
        self.count != 0 && self.bits[i / 64] & (1 << (i % 64)) != 0
    }

    /// Marks entry `i` removed (it was not).
    pub fn mark(&mut self, i: usize) {
        self.bits[i / 64] |= 1 << (i % 64);
        self.count += 1;
    }

    /// Marks entry `i` present again (it was removed).
    pub fn unmark(&mut self, i: usize) {
        self.bits[i / 64] &= !(1 << (i % 64));
        self.count -= 1;
    }

    /// The last entry before `end` not removed: 64 entries a step, so a
    /// run of removed entries costs a word each 64 of them.
    pub fn live_before(&self, end: usize) -> Option<usize> {
        let mut last = end.checked_sub(1)?;
        if self.count == 0 {
            return Some(last);
        }
        loop {
            let w = last / 64;
            let live = !self.bits[w] & (u64::MAX >> (63 - last % 64));
            if live != 0 {
                return Some(w * 64 + 63 - live.leading_zeros() as usize);
            }
            last = (w * 64).checked_sub(1)?;
        }
    }

    /// The first entry from `start` on, below `len`, not removed.
    pub fn live_from(&self, start: usize, len: usize) -> Option<usize> {
        if start >= len || self.count == 0 {
            return (start < len).then_some(start);
        }
        let mut first = start;
        while first < len {
            let w = first / 64;
            let live = !self.bits[w] & (u64::MAX << (first % 64));
            if live != 0 {
                let i = w * 64 + live.trailing_zeros() as usize;
                return (i < len).then_some(i);
            }
            first = (w + 1) * 64;
        }
        None
    }
}

/// `entries` sorted by key, exactly sized, of equal keys the last given
/// kept (as inserting them one by one would). In place, no second copy
/// of a million entries: reversed, then sorted stably, the last given of
/// equal keys comes first, and is the one `dedup` keeps.
pub(crate) fn sorted_last_wins<K: Ord + Copy, V>(mut entries: Vec<(K, V)>) -> Vec<(K, V)> {
    entries.reverse();
    entries.sort_by_key(|e| e.0);
    entries.dedup_by_key(|e| e.0);
    entries.shrink_to_fit();
    entries
}

/// The entries of `base` not `gone`, merged with `recent` (sorted, none
/// of its keys in `base`), in one vector allocated at its exact size.
pub(crate) fn merged<K: Ord + Copy, V>(
    base: Vec<(K, V)>,
    gone: &Gone,
    recent: impl ExactSizeIterator<Item = (K, V)>,
) -> Vec<(K, V)> {
    let mut out = Vec::with_capacity(base.len() - gone.count() + recent.len());
    let mut recent = recent.peekable();
    for (i, e) in base.into_iter().enumerate() {
        if gone.is(i) {
            continue;
        }
        while let Some(r) = recent.next_if(|r| r.0 < e.0) {
            out.push(r);
        }
        out.push(e);
    }
    out.extend(recent);
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// `live_before` and `live_from` are a plain scan's answers, for runs
    /// of removed entries across word edges, at both ends, and none.
    #[test]
    fn the_neighbours_of_removed_runs_are_a_plain_scans() {
        let len = 300;
        // Runs of removed entries, [from, to).
        let runs: &[&[(usize, usize)]] = &[
            &[],
            &[(0, 1)],
            &[(0, 64)],
            &[(0, 300)],
            &[(63, 65), (127, 200)],
            &[(1, 2), (62, 130), (299, 300)],
            &[(64, 128), (256, 300)],
        ];
        for removed in runs {
            let mut gone = Gone::new(len);
            for &(from, to) in removed.iter() {
                (from..to).for_each(|i| gone.mark(i));
            }
            let dead = |i: usize| removed.iter().any(|&(from, to)| (from..to).contains(&i));
            assert_eq!(gone.count(), (0..len).filter(|i| dead(*i)).count());
            for at in 0..=len {
                let before = (0..at).rev().find(|i| !dead(*i));
                assert_eq!(gone.live_before(at), before, "{removed:?} before {at}");
                let from = (at..len).find(|i| !dead(*i));
                assert_eq!(gone.live_from(at, len), from, "{removed:?} from {at}");
                if at < len {
                    assert_eq!(gone.is(at), dead(at));
                }
            }
        }
        let mut gone = Gone::new(10);
        gone.mark(3);
        gone.unmark(3);
        assert_eq!((gone.count(), gone.is(3), gone.live_before(4)), (0, false, Some(3)));
    }

    #[test]
    fn a_merge_keeps_the_live_entries_and_the_recent_in_order() {
        let base = vec![(1, 'a'), (3, 'b'), (5, 'c'), (7, 'd')];
        let mut gone = Gone::new(base.len());
        gone.mark(1);
        let out = merged(base, &gone, vec![(0, 'x'), (4, 'y'), (9, 'z')].into_iter());
        assert_eq!(out, vec![(0, 'x'), (1, 'a'), (4, 'y'), (5, 'c'), (7, 'd'), (9, 'z')]);
        assert_eq!(out.capacity(), out.len());
        assert_eq!(
            sorted_last_wins(vec![(2, 'a'), (1, 'b'), (2, 'c'), (1, 'd')]),
            vec![(1, 'd'), (2, 'c')]
        );
    }
}
