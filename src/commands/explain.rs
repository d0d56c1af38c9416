//! `fleetban explain ADDR`: why an address is or is not banned. Its own
//! ban (rule, host, reason, since, until, time left, offence count), the
//! wider bans covering it, its count in each rule's window against the
//! limit, and whether loopback, `allow:`, `proxies:` or the host's own
//! addresses keep it from ever being banned. With Redis the windows are
//! read there, under the limiter's own key names (`store::Keys`); with the
//! embedded store the daemon is asked (`Request::Explain`).

use std::path::Path;

use anyhow::Context;
use ipnet::IpNet;
use serde::Serialize;

use fleetban::addr::{client_key, loopback, AddrText, Keying};
use fleetban::bans::{BanList, BanRecord};
use fleetban::config::Config;
use fleetban::control::{Client, WindowCount};
use fleetban::limit::RuleLimit;
use fleetban::store::Keys;

use super::human::{local, relative, span, Table};
use super::list::target;
use super::{failed, load_for_cli, runtime, say, Outcome};

/// `explain --json`, fields in this order (docs/design.md §6).
#[derive(Serialize)]
struct Explanation {
    /// As typed, in fleetban's spelling.
    addr: String,
    /// The client key it is counted and banned under (an IPv6 address's
    /// `ipv6_prefix`).
    key: String,
    /// Blocked now: by its own ban or a wider one.
    banned: bool,
    ban: Option<BanLine>,
    covering: Vec<BanLine>,
    /// Why it is never counted nor banned (empty: it can be).
    never_banned: Vec<String>,
    windows: Vec<WindowCount>,
    /// `FILE: NETWORK` for each `blocklists:` file whose networks (as this
    /// host loads them: allowed ones taken out) hold the address.
    blocklisted: Vec<String>,
}

#[derive(Serialize)]
struct BanLine {
    addr: String,
    rule: String,
    reason: String,
    host: String,
    since: String,
    until: Option<String>,
    left_s: Option<i64>,
    count: u32,
}

fn line(r: &BanRecord, now: i64) -> BanLine {
    BanLine {
        addr: AddrText(&r.addr).to_string(),
        rule: r.rule.clone(),
        reason: r.reason.clone(),
        host: r.host.clone(),
        since: fleetban::rfc3339(r.since),
        until: r.until.map(fleetban::rfc3339),
        left_s: r.until.map(|t| (t - now).max(0) / 1000),
        count: r.count,
    }
}

pub fn explain(path: &Path, addr: &str, json: bool) -> Outcome {
    let config = load_for_cli(path)?;
    let net = target(addr)?;
    // A single address is counted under its client key (IPv6: its prefix).
    let key = if net.prefix_len() == net.max_prefix_len() {
        client_key(net.addr(), config.ipv6_prefix)
    } else {
        net
    };
    let now = fleetban::now_ms();
    // Each rule counts the client under its own key: the address, or its
    // network for `key: network`; one reading per distinct key.
    let rule_keys: Vec<IpNet> = config
        .rules
        .iter()
        .map(|r| match r.limit.keying {
            Keying::Address => key,
            k if net.prefix_len() == net.max_prefix_len() => k.key(net.addr(), config.ipv6_prefix),
            _ => net,
        })
        .collect();
    let mut distinct: Vec<IpNet> = rule_keys.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let (records, by_key) = match &config.redis {
        Some(r) => {
            let rt = runtime();
            rt.block_on(async {
                let mut list = BanList::connect(r).await.with_context(|| format!("redis {}", r.url))?;
                let records = list.records(now).await.map_err(failed)?;
                let mut by_key = Vec::new();
                if let BanList::Redis { con, keys } = &mut list {
                    for k in &distinct {
                        let w = redis_windows(&config, con, keys, k, now)
                            .await
                            .context("reading the windows")?;
                        by_key.push(w);
                    }
                }
                Ok::<_, super::Failure>((records, by_key))
            })?
        }
        None => {
            let client = Client::new(&config.control);
            let records = client.bans().map_err(failed)?;
            let by_key = distinct
                .iter()
                .map(|k| client.explain(*k).map_err(failed))
                .collect::<Result<Vec<_>, _>>()?;
            (records, by_key)
        }
    };
    let windows = rule_window(&rule_keys, &distinct, by_key);
    let own = records.iter().find(|r| r.addr == net || r.addr == key);
    let covering: Vec<&BanRecord> = records
        .iter()
        .filter(|r| Some(*r) != own && (r.addr.contains(&net) || r.addr.contains(&key)))
        .collect();
    let e = Explanation {
        addr: AddrText(&net).to_string(),
        key: AddrText(&key).to_string(),
        banned: own.is_some() || !covering.is_empty(),
        ban: own.map(|r| line(r, now)),
        covering: covering.iter().map(|r| line(r, now)).collect(),
        never_banned: never_banned(&config, &net),
        windows,
        blocklisted: blocklisted(&config, &net),
    };
    if json {
        say!("{}", serde_json::to_string(&e).map_err(failed)?);
    } else {
        say!("{}", render(&e, own, &covering, now).trim_end_matches('\n'));
    }
    Ok(())
}

