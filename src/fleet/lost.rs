//! A list Redis lost, told from a list emptied by unbans. Redis restarted
//! without persistence, or a FLUSHALL, leaves an empty list that a
//! reconcile would take as the truth, lifting every ban of the fleet.
//! `{prefix}:epoch` (`Keys::epoch`) is set once, by whichever host first
//! finds it missing, and never deleted by fleetban: unbans leave it, a loss
//! takes it. A host whose epoch changed since its last snapshot writes
//! back the bans it still enforces, with their ends and records
//! (`BanList::restore`, the later end winning), and keeps them in its set.
//!
//! The epoch is also kept in `state_dir/epoch`: a host started after the
//! loss finds it changed at its first snapshot and writes back what its nft
//! set kept while it was down (records naming it).
//!
//! [`Remembered`] is what this host knows to write back: the list as it
//! last applied it (snapshots and events), with each entry's record; and,
//! for a host joining Redis from the embedded store, the bans its
//! `bans.json` holds, written the same way at its first snapshot.

use std::path::PathBuf;

use ipnet::IpNet;

use super::kept::{Kept, Names};
use crate::bans::{BanList, BanListError, BanRecord, End, NetMap};
use crate::enforce::{Change, Element, Until};

/// Records read per call (`BanList::raw_records`).
const RECORDS_PAGE: usize = 4_096;

#[derive(Default)]
pub struct Remembered {
    /// The fleet's epoch at this host's last snapshot (None before the first).
    epoch: Option<String>,
    /// The list as this host last applied it: each entry's end and record
    /// (`Kept::UNREAD` until a snapshot has read it). Compact (`NetMap`, records as
    /// `kept::Kept`): with a million bans this is the largest table a host
    /// keeps.
    bans: NetMap<(End, Kept)>,
    /// The rule, host and reason the records share.
    names: Names,
    /// Reading the epoch was refused once (warned once).
    refused: bool,
    /// The embedded store's file this host joins Redis with and its active
    /// bans: written to the list at the next snapshot, then set aside.
    joining: Option<(PathBuf, Vec<BanRecord>)>,
    /// Where the epoch is kept across restarts (`state_dir/epoch`), and
    /// the one it holds.
    file: Option<PathBuf>,
    saved: Option<String>,
    /// The first snapshot found the epoch changed since the saved one:
    /// Redis lost the list while this host was down.
    lost_while_down: bool,
    /// Entries whose records are still to be read, a page at a time
    /// ([`Remembered::read_records`]): a snapshot reads the first page,
    /// the fleet sync the rest between reads of the events stream. A
    /// million records took 6.3 s to read, which the start no longer waits
    /// for.
    unread: Vec<IpNet>,
}

impl Remembered {
    /// Keeps the fleet's epoch in `file` across restarts; reads the one
    /// a previous run left.
    pub fn keep_epoch_in(&mut self, file: PathBuf) {
        self.saved = std::fs::read_to_string(&file)
            .ok()
            .map(|s| s.trim().to_owned())
            .filter(|s| !s.is_empty());
        self.file = Some(file);
    }

    /// The first snapshot found that Redis lost the list while this host
    /// was down (asked once).
    pub fn take_lost_while_down(&mut self) -> bool {
        std::mem::take(&mut self.lost_while_down)
    }

    /// The first snapshot failed (Redis down at start): the list as this
    /// host knows it is what its nft set `kept`, under the saved epoch, so
    /// the first snapshot that works writes it back if the list was lost.
    pub fn resume(&mut self, kept: Vec<Element>) {
        self.epoch = self.saved.clone();
        self.observe(&Change::Replace(kept));
    }

    /// Redis lost the list while this host was down: writes back what its
    /// nft set `kept` (records naming this host), said once with the
    /// count; `entries` (the list read at start) with them.
    pub async fn write_back_kept(
        &mut self,
        list: &mut BanList,
        host: &str,
        kept: Vec<Element>,
        mut entries: Vec<Element>,
    ) -> Result<Vec<Element>, BanListError> {
        let back: Vec<(IpNet, Until, Option<String>)> = kept.iter().map(|e| (e.net, e.until, None)).collect();
        let written = list.restore(&back, host, crate::now_ms()).await?;
        tracing::warn!(count = back.len(), written, in_list = entries.len(),
            "The ban list was lost while this host was down (the fleet's epoch changed since it last ran); wrote back the bans its nft set kept.");
        merge(&mut entries, back.iter().map(|(n, u, _)| (*n, *u)));
        self.observe(&Change::Replace(entries.clone()));
        Ok(entries)
    }

