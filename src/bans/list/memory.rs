//! The embedded ban list, for a host without Redis: a map saved to
//! `state_dir/bans.json`, with the rules `lua/ban.lua` keeps in Redis (the
//! later end wins unless replaced, offence counts, escalation).

use std::collections::HashMap;
use std::path::PathBuf;

use ipnet::IpNet;

use super::*;

/// The embedded ban list of a host without Redis.
#[derive(Default)]
pub struct MemoryBans {
    pub(super) bans: HashMap<IpNet, BanRecord>,
    /// Offence count and its expiry per address (escalation).
    offences: HashMap<IpNet, (u32, i64)>,
    /// The addresses each rule banned per network (`escalate_network:`).
    escalations: crate::bans::escalate::Tracker,
    file: Option<PathBuf>,
    /// The file could not be read as a list at start.
    pub(super) lost: bool,
    /// There was no file at start: this host kept no list of its own (new,
    /// or coming from Redis), and may take its kernel's set as its list.
    pub(super) absent: bool,
    /// The last save failed: retried (`BanList::retry_save`).
    pub(super) unsaved: bool,
    save_warn: crate::ratelog::Every,
}

impl MemoryBans {
    /// The list `file` holds. Records that do not parse are counted and
    /// skipped, the others kept and written back; a file that is not a list
    /// at all keeps none (`lost`: the kernel's set is then left as it is at
    /// start, its elements enforced until their own timeouts). Either way
    /// the file is set aside as `bans.json.corrupt`, loudly.
    pub(super) fn load(file: Option<PathBuf>) -> MemoryBans {
        let mut m = MemoryBans {
            file,
            ..MemoryBans::default()
        };
        let Some(path) = m.file.clone() else { return m };
        let bytes = match std::fs::read(&path) {
            Ok(b) => b,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                m.absent = true;
                return m;
            }
            Err(e) => {
                tracing::warn!(file = %path.display(), error = %e,
                    "Ban list file unreadable; starting with none, the kernel's set kept as it is.");
                m.lost = true;
                return m;
            }
        };
        let (records, bad) = match serde_json::from_slice::<Vec<serde_json::Value>>(&bytes) {
            Ok(values) => {
                let n = values.len();
                let good: Vec<BanRecord> = values
                    .into_iter()
                    .filter_map(|v| serde_json::from_value::<BanRecord>(v).ok())
                    .collect();
                let bad = n - good.len();
                (good, bad)
            }
            Err(e) => {
                m.lost = true;
                tracing::warn!(file = %path.display(), error = %e,
                    "Ban list file is not a list; no ban could be read from it, the kernel's set kept as it is.");
                (Vec::new(), 0)
            }
        };
        m.bans = records.into_iter().map(|r| (r.addr, r)).collect();
        if bad > 0 || m.lost {
            let aside = path.with_extension("json.corrupt");
            if bad > 0 {
                tracing::warn!(file = %path.display(), bad, kept = m.bans.len(), aside = %aside.display(),
                    "Ban records that do not parse; skipped, the others kept, the file set aside.");
            }
            if let Err(e) = std::fs::rename(&path, &aside) {
                tracing::warn!(error = %e, aside = %aside.display(), "Setting the ban list file aside failed.");
            } else if bad > 0 {
                if let Err(e) = m.save() {
                    tracing::warn!(error = %e, "Writing back the readable bans failed.");
                }
            }
        }
        m
    }

    fn save(&self) -> std::io::Result<()> {
        let Some(file) = &self.file else { return Ok(()) };
        let recs: Vec<&BanRecord> = self.bans.values().collect();
        let tmp = file.with_extension("tmp");
        let written = serde_json::to_vec(&recs)
            .map_err(std::io::Error::other)
            .and_then(|b| std::fs::write(&tmp, b))
            .and_then(|()| std::fs::rename(&tmp, file));
        if written.is_err() {
            // No half-written bans.tmp left behind (a full disk).
            let _ = std::fs::remove_file(&tmp);
        }
        written
    }

    /// Saves the list; a failure keeps it in memory (it is enforced all the
    /// same), is retried every second (`BanList::retry_save`) and warned
    /// about at most once a minute.
    pub(super) fn persist(&mut self) {
        match self.save() {
            Ok(()) if self.unsaved => {
                self.unsaved = false;
                tracing::info!("Ban list saved again.");
            }
            Ok(()) => {}
            Err(e) => {
                self.unsaved = true;
                if let Some(n) = self.save_warn.note(1, std::time::Duration::from_secs(60)) {
                    tracing::warn!(error = %e, failures = n, file = %self.file.as_deref().map(|p| p.display().to_string()).unwrap_or_default(),
                        "Saving the ban list failed; the bans stay enforced, saving is retried every second (at most one warning a minute).");
                }
            }
        }
    }

    /// Takes `elems` (what the firewall kept) as bans of `host`, for those
    /// addresses it has no ban of; saved. How many it took.
    pub(super) fn adopt(&mut self, elems: &[crate::enforce::Element], host: &str, now_ms: i64) -> usize {
        let mut n = 0;
        for e in elems.iter().filter(|e| e.until > Until::At(now_ms)) {
            if self.bans.contains_key(&e.net) {
                continue;
            }
            self.bans.insert(
                e.net,
                BanRecord {
                    addr: e.net,
                    rule: String::new(),
                    reason: "kept from the firewall's set at start (no bans.json)".into(),
                    host: host.to_owned(),
                    since: now_ms,
                    until: until_ms(e.until),
                    count: 1,
                    hits: 0,
                },
            );
            n += 1;
        }
        if n > 0 {
            self.persist();
        }
        n
    }

    pub(super) fn active(&self, now_ms: i64) -> impl Iterator<Item = &BanRecord> {
        self.bans.values().filter(move |r| r.until.is_none_or(|t| t > now_ms))
    }

    /// [`MemoryBans::ban`], and the network ban it triggered (same rules
    /// as ban.lua's `escalate_network` step).
    pub fn ban_escalating(&mut self, req: &BanRequest, now_ms: i64) -> (Outcome, Option<BanRecord>) {
        let out = self.ban(req, now_ms);
        let Mode::Auto(policy) = req.mode else {
            return (out, None);
        };
        let Outcome::Banned(_) = out else { return (out, None) };
        let Some((e, net)) = policy
            .network
            .and_then(|e| crate::bans::escalate::network_of(&req.addr, &e).map(|n| (e, n)))
        else {
            return (out, None);
        };
        let n = self.escalations.note(&req.rule, net, req.addr, now_ms, e.within_ms);
        // `ban` dropped the expired entries: any left is active.
        if n < e.bans || self.bans.contains_key(&net) {
            return (out, None);
        }
        let rec = crate::bans::escalate::record(req, &e, net, now_ms, now_ms + e.duration_ms);
        self.bans.insert(net, rec.clone());
        (out, Some(rec))
    }

    /// Same rules as ban.lua.
    pub fn ban(&mut self, req: &BanRequest, now_ms: i64) -> Outcome {
        self.bans.retain(|_, r| r.until.is_none_or(|t| t > now_ms));
        if let (Mode::Auto(_), Some(cur)) = (req.mode, self.bans.get(&req.addr)) {
            return Outcome::AlreadyBanned(cur.until());
        }
        if let Some(cur) = self.bans.get_mut(&req.addr) {
            // An operator's ban of an active one: never shorter unless replaced.
            let was = cur.until();
            let asked = match req.mode {
                Mode::For { ms, .. } => Until::At(now_ms + ms),
                _ => Until::Permanent,
            };
            let reason = if req.reason.is_empty() {
                cur.reason.clone()
            } else {
                req.reason.clone()
            };
            let effect = if req.mode.replaces() {
                *cur = BanRecord {
                    reason,
                    ..req.record(now_ms, until_ms(asked), cur.count)
                };
                Effect::Replaced
            } else if asked <= was {
                cur.reason = reason;
                Effect::Kept
            } else {
                cur.reason = reason;
                cur.until = until_ms(asked);
                Effect::Extended
            };
            return Outcome::Changed {
                rec: cur.clone(),
                effect,
                was,
            };
        }
        let (count, until) = match req.mode {
            Mode::Auto(p) => {
                let e = self.offences.entry(req.addr).or_insert((0, 0));
                if e.1 <= now_ms {
                    *e = (0, 0);
                }
                e.0 += 1;
                e.1 = now_ms + p.forget_after_ms;
                let d = p.duration_ms as f64 * p.factor.powi(e.0 as i32 - 1);
                let d = if d > p.max_ms as f64 { p.max_ms } else { d as i64 };
                (e.0, Some(now_ms + d))
            }
            Mode::For { ms, .. } => (1, Some(now_ms + ms)),
            Mode::Permanent { .. } => (1, None),
        };
        let rec = req.record(now_ms, until, count);
        self.bans.insert(req.addr, rec.clone());
        Outcome::Banned(rec)
    }
}
