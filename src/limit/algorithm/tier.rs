//! The fixed-window counter with each line counted once (`lua/tier.lua`),
//! shared by `fixed_window` and the prefilter of `sliding_window`: its key
//! (`PREFIX:fixed:{TAG}:ADDR:RULE:N`, a HASH of the count and the last
//! offset counted per origin), its reading for `explain`, and its mirror.

use ipnet::IpNet;

use super::Map;
use crate::detect::Hit;
use crate::store::{Conn, Keys, StateKey};

/// `PREFIX:fixed:{TAG}:ADDR:RULE:N`, one per window number `N`.
pub const KEY: StateKey = StateKey {
    kind: "fixed",
    per_window: true,
};

impl Keys {
    /// `fleetban:fixed:{TAG}:ADDR:RULE` (`:HOST` for `scope: host`): the
    /// base of the fixed-window counters; the script appends `:N`, the
    /// window number (same slot: same tag).
    pub fn fixed(&self, addr: &IpNet, rule: &str, host: Option<&str>) -> String {
        self.state(KEY, addr, rule, host)
    }
}

/// The count of the window of `now` (`lua/tier.lua`'s field `c`).
pub async fn count(con: &mut Conn, at: &super::At<'_>, now: i64) -> redis::RedisResult<u64> {
    let n = now.div_euclid(at.rule.window_ms.max(1));
    let key = at.keys.state_in_window(KEY, at.addr, &at.rule.name, at.host, n);
    let c: Option<u64> = redis::cmd("HGET").arg(key).arg("c").query_async(con).await?;
    Ok(c.unwrap_or(0))
}

/// One counter: its count and, per origin, the offset of the last line it
/// counted.
struct Fixed {
    count: u32,
    marks: Vec<(u64, u64)>,
    expires_at: i64,
}

/// What a counter makes of one line (`tier_offer` in the scripts).
pub enum Offer {
    /// Counted before: at or before the last offset counted from its origin.
    Seen,
    /// The counter already holds its cap: not counted.
    Full,
    Counted,
}

/// One rule's counters in memory, by (client key, window number).
#[derive(Default)]
pub struct Counters {
    map: Map<(IpNet, i64), Fixed>,
    /// The marks' heap blocks at the last sweep or shed (a counter has one
    /// mark per origin that wrote to it, usually one).
    heap: usize,
}

impl Fixed {
    fn heap(&self) -> usize {
        super::vec_bytes::<(u64, u64)>(self.marks.capacity())
    }
}

impl Counters {
    /// Offers the line of `hit` to the counter of (`key`, window `n`) of at
    /// most `cap` hits (`tier_offer`); also the count after it. A counter
    /// created here expires `window_ms` + 1 s from now.
    pub fn offer(&mut self, key: IpNet, n: i64, hit: &Hit, cap: u32, wall_now: i64, window_ms: i64) -> (Offer, u32) {
        let f = self.map.entry((key, n)).or_insert(Fixed {
            count: 0,
            marks: Vec::new(),
            expires_at: 0,
        });
        if f.expires_at <= wall_now {
            f.count = 0;
            f.marks.clear();
        }
        let mark = f.marks.iter_mut().find(|(origin, _)| *origin == hit.origin);
        if mark.as_ref().is_some_and(|(_, offset)| hit.offset <= *offset) {
            return (Offer::Seen, f.count);
        }
        if f.count >= cap {
            return (Offer::Full, f.count);
        }
        match mark {
            Some(m) => m.1 = hit.offset,
            None => f.marks.push((hit.origin, hit.offset)),
        }
        f.count += 1;
        if f.count == 1 {
            f.expires_at = wall_now + window_ms + 1000;
        }
        (Offer::Counted, f.count)
    }

    /// The count of (`key`, window `n`) if it lives at `now`.
    pub fn count(&self, key: &IpNet, n: i64, now: i64) -> u64 {
        self.map
            .get(&(*key, n))
            .filter(|f| f.expires_at > now)
            .map_or(0, |f| u64::from(f.count))
    }
}

impl super::Expiring for Counters {
    fn forget(&mut self, key: &IpNet) {
        self.map.retain(|(k, _), _| k != key);
    }

    fn tracked_keys(&self) -> usize {
        self.map.len()
    }

    fn sweep(&mut self, wall_now: i64) {
        let mut heap = 0;
        self.map.retain(|_, f| {
            let live = f.expires_at > wall_now;
            if live {
                heap += f.heap();
            }
            live
        });
        self.heap = heap;
    }

    fn size(&self) -> super::Size {
        super::table_size::<((IpNet, i64), Fixed)>(self.map.len(), self.map.capacity(), self.heap)
    }

    /// A counter's fill is its count against its cap: the prefilter's
    /// share of a sliding window, or `fixed_window`'s `hits`.
    fn shed(&mut self, rule: &crate::limit::RuleLimit, below: f64, max: usize, now: i64) -> usize {
        let cap = match rule.prefilter {
            0 => rule.hits,
            pre => pre,
        };
        let (mut shed, mut heap) = (0, 0);
        self.map.retain(|_, f| {
            if f.expires_at <= now {
                return false;
            }
            if shed < max && super::fraction(u64::from(f.count), cap) < below {
                shed += 1;
                return false;
            }
            heap += f.heap();
            true
        });
        self.heap = heap;
        shed
    }

    fn shrink(&mut self) {
        self.map.shrink_to_fit();
    }
}
