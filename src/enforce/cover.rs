//! Bookkeeping and planning, without nft: what is wanted, what the kernel
//! holds, and the element changes that take one to the other.
//!
//! `desired` (net -> until) is what callers asked for. `applied` is what we
//! believe the kernel's sets hold, keyed by the start of each span; the
//! cover keeps applied spans disjoint (the interval sets of earlier layouts
//! refused overlaps; the plain sets per length would take them, but a
//! narrower ban inside a wider one would only cost an element), so the only
//! span that can contain an address is the last one starting at or before
//! it.
//!
//! The plan puts into the kernel the desired nets not strictly inside another
//! desired net (the *cover*); a covered net comes back by itself once its
//! cover is gone from `desired`. Deleting an element the kernel has already
//! expired fails the whole transaction, so an applied element near its end
//! ("dying") is never deleted, and a new element overlapping it waits
//! ("deferred") until it is surely gone; `wake` says when to plan again.

use std::collections::BTreeMap;
use std::fmt;
use std::net::IpAddr;

use ipnet::{IpNet, Ipv4Subnets, Ipv6Subnets};

use super::tree::Tree;
use super::{Element, End, ReconcileStats, Until};

/// An applied element is not deleted from this long before its end: the
/// kernel may already have expired it.
pub(crate) const DELETE_MARGIN_MS: i64 = 1_000;
/// An applied element is surely gone this long after its end. Covers the
/// kernel's whole-second `expires` in listings, the time a listing takes
/// (~2 s at 100k elements) and transaction latency.
pub(crate) const GONE_MARGIN_MS: i64 = 5_000;
/// Ends closer than this count as equal (beyond what a listing leaves
/// unknown, `Book::slack`): a transaction lands a little after its
/// timeouts were computed, and re-adding 100k elements to move their ends
/// by a second is not worth a transaction (docs/design.md §3, "Reconciling").
pub(crate) const REFRESH_TOLERANCE_MS: i64 = 5_000;
/// What a listing leaves unknown of an element's end besides the time the
/// listing took: nft prints `expires` in whole seconds, truncated.
pub(crate) const EXPIRES_GRAIN_MS: i64 = 1_000;
/// Longer bans become permanent; the kernel refuses timeouts of ~1000 years.
pub const MAX_TIMEOUT_MS: i64 = 3_650 * 86_400_000;

/// An inclusive address range, the kernel's view of an interval element.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Span {
    pub lo: IpAddr,
    pub hi: IpAddr,
}

impl Span {
    pub fn of(net: &IpNet) -> Span {
        Span {
            lo: net.network(),
            hi: net.broadcast(),
        }
    }

    /// The span as a prefix, if it is one.
    pub fn as_net(&self) -> Option<IpNet> {
        let (lo, hi, bits) = match (self.lo, self.hi) {
            (IpAddr::V4(a), IpAddr::V4(b)) => (u128::from(u32::from(a)), u128::from(u32::from(b)), 32),
            (IpAddr::V6(a), IpAddr::V6(b)) => (u128::from(a), u128::from(b), 128),
            _ => return None,
        };
        let diff = hi.checked_sub(lo)?;
        // A prefix spans 2^k addresses starting at a multiple of 2^k.
        if diff & diff.wrapping_add(1) != 0 || lo & diff != 0 {
            return None;
        }
        let len = bits - diff.count_ones() as u8;
        IpNet::new(self.lo, len).ok()
    }
}

/// nft syntax: `1.2.3.4`, `10.0.0.0/24` or `10.0.0.1-10.0.0.5`.
impl fmt::Display for Span {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.as_net() {
            Some(net) if net.prefix_len() == net.max_prefix_len() => write!(f, "{}", net.addr()),
            Some(net) => write!(f, "{net}"),
            None => write!(f, "{}-{}", self.lo, self.hi),
        }
    }
}

/// One applied element, beside its span's start: where the span ends and
/// when it expires, in 11 bytes aligned on 1 (a book of 1,000,000
/// elements).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) struct Slot {
    pub end: End,
    /// The span's prefix length, or [`RANGE`]: a span that is no prefix,
    /// its end in [`Applied::ranges`].
    len: u8,
    /// Read from the kernel's last listing: its end may be up to
    /// [`Book::slack`] later than `until`.
    listed: bool,
    /// Kept by the plan under way (`Book::plan` clears it after).
    kept: bool,
}

/// [`Slot::len`] of a span that is no prefix (only from a listing of a
/// table another program changed).
const RANGE: u8 = u8::MAX;

impl Slot {
    pub fn until(&self) -> Until {
        self.end.until()
    }
}

/// What the kernel holds: span start -> slot. Spans are disjoint, and
/// prefixes but for a rare range.
#[derive(Clone, Debug, Default)]
struct Applied {
    slots: Tree<IpAddr, Slot>,
    /// The ends of the spans that are no prefix.
    ranges: BTreeMap<IpAddr, IpAddr>,
}

impl Applied {
    fn span(&self, lo: IpAddr, slot: &Slot) -> Span {
        let hi = match slot.len {
            RANGE => self.ranges.get(&lo).copied().unwrap_or(lo),
            len => IpNet::new(lo, len).map_or(lo, |n| n.broadcast()),
        };
        Span { lo, hi }
    }

