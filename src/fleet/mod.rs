//! Keeps this host's set equal to the fleet's ban list. At start and after
//! any error it reconciles against the whole list; in between it follows the
//! events stream (XREAD BLOCK) from the last id it applied, so a ban written
//! by any host reaches this one within one round trip. A periodic reconcile
//! repairs whatever drifted (missed events, timeouts).
//!
//! It follows, in the same XREAD, `{fleetban}:marks`: the hosts' hot marks
//! and arrivals (`hot.rs`), which go to the limiter as [`FleetNews`]; every
//! snapshot also reads the live marks and the number of registered hosts.
//!
//! A periodic reconcile that can find nothing new reads nothing: while the
//! stream has been followed without a gap or an error since the last full
//! read, every change of the list has arrived as an event (each script
//! that changes it, `ban.lua`, `unban.lua`, `restore.lua`, adds one in the
//! same call; an entry's expiry is the kernel's own), so the list is read
//! whole again only every [`FULL_EVERY`]th period, as drift repair (a
//! member written by hand, a kernel element deleted by hand). A list of
//! one page or less is read at every period: one page is bounded anyway.
//!
//! Gaps are detected, not assumed away: after every read the stream's
//! `XINFO STREAM` says whether entries after our last id were deleted
//! (`max-deleted-entry-id`, XADD MAXLEN / XTRIM / XDEL) or whether the stream
//! is younger than our last id (Redis restarted empty, key deleted); either
//! way the host reconciles at once.

pub mod hot;
mod kept;
mod lost;
mod story;

pub use lost::{Drift, DriftRead, Remembered};
pub use story::Story;

use std::time::Duration;

use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use tokio_util::sync::CancellationToken;

use crate::bans::{list::parse_until, with_held, BanList, Held};
use crate::enforce::{Change, Changes, Element};
use crate::limit::FleetNews;
use crate::ratelog::Retry;
use crate::store::Keys;
use ipnet::IpNet;
use tokio::sync::mpsc::UnboundedSender;

/// How long one XREAD waits for events before looping (to notice shutdown
/// and reconcile deadlines).
const BLOCK_MS: usize = 1000;

/// With Sentinel, how often the sentinels are asked whether the master
/// this host uses is still the one they name (a failover may leave the old
/// one alive, answering: no error would move us).
const MASTER_CHECK: Duration = Duration::from_secs(5);

/// While reading the fleet fails (an outage), one warning per this period.
const FAILING_PERIOD: Duration = Duration::from_secs(60);
/// The first wait after a failed step, and the longest: a snapshot (the
/// whole list: 42 ms of Redis for 100k bans) waits up to 5 s, a read of
/// the stream (each failure also schedules a snapshot) up to 10 s.
const FIRST_RETRY: Duration = Duration::from_millis(100);
const MAX_SNAPSHOT_RETRY: Duration = Duration::from_secs(5);
const MAX_READ_RETRY: Duration = Duration::from_secs(10);
/// With nothing missed, the list is read whole every this many periods of
/// `reconcile_every` (10 min by default): at 1,000,000 bans a full read
/// costs ~5 s of Redis replies and a listing of the kernel's set.
pub const FULL_EVERY: u32 = 10;

pub struct FleetSync {
    /// Dedicated to blocking reads.
    pub events: crate::store::Conn,
    /// Reads the full list on reconcile.
    pub list: BanList,
    /// This host's id, registered at every reconcile (`BanList::register_host`).
    pub host: String,
    pub keys: Keys,
    pub reconcile_every: Duration,
    /// To the enforcer and to the pipeline's view of the list.
    pub changes: Changes,
    /// Gaps detected in the stream (each one caused a reconcile).
    pub gaps: u64,
    /// Entries the last full read returned: a list of one page at most is
    /// read at every period, a longer one only when something may be missed.
    pub listed: usize,
    /// Bans this host decided while Redis was down and has not yet written
    /// to the list: a reconcile keeps them rather than lifting them.
    pub held: Held,
    /// To the limiter: hot marks, hosts, whether marks may have been missed.
    pub news: Option<UnboundedSender<FleetNews>>,
    /// The last id applied of `{fleetban}:marks` (set by each snapshot).
    pub marks_id: String,
    /// The list as this host knows it, with records, and the fleet's epoch:
    /// what it writes back when Redis lost the list (`lost.rs`).
    pub remembered: Remembered,
    /// This host's log of the bans and unbans it applies from the fleet.
    pub story: Story,
    /// Counts each failed step among the host's Redis errors (`status`).
    pub health: crate::store::Health,
    /// Where the next snapshot's pages go as they are read (the start's:
    /// nft loads them meanwhile, `daemon::start::preload`); taken by it.
    pub early: Option<UnboundedSender<Vec<Element>>>,
}