    /// This host joins Redis with the embedded store's `file` holding
    /// `bans`: they go to the fleet's list at the next snapshot rather
    /// than being lifted by it.
    pub fn joining(&mut self, file: PathBuf, bans: Vec<BanRecord>) {
        self.joining = Some((file, bans));
    }

    /// An event or a change applied: the list as this host knows it follows.
    pub fn observe(&mut self, change: &Change) {
        match change {
            Change::Add(elems) => {
                for e in elems {
                    let end = End::of(e.until);
                    match self.bans.get_mut(&e.net) {
                        Some(entry) if entry.0 == end => {}
                        // Another ban of the same address: its record is new.
                        Some(entry) => *entry = (end, Kept::UNREAD),
                        None => {
                            self.bans.insert(e.net, (end, Kept::UNREAD));
                        }
                    }
                }
            }
            Change::Remove(nets) => {
                for n in nets {
                    self.bans.remove(n);
                }
            }
            Change::Replace(elems) => {
                let next: NetMap<(End, Kept)> = elems
                    .iter()
                    .map(|e| {
                        let end = End::of(e.until);
                        let rec = match self.bans.get(&e.net) {
                            Some(&(u, rec)) if u == end => rec,
                            _ => Kept::UNREAD,
                        };
                        (e.net, (end, rec))
                    })
                    .collect();
                self.bans = next;
            }
        }
    }

    /// Whether the list as this host knows it holds `e` already (the same
    /// end or a later one): an event of it is nothing new here.
    pub fn holds(&self, e: &Element) -> bool {
        self.bans.get(&e.net).is_some_and(|(u, _)| u.until() >= e.until)
    }

    /// Whether the list as this host knows it has a ban of `net`.
    pub fn has(&self, net: &IpNet) -> bool {
        self.bans.contains(net)
    }

    /// After a snapshot read `entries` from `list` (before the epoch: a
    /// loss between the two shows in the epoch): the list Redis has now,
    /// with what this host still enforces written back if the list was
    /// lost. Records of entries this host has none of are read from `list`:
    /// the first page now, the others by [`Remembered::read_records`].
    ///
    /// With `drift` (a periodic repair's, [`DriftRead`]), and when nothing
    /// was written back, it returns it again and follows those changes
    /// alone instead of rebuilding its table from the whole list.
    pub async fn after_snapshot(
        &mut self,
        list: &mut BanList,
        host: &str,
        mut entries: Vec<Element>,
        drift: Option<Drift>,
    ) -> Result<(Vec<Element>, Option<Drift>), BanListError> {
        let read = entries.len();
        let now = crate::now_ms();
        let token = format!("{host}:{now}:{}", std::process::id());
        let epoch = match list.epoch(&token).await {
            Ok(e) => e,
            Err(e) if e.is_outage() => return Err(e),
            Err(e) => {
                // An ACL without GET/SET: no way to tell a lost list.
                if !self.refused {
                    tracing::warn!(error = %crate::ratelog::cap_error(&e.to_string()),
                        "Reading the fleet's epoch refused (the ACL lacks GET or SET?); a list Redis loses will not be written back.");
                    self.refused = true;
                }
                self.epoch.clone()
            }
        };
        if self.epoch.is_some() && epoch != self.epoch {
            let live = |u: &Until| *u > Until::At(now);
            let back: Vec<(IpNet, Until, Option<String>)> = self
                .bans
                .iter()
                .filter(|(_, (u, _))| live(&u.until()))
                .map(|(n, (u, rec))| (n, u.until(), self.names.text(rec, u.until())))
                .collect();
            // Remembered as lost until written: a failure here retries.
            let written = list.restore(&back, host, now).await?;
            tracing::warn!(count = back.len(), written, in_list = entries.len(),
                "The ban list was lost (the fleet's epoch changed: Redis restarted without persistence, or FLUSHALL); wrote back the bans this host enforces, with their ends and records.");
            merge(&mut entries, back.iter().map(|(n, u, _)| (*n, *u)));
        }
        if let Some((file, bans)) = self.joining.take() {
            let back: Vec<(IpNet, Until, Option<String>)> = bans
                .iter()
                .filter(|r| r.until() > Until::At(now))
                .map(|r| (r.addr, r.until(), serde_json::to_string(r).ok()))
                .collect();
            match list.restore(&back, host, now).await {
                Ok(written) => {
                    let aside = file.with_extension("json.imported");
                    if !back.is_empty() {
                        tracing::warn!(count = back.len(), written, in_list = entries.len(), file = %file.display(), aside = %aside.display(),
                        "Joined Redis with bans of this host's embedded store: wrote them to the fleet's list (the later end wins, records kept); the file is set aside.");
                    }
                    if let Err(e) = std::fs::rename(&file, &aside) {
                        tracing::warn!(error = %e, file = %file.display(), "Setting the embedded ban list aside failed; its bans are written again at the next start.");
                    }
                    merge(&mut entries, back.iter().map(|(n, u, _)| (*n, *u)));
                }
                Err(e) if e.is_outage() => {
                    self.joining = Some((file, bans));
                    return Err(e);
                }
                Err(e) => tracing::warn!(error = %crate::ratelog::cap_error(&e.to_string()), file = %file.display(),
                    "Writing this host's embedded bans to the fleet's list refused; the file is kept for the next start."),
            }
        }
        if self.epoch.is_none() && self.saved.is_some() && epoch.is_some() && epoch != self.saved {
            self.lost_while_down = true;
        }
        if epoch.is_some() && epoch != self.saved {
            self.save_epoch(epoch.as_deref().unwrap_or_default());
            self.saved = epoch.clone();
        }
        self.epoch = epoch;
        // Nothing written back: the entries are the list as read.
        let drift = drift.filter(|_| entries.len() == read);
        match &drift {
            Some(d) => {
                self.observe(&Change::Add(d.adds.clone()));
                self.observe(&Change::Remove(d.removes.clone()));
            }
            None => self.observe(&Change::Replace(entries.clone())),
        }
        self.unread = self
            .bans
            .iter()
            .filter(|(_, (_, rec))| !rec.is_read())
            .map(|(n, _)| n)
            .collect();
        self.read_records(list).await?;
        Ok((entries, drift))
    }