    /// `span`'s slot, at its start; a span that is no prefix keeps its
    /// end in `ranges` (a field apart, for builders of `slots` in bulk).
    fn entry(ranges: &mut BTreeMap<IpAddr, IpAddr>, span: Span, end: End, listed: bool) -> (IpAddr, Slot) {
        let len = match span.as_net() {
            Some(net) => {
                ranges.remove(&span.lo);
                net.prefix_len()
            }
            None => {
                ranges.insert(span.lo, span.hi);
                RANGE
            }
        };
        let slot = Slot {
            end,
            len,
            listed,
            kept: false,
        };
        (span.lo, slot)
    }

    fn insert(&mut self, span: Span, end: End, listed: bool) {
        let (lo, slot) = Applied::entry(&mut self.ranges, span, end, listed);
        self.slots.insert(lo, slot);
    }

    fn remove(&mut self, lo: &IpAddr) {
        if self.slots.remove(lo).is_some_and(|s| s.len == RANGE) {
            self.ranges.remove(lo);
        }
    }

    /// The slot of exactly `span`.
    fn exact(&self, span: Span) -> Option<&Slot> {
        self.slots.get(&span.lo).filter(|s| self.span(span.lo, s).hi == span.hi)
    }

    fn exact_mut(&mut self, span: Span) -> Option<&mut Slot> {
        self.exact(span)?;
        self.slots.get_mut(&span.lo)
    }

    fn iter(&self) -> impl Iterator<Item = (Span, &Slot)> + '_ {
        self.slots.iter().map(|(lo, s)| (self.span(lo, s), s))
    }

    /// Applied spans that overlap `span`.
    fn overlapping(&self, span: Span) -> impl Iterator<Item = (Span, Slot)> + '_ {
        let before = self
            .slots
            .before(&span.lo)
            .map(|(lo, s)| (self.span(lo, s), *s))
            .filter(move |(s, _)| s.hi >= span.lo);
        before.into_iter().chain(
            self.slots
                .range(&span.lo, &span.hi)
                .map(|(lo, s)| (self.span(lo, s), *s)),
        )
    }

    fn retain(&mut self, mut keep: impl FnMut(&Slot) -> bool) {
        let ranges = &mut self.ranges;
        self.slots.retain(|lo, s| {
            let k = keep(s);
            if !k && s.len == RANGE {
                ranges.remove(&lo);
            }
            k
        });
    }
}

/// Where an applied element stands at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Life {
    /// Surely in the kernel: may be deleted.
    Live,
    /// Maybe expired: neither delete it nor add anything overlapping it.
    Dying,
    /// Surely expired.
    Gone,
}

fn life(until: Until, now: i64) -> Life {
    match until {
        Until::Permanent => Life::Live,
        Until::At(t) if now < t - DELETE_MARGIN_MS => Life::Live,
        Until::At(t) if now < t + GONE_MARGIN_MS => Life::Dying,
        Until::At(_) => Life::Gone,
    }
}

/// Whether the kernel's element (`slot`) already ends as `want` says: its
/// end lies in `[until, until + slack]` (`slack`: [`Book::slack`] for an
/// element read from a listing, else 0), and `want` within
/// [`REFRESH_TOLERANCE_MS`] of that window. Only an end really moved
/// (extended, shortened) is re-added, not one the kernel counted down.
fn same_until(slot: &Slot, want: Until, slack: u32) -> bool {
    let slack = if slot.listed { i64::from(slack) } else { 0 };
    match (slot.until(), want) {
        (Until::At(x), Until::At(y)) => y > x - REFRESH_TOLERANCE_MS && y < x + slack + REFRESH_TOLERANCE_MS,
        (a, b) => a == b,
    }
}

fn earliest(a: Option<i64>, b: i64) -> Option<i64> {
    Some(a.map_or(b, |a| a.min(b)))
}

/// A net and its end as the bookkeeping stores them, or None if expired.
pub(crate) fn normalize(elem: &Element, now: i64) -> Option<(IpNet, Until)> {
    let until = match elem.until {
        Until::At(t) if t <= now => return None,
        Until::At(t) if t.saturating_sub(now) > MAX_TIMEOUT_MS => Until::Permanent,
        u => u,
    };
    Some((elem.net.trunc(), until))
}

/// Element changes for one transaction: deletes first, then adds.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    pub delete: Vec<Span>,
    /// New elements and refreshed ones (re-adding replaces the timeout).
    pub add: Vec<(IpNet, Until)>,
    pub stats: ReconcileStats,
    /// When to plan again, if something waits for an expiry.
    pub wake: Option<i64>,
}

impl Plan {
    pub fn is_empty(&self) -> bool {
        self.delete.is_empty() && self.add.is_empty()
    }
}

