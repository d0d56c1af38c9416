//! The ban list: one entry per address or network, each with its own expiry
//! (docs/design.md §3). In Redis for a fleet, where `lua/ban.lua` writes the list,
//! the record, the offence count and the event in one atomic call; embedded
//! (a map saved under `state_dir`) for a single host, with the same rules.

use std::path::PathBuf;

use ipnet::IpNet;

use super::{BanRecord, BanRequest, Effect, Mode, Outcome};
use crate::addr::AddrText;
use crate::enforce::Until;
use crate::store::{Keys, BAN, RESTORE, STREAM_MAXLEN, UNBAN};

mod memory;
mod query;
mod read;
mod record;
pub use memory::MemoryBans;
pub use query::Span;
pub use read::Cursor;
pub(crate) use read::PAGE;
pub use record::{decode_record, Names, RecordFields};

#[derive(Debug, thiserror::Error)]
pub enum BanListError {
    #[error("redis: {0}")]
    Redis(#[from] redis::RedisError),
    #[error("unexpected reply from ban.lua: {0}")]
    Reply(String),
    #[error("saving the ban list: {0}")]
    Io(#[from] std::io::Error),
    #[error("Redis is down (tried again after a backoff)")]
    Down,
}

impl BanListError {
    /// Redis could not be used (`store::is_outage`), as opposed to Redis,
    /// the reply or the embedded file failing this one call.
    pub fn is_outage(&self) -> bool {
        match self {
            BanListError::Redis(e) => crate::store::is_outage(e),
            BanListError::Down => true,
            BanListError::Reply(_) | BanListError::Io(_) => false,
        }
    }

    /// Redis refused the write for its `maxmemory`.
    pub fn is_oom(&self) -> bool {
        matches!(self, BanListError::Redis(e) if crate::store::is_oom(e))
    }
}

pub enum BanList {
    Redis { con: crate::store::Conn, keys: Keys },
    Memory(MemoryBans),
}

impl BanList {
    pub fn redis(con: crate::store::Conn, keys: Keys) -> BanList {
        BanList::Redis { con, keys }
    }

    /// The fleet's list in the Redis `r` names, connected now (an operator's
    /// command: it fails rather than waits), with at least 2 s per command.
    pub async fn connect(r: &crate::config::RedisConfig) -> Result<BanList, redis::RedisError> {
        let con = crate::store::connect(r, Some(r.timeout.max(std::time::Duration::from_secs(2)))).await?;
        Ok(BanList::redis(con, Keys::new(&r.prefix)))
    }

    /// Embedded list; `file` (under `state_dir`) keeps it across restarts.
    pub fn memory(file: Option<PathBuf>) -> BanList {
        BanList::Memory(MemoryBans::load(file))
    }

    /// The embedded list's file could not be read as a list at start: the
    /// kernel's set must not be replaced by the (empty) list.
    pub fn lost_at_start(&self) -> bool {
        matches!(self, BanList::Memory(m) if m.lost)
    }

    /// The embedded list had no file at start (see [`MemoryBans`]).
    pub fn absent_at_start(&self) -> bool {
        matches!(self, BanList::Memory(m) if m.absent)
    }

    /// The embedded list takes `elems` (the firewall's set at start) as
    /// bans of `host` where it has none; Redis takes nothing here.
    pub fn adopt(&mut self, elems: &[crate::enforce::Element], host: &str, now_ms: i64) -> usize {
        match self {
            BanList::Memory(m) => m.adopt(elems, host, now_ms),
            BanList::Redis { .. } => 0,
        }
    }

    /// Writes a ban (or finds the one already active) at `now_ms`.
    pub async fn ban(&mut self, req: &BanRequest, now_ms: i64) -> Result<Outcome, BanListError> {
        Ok(self.ban_escalating(req, now_ms).await?.0)
    }

    /// [`BanList::ban`], and the ban of the address's network that it
    /// triggered in the same step, if any (`escalate_network:`,
    /// `bans::escalate`).
    pub async fn ban_escalating(
        &mut self,
        req: &BanRequest,
        now_ms: i64,
    ) -> Result<(Outcome, Option<BanRecord>), BanListError> {
        match self {
            BanList::Memory(m) => {
                let out = m.ban_escalating(req, now_ms);
                m.persist();
                Ok(out)
            }
            BanList::Redis { con, keys } => {
                let esc = match req.mode {
                    Mode::Auto(p) => p
                        .network
                        .and_then(|e| super::escalate::network_of(&req.addr, &e).map(|n| (e, n))),
                    _ => None,
                };
                let (duration, factor, max, forget, mode) = match req.mode {
                    Mode::Auto(p) => (p.duration_ms, p.factor, p.max_ms, p.forget_after_ms, "auto"),
                    Mode::For { ms, .. } => (ms, 1.0, ms, 1, "set"),
                    Mode::Permanent { .. } => (0, 1.0, 0, 1, "perm"),
                };
                let addr = AddrText(&req.addr).to_string();
                // The escalation's key only with an escalation: no key
                // outside the list's slot (Cluster).
                let mut names = vec![keys.bans(), keys.records(), keys.events(), keys.offences(&req.addr)];
                names.extend(esc.map(|(_, n)| keys.escalation(&req.rule, &n)));
                let names: Vec<&str> = names.iter().map(String::as_str).collect();
                let mut cmd = BAN.cmd(&names);
                cmd.arg(&addr)
                    .arg(now_ms)
                    .arg(duration)
                    .arg(factor)
                    .arg(max)
                    .arg(forget.max(1))
                    .arg(&req.rule)
                    .arg(&req.reason)
                    .arg(&req.host)
                    .arg(req.hits)
                    .arg(mode)
                    .arg(STREAM_MAXLEN)
                    .arg(if req.mode.replaces() { "1" } else { "0" });
                match esc {
                    Some((e, n)) => cmd
                        .arg(AddrText(&n).to_string())
                        .arg(e.bans)
                        .arg(e.within_ms)
                        .arg(e.duration_ms)
                        .arg(super::escalate::reason(&e, &n, &req.rule)),
                    None => cmd.arg("").arg(0).arg(0).arg(0).arg(""),
                };
                let (code, until, count, effect, was, net_until): (i64, String, i64, String, String, String) =
                    BAN.run(con, &cmd).await?;
                let until = parse_until(&until).ok_or_else(|| BanListError::Reply(until.clone()))?;
                let count = u32::try_from(count).unwrap_or(1);
                let network = match (esc, net_until.as_str()) {
                    (Some((e, n)), t) if !t.is_empty() => {
                        let Some(Until::At(t)) = parse_until(t) else {
                            return Err(BanListError::Reply(net_until));
                        };
                        Some(super::escalate::record(req, &e, n, now_ms, t))
                    }
                    _ => None,
                };
                match code {
                    1 => Ok((Outcome::Banned(req.record(now_ms, until_ms(until), count)), network)),
                    0 => Ok((Outcome::AlreadyBanned(until), None)),
                    _ => {
                        let effect = Effect::parse(&effect).ok_or_else(|| BanListError::Reply(effect.clone()))?;
                        let was = parse_until(&was).ok_or_else(|| BanListError::Reply(was.clone()))?;
                        // The record as ban.lua wrote it (rule, host, start kept).
                        let fields = record::read_records(con, keys, &[req.addr]).await?.pop().flatten();
                        let rec = match fields {
                            Some(f) => RecordFields::into_record(Some(f), req.addr, until),
                            None => req.record(now_ms, until_ms(until), count),
                        };
                        Ok((Outcome::Changed { rec, effect, was }, None))
                    }
                }
            }
        }
    }

    /// The embedded list's last save failed: tries again (each second,
    /// from the pipeline).
    pub fn retry_save(&mut self) {
        if let BanList::Memory(m) = self {
            if m.unsaved {
                m.persist();
            }
        }
    }

    /// Whether the list answers (Redis: `PING`; embedded: always).
    pub async fn ping(&mut self) -> Result<(), BanListError> {
        match self {
            BanList::Memory(_) => Ok(()),
            BanList::Redis { con, .. } => {
                let _: String = redis::cmd("PING").query_async(con).await?;
                Ok(())
            }
        }
    }

    /// Removes a ban; true if there was one.
    pub async fn unban(&mut self, addr: &IpNet, host: &str) -> Result<bool, BanListError> {
        match self {
            BanList::Memory(m) => {
                let was = m.bans.remove(addr).is_some();
                m.persist();
                Ok(was)
            }
            BanList::Redis { con, keys } => {
                let mut cmd = UNBAN.cmd(&[&keys.bans(), &keys.records(), &keys.events()]);
                cmd.arg(AddrText(addr).to_string()).arg(host).arg(STREAM_MAXLEN);
                // A member written `::ffff:a.b.c.d` that no reconcile has
                // rewritten yet (`canonicalize`).
                if let IpNet::V4(v4) = addr {
                    if v4.prefix_len() == 32 {
                        cmd.arg(format!("::ffff:{}", v4.addr()));
                    }
                }
                let n: i64 = UNBAN.run(con, &cmd).await?;
                Ok(n > 0)
            }
        }
    }

    /// The fleet's epoch (`Keys::epoch`), set to `token` first if it has
    /// none (a fleet's first reconcile, or a list that lost its data).
    /// None for the embedded list.
    pub async fn epoch(&mut self, token: &str) -> Result<Option<String>, BanListError> {
        match self {
            BanList::Memory(_) => Ok(None),
            BanList::Redis { con, keys } => {
                let (_, epoch): (redis::Value, Option<String>) = redis::pipe()
                    .cmd("SET")
                    .arg(keys.epoch())
                    .arg(token)
                    .arg("NX")
                    .cmd("GET")
                    .arg(keys.epoch())
                    .query_async(con)
                    .await?;
                Ok(epoch)
            }
        }
    }

    /// The records of `addrs` as JSON text, the form `restore` takes (None
    /// where there is none or it is damaged).
    pub async fn raw_records(&mut self, addrs: &[IpNet]) -> Result<Vec<Option<String>>, BanListError> {
        let BanList::Redis { con, keys } = self else {
            return Ok(vec![None; addrs.len()]);
        };
        let recs = record::read_records(con, keys, addrs).await?;
        Ok(recs.into_iter().map(|r| r.map(|f| f.to_json())).collect())
    }

    /// Writes back `bans` (network, end, record as `ban.lua` wrote it) that
    /// this host still enforces after Redis lost the list (`lua/restore.lua`:
    /// the later end wins, so hosts restoring at once agree). A ban without
    /// its record gets one naming `host` and why. How many entries were
    /// added or given a later end.
    pub async fn restore(
        &mut self,
        bans: &[(IpNet, Until, Option<String>)],
        host: &str,
        now_ms: i64,
    ) -> Result<u64, BanListError> {
        let BanList::Redis { con, keys } = self else {
            return Ok(0);
        };
        let mut n = 0;
        for some in bans.chunks(256) {
            let mut cmd = RESTORE.cmd(&[&keys.bans(), &keys.records(), &keys.events()]);
            cmd.arg(host).arg(STREAM_MAXLEN);
            for (net, until, rec) in some {
                let parsed = rec
                    .as_deref()
                    .and_then(|r| serde_json::from_str::<RecordFields>(r).ok());
                let rec = match (&parsed, rec) {
                    (Some(_), Some(r)) => r.clone(),
                    _ => serde_json::json!({
                        "rule": "", "reason": "restored after Redis lost the ban list", "host": host,
                        "since": now_ms, "until": match until { Until::At(t) => Some(*t), Until::Permanent => None },
                        "count": 1, "hits": 0,
                    })
                    .to_string(),
                };
                let until = match until {
                    Until::At(t) => t.to_string(),
                    Until::Permanent => "inf".to_owned(),
                };
                cmd.arg(AddrText(net).to_string())
                    .arg(until)
                    .arg(parsed.map(|p| p.rule).unwrap_or_default())
                    .arg(rec);
            }
            let added: i64 = RESTORE.run(con, &cmd).await?;
            n += u64::try_from(added).unwrap_or(0);
        }
        Ok(n)
    }

    /// With Sentinel: moves the list's connection (the limiter's and the
    /// bans' too: they share it) to the master the sentinels name now, if
    /// it is on another one (`Conn::follow_master`). True if it moved; a
    /// sentinel that does not answer moves nothing.
    pub async fn follow_master(&mut self) -> bool {
        match self {
            BanList::Redis { con, .. } => con.follow_master().await.unwrap_or_else(|e| {
                tracing::debug!(error = %e, "Asking the sentinels for the master failed.");
                false
            }),
            BanList::Memory(_) => false,
        }
    }

    /// Makes `host` one of the hosts whose `scope: host` windows an unban
    /// deletes (`Keys::hosts`); the fleet sync calls it at every reconcile,
    /// so a Redis that lost its data learns it again. Whether `host` was
    /// new, and how many hosts are registered (the embedded list: one).
    pub async fn register_host(&mut self, host: &str) -> Result<(bool, u32), BanListError> {
        match self {
            BanList::Memory(_) => Ok((false, 1)),
            BanList::Redis { con, keys } => {
                let (added, hosts): (i64, i64) = redis::pipe()
                    .cmd("SADD")
                    .arg(keys.hosts())
                    .arg(host)
                    .cmd("SCARD")
                    .arg(keys.hosts())
                    .query_async(con)
                    .await?;
                Ok((added > 0, u32::try_from(hosts).unwrap_or(u32::MAX)))
            }
        }
    }

    /// Deletes the state of `addr` under `rules` (name, window ms), every
    /// algorithm's, in the fleet's scope and in the `scope: host` scope of
    /// every registered host and of `host` (`Keys::of_address`: one hash
    /// tag, so one slot), so its next request on any host starts fresh
    /// windows instead of banning it again at once. Nothing to do for the
    /// embedded list: the daemon's limiter forgets on the unban itself.
    pub async fn forget_windows(
        &mut self,
        addr: &IpNet,
        rules: &[(&str, i64)],
        host: &str,
        now_ms: i64,
    ) -> Result<(), BanListError> {
        match self {
            BanList::Memory(_) => Ok(()),
            BanList::Redis { con, keys } => {
                if rules.is_empty() {
                    return Ok(());
                }
                let registered: Vec<String> = redis::cmd("SMEMBERS").arg(keys.hosts()).query_async(con).await?;
                let mut hosts: Vec<&str> = registered.iter().map(String::as_str).collect();
                if !hosts.contains(&host) {
                    hosts.push(host);
                }
                let kinds = crate::limit::algorithm::state_keys();
                let window_keys = keys.of_address(addr, rules.iter().copied(), &hosts, now_ms, &kinds);
                // Bounded commands however large the fleet.
                for some in window_keys.chunks(1024) {
                    let _: i64 = redis::cmd("DEL").arg(some).query_async(con).await?;
                }
                Ok(())
            }
        }
    }

    /// The active entries: (network, expiry). Members that are not an
    /// address or network are skipped with a warning, never returned.
    pub async fn active(&mut self, now_ms: i64) -> Result<Vec<(IpNet, Until)>, BanListError> {
        let mut cursor = Cursor::new(now_ms, PAGE);
        let mut out = Vec::new();
        while let Some(page) = self.entries_page(&mut cursor).await? {
            out.extend(page);
        }
        Ok(out)
    }

    /// The next page of active entries, or None after the last (the
    /// embedded list is one page): a reader that works between pages (the
    /// fleet's full read follows the events meanwhile). Members in another
    /// spelling are rewritten as the page is read; a page that times out
    /// is asked again, [`read::PAGE_TRIES`] times in all.
    pub async fn entries_page(&mut self, cursor: &mut Cursor) -> Result<Option<Vec<(IpNet, Until)>>, BanListError> {
        match self {
            BanList::Memory(m) => {
                if cursor.finish() {
                    return Ok(None);
                }
                Ok(Some(m.active(cursor.now_ms()).map(|r| (r.addr, r.until())).collect()))
            }
            BanList::Redis { con, keys } => {
                let mut timeouts = 0;
                let (entries, respelled) = loop {
                    match cursor.next(con, keys).await {
                        Ok(Some(page)) => break page,
                        Ok(None) => return Ok(None),
                        // The cursor stays where it was: the same page again.
                        Err(BanListError::Redis(e)) if e.is_timeout() && timeouts + 1 < read::PAGE_TRIES => {
                            timeouts += 1
                        }
                        Err(e) => return Err(e),
                    }
                };
                if !respelled.is_empty() {
                    read::canonicalize(con, keys, &respelled).await?;
                }
                Ok(Some(entries))
            }
        }
    }
}

/// The active bans an embedded list saved in `file`, read as the embedded
/// store reads it (records that do not parse skipped); None without the
/// file. A host joining Redis writes them to the fleet's list.
pub fn embedded_bans(file: &std::path::Path, now_ms: i64) -> Option<Vec<BanRecord>> {
    let m = MemoryBans::load(Some(file.to_owned()));
    (!m.absent).then(|| m.active(now_ms).cloned().collect())
}

/// A ban's end as a record holds it (None: permanent).
pub fn until_ms(u: Until) -> Option<i64> {
    match u {
        Until::At(t) => Some(t),
        Until::Permanent => None,
    }
}

/// `inf` or an integer number of ms, as ban.lua and the list store them.
pub fn parse_until(s: &str) -> Option<Until> {
    match s {
        "inf" | "+inf" => Some(Until::Permanent),
        _ => s
            .parse::<f64>()
            .ok()
            .filter(|f| f.is_finite())
            .map(|f| Until::At(f as i64)),
    }
}