    /// What `entries`, a full read of the list, changes in the list as
    /// this host knows it, the read compared whole ([`DriftRead`]).
    pub fn drift(&self, entries: &[Element], now: i64) -> Drift {
        let mut read = DriftRead::new(now);
        read.compare(entries, self);
        read.finish(self, entries)
    }

    /// The end this host knows for a ban of `net`, if it has one.
    fn end(&self, net: &IpNet) -> Option<End> {
        self.bans.get(net).map(|(end, _)| *end)
    }
}

/// A drift repair's read of a long list, compared page by page as the
/// pages come (between them the fleet's task follows the events), against
/// the list as this host knew it when the read began: a net an event
/// changed since is compared with what was known of it before that event
/// ([`DriftRead::seen`]), every other one with the list as it is. The
/// comparison used to run after the last page, 50-100 ms of lookups at a
/// million bans, during which no event was followed.
///
/// What it finds ([`DriftRead::finish`]):
/// - adds: entries this host lacked or held with another end;
/// - removes: its bans still live that the read did not find.
///
/// Nets the events changed are neither: their last event is applied here
/// and sent already. Finding removes takes two counts, of the bans known
/// here live and of those the read found; only when they differ (a member
/// deleted by hand) are the read's nets sorted to name them.
#[derive(Debug)]
pub struct DriftRead {
    /// Bans ending at or before it are not live (the read's own `now`).
    now: i64,
    adds: Vec<Element>,
    /// Bans known here live that the read found, with whatever end.
    found: usize,
    /// For each net an event changed during the read, what this host knew
    /// of it before the first such event (None: no ban).
    before: foldhash::HashMap<IpNet, Option<End>>,
    took: std::time::Duration,
}

impl DriftRead {
    pub fn new(now: i64) -> DriftRead {
        DriftRead {
            now,
            adds: Vec::new(),
            found: 0,
            before: Default::default(),
            took: std::time::Duration::ZERO,
        }
    }

    fn live(&self, end: End) -> bool {
        end.until() > Until::At(self.now)
    }

    /// An event of the stream, before `known` (the list as this host
    /// knows it) follows it.
    pub fn seen(&mut self, change: &Change, known: &Remembered) {
        let mut before = |net: IpNet| {
            self.before.entry(net).or_insert_with(|| known.end(&net));
        };
        match change {
            Change::Add(elems) => elems.iter().for_each(|e| before(e.net)),
            Change::Remove(nets) => nets.iter().for_each(|&n| before(n)),
            Change::Replace(_) => {}
        }
    }