impl FleetSync {
    /// The id of the newest event, then the full list: events after that id
    /// are applied on top, so nothing between the two reads is lost. This
    /// host registers itself first (an unban then reaches its `scope: host`
    /// windows); a registration refused (an ACL without SADD) is a warning,
    /// not a failed reconcile.
    ///
    /// After the start, the events are followed between the list's pages
    /// (`During`): each is sent at once, and the list returned has them on
    /// top, with the id of the last one read. A million bans are 245 pages
    /// and ~2.4 s of reading; a ban decided meanwhile used to wait for them.
    ///
    /// A periodic `repair` of a list longer than the enforcer lists the
    /// kernel for ([`crate::enforce::LIST_MAX`]) also returns its
    /// [`Drift`]: what changed without an event, all the enforcer and the
    /// view need instead of the whole list.
    pub async fn snapshot(&mut self, repair: bool) -> Result<(String, Vec<Element>, Option<Drift>), redis::RedisError> {
        // Taken first: whichever way this returns, the pages' receiver
        // learns the read is over (the start waits for it).
        let early = self.early.take();
        // The marks stream's position before the hosts are counted: a host
        // that registers after the count announces itself after this id
        // (SADD, then XADD), so it is read as an arrival, never missed.
        self.marks_id = self.newest_id(&self.keys.marks()).await?;
        let hosts = match self.list.register_host(&self.host).await {
            Ok((new, hosts)) => {
                if new {
                    if let Err(e) = hot::announce_join(&mut self.events, &self.keys, &self.host).await {
                        tracing::warn!(error = %e, "Announcing this host to the fleet failed; the others count it at their next reconcile.");
                    }
                }
                hosts
            }
            Err(e) => {
                let e = redis_error(e);
                if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
                    return Err(e);
                }
                tracing::warn!(error = %e, host = %self.host,
                    "Registering this host refused; an unban elsewhere leaves its scope: host windows, and the fleet's size is redis.fleet_size.");
                0
            }
        };
        let id = self.newest_id(&self.keys.events()).await?;
        let mut cursor = crate::bans::Cursor::new(crate::now_ms(), crate::bans::list::PAGE);
        // A repair of a long list compares its pages as they come.
        let compare = (repair && self.listed > crate::enforce::LIST_MAX).then(|| DriftRead::new(cursor.now_ms()));
        let mut during = early.is_none().then(|| During::after(id.clone(), compare));
        let started = std::time::Instant::now();
        let mut entries: Vec<Element> = Vec::new();
        while let Some(page) = self.list.entries_page(&mut cursor).await.map_err(redis_error)? {
            let page: Vec<Element> = page.into_iter().map(|(net, until)| Element { net, until }).collect();
            if let Some(drift) = during.as_mut().and_then(|d| d.drift.as_mut()) {
                drift.compare(&page, &self.remembered);
            }
            entries.extend_from_slice(&page);
            if let Some(tx) = &early {
                let _ = tx.send(page);
            }
            if let Some(d) = &mut during {
                self.follow_during(d).await?;
            }
        }
        // The list is read: the start's preload may end.
        drop(early);
        self.listed = entries.len();
        let read = started.elapsed();
        let (id, drift) = match during {
            Some(d) => {
                if d.events > 0 && self.gap_after(&self.keys.events(), &id).await? {
                    return Err(redis::RedisError::from(std::io::Error::other(
                        "ban events were trimmed during the list's read; reading it again",
                    )));
                }
                d.on_top(&mut entries)
            }
            None => (id, None),
        };
        let drift = drift
            .filter(|_| entries.len() > crate::enforce::LIST_MAX)
            .map(|d| d.finish(&self.remembered, &entries));
        let (entries, drift) = self
            .remembered
            .after_snapshot(&mut self.list, &self.host, entries, drift)
            .await
            .map_err(redis_error)?;
        // Marks after `id` come as events on top, as bans do.
        let news = match hot::read_all(&mut self.events, &self.keys, crate::now_ms()).await {
            Ok(hot) => FleetNews::Snapshot { hosts, hot },
            Err(e) => {
                tracing::warn!(error = %e, "Reading the fleet's hot clients failed; this host sends every hit at once until it can.");
                FleetNews::Lost
            }
        };
        self.tell(news);
        tracing::debug!(
            entries = entries.len(),
            took = %crate::took(read),
            then = %crate::took(started.elapsed() - read),
            "Ban list entries read."
        );
        Ok((id, entries, drift))
    }

    /// After each page of a full read: the ban events after `d.last`, up
    /// to the stream's end, without waiting, each applied at once (as the
    /// loop of `run` does) and kept in `d` for the list read. Read to the
    /// end, so that after the last page every change its entries show has
    /// been read as an event too.
    async fn follow_during(&mut self, d: &mut During) -> Result<(), redis::RedisError> {
        const COUNT: usize = 1000;
        let events = self.keys.events();
        let opts = StreamReadOptions::default().count(COUNT);
        loop {
            let reply: StreamReadReply = self
                .events
                .xread_options(&[events.as_str()], &[d.last.as_str()], &opts)
                .await?;
            let mut read = 0;
            for entry in reply.keys.into_iter().flat_map(|k| k.ids) {
                self.apply_event(&entry, |c, known| d.note(c, known));
                read += 1;
                d.last = entry.id;
            }
            d.events += read;
            self.story.flush();
            if read < COUNT {
                return Ok(());
            }
        }
    }

    /// One ban event of the stream applied: told in this host's story,
    /// shown to `note` with the remembered list, which then follows it,
    /// then sent to the enforcer and the view. An entry that is no change
    /// is skipped.
    fn apply_event(&mut self, entry: &redis::streams::StreamId, note: impl FnOnce(&Change, &Remembered)) {
        if let Some(c) = change_of(entry) {
            self.story.event(entry, &c, &self.host, &self.remembered);
            note(&c, &self.remembered);
            self.remembered.observe(&c);
            self.changes.send(c);
        }
    }

    /// A drift repair of a long list: only what changed without an event
    /// goes to the enforcer and the view (a ban held for Redis stays).
    fn repair(&self, mut d: Drift) {
        {
            let held = self.held.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
            d.removes.retain(|n| !held.iter().any(|h| h.net == *n));
        }
        tracing::debug!(
            listed = self.listed,
            added = d.adds.len(),
            removed = d.removes.len(),
            sorted = d.sorted,
            took = %crate::took(d.took),
            "Drift repair: the list read whole; what changed without an event applied."
        );
        if !d.adds.is_empty() {
            self.changes.send(Change::Add(d.adds));
        }
        if !d.removes.is_empty() {
            self.changes.send(Change::Remove(d.removes));
        }
    }

    /// The id of the newest entry of `stream` (`0-0` if it has none).
    async fn newest_id(&mut self, stream: &str) -> Result<String, redis::RedisError> {
        let last: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
            .arg(stream)
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.events)
            .await?;
        Ok(last.into_iter().next().map_or_else(|| "0-0".to_owned(), |(id, _)| id))
    }

    fn tell(&self, news: FleetNews) {
        if let Some(n) = &self.news {
            let _ = n.send(news);
        }
    }

    pub async fn run(mut self, mut last_id: String, shutdown: CancellationToken) {
        let mut next_reconcile = tokio::time::Instant::now() + self.reconcile_every;
        // Each step backs off and warns by its own failures alone: a read
        // that keeps failing (an ACL without XREAD) while every snapshot
        // succeeds waits ever longer, not 100 ms after each snapshot.
        let mut snapshot = Retry::new(FIRST_RETRY, MAX_SNAPSHOT_RETRY);
        let mut read = Retry::new(FIRST_RETRY, MAX_READ_RETRY);
        let mut next_master_check = tokio::time::Instant::now() + MASTER_CHECK;
        // Periods since the last full read, and whether something may have
        // been missed since (a gap, an error, a new master): then the next
        // reconcile reads the list whole, at once.
        let (mut periods, mut missed) = (0u32, false);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            if tokio::time::Instant::now() >= next_master_check {
                next_master_check = tokio::time::Instant::now() + MASTER_CHECK;
                let events_moved = self
                    .events
                    .follow_master()
                    .await
                    .inspect_err(|e| tracing::debug!(error = %e, "Asking the sentinels for the master failed."))
                    .unwrap_or(false);
                if self.list.follow_master().await || events_moved {
                    // What the new master holds, read whole.
                    self.tell(FleetNews::Lost);
                    (next_reconcile, missed) = (tokio::time::Instant::now(), true);
                }
            }
            if tokio::time::Instant::now() >= next_reconcile
                && !missed
                && periods + 1 < FULL_EVERY
                && self.listed > crate::bans::list::PAGE
            {
                // Every change since the last full read came as an event.
                periods += 1;
                tracing::debug!(
                    periods,
                    listed = self.listed,
                    "Periodic reconcile: no event missed since the last full read; the list not read."
                );
                next_reconcile = tokio::time::Instant::now() + self.reconcile_every;
            }
            if tokio::time::Instant::now() >= next_reconcile {
                match self.snapshot(!missed).await {
                    Ok((id, elems, drift)) => {
                        last_id = id;
                        if snapshot.succeeded() {
                            tracing::info!("Ban list read again after an error; reconciled.");
                        }
                        match drift {
                            Some(d) => self.repair(d),
                            None => self
                                .changes
                                .send(Change::Replace(with_held(elems, &self.held, crate::now_ms()))),
                        }
                        next_reconcile = tokio::time::Instant::now() + self.reconcile_every;
                        (periods, missed) = (0, false);
                    }
                    Err(e) => {
                        missed = true;
                        let (wait, warn) = snapshot.failed(FAILING_PERIOD);
                        let errors = self.health.count_error() + 1;
                        if let Some(n) = warn {
                            tracing::warn!(error = %crate::ratelog::cap_error(&e.to_string()), failures = n, errors,
                                "Reconcile with the ban list failed; retrying with backoff (one warning a minute meanwhile).");
                        }
                        if sleep_or_stop(wait, &shutdown).await {
                            return;
                        }
                        continue;
                    }
                }
            }
            // Records a snapshot left unread, a page per turn: the stream
            // is read between pages, without waiting.
            let mut opts = StreamReadOptions::default().count(1000);
            if self.remembered.records_unread() {
                if let Err(e) = self.remembered.read_records(&mut self.list).await {
                    tracing::debug!(error = %e, "Reading ban records failed; read again at the next reconcile.");
                    (next_reconcile, missed) = (tokio::time::Instant::now(), true);
                }
                if !self.remembered.records_unread() {
                    // The replies of every page are freed: their pages go
                    // back, and the code that read them is let go.
                    crate::daemon::trim_heap();
                    crate::daemon::release_code_pages();
                }
            }
            if !self.remembered.records_unread() {
                opts = opts.block(BLOCK_MS);
            }
            let (events, marks) = (self.keys.events(), self.keys.marks());
            let stream = [events.as_str(), marks.as_str()];
            let from = [last_id.clone(), self.marks_id.clone()];
            let reply = tokio::select! {
                r = self.events.xread_options::<_, _, StreamReadReply>(&stream, &from, &opts) => r,
                _ = shutdown.cancelled() => return,
            };
            let (before, marks_before) = (last_id.clone(), self.marks_id.clone());
            let reply = match reply {
                Ok(reply) => reply,
                Err(e) => {
                    // After any gap the whole list is read again, once
                    // this step's wait is over.
                    let (wait, warn) = read.failed(FAILING_PERIOD);
                    self.lost(
                        warn,
                        &e,
                        "Following ban events failed; will reconcile (one warning a minute while it fails).",
                    );
                    (next_reconcile, missed) = (tokio::time::Instant::now(), true);
                    if sleep_or_stop(wait, &shutdown).await {
                        return;
                    }
                    continue;
                }
            };
            let mut got = 0;
            for key in reply.keys {
                if key.key == marks {
                    for entry in key.ids {
                        if let Some(n) = news_of(&entry, &self.host) {
                            self.tell(n);
                        }
                        self.marks_id = entry.id;
                    }
                    continue;
                }
                got += key.ids.len();
                for entry in key.ids {
                    self.apply_event(&entry, |_, _| {});
                    last_id = entry.id;
                }
            }
            self.story.flush();
            // Marks trimmed unread: some may be missed until the
            // next snapshot reads them all.
            if !matches!(self.gap_after(&marks, &marks_before).await, Ok(false)) {
                self.tell(FleetNews::Lost);
                tracing::warn!("Hot-client marks after our last id were trimmed; reading them all again.");
                (next_reconcile, missed) = (tokio::time::Instant::now(), true);
            }
            match self.gap_after(&events, &before).await {
                Ok(gap) => {
                    if read.succeeded() {
                        tracing::info!("Following ban events again.");
                    }
                    if gap {
                        self.gaps += 1;
                        self.tell(FleetNews::Lost);
                        tracing::warn!(last_id = %before, read = got,
                            "Ban events after our last id were trimmed or the stream was reset; reconciling.");
                        (next_reconcile, missed) = (tokio::time::Instant::now(), true);
                    }
                }
                Err(e) => {
                    let (wait, warn) = read.failed(FAILING_PERIOD);
                    self.lost(warn, &e, "Checking the events stream failed; will reconcile.");
                    (next_reconcile, missed) = (tokio::time::Instant::now(), true);
                    if sleep_or_stop(wait, &shutdown).await {
                        return;
                    }
                }
            }
        }
    }
}