/// The blocklist networks holding `net`, read from the files as the
/// daemon reads them (an unreadable file is named with its error).
fn blocklisted(config: &Config, net: &IpNet) -> Vec<String> {
    let allowed = fleetban::detect::never_dropped(&config.never_banned());
    let mut out = Vec::new();
    for spec in &config.blocklists {
        match fleetban::blocklist::load(spec, &allowed) {
            Ok(l) => out.extend(
                l.nets
                    .iter()
                    .filter(|n| n.contains(net))
                    .map(|n| format!("{}: {}", spec.file.display(), AddrText(n))),
            ),
            Err(e) => out.push(format!("{}: unreadable ({e})", spec.file.display())),
        }
    }
    out
}

/// Rule i's window read under its own key `rule_keys[i]`, from the readings
/// of every rule under each distinct key (an empty reading: none).
fn rule_window(rule_keys: &[IpNet], distinct: &[IpNet], by_key: Vec<Vec<WindowCount>>) -> Vec<WindowCount> {
    let mut out = Vec::new();
    for (i, k) in rule_keys.iter().enumerate() {
        let at = distinct
            .binary_search(k)
            .expect("every rule key is in the distinct list");
        if let Some(w) = by_key.get(at).and_then(|r| r.get(i)) {
            out.push(WindowCount {
                key: AddrText(k).to_string(),
                ..w.clone()
            });
        }
    }
    out
}

/// Why `net` is never counted nor banned, one reason each.
fn never_banned(config: &Config, net: &IpNet) -> Vec<String> {
    let mut out = Vec::new();
    let overlaps = |n: &IpNet| n.contains(net) || net.contains(n);
    if let Some(n) = loopback().iter().find(|n| overlaps(n)) {
        out.push(format!("loopback ({n})"));
    }
    if let Some(n) = config.allow.iter().find(|n| overlaps(n)) {
        out.push(format!("allow: {}", AddrText(n)));
    }
    if let Some(n) = config.proxies.iter().find(|n| overlaps(n)) {
        out.push(format!("proxies: {} (a trusted proxy)", AddrText(n)));
    }
    let (_, own) = fleetban::detect::OwnAddresses::new(&[]);
    if net.prefix_len() == net.max_prefix_len()
        && loopback().iter().all(|n| !n.contains(net))
        && own.contains(net.addr())
    {
        out.push("this host's own address".to_owned());
    }
    out
}

/// Each rule's count of `key` in Redis (`limit::peek`).
async fn redis_windows(
    config: &Config,
    con: &mut fleetban::store::Conn,
    keys: &Keys,
    key: &IpNet,
    now: i64,
) -> redis::RedisResult<Vec<WindowCount>> {
    let rules = RuleLimit::of(&config.rules);
    let counts = fleetban::limit::peek::redis_counts(con, keys, &rules, &config.host_id, key, now).await?;
    Ok(rules
        .into_iter()
        .zip(counts)
        .map(|(r, count)| WindowCount::of(r, count))
        .collect())
}

fn render(e: &Explanation, own: Option<&BanRecord>, covering: &[&BanRecord], now: i64) -> String {
    let mut out = e.addr.clone();
    if e.key != e.addr {
        out += &format!(" (counted and banned as {})", e.key);
    }
    out += if e.banned { ": banned\n" } else { ": not banned\n" };
    let describe = |r: &BanRecord| {
        format!(
            "{} by rule {} on host {}{}; since {}; until {}{}; offence {}",
            AddrText(&r.addr),
            if r.rule.is_empty() { "?" } else { &r.rule },
            if r.host.is_empty() { "?" } else { &r.host },
            if r.reason.is_empty() {
                String::new()
            } else {
                format!(" ({})", r.reason)
            },
            local(r.since),
            r.until.map_or("forever".to_owned(), local),
            r.until.map_or(String::new(), |t| format!(" ({})", relative(t, now))),
            r.count
        )
    };
    match own {
        Some(r) => out += &format!("  ban:      {}\n", describe(r)),
        None => out += "  ban:      none of its own\n",
    }
    for r in covering {
        out += &format!("  covered:  {}\n", describe(r));
    }
    if e.never_banned.is_empty() {
        out += "  never banned: no (it can be banned)\n";
    } else {
        out += &format!("  never banned: yes: {}\n", e.never_banned.join("; "));
    }
    for b in &e.blocklisted {
        out += &format!("  blocklist: {b}\n");
    }
    let mut t = Table::new(&["RULE", "KEY", "ALGORITHM", "COUNT", "LIMIT", "WINDOW"])
        .right(3)
        .right(4);
    for w in &e.windows {
        let count = match w.algorithm.as_str() {
            "token_bucket" => format!("{} in use", w.count),
            _ => w.count.to_string(),
        };
        t.row(vec![
            w.rule.clone(),
            w.key.clone(),
            w.algorithm.clone(),
            count,
            w.limit.to_string(),
            span(w.window_ms),
        ]);
    }
    if !t.is_empty() {
        out += "  windows now:\n";
        out += &t.render().lines().map(|l| format!("    {l}\n")).collect::<String>();
    }
    out
}