/// Desired and applied state of one enforcer.
#[derive(Clone, Debug, Default)]
pub(crate) struct Book {
    /// What callers want enforced; nets truncated, none expired at last plan.
    desired: Tree<IpNet, End>,
    /// What the kernel holds. A plan marks what it keeps in place
    /// (`Slot::kept`) rather than in a set of kept elements: it allocates
    /// nothing in proportion to the bans (one ban on top of 100k used to
    /// allocate and free ~8 MB, which the allocator kept).
    applied: Applied,
    /// From the last committed plan.
    wake: Option<i64>,
    /// How much later than `until` the end of an element read from the
    /// last listing may be (ms): its `until` is the listing's start plus
    /// `expires`, and the kernel counted down while nft listed (1M
    /// elements: tens of seconds). Without it a slow listing made every
    /// element look shortened and re-added them all.
    slack: u32,
}

impl Book {
    /// Adds or updates wanted bans; returns how many were already expired.
    pub fn desire(&mut self, elems: &[Element], now: i64) -> usize {
        let mut expired = 0;
        for e in elems {
            match normalize(e, now) {
                Some((net, until)) => {
                    self.desired.insert(net, End::of(until));
                }
                None => expired += 1,
            }
        }
        expired
    }

    pub fn undesire(&mut self, nets: &[IpNet]) {
        for net in nets {
            self.desired.remove(&net.trunc());
        }
    }

    /// Replaces the wanted bans; returns how many input elements were expired.
    pub fn set_desired(&mut self, elems: &[Element], now: i64) -> usize {
        let mut expired = 0;
        let wanted: Vec<(IpNet, End)> = elems
            .iter()
            .filter_map(|e| {
                let n = normalize(e, now);
                expired += usize::from(n.is_none());
                n.map(|(net, until)| (net, End::of(until)))
            })
            .collect();
        // Built in bulk (sorted once, last of equal nets wins, as inserting
        // one by one would): 100k bans at start. The old table goes first,
        // so that the new one's nodes take its place in the heap rather
        // than leave it a hole as large (a million bans: 27 MB).
        self.desired = Tree::default();
        self.desired = wanted.into_iter().collect();
        expired
    }

    /// Replaces the applied state with the kernel's elements, their ends
    /// as a listing that began at their `until`'s base and took
    /// `listing_ms` estimates them (see `Book::slack`).
    pub fn load_applied(&mut self, elems: &[(Span, Until)], listing_ms: i64) {
        self.slack = u32::try_from((listing_ms.max(0)).saturating_add(EXPIRES_GRAIN_MS)).unwrap_or(u32::MAX);
        // The old table goes first (as in `set_desired`).
        self.applied = Applied::default();
        let ranges = &mut self.applied.ranges;
        self.applied.slots = elems
            .iter()
            .map(|(s, u)| Applied::entry(ranges, *s, End::of(*u), true))
            .collect();
    }

    /// Wants exactly what is applied (a restarted daemon keeps the kernel's
    /// bans). A range that is not a prefix becomes the prefixes covering it.
    pub fn desire_applied(&mut self) {
        self.desired.clear();
        for (span, slot) in self.applied.iter() {
            for net in span_nets(span) {
                self.desired.insert(net, slot.end);
            }
        }
    }

    pub fn clear(&mut self) {
        *self = Book::default();
    }

    /// The wanted nets, in order.
    /// Whether `net` is one of the bans wanted.
    pub fn wants(&self, net: &IpNet) -> bool {
        self.desired.contains_key(net)
    }