impl FleetSync {
    /// Reading the stream failed: what the limiter knows of the fleet may be
    /// stale (`Lost`), and `what` is said when the warning is due (`warn`:
    /// the failures since the last one).
    fn lost(&self, warn: Option<u64>, e: &redis::RedisError, what: &str) {
        self.tell(FleetNews::Lost);
        let errors = self.health.count_error() + 1;
        if let Some(n) = warn {
            tracing::warn!(error = %crate::ratelog::cap_error(&e.to_string()), failures = n, errors, "{what}");
        }
    }

    /// True if the stream may have lost events after `last`, the id we had
    /// applied before the read that just returned. Trimming (XADD MAXLEN,
    /// XTRIM) removes the oldest entries first, so an unread entry can only
    /// be gone if every entry up to `last` is gone too: the first entry is
    /// newer than `last`, or the stream is empty although ids after `last`
    /// were generated. XDEL shows in `max-deleted-entry-id` (Redis 7); a
    /// stream whose newest id is older than `last` was recreated. A false
    /// alarm (a host ~100k events behind) costs one reconcile.
    async fn gap_after(&mut self, stream: &str, last: &str) -> Result<bool, redis::RedisError> {
        let Some(last) = StreamId::parse(last) else {
            return Ok(true);
        };
        let info: redis::RedisResult<redis::Value> = redis::cmd("XINFO")
            .arg("STREAM")
            .arg(stream)
            .query_async(&mut self.events)
            .await;
        let info = match info {
            Ok(v) => v,
            // No stream at all: a gap unless we never saw one either.
            Err(e) if e.to_string().contains("no such key") => return Ok(last != StreamId::ZERO),
            Err(e) => return Err(e),
        };
        let id = |name: &str| info_field(&info, name).and_then(id_of).unwrap_or(StreamId::ZERO);
        let newest = id("last-generated-id");
        if newest < last || id("max-deleted-entry-id") > last {
            return Ok(true);
        }
        if last == StreamId::ZERO {
            // The stream was empty at the snapshot: everything in it is new.
            return Ok(false);
        }
        Ok(match info_field(&info, "first-entry") {
            Some(redis::Value::Array(entry)) => entry.first().and_then(id_of).is_some_and(|first| first > last),
            _ => newest > last,
        })
    }
}

