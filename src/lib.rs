//! fleetban: a log-tailing ban daemon for a fleet of nginx hosts.
//!
//! # Layout
//! The modules follow the data flow, bytes to firewall, each importing only
//! from those below it (ARCHITECTURE.md; the contract is docs/design.md):
//! - `addr`: addresses as text, the gate for values read back, client keys.
//! - `source`: follows log files (tail -F), yields chunks of whole lines with offsets.
//! - `parse`: one line to a [`parse::Request`] (nginx combined/common, log_format, regex).
//! - `verdict`: who is never banned, what a ban covers and what is enforced
//!   for an address: decided once, read by nft, `/check`, `explain` and `test`.
//! - `enforce`: nftables (or a log, for dry runs); the only module that runs nft.
//! - `ratelog`: one warning per period for what repeats ([`ratelog::Every`]).
//! - `sorted`: what the compact tables of long ban lists share (sorted vectors,
//!   removals marked in a bitset, the merge that rebuilds them).
//! - `config`: the YAML files, validated, with file:line:column errors.
//! - `detect`: the per-line loop: which requests are hits, for which rule and client.
//! - `store`: the Redis connection and its health, key names, the Lua scripts.
//! - `limit`: the limiter: pending hits, the windows in Redis (`lua/`) or in
//!   memory with the same semantics, the fallback while Redis is down.
//! - `notify`: webhook targets told of bans and outages, never in the way of banning.
//! - `bans`: the one owner of ban application: ban list (Redis or embedded),
//!   escalation, safety valve, the queue while Redis is down, this host's view.
//! - `fleet`: follows the fleet's ban events and reconciles the local set with the list.
//! - `control`: the control socket's protocol, client and server.
//! - `http`: the decision endpoint nginx's `auth_request` asks (`GET /check`),
//!   answered from an in-memory view of the list kept by the enforcer's changes.
//! - `replay`: `fleetban test`, the offline replay with log time.
//! - `daemon`: `fleetban run`: start, tasks, pipeline, reload, shutdown.
//!
//! The command line (`src/main.rs`, `src/commands/`) is the binary's.

pub mod addr;
pub mod bans;
pub mod blocklist;
pub mod config;
pub mod control;
pub mod daemon;
pub mod detect;
pub mod enforce;
pub mod fleet;
pub mod http;
pub mod limit;
pub mod notify;
pub mod parse;
pub mod ratelog;
pub mod replay;
mod sorted;
pub mod source;
pub mod store;
pub mod verdict;

/// A duration as fleetban writes it everywhere (`check`, reasons, logs):
/// in the largest unit that divides it (`90s`, `1500ms`, `1d`), never
/// rounded.
pub fn duration_text(ms: i64) -> String {
    const UNITS: [(i64, &str); 4] = [(86_400_000, "d"), (3_600_000, "h"), (60_000, "m"), (1_000, "s")];
    UNITS
        .iter()
        .find(|(u, _)| ms != 0 && ms % u == 0)
        .map_or(format!("{ms}ms"), |(u, name)| format!("{}{name}", ms / u))
}

/// How long something took, for the logs: `took=0.42ms`, `took=310ms`,
/// `took=2.5s` (never `3.034e-6`).
pub fn took(d: std::time::Duration) -> String {
    let ms = d.as_secs_f64() * 1000.0;
    match ms {
        ms if ms < 10.0 => format!("{ms:.2}ms"),
        ms if ms < 1000.0 => format!("{ms:.0}ms"),
        ms => format!("{:.1}s", ms / 1000.0),
    }
}

/// `f`, off the runtime's workers when it has several (ms of CPU at
/// start, the plans and views of a long list, while the fleet's read of
/// that list runs on them); in place on a one-thread runtime.
pub(crate) fn off_workers<T>(f: impl FnOnce() -> T) -> T {
    match tokio::runtime::Handle::try_current().map(|h| h.runtime_flavor()) {
        Ok(tokio::runtime::RuntimeFlavor::MultiThread) => tokio::task::block_in_place(f),
        _ => f(),
    }
}

/// Wall-clock time in unix milliseconds.
pub fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
}

/// Unix ms as a UTC civil date and time: (year, month 1-12, day 1-31, hour, minute, second).
pub fn civil(ms: i64) -> (i64, u32, u32, u32, u32, u32) {
    let secs = ms.div_euclid(1000);
    let (days, rem) = (secs.div_euclid(86_400), secs.rem_euclid(86_400));
    // Howard Hinnant's civil_from_days.
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    let y = yoe + era * 400 + i64::from(m <= 2);
    (
        y,
        m,
        d,
        (rem / 3600) as u32,
        (rem % 3600 / 60) as u32,
        (rem % 60) as u32,
    )
}

/// Unix ms as RFC 3339 UTC with second precision: `2015-05-17T10:05:03Z`.
pub fn rfc3339(ms: i64) -> String {
    let (y, m, d, h, mi, s) = civil(ms);
    format!("{y:04}-{m:02}-{d:02}T{h:02}:{mi:02}:{s:02}Z")
}

/// Unix ms as nginx writes `$time_local` in UTC: `17/May/2015:10:05:03 +0000`.
pub fn time_local(ms: i64) -> String {
    const MON: [&str; 12] = [
        "Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec",
    ];
    let (y, m, d, h, mi, s) = civil(ms);
    format!("{d:02}/{}/{y}:{h:02}:{mi:02}:{s:02} +0000", MON[(m - 1) as usize])
}

#[cfg(test)]
mod tests {
    #[test]
    fn rfc3339() {
        assert_eq!(super::rfc3339(1_431_857_103_000), "2015-05-17T10:05:03Z");
        assert_eq!(super::rfc3339(0), "1970-01-01T00:00:00Z");
        assert_eq!(super::rfc3339(951_782_400_000), "2000-02-29T00:00:00Z");
        assert_eq!(super::time_local(1_431_857_103_000), "17/May/2015:10:05:03 +0000");
    }
}