    /// One page of the read, against the list as `known` began it.
    pub fn compare(&mut self, page: &[Element], known: &Remembered) {
        let started = std::time::Instant::now();
        for e in page {
            let end = match self.before.get(&e.net) {
                Some(before) => *before,
                None => known.end(&e.net),
            };
            if let Some(end) = end {
                self.found += usize::from(self.live(end));
            }
            if end != Some(End::of(e.until)) {
                self.adds.push(e.clone());
            }
        }
        self.took += started.elapsed();
    }

    /// An entry the read returned for a net an event changed (taken out of
    /// the list read, `During::on_top`): uncounted, as it was counted.
    pub fn unread(&mut self, e: &Element) {
        if let Some(Some(end)) = self.before.get(&e.net) {
            self.found = self.found.saturating_sub(usize::from(self.live(*end)));
        }
    }

    /// The drift, once `entries` (the list read, events on top) is whole
    /// and `known` has followed every event of the read.
    pub fn finish(mut self, known: &Remembered, entries: &[Element]) -> Drift {
        let started = std::time::Instant::now();
        let touched = std::mem::take(&mut self.before);
        self.adds.retain(|e| !touched.contains_key(&e.net));
        let live = |end: &End| self.live(*end);
        let here = known.bans.iter().filter(|(_, (end, _))| live(end)).count()
            - touched
                .keys()
                .filter(|n| known.end(n).is_some_and(|end| live(&end)))
                .count();
        let sorted = self.found != here;
        let removes = if !sorted {
            Vec::new()
        } else {
            let mut read: Vec<IpNet> = entries.iter().map(|e| e.net).collect();
            read.sort_unstable();
            known
                .bans
                .iter()
                .filter(|(n, (end, _))| live(end) && read.binary_search(n).is_err())
                .map(|(n, _)| n)
                .collect()
        };
        Drift {
            adds: self.adds,
            removes,
            sorted,
            took: self.took + started.elapsed(),
        }
    }
}

/// What a full read of the list found changed without an event
/// ([`Remembered::drift`]).
#[derive(Debug, Default)]
pub struct Drift {
    /// Entries this host lacked, or held with another end.
    pub adds: Vec<Element>,
    /// Bans this host held, live, that the list no longer has.
    pub removes: Vec<IpNet>,
    /// The counts differed: the read's nets were sorted to name the removes.
    pub sorted: bool,
    /// How long finding them took (in the fleet's task).
    pub took: std::time::Duration,
}

impl Drift {
    pub fn is_empty(&self) -> bool {
        self.adds.is_empty() && self.removes.is_empty()
    }
}

impl Remembered {
    /// Whether records remain to be read ([`Remembered::read_records`]).
    pub fn records_unread(&self) -> bool {
        !self.unread.is_empty()
    }

    /// Reads one page of the records the last snapshot left unread (the
    /// replies of a million records are never held at once). A refusal
    /// leaves them for the next snapshot; an outage is the caller's.
    pub async fn read_records(&mut self, list: &mut BanList) -> Result<(), BanListError> {
        let page: Vec<IpNet> = self.unread.split_off(self.unread.len().saturating_sub(RECORDS_PAGE));
        if self.unread.is_empty() {
            self.unread = Vec::new();
        }
        let page: Vec<IpNet> = page
            .into_iter()
            .filter(|n| self.bans.get(n).is_some_and(|(_, rec)| !rec.is_read()))
            .collect();
        if page.is_empty() {
            return Ok(());
        }
        match list.raw_records(&page).await {
            Ok(recs) => {
                for (net, rec) in page.iter().zip(recs) {
                    if let (Some(entry), Some(rec)) = (self.bans.get_mut(net), rec) {
                        // A record that does not parse is written back
                        // as restored, as one never read.
                        entry.1 = self.names.keep(&rec).unwrap_or(Kept::UNREADABLE);
                    }
                }
                Ok(())
            }
            Err(e) => {
                self.unread = Vec::new();
                if e.is_outage() {
                    return Err(e);
                }
                tracing::debug!(error = %e, "Reading ban records refused; read again at the next reconcile.");
                Ok(())
            }
        }
    }