/// The ban events read during a full read of the list (`snapshot`).
struct During {
    /// The id of the last event read.
    last: String,
    /// How many were read.
    events: usize,
    /// Each net they changed, with its last change: the ban (`Some`) or
    /// the unban (`None`).
    touched: foldhash::HashMap<IpNet, Option<Element>>,
    /// A drift repair's comparison of the pages, told of each event.
    drift: Option<DriftRead>,
}

impl During {
    fn after(id: String, drift: Option<DriftRead>) -> During {
        During {
            last: id,
            events: 0,
            touched: Default::default(),
            drift,
        }
    }

    /// An event, before `known` (the list as this host knows it) follows it.
    fn note(&mut self, c: &Change, known: &Remembered) {
        if let Some(d) = &mut self.drift {
            d.seen(c, known);
        }
        match c {
            Change::Add(elems) => self.touched.extend(elems.iter().map(|e| (e.net, Some(e.clone())))),
            Change::Remove(nets) => self.touched.extend(nets.iter().map(|&n| (n, None))),
            Change::Replace(_) => {}
        }
    }

    /// The list as the events left it: a net they changed is as its last
    /// event says, whatever page it was read in (or not read). Returns the
    /// id of the last event read, and the drift repair's comparison.
    fn on_top(self, entries: &mut Vec<Element>) -> (String, Option<DriftRead>) {
        let During {
            last,
            touched,
            mut drift,
            ..
        } = self;
        if !touched.is_empty() {
            entries.retain(|e| {
                let keep = !touched.contains_key(&e.net);
                if let (false, Some(d)) = (keep, &mut drift) {
                    d.unread(e);
                }
                keep
            });
            entries.extend(touched.into_values().flatten());
        }
        (last, drift)
    }
}

