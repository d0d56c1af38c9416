//! `fleetban check --online`: Redis and the firewall asked, not only the
//! files read. Redis: connected, PINGed, every command fleetban sends tried
//! by `store::probe` (each one the user may not run is named), and the
//! server's ZSET listpack threshold read for the window warning. The
//! firewall: `nft list tables` run (and whether the table is there yet);
//! the `log` backend runs nothing and says so. Each failure is a line here
//! and makes `check` exit 1.

use std::time::Duration;

use fleetban::config::{Config, RedisConfig};
use fleetban::store::{self, Keys};

use super::super::runtime;

/// How long `--online` waits for Redis (connection and probe) and nft.
const WAIT: Duration = Duration::from_secs(5);

/// A line per `notify:` target (its origin only: the path may be a
/// secret); with `send`, one test event POSTed to each and its answer.
/// Returns what failed.
pub fn notify(config: &Config, send: bool, out: &mut String) -> Vec<String> {
    let mut failures = Vec::new();
    for t in &config.notify {
        let origin = t.endpoint.origin();
        let mut what = vec![t.format.name().to_owned()];
        if t.secret_file.is_some() {
            what.push("signed".to_owned());
        }
        what.push(format!("events {}", t.events.join(", ")));
        if !t.rules.is_empty() {
            what.push(format!("rules {}", t.rules.join(", ")));
        }
        if t.min_duration_ms > 0 {
            what.push(format!("bans of {} or longer", super::duration(t.min_duration_ms)));
        }
        let what = what.join("; ");
        if !send {
            report!(
                out,
                "  notify: {origin} ({what}): nothing sent (--online --notify-test sends a test event)"
            );
            continue;
        }
        match runtime().block_on(fleetban::notify::send_test(t, &config.host_id)) {
            Ok(status) => report!(out, "  notify: {origin} ({what}): test event sent, HTTP {status}"),
            Err(e) => {
                report!(out, "  notify: {origin} ({what}): FAILED: {e}");
                failures.push(format!("notify {origin}: {e}"));
            }
        }
    }
    failures
}

/// Prints a line for Redis and one for the firewall; returns what failed.
pub fn contact(config: &Config, out: &mut String) -> Vec<String> {
    let rt = runtime();
    let mut failures = Vec::new();
    match &config.redis {
        None => report!(out, "  redis: none (single host, embedded store)"),
        Some(r) => match rt.block_on(async { tokio::time::timeout(WAIT, redis(r)).await }) {
            Ok(Ok(found)) => {
                report!(
                    out,
                    "  redis: {} (prefix {}): ok, answers PING; the user may run every command fleetban sends",
                    masked(&r.url),
                    r.prefix
                );
                for rule in &config.rules {
                    if let Some(w) = fleetban::limit::listpack_warning(&rule.limit, found) {
                        report!(out, "warning: {}: {}: {w}", rule.file.display(), rule.name);
                    }
                }
            }
            Ok(Err(e)) => {
                report!(out, "  redis: {}: FAILED: {e}", masked(&r.url));
                failures.push(format!("redis {}: {e}", masked(&r.url)));
            }
            Err(_) => {
                let e = format!("no answer within {}s", WAIT.as_secs());
                report!(out, "  redis: {}: FAILED: {e}", masked(&r.url));
                failures.push(format!("redis {}: {e}", masked(&r.url)));
            }
        },
    }
    let table = &config.firewall.table;
    let probed = config
        .firewall
        .enforcer(false)
        .map_err(|e| e.to_string())
        .and_then(|mut enforcer| {
            rt.block_on(async {
                match tokio::time::timeout(WAIT, enforcer.probe()).await {
                    Ok(r) => r.map_err(|e| e.to_string()),
                    Err(_) => Err(format!("nft did not answer within {}s", WAIT.as_secs())),
                }
            })
        });
    match probed {
        Ok(None) => report!(
            out,
            "  firewall: log backend (bans are logged, nft is never run): nothing to contact"
        ),
        Ok(Some(true)) => report!(
            out,
            "  firewall: nftables: ok, nft lists the tables; table inet {table} is there"
        ),
        Ok(Some(false)) => report!(
            out,
            "  firewall: nftables: ok, nft lists the tables; table inet {table} not there yet \
             (the daemon creates it)"
        ),
        Err(e) => {
            report!(out, "  firewall: nftables: FAILED: {e}");
            failures.push(format!("firewall: {e}"));
        }
    }
    failures
}

/// Connects, probes, reads the listpack threshold (Redis's default where
/// CONFIG is refused, as the daemon assumes).
async fn redis(r: &RedisConfig) -> Result<u64, String> {
    let mut con = store::connect(r, Some(r.timeout.max(Duration::from_secs(1))))
        .await
        .map_err(|e| format!("cannot connect: {e}"))?;
    let found = store::probe(&mut con, &Keys::new(&r.prefix))
        .await
        .map_err(|e| format!("no answer to PING: {e}"))?;
    if !found.denied.is_empty() {
        let mut e = format!(
            "the user may not run {} (config/redis-acl.conf lists what fleetban needs)",
            found.denied.join(", ")
        );
        if found.scripts_unchecked {
            e += "; the commands inside the scripts were not tried";
        }
        return Err(e);
    }
    Ok(store::listpack_threshold(&mut con)
        .await
        .unwrap_or(fleetban::limit::LISTPACK_DEFAULT))
}

/// `url` without its password (`redis://user:***@host`, `?pass=***`).
pub fn masked(url: &str) -> String {
    let mut out = url.to_owned();
    if let Some(scheme_end) = out.find("://") {
        let auth_start = scheme_end + 3;
        if let Some(at) = out[auth_start..].find('@').map(|i| auth_start + i) {
            if let Some(colon) = out[auth_start..at].find(':').map(|i| auth_start + i) {
                out.replace_range(colon + 1..at, "***");
            }
        }
    }
    if let Some(i) = out.find("pass=") {
        let end = out[i..].find('&').map_or(out.len(), |j| i + j);
        out.replace_range(i + 5..end, "***");
    }
    out
}
