//! The operators' side of [`Bans`]: a ban that never shortens an active
//! one unless it replaces it, an unban, and both while Redis is down
//! (enforced or lifted here at once, queued for Redis in order with the
//! rule bans decided meanwhile); the wider bans that still cover an
//! address. A child of `apply.rs`: the same owner, its own file.

use ipnet::IpNet;

use super::Bans;
use crate::addr::AddrText;
use crate::bans::{Applied, BanList, BanListError, BanRequest, Effect, Mode, Outcome};
use crate::enforce::{Change, Element, Until};
use std::sync::atomic::Ordering::Relaxed;

/// What came of an unban.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Unbanned {
    /// The address had a ban of its own (here, when queued).
    pub removed: bool,
    /// Redis was down: lifted here, written to the list when it answers.
    pub queued: bool,
}

impl Bans {
    /// Redis is known down and not due for another try: no timeout paid.
    pub(super) fn known_down(&self) -> bool {
        self.queue
            .as_ref()
            .is_some_and(|q| q.health.is_down() && !q.health.due())
    }

    /// Notes an outage the list met (its error) in the shared health.
    fn outage(&self, e: &BanListError) {
        if let (Some(q), false) = (&self.queue, matches!(e, BanListError::Down)) {
            q.health.count_error();
            q.health.failed();
        }
    }

    /// An operator's ban (see [`Bans::ban`]).
    pub(super) async fn manual(&mut self, req: BanRequest, at_ms: i64, now_ms: i64) -> Result<Applied, BanListError> {
        let outcome = match self.known_down() {
            true => Err(BanListError::Down),
            false => self.list.ban(&req, now_ms).await,
        };
        match outcome {
            Ok(Outcome::Banned(rec)) => Ok(self.banned(rec, at_ms, now_ms)),
            Ok(Outcome::AlreadyBanned(u)) => Ok(Applied::Already(u)),
            Ok(Outcome::Changed { rec, effect, was }) => {
                if effect != Effect::Kept {
                    tracing::info!(addr = %AddrText(&rec.addr), effect = effect.name(),
                        was = %crate::bans::until_text(was), until = %crate::bans::until_text(rec.until()),
                        reason = %rec.reason, "Ban changed.");
                    self.enforce(rec.addr, rec.until());
                }
                Ok(Applied::Changed { rec, effect, was })
            }
            Err(e) if e.is_outage() && self.queue.is_some() => {
                self.outage(&e);
                // Enforced here at once, never shorter than what this host
                // enforces already (unless replaced), and queued.
                let asked = match req.mode {
                    Mode::For { ms, .. } => Until::At(now_ms + ms),
                    _ => Until::Permanent,
                };
                let until = match self.cache.read().get(&req.addr) {
                    Some(cur) if cur > asked && !req.mode.replaces() => cur,
                    _ => asked,
                };
                let Some(q) = &mut self.queue else { return Err(e) };
                if !q.push(req.clone(), now_ms, until) {
                    self.counters.dropped.fetch_add(1, Relaxed);
                    return Err(e);
                }
                self.counters.queued.store(q.len() as u64, Relaxed);
                self.counters.bans.fetch_add(1, Relaxed);
                let rec = req.record(now_ms, crate::bans::list::until_ms(until), 1);
                self.log_banned(&rec, at_ms, now_ms, Some("Redis down; queued"));
                self.enforce(rec.addr, until);
                Ok(Applied::Local(Element { net: rec.addr, until }))
            }
            Err(e) => Err(e),
        }
    }

    /// Lifts the ban of `net`. With Redis, its state under `rules` (name,
    /// window ms) is deleted first: once the unban event is out, a host
    /// counting the next request must find it empty. With Redis down (and
    /// a queue: the daemon), it is lifted here at once and queued, in
    /// order with the bans queued before it.
    pub async fn unban(&mut self, net: &IpNet, rules: &[(&str, i64)]) -> Result<Unbanned, BanListError> {
        let now = crate::now_ms();
        let written = match self.known_down() {
            true => Err(BanListError::Down),
            false => match self.list.forget_windows(net, rules, &self.host, now).await {
                Ok(()) => self.list.unban(net, &self.host).await,
                Err(e) => Err(e),
            },
        };
        let unbanned = match written {
            Ok(removed) => {
                // With Redis, every host tells it from the unban's event.
                if removed && !self.uses_redis() {
                    tracing::info!(addr = %AddrText(net), host = %self.host, decided_by = %"operator", "Unbanned.");
                }
                Unbanned { removed, queued: false }
            }
            Err(e) if e.is_outage() && self.queue.is_some() => {
                self.outage(&e);
                let removed = self.cache.read().get(net).is_some();
                let rules = rules.iter().map(|(n, w)| ((*n).to_owned(), *w)).collect();
                let Some(q) = &mut self.queue else { return Err(e) };
                if !q.push_unban(*net, rules) {
                    return Err(e);
                }
                self.counters.queued.store(q.len() as u64, Relaxed);
                tracing::info!(addr = %AddrText(net), "Unbanned here; Redis down, the unban is queued.");
                Unbanned { removed, queued: true }
            }
            Err(e) => return Err(e),
        };
        self.cache.write().remove(net);
        self.publish_active();
        self.changes.send(Change::Remove(vec![*net]));
        if unbanned.removed {
            self.notifier.send(crate::notify::Event::Unban {
                addr: *net,
                host: self.host.clone(),
                at_ms: now,
            });
        }
        Ok(unbanned)
    }

    /// The bans of wider networks that still cover `net` here, by this
    /// host's view of the list.
    pub fn wider(&self, net: &IpNet) -> Vec<(IpNet, Until)> {
        self.cache.read().wider(net)
    }

    /// Whether the list is the fleet's, in Redis.
    pub fn uses_redis(&self) -> bool {
        matches!(self.list, BanList::Redis { .. })
    }
}