    pub fn desired_nets(&self) -> impl Iterator<Item = IpNet> + '_ {
        self.desired.keys()
    }

    /// The wanted bans with their ends.
    pub fn desired(&self) -> impl Iterator<Item = (IpNet, Until)> + '_ {
        self.desired.iter().map(|(n, e)| (n, e.until()))
    }

    pub fn applied_len(&self) -> usize {
        self.applied.slots.len()
    }

    pub fn desired_len(&self) -> usize {
        self.desired.len()
    }

    pub fn wake(&self) -> Option<i64> {
        self.wake
    }

    /// The changes that make the kernel enforce `desired` at `now`. Drops
    /// expired wanted bans and surely-expired applied elements first.
    pub fn plan(&mut self, now: i64) -> Plan {
        self.desired.retain(|_, e| match e.until() {
            Until::At(t) => t > now,
            Until::Permanent => true,
        });
        self.applied.retain(|s| life(s.until(), now) != Life::Gone);

        let mut plan = Plan::default();
        let slack = self.slack;
        // The cover: sorted by (network, prefix length), a net is inside some
        // kept net iff it is inside the last kept one (prefixes nest or are
        // disjoint), so one pass finds it.
        let mut top: Option<(IpNet, Until)> = None;
        let mut wanted_overlaps: Vec<IpAddr> = Vec::new();
        for (net, end) in self.desired.iter() {
            let until = end.until();
            if let Some((top, top_until)) = top {
                if top.contains(&net) {
                    plan.stats.covered += 1;
                    if let Until::At(t) = top_until {
                        if until > top_until {
                            // Outlives its cover: plan again once the cover is gone.
                            plan.wake = earliest(plan.wake, t + GONE_MARGIN_MS);
                        }
                    }
                    continue;
                }
            }
            top = Some((net, until));
            let span = Span::of(&net);
            if let Some(slot) = self.applied.exact_mut(span) {
                slot.kept = true;
                if same_until(slot, until, slack) {
                    plan.stats.unchanged += 1;
                } else {
                    plan.add.push((net, until));
                    plan.stats.refreshed += 1;
                }
                continue;
            }
            let mut blocked = false;
            for (_, slot) in self.applied.overlapping(span) {
                if let (Life::Dying, Until::At(t)) = (life(slot.until(), now), slot.until()) {
                    blocked = true;
                    plan.wake = earliest(plan.wake, t + GONE_MARGIN_MS);
                }
            }
            if blocked {
                plan.stats.deferred += 1;
                // Keep what already drops part of it, as long as it is wanted.
                wanted_overlaps.clear();
                wanted_overlaps.extend(self.applied.overlapping(span).filter_map(|(s, _)| {
                    s.as_net()
                        .is_some_and(|n| self.desired.contains_key(&n))
                        .then_some(s.lo)
                }));
                for lo in &wanted_overlaps {
                    if let Some(slot) = self.applied.slots.get_mut(lo) {
                        slot.kept = true;
                    }
                }
            } else {
                plan.add.push((net, until));
                plan.stats.added += 1;
            }
        }

        for (span, slot) in self.applied.iter() {
            if !slot.kept && life(slot.until(), now) == Life::Live {
                plan.delete.push(span);
            }
        }
        for slot in self.applied.slots.values_mut() {
            slot.kept = false;
        }
        plan.stats.removed = plan.delete.len();
        plan
    }

    /// The plan for a few changed nets alone (already desired/undesired),
    /// or None when they need [`Book::plan`]: only nets (of any length:
    /// every set is plain since issue 27) that no wanted net covers or is
    /// covered by, with nothing else in the kernel overlapping them and no
    /// applied element of theirs near its end. For those the full plan
    /// would produce exactly these changes; the other bans are untouched.
    pub fn plan_for(&self, nets: &[IpNet], now: i64) -> Option<Plan> {
        const MAX: usize = 64;
        if nets.len() > MAX {
            return None;
        }
        let mut nets: Vec<IpNet> = nets.iter().map(IpNet::trunc).collect();
        nets.sort_unstable();
        nets.dedup();
        let mut plan = Plan {
            wake: self.wake,
            ..Plan::default()
        };
        for net in nets {
            if self.covered(&net) || self.covers_another(&net) {
                return None;
            }
            let span = Span::of(&net);
            let exact = self.applied.exact(span);
            if self.applied.overlapping(span).any(|(s, _)| s != span) {
                return None;
            }
            let wanted = match self.desired.get(&net).map(|e| e.until()) {
                Some(Until::At(t)) if t <= now => return None,
                w => w,
            };
            if exact.is_some_and(|s| life(s.until(), now) != Life::Live) {
                return None;
            }
            match (wanted, exact) {
                (Some(until), Some(slot)) if same_until(slot, until, self.slack) => plan.stats.unchanged += 1,
                (Some(until), Some(_)) => {
                    plan.add.push((net, until));
                    plan.stats.refreshed += 1;
                }
                (Some(until), None) => {
                    plan.add.push((net, until));
                    plan.stats.added += 1;
                }
                (None, Some(_)) => plan.delete.push(span),
                (None, None) => {}
            }
        }
        plan.stats.removed = plan.delete.len();
        Some(plan)
    }

    /// Whether a wanted net strictly wider than `net` contains it.
    fn covered(&self, net: &IpNet) -> bool {
        (0..net.prefix_len()).any(|len| {
            IpNet::new(net.addr(), len)
                .map(|n| n.trunc())
                .is_ok_and(|n| self.desired.contains_key(&n))
        })
    }

    /// Whether `net` strictly contains another wanted net. Wanted nets are
    /// ordered by (address, prefix length): the nets inside `net` come
    /// right after it, so the next one tells.
    fn covers_another(&self, net: &IpNet) -> bool {
        self.desired.after(net).is_some_and(|(k, _)| net.contains(&k))
    }

    /// Wanted nets the kernel is not believed to hold: neither applied as
    /// they are nor inside a wider wanted net (the cover `plan` keeps). After
    /// a failed transaction these are the bans not enforced. One walk of
    /// the wanted bans, as `plan`'s.
    pub fn unapplied(&self) -> Vec<IpNet> {
        let mut out = Vec::new();
        let mut top: Option<IpNet> = None;
        for net in self.desired.keys() {
            if top.is_some_and(|t| t.contains(&net)) {
                continue;
            }
            top = Some(net);
            let span = Span::of(&net);
            if self.applied.exact(span).is_none() {
                out.push(net);
            }
        }
        out
    }

    /// Adds `elems` to the wanted bans and plans adding those of them
    /// that nothing applied overlaps, recording them as applied at once
    /// (so that nested nets of one call are not both planned); the caller
    /// re-reads the kernel if nft refuses the plan. The rest wait for
    /// [`Book::plan`]. The start's pages, while the list is still read
    /// (`NftEnforcer::preload`).
    pub fn plan_preload(&mut self, elems: &[Element], now: i64) -> Plan {
        let mut plan = Plan {
            wake: self.wake,
            ..Plan::default()
        };
        // Taken in the nets' order (a page of the list comes in the order
        // of the bans' ends, its nets spread over the whole space): each
        // search of the book's tables goes where the last one went, in
        // memory the cache still holds. Sorted stably: of equal nets the
        // last given is still inserted last.
        let mut page: Vec<(IpNet, Until)> = elems.iter().filter_map(|e| normalize(e, now)).collect();
        page.sort_by_key(|e| e.0);
        for (net, until) in page {
            let end = End::of(until);
            self.desired.insert(net, end);
            let span = Span::of(&net);
            if self.applied.overlapping(span).next().is_none() {
                self.applied.insert(span, end, false);
                plan.add.push((net, until));
                plan.stats.added += 1;
            }
        }
        plan
    }

    /// Records a plan the kernel accepted.
    pub fn commit(&mut self, plan: &Plan) {
        if self.applied.slots.is_empty() && plan.delete.is_empty() {
            // A load into empty sets: built in bulk.
            self.applied.ranges.clear();
            let ranges = &mut self.applied.ranges;
            self.applied.slots = plan
                .add
                .iter()
                .map(|&(net, until)| Applied::entry(ranges, Span::of(&net), End::of(until), false))
                .collect();
            self.wake = plan.wake;
            return;
        }
        for span in &plan.delete {
            self.applied.remove(&span.lo);
        }
        for &(net, until) in &plan.add {
            self.applied.insert(Span::of(&net), End::of(until), false);
        }
        self.wake = plan.wake;
    }

    /// Rebuilds what is applied in bulk (a B-tree filled one element at a
    /// time keeps its nodes about 3/4 full): after the start's preloads,
    /// whose wanted bans the first sync's `set_desired` rebuilds.
    pub fn compact(&mut self) {
        self.applied.slots = std::mem::take(&mut self.applied.slots).rebuilt();
    }

    #[cfg(test)]
    fn applied_spans(&self) -> Vec<String> {
        self.applied.iter().map(|(span, _)| span.to_string()).collect()
    }
}