/// A stream id `ms-seq`, ordered as Redis orders them.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct StreamId(u64, u64);

impl StreamId {
    pub const ZERO: StreamId = StreamId(0, 0);

    pub fn parse(s: &str) -> Option<StreamId> {
        let (ms, seq) = s.split_once('-').unwrap_or((s, "0"));
        Some(StreamId(ms.parse().ok()?, seq.parse().ok()?))
    }
}

/// One field of an `XINFO STREAM` reply (a flat array in RESP2, a map in RESP3).
/// A ban list's error as the Redis error the sync's loop handles.
fn redis_error(e: crate::bans::BanListError) -> redis::RedisError {
    match e {
        crate::bans::BanListError::Redis(r) => r,
        other => redis::RedisError::from(std::io::Error::other(other.to_string())),
    }
}

fn info_field<'a>(info: &'a redis::Value, name: &str) -> Option<&'a redis::Value> {
    use redis::Value;
    let is = |v: &Value| match v {
        Value::BulkString(b) => b == name.as_bytes(),
        Value::SimpleString(s) => s == name,
        _ => false,
    };
    match info {
        Value::Array(items) => items.chunks_exact(2).find(|kv| is(&kv[0])).map(|kv| &kv[1]),
        Value::Map(pairs) => pairs.iter().find(|(k, _)| is(k)).map(|(_, v)| v),
        _ => None,
    }
}

