//! The fleet's side of each host's log: a ban this host applies from
//! another's decision (another host's rule, or an operator's `fleetban
//! ban` written straight to Redis) gets its `Banned.` line here, naming
//! who decided; an unban that lifts a ban this host held gets its
//! `Unbanned.` line, naming the host whose configuration the operator used.
//! This host's own rule bans are logged where they are decided
//! (`bans::Bans`), so they are not told twice. Beyond a few lines a second
//! the rest of that second is one summary line.

use std::time::Duration;

use crate::addr::AddrText;
use crate::bans::until_text;
use crate::enforce::Change;
use crate::ratelog::Burst;

use super::Remembered;

/// Lines a second before the rest is summed up.
const LINES_PER_SECOND: u32 = 5;

pub struct Story {
    /// The `Banned.`/`Unbanned.` lines let through, and what is held back.
    burst: Burst,
}

impl Default for Story {
    fn default() -> Story {
        Story {
            burst: Burst::new(LINES_PER_SECOND, Duration::from_secs(1)),
        }
    }
}

impl Story {
    /// One event of `{fleetban}:events` (`change`, read from `entry`),
    /// before `known` (the list as this host knew it) takes it.
    pub fn event(&mut self, entry: &redis::streams::StreamId, change: &Change, own: &str, known: &Remembered) {
        let field = |k: &str| entry.get::<String>(k).unwrap_or_default();
        let (rule, host) = (field("rule"), field("host"));
        let by = match rule.as_str() {
            "manual" => "operator",
            "" => "a host writing back a lost list",
            _ => "rule",
        };
        match change {
            Change::Add(elems) => {
                for e in elems {
                    // Logged where it was decided; or nothing new here.
                    if (host == own && by == "rule") || known.holds(e) {
                        continue;
                    }
                    if self.burst.admit(&format!("{rule}@{host}")) {
                        tracing::info!(rule = %rule, addr = %AddrText(&e.net), until = %until_text(e.until),
                            host = %host, decided_by = %by, "Banned.");
                    }
                }
            }
            Change::Remove(nets) => {
                for n in nets.iter().filter(|n| known.has(n)) {
                    if self.burst.admit(&format!("unban@{host}")) {
                        tracing::info!(addr = %AddrText(n), host = %host, decided_by = %"operator", "Unbanned.");
                    }
                }
            }
            Change::Replace(_) => {}
        }
    }

    /// The summary of what a busy second held back, once it is over
    /// (called after every read of the stream: at least once a second).
    pub fn flush(&mut self) {
        if let Some((count, by)) = self.burst.summary() {
            tracing::info!(count, by = %by,
                "More bans and unbans applied from the fleet than 5 a second; summed up (by RULE@HOST: count).");
        }
    }
}