    /// Writes `epoch` to the file it is kept in (atomically); a failure
    /// is a warning: a restart then cannot tell a list lost meanwhile.
    fn save_epoch(&self, epoch: &str) {
        let Some(file) = &self.file else { return };
        let tmp = file.with_extension("tmp");
        let written = std::fs::write(&tmp, epoch).and_then(|()| std::fs::rename(&tmp, file));
        if let Err(e) = written {
            let _ = std::fs::remove_file(&tmp);
            tracing::warn!(error = %e, file = %file.display(),
                "Saving the fleet's epoch failed; a list Redis loses while this host is down will not be written back by it.");
        }
    }
}

/// `entries` (the list read) with `back` (bans written back) in it, the
/// later end winning.
fn merge(entries: &mut Vec<Element>, back: impl Iterator<Item = (IpNet, Until)>) {
    let mut at: std::collections::HashMap<IpNet, usize> = entries.iter().enumerate().map(|(i, e)| (e.net, i)).collect();
    for (net, until) in back {
        match at.get(&net) {
            Some(&i) => entries[i].until = entries[i].until.max(until),
            None => {
                at.insert(net, entries.len());
                entries.push(Element { net, until });
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A remembered ban is its key, end and record without padding: 32
    /// bytes an IPv4 ban, 36 an IPv6 /64 (40 with a key aligned on 8).
    #[test]
    fn a_remembered_ban_takes_its_key_end_and_record() {
        assert_eq!(NetMap::<(End, Kept)>::entry_bytes(), [32, 36, 44]);
    }

    #[test]
    fn drift_is_what_a_full_read_changes_and_nothing_else() {
        let el = |s: &str, t: i64| Element {
            net: s.parse().unwrap(),
            until: Until::At(t),
        };
        let now = 1_000;
        let mut r = Remembered::default();
        let known = vec![
            el("192.0.2.1/32", 5_000),
            el("192.0.2.2/32", 5_000),
            el("198.51.100.0/24", 6_000),
            el("2001:db8::/64", 7_000),
            // Ended (the kernel's own expiry): no read has it any more.
            el("192.0.2.9/32", 900),
        ];
        r.observe(&Change::Replace(known.clone()));
        // The same list, read in another order, without what ended.
        let mut read: Vec<Element> = known[..4].iter().rev().cloned().collect();
        assert!(r.drift(&read, now).is_empty());
        // A member written without an event, another end for one, and one
        // deleted by hand.
        read.retain(|e| e.net.to_string() != "198.51.100.0/24");
        read.push(el("203.0.113.7/32", 8_000));
        read[0] = el("2001:db8::/64", 9_000);
        let d = r.drift(&read, now);
        assert_eq!(d.adds, vec![el("2001:db8::/64", 9_000), el("203.0.113.7/32", 8_000)]);
        assert_eq!(d.removes, vec!["198.51.100.0/24".parse::<IpNet>().unwrap()]);
        // Followed, the drift leaves nothing to repair.
        r.observe(&Change::Add(d.adds));
        r.observe(&Change::Remove(d.removes));
        assert!(r.drift(&read, now).is_empty());
    }

    #[test]
    fn the_list_is_remembered_with_the_records_of_unchanged_entries() {
        let a: IpNet = "192.0.2.1/32".parse().unwrap();
        let b: IpNet = "192.0.2.2/32".parse().unwrap();
        let mut r = Remembered::default();
        r.observe(&Change::Add(vec![
            Element {
                net: a,
                until: Until::At(10),
            },
            Element {
                net: b,
                until: Until::Permanent,
            },
        ]));
        let kept = r.names.keep(r#"{"rule":"r"}"#).unwrap();
        r.bans.retain(|rec| {
            rec.1 = kept;
            true
        });
        // A reconcile: `a` unchanged keeps its record, `b` banned anew loses it.
        r.observe(&Change::Replace(vec![
            Element {
                net: a,
                until: Until::At(10),
            },
            Element {
                net: b,
                until: Until::At(20),
            },
        ]));
        assert_eq!(r.bans.get(&a), Some(&(End::of(Until::At(10)), kept)));
        assert_eq!(r.bans.get(&b), Some(&(End::of(Until::At(20)), Kept::UNREAD)));
        r.observe(&Change::Remove(vec![a]));
        assert!(!r.bans.contains(&a) && r.bans.len() == 1);
    }
}