/// The prefixes that exactly make up a span.
fn span_nets(span: Span) -> Vec<IpNet> {
    if let Some(net) = span.as_net() {
        return vec![net];
    }
    match (span.lo, span.hi) {
        (IpAddr::V4(a), IpAddr::V4(b)) => Ipv4Subnets::new(a, b, 0).map(IpNet::V4).collect(),
        (IpAddr::V6(a), IpAddr::V6(b)) => Ipv6Subnets::new(a, b, 0).map(IpNet::V6).collect(),
        _ => Vec::new(),
    }
}

/// A span from two textual addresses of one family, as in a listing.
pub(crate) fn span_from(lo: IpAddr, hi: IpAddr) -> Option<Span> {
    match (lo, hi) {
        (IpAddr::V4(_), IpAddr::V4(_)) | (IpAddr::V6(_), IpAddr::V6(_)) if lo <= hi => Some(Span { lo, hi }),
        _ => None,
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::net::Ipv4Addr;

    const NOW: i64 = 1_700_000_000_000;
    const H: i64 = 3_600_000;

    pub(crate) use crate::addr::net;

    /// A fixed pseudo-random sequence: `rnd(n)` is below `n`.
    fn xorshift() -> impl FnMut(u64) -> u64 {
        let mut seed = 0x9e37_79b9_7f4a_7c15u64;
        move |n| {
            seed ^= seed << 13;
            seed ^= seed >> 7;
            seed ^= seed << 17;
            seed % n
        }
    }

    fn el(s: &str, until: Until) -> Element {
        Element { net: net(s), until }
    }

    fn at(ms: i64) -> Until {
        Until::At(NOW + ms)
    }

    /// The book's entries carry no padding: what is wanted 16 bytes an
    /// IPv4 ban, 25 an IPv6 one (28 with an end aligned on 4); what is
    /// applied 16 and 27.
    #[test]
    fn an_entry_of_the_book_takes_its_key_and_fields() {
        assert_eq!(Tree::<IpNet, End>::entry_bytes(), [16, 25]);
        assert_eq!(Tree::<IpAddr, Slot>::entry_bytes(), [16, 27]);
    }

    /// Plans and commits, as a successful transaction would.
    fn step(book: &mut Book, now: i64) -> (Vec<String>, Vec<String>) {
        let plan = book.plan(now);
        book.commit(&plan);
        (
            plan.delete.iter().map(|s| s.to_string()).collect(),
            plan.add.iter().map(|(n, _)| Span::of(n).to_string()).collect(),
        )
    }

    #[test]
    fn unapplied_is_what_a_failed_plan_left_out_of_the_kernel() {
        let mut book = Book::default();
        book.desire(&[el("192.0.2.1", at(H)), el("198.51.100.0/24", at(H))], NOW);
        step(&mut book, NOW);
        assert!(book.unapplied().is_empty());
        // Planned but not committed (nft refused): both new nets are missing,
        // the one inside the applied /24 is covered.
        book.desire(
            &[
                el("192.0.2.2", at(H)),
                el("198.51.100.7", at(H)),
                el("2001:db8::/64", at(H)),
            ],
            NOW,
        );
        let _ = book.plan(NOW);
        assert_eq!(book.unapplied(), vec![net("192.0.2.2/32"), net("2001:db8::/64")]);
        step(&mut book, NOW);
        assert!(book.unapplied().is_empty());
    }

    #[test]
    fn span_display_and_prefixes() {
        let s = |lo: &str, hi: &str| span_from(lo.parse().unwrap(), hi.parse().unwrap()).unwrap();
        assert_eq!(s("1.2.3.4", "1.2.3.4").to_string(), "1.2.3.4");
        assert_eq!(s("10.0.0.0", "10.0.0.255").to_string(), "10.0.0.0/24");
        assert_eq!(s("10.0.0.1", "10.0.0.5").to_string(), "10.0.0.1-10.0.0.5");
        assert_eq!(
            s("2001:db8::", "2001:db8::ffff:ffff:ffff:ffff").to_string(),
            "2001:db8::/64"
        );
        assert_eq!(s("0.0.0.0", "255.255.255.255").to_string(), "0.0.0.0/0");
        assert_eq!(s("::", "ffff:ffff:ffff:ffff:ffff:ffff:ffff:ffff").to_string(), "::/0");
        let nets: Vec<String> = span_nets(s("10.0.0.1", "10.0.0.5"))
            .iter()
            .map(|n| n.to_string())
            .collect();
        assert_eq!(nets, ["10.0.0.1/32", "10.0.0.2/31", "10.0.0.4/31"]);
        assert!(span_from("1.2.3.4".parse().unwrap(), "::1".parse().unwrap()).is_none());
    }

    #[test]
    fn expired_skipped_and_far_future_is_permanent() {
        let mut b = Book::default();
        let expired = b.desire(
            &[
                el("1.1.1.1", Until::At(NOW)),
                el("2.2.2.2", at(1)),
                el("3.3.3.3", at(MAX_TIMEOUT_MS + 1)),
            ],
            NOW,
        );
        assert_eq!(expired, 1);
        let plan = b.plan(NOW);
        assert_eq!(plan.add.len(), 2);
        assert_eq!(plan.add[1].1, Until::Permanent);
    }

    #[test]
    fn broad_after_narrow_deletes_narrow_in_same_plan() {
        let mut b = Book::default();
        b.desire(&[el("10.0.0.5", at(H))], NOW);
        assert_eq!(step(&mut b, NOW), (vec![], vec!["10.0.0.5".into()]));
        b.desire(&[el("10.0.0.0/24", at(H))], NOW);
        assert_eq!(step(&mut b, NOW), (vec!["10.0.0.5".into()], vec!["10.0.0.0/24".into()]));
        // Removing the broad one brings the narrow one back.
        b.undesire(&[net("10.0.0.0/24")]);
        assert_eq!(step(&mut b, NOW), (vec!["10.0.0.0/24".into()], vec!["10.0.0.5".into()]));
        assert_eq!(b.applied_spans(), ["10.0.0.5"]);
    }

    #[test]
    fn narrow_after_broad_is_covered() {
        let mut b = Book::default();
        b.desire(&[el("10.0.0.0/24", at(H))], NOW);
        step(&mut b, NOW);
        b.desire(&[el("10.0.0.5", at(H / 2))], NOW);
        let plan = b.plan(NOW);
        assert!(plan.is_empty());
        assert_eq!(plan.stats.covered, 1);
        assert_eq!(plan.wake, None, "the narrow one ends first: nothing to add back");
        // Removing the narrow one changes nothing in the kernel.
        b.undesire(&[net("10.0.0.5")]);
        assert!(b.plan(NOW).is_empty());
        assert_eq!(b.desired_len(), 1);
    }

    #[test]
    fn covered_outliving_its_cover_comes_back_after_expiry() {
        let mut b = Book::default();
        b.desire(&[el("10.0.0.0/24", at(H)), el("10.0.0.5", at(2 * H))], NOW);
        let plan = b.plan(NOW);
        assert_eq!(plan.wake, Some(NOW + H + GONE_MARGIN_MS));
        b.commit(&plan);
        assert_eq!(b.applied_spans(), ["10.0.0.0/24"]);
        // Near its end the /24 is dying: not deleted, and the /32 is deferred.
        let (del, add) = step(&mut b, NOW + H - 10);
        assert!(del.is_empty() && add.is_empty());
        // Once surely gone, the /32 is added back; no delete of the expired /24.
        let (del, add) = step(&mut b, NOW + H + GONE_MARGIN_MS);
        assert!(del.is_empty());
        assert_eq!(add, ["10.0.0.5"]);
        assert_eq!(b.applied_spans(), ["10.0.0.5"]);
    }

    #[test]
    fn dying_element_is_not_deleted_and_blocks_overlaps() {
        let mut b = Book::default();
        b.desire(&[el("10.0.0.5", at(5_000)), el("10.0.0.9", at(H))], NOW);
        step(&mut b, NOW);
        // 10.0.0.5 is unbanned just before it expires: deleting could fail.
        b.undesire(&[net("10.0.0.5")]);
        let plan = b.plan(NOW + 4_500);
        assert!(plan.delete.is_empty());
        // A broader ban over both must wait for 10.0.0.5 to be surely gone, and
        // meanwhile 10.0.0.9 (still wanted) stays in the kernel.
        b.desire(&[el("10.0.0.0/28", at(H))], NOW + 4_500);
        let plan = b.plan(NOW + 4_500);
        assert!(plan.is_empty(), "{plan:?}");
        assert_eq!(plan.stats.deferred, 1);
        assert_eq!(plan.wake, Some(NOW + 5_000 + GONE_MARGIN_MS));
        b.commit(&plan);
        let (del, add) = step(&mut b, NOW + 5_000 + GONE_MARGIN_MS);
        assert_eq!(del, ["10.0.0.9"]);
        assert_eq!(add, ["10.0.0.0/28"]);
    }

    /// A listing that took 30 s reads every end up to 31 s early (the
    /// kernel counted down meanwhile): those are not re-added; an end the
    /// list really moved, later or earlier, is.
    #[test]
    fn a_slow_listing_re_adds_only_ends_that_really_moved() {
        let mut b = Book::default();
        let (a, c, d, e) = ("192.0.2.1", "192.0.2.2", "192.0.2.3", "192.0.2.4");
        let listed = |s: &str, u: i64| (Span::of(&net(s)), at(u));
        // As read: the base is the listing's start, the true ends later.
        b.load_applied(
            &[listed(a, H - 29_000), listed(c, H - 2_000), listed(d, H), listed(e, H)],
            30_000,
        );
        b.desire(
            &[el(a, at(H)), el(c, at(H)), el(d, at(H + 60_000)), el(e, at(H - 60_000))],
            NOW,
        );
        let plan = b.plan(NOW);
        assert_eq!(plan.stats.unchanged, 2, "{plan:?}");
        assert_eq!(plan.stats.refreshed, 2, "{plan:?}");
        let moved: Vec<IpNet> = plan.add.iter().map(|(n, _)| *n).collect();
        assert_eq!(moved, vec![net(d), net(e)]);
        // Once put in by this process, the end is exact again.
        b.commit(&plan);
        b.desire(&[el(d, at(H + 60_000 + 30_000))], NOW);
        assert_eq!(b.plan(NOW).stats.refreshed, 1);
    }

    #[test]
    fn refresh_only_when_the_end_changes() {
        let mut b = Book::default();
        b.desire(&[el("2001:db8::/64", at(H)), el("192.0.2.1", Until::Permanent)], NOW);
        step(&mut b, NOW);
        b.desire(&[el("2001:db8::/64", at(H + 500))], NOW);
        assert!(b.plan(NOW).is_empty(), "within tolerance");
        b.desire(&[el("2001:db8::/64", at(3 * H)), el("192.0.2.1", at(H))], NOW);
        let plan = b.plan(NOW);
        assert_eq!(plan.stats.refreshed, 2);
        assert!(plan.delete.is_empty());
    }

    #[test]
    fn a_preload_adds_what_nothing_applied_overlaps_and_the_first_sync_does_the_rest() {
        let mut b = Book::default();
        b.load_applied(&[(Span::of(&net("10.0.0.0/24")), at(H))], 0);
        b.desire_applied();
        let plan = b.plan_preload(
            &[
                // Inside the applied /24, inside the /16 of the same call,
                // ended: none is added.
                el("10.0.0.5", at(H)),
                el("10.1.0.0/16", at(H)),
                el("10.1.2.3", at(2 * H)),
                el("10.2.0.1", at(-1)),
                el("10.3.0.1", Until::Permanent),
            ],
            NOW,
        );
        let added: Vec<String> = plan.add.iter().map(|(n, _)| n.to_string()).collect();
        assert_eq!(added, ["10.1.0.0/16", "10.3.0.1/32"]);
        assert_eq!(b.applied_spans(), ["10.0.0.0/24", "10.1.0.0/16", "10.3.0.1"]);
        b.compact();
        assert_eq!(b.applied_spans(), ["10.0.0.0/24", "10.1.0.0/16", "10.3.0.1"]);
        // The first sync wants the list read: the /24 is no ban of it.
        let list = [
            el("10.0.0.5", at(H)),
            el("10.1.0.0/16", at(H)),
            el("10.1.2.3", at(2 * H)),
            el("10.3.0.1", Until::Permanent),
        ];
        b.set_desired(&list, NOW);
        let plan = b.plan(NOW);
        assert_eq!(plan.stats.unchanged, 2, "what the preload put in stays");
        b.commit(&plan);
        let del: Vec<String> = plan.delete.iter().map(ToString::to_string).collect();
        let add: Vec<String> = plan.add.iter().map(|(n, _)| Span::of(n).to_string()).collect();
        assert_eq!(del, ["10.0.0.0/24"]);
        assert_eq!(add, ["10.0.0.5"]);
        assert_eq!(b.applied_spans(), ["10.0.0.5", "10.1.0.0/16", "10.3.0.1"]);
    }

    #[test]
    fn replace_all_removes_stale_and_foreign_ranges() {
        let mut b = Book::default();
        let range = span_from("10.9.0.1".parse().unwrap(), "10.9.0.5".parse().unwrap()).unwrap();
        b.load_applied(&[(Span::of(&net("10.1.0.0/16")), at(H)), (range, at(H))], 0);
        b.desire_applied();
        assert_eq!(b.desired_len(), 4, "the /16 and the range's 3 prefixes");
        // Keeping the kernel's bans replaces the range by its prefixes.
        let (del, add) = step(&mut b, NOW);
        assert_eq!(del, ["10.9.0.1-10.9.0.5"]);
        assert_eq!(add.len(), 3);
        b.set_desired(&[el("10.2.0.0/16", at(H))], NOW);
        let (del, add) = step(&mut b, NOW);
        assert_eq!(del.len(), 4);
        assert_eq!(add, ["10.2.0.0/16"]);
    }

    /// Brute force: after every step the applied spans are disjoint and every
    /// wanted address is dropped by exactly the cover of the wanted nets.
    #[test]
    fn random_steps_keep_applied_disjoint_and_equal_to_cover() {
        let mut rnd = xorshift();
        let mut b = Book::default();
        let mut now = NOW;
        for _ in 0..2_000 {
            let len = [24u8, 28, 30, 32][rnd(4) as usize];
            let addr = Ipv4Addr::new(10, 0, 0, rnd(64) as u8);
            let n = IpNet::new(addr.into(), len).unwrap().trunc();
            match rnd(3) {
                0 => {
                    b.undesire(&[n]);
                }
                _ => {
                    let until = if rnd(5) == 0 {
                        Until::Permanent
                    } else {
                        Until::At(now + rnd(60_000) as i64)
                    };
                    b.desire(&[Element { net: n, until }], now);
                }
            }
            now += rnd(20_000) as i64;
            step(&mut b, now);
            let spans: Vec<Span> = b.applied.iter().map(|(span, _)| span).collect();
            for w in spans.windows(2) {
                assert!(w[0].hi < w[1].lo, "overlap {} {}", w[0], w[1]);
            }
            // Every live wanted net is inside some applied span, unless deferred
            // or waiting for its cover to go (both bounded by wake).
            for (n, until) in b.desired.iter() {
                let s = Span::of(&n);
                let inside = spans.iter().any(|a| a.lo <= s.lo && s.hi <= a.hi);
                assert!(inside || b.wake.is_some(), "{n} until {until:?} not enforced at {now}");
            }
        }
    }

    /// The plan for a few changed nets equals what the full plan does to
    /// those nets, whenever it answers; over random bans, unbans, refreshes
    /// and expiries of addresses, /64s and the networks that cover them.
    #[test]
    fn the_plan_for_touched_nets_matches_the_full_plan() {
        let universe: Vec<IpNet> = [
            "10.0.0.1/32",
            "10.0.0.2/32",
            "10.0.0.3/32",
            "10.0.0.4/32",
            "10.0.0.0/30",
            "10.0.1.1/32",
            "2001:db8::/64",
            "2001:db8:0:1::/64",
            "2001:db8::/48",
            "2001:db8::1/128",
            "2001:db9::/64",
            "10.0.2.0/24",
            "10.0.2.128/25",
            "192.0.2.0/31",
            "2001:dba::/48",
        ]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
        let mut rnd = xorshift();
        let mut book = Book::default();
        let mut now = NOW;
        let (mut quick, mut full) = (0, 0);
        for _ in 0..5_000 {
            now += rnd(3_000) as i64;
            let mut add = Vec::new();
            let mut remove = Vec::new();
            for _ in 0..=rnd(2) {
                let net = universe[rnd(universe.len() as u64) as usize];
                match rnd(4) {
                    0 => remove.push(net),
                    1 => add.push(Element {
                        net,
                        until: Until::Permanent,
                    }),
                    _ => add.push(Element {
                        net,
                        until: Until::At(now + 500 + rnd(20_000) as i64),
                    }),
                }
            }
            book.desire(&add, now);
            book.undesire(&remove);
            let touched: Vec<IpNet> = add.iter().map(|e| e.net).chain(remove.iter().copied()).collect();
            let plan = match book.plan_for(&touched, now) {
                Some(p) => {
                    let mut whole = book.clone();
                    let all = whole.plan(now);
                    let is_touched = |s: &Span| touched.iter().any(|n| Span::of(&n.trunc()) == *s);
                    let mut want_add: Vec<String> = all
                        .add
                        .iter()
                        .filter(|(n, _)| is_touched(&Span::of(n)))
                        .map(|(n, u)| format!("{n} {u:?}"))
                        .collect();
                    let mut want_del: Vec<String> = all
                        .delete
                        .iter()
                        .filter(|s| is_touched(s))
                        .map(|s| s.to_string())
                        .collect();
                    let mut got_add: Vec<String> = p.add.iter().map(|(n, u)| format!("{n} {u:?}")).collect();
                    let mut got_del: Vec<String> = p.delete.iter().map(|s| s.to_string()).collect();
                    for v in [&mut want_add, &mut want_del, &mut got_add, &mut got_del] {
                        v.sort();
                    }
                    assert_eq!((got_add, got_del), (want_add, want_del), "touched {touched:?}");
                    quick += 1;
                    p
                }
                None => {
                    full += 1;
                    book.plan(now)
                }
            };
            book.commit(&plan);
        }
        assert!(quick > 1_000 && full > 100, "quick {quick}, full {full}");
    }
}