fn id_of(v: &redis::Value) -> Option<StreamId> {
    match v {
        redis::Value::BulkString(b) => StreamId::parse(std::str::from_utf8(b).ok()?),
        redis::Value::SimpleString(s) => StreamId::parse(s),
        _ => None,
    }
}

async fn sleep_or_stop(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.cancelled() => true,
    }
}

/// One entry of `{fleetban}:marks` as news for the limiter, unless it is
/// this host's (`own`) or not understood.
fn news_of(entry: &redis::streams::StreamId, own: &str) -> Option<FleetNews> {
    let field = |k: &str| entry.get::<String>(k);
    if field("host").as_deref() == Some(own) {
        return None;
    }
    match field("op")?.as_str() {
        "hot" => {
            let (marks, bad) = hot::decode(&field("marks")?);
            if bad > 0 {
                tracing::warn!(bad, "Hot-client marks with lines that do not parse; those skipped.");
            }
            Some(FleetNews::Hot(marks))
        }
        "join" => Some(FleetNews::Joined),
        _ => None,
    }
}

/// One stream entry as a change; entries whose address does not parse are
/// dropped with a warning (nothing unparsed reaches nft).
fn change_of(entry: &redis::streams::StreamId) -> Option<Change> {
    let field = |k: &str| entry.get::<String>(k);
    let op = field("op")?;
    let addr = field("addr")?;
    let Some(net) = crate::addr::parse_member(&addr) else {
        tracing::warn!(member = %crate::ratelog::cap(&addr).escape_debug(), "Ban event for something that is not an address; ignored.");
        return None;
    };
    match op.as_str() {
        "ban" => {
            let until = parse_until(&field("until")?)?;
            Some(Change::Add(vec![Element { net, until }]))
        }
        "unban" => Some(Change::Remove(vec![net])),
        _ => None,
    }
}
