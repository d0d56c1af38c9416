//! `fleetban explain ADDR`: why an address is or is not banned. The
//! headline is `verdict::verdict` over the list, the blocklists and this
//! host's never-banned set, the decision nft and `/check` enforce: banned,
//! not banned, never banned (and why), dropped by a blocklist. Below: its
//! own ban (rule, host, reason, since, until, time left, offence count),
//! the wider bans covering it, its count in each rule's window against the
//! limit. With Redis the windows are read there, under the limiter's own
//! key names (`store::Keys`); with the embedded store the daemon is asked
//! (`Request::Explain`).

use std::path::Path;

use anyhow::Context;
use ipnet::IpNet;
use serde::Serialize;

use fleetban::addr::{client_key, AddrText, Keying};
use fleetban::bans::{BanList, BanRecord};
use fleetban::config::Config;
use fleetban::control::{Client, WindowCount};
use fleetban::limit::RuleLimit;
use fleetban::store::Keys;
use fleetban::verdict::{verdict, NeverBanned, Verdict};

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
    /// What is enforced for it (`verdict::verdict`): `banned`,
    /// `never_banned`, `blocklisted` or `not_banned`.
    verdict: &'static str,
    /// Dropped now by a ban, its own or a wider one (false when never banned).
    banned: bool,
    ban: Option<BanLine>,
    covering: Vec<BanLine>,
    /// Why it is never counted nor banned (empty: it can be); for a
    /// network, the never-banned networks inside it, which its ban spares.
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
                // The bans of the target, of its key and of every network
                // holding them: looked up, never the whole list read.
                let mut records = list.covering(&net, now).await.map_err(failed)?;
                if key != net {
                    for r in list.covering(&key, now).await.map_err(failed)? {
                        if !records.iter().any(|o| o.addr == r.addr) {
                            records.push(r);
                        }
                    }
                }
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
            match client.bans() {
                // Stopped: the list it saved; the windows lived in it.
                Err(e) if e.not_running() => (super::saved_bans(&config, &e)?, Vec::new()),
                records => {
                    let records = records.map_err(failed)?;
                    let by_key = distinct
                        .iter()
                        .map(|k| client.explain(*k).map_err(failed))
                        .collect::<Result<Vec<_>, _>>()?;
                    (records, by_key)
                }
            }
        }
    };
    let windows = rule_window(&rule_keys, &distinct, by_key);
    let own = records.iter().find(|r| r.addr == net || r.addr == key);
    let covering: Vec<&BanRecord> = records
        .iter()
        .filter(|r| Some(*r) != own && (r.addr.contains(&net) || r.addr.contains(&key)))
        .collect();
    let never = NeverBanned::new(
        &config.allow,
        &config.proxies,
        &fleetban::verdict::never::local_addresses(),
    );
    let blocks = blocklisted(&config, &net, &never);
    let bans = own.iter().chain(&covering).copied();
    let enforced = enforced(&net, &never, bans, &blocks);
    let spared: Vec<String> = match net.prefix_len() == net.max_prefix_len() {
        true => never.why(net.addr()).into_iter().map(|w| w.to_string()).collect(),
        false => never.overlapping(&net).map(|w| w.to_string()).collect(),
    };
    let e = Explanation {
        addr: AddrText(&net).to_string(),
        key: AddrText(&key).to_string(),
        verdict: match &enforced {
            Verdict::Never(_) => "never_banned",
            Verdict::Banned(_) => "banned",
            Verdict::Blocked(_) => "blocklisted",
            Verdict::Open => "not_banned",
        },
        banned: matches!(enforced, Verdict::Banned(_)),
        ban: own.map(|r| line(r, now)),
        covering: covering.iter().map(|r| line(r, now)).collect(),
        never_banned: spared,
        windows,
        blocklisted: blocks
            .iter()
            .map(|b| match b {
                Ok((file, n)) => format!("{file}: {}", AddrText(n)),
                Err(e) => e.clone(),
            })
            .collect(),
    };
    if json {
        say!("{}", serde_json::to_string(&e).map_err(failed)?);
    } else {
        say!("{}", render(&e, &enforced, own, &covering, now).trim_end_matches('\n'));
    }
    Ok(())
}

/// What is enforced for the target: for an address, `verdict::verdict`
/// over its bans (its own first) and the blocklists; for a network, the
/// same precedence over the whole of it (never banned when the set holds
/// all of it, a blocklist when one network holds all of it).
fn enforced<'a>(
    net: &IpNet,
    never: &NeverBanned,
    mut bans: impl Iterator<Item = &'a BanRecord>,
    blocks: &[Blocked],
) -> Verdict<&'a BanRecord, (String, IpNet)> {
    let block = || blocks.iter().find_map(|b| b.as_ref().ok()).cloned();
    if net.prefix_len() == net.max_prefix_len() {
        return verdict(net.addr(), never, |_| bans.next(), |_| block());
    }
    if let Some(why) = never.holding(net) {
        return Verdict::Never(why);
    }
    match bans.next() {
        Some(b) => Verdict::Banned(b),
        None => block().map_or(Verdict::Open, Verdict::Blocked),
    }
}

/// A blocklist network holding the target, with its file; or a file that
/// could not be read, named with its error.
type Blocked = Result<(String, IpNet), String>;

/// The blocklist networks holding `net`, read from the files as the
/// daemon reads them (cut around `never`).
fn blocklisted(config: &Config, net: &IpNet, never: &NeverBanned) -> Vec<Blocked> {
    let mut out = Vec::new();
    for spec in &config.blocklists {
        let file = spec.file.display().to_string();
        match fleetban::blocklist::load(spec, never.nets()) {
            Ok(l) => out.extend(
                l.nets
                    .iter()
                    .filter(|n| n.contains(net))
                    .map(|n| Ok((file.clone(), *n))),
            ),
            Err(e) => out.push(Err(format!("{file}: unreadable ({e})"))),
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

/// What a never-banned address's headline adds when bans cover it.
fn spares(own: Option<&BanRecord>, covering: &[&BanRecord]) -> String {
    let bans: Vec<String> = own
        .into_iter()
        .chain(covering.iter().copied())
        .map(|r| AddrText(&r.addr).to_string())
        .collect();
    match bans.as_slice() {
        [] => String::new(),
        [one] => format!("; the ban of {one} spares it"),
        many => format!("; the bans of {} spare it", many.join(", ")),
    }
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

fn render(
    e: &Explanation,
    enforced: &Verdict<&BanRecord, (String, IpNet)>,
    own: Option<&BanRecord>,
    covering: &[&BanRecord],
    now: i64,
) -> String {
    let mut out = e.addr.clone();
    if e.key != e.addr {
        out += &format!(" (counted and banned as {})", e.key);
    }
    out += &match enforced {
        Verdict::Banned(r) if Some(*r) == own => ": banned\n".to_owned(),
        Verdict::Banned(r) => format!(": banned, by {}\n", AddrText(&r.addr)),
        Verdict::Never(why) => format!(": never banned ({why}){}\n", spares(own, covering)),
        Verdict::Blocked((file, n)) => format!(": dropped by blocklist {file} ({})\n", AddrText(n)),
        Verdict::Open => ": not banned\n".to_owned(),
    };
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
    match enforced {
        // The headline named the first reason; here are all of them.
        Verdict::Never(_) if e.never_banned.len() > 1 => {
            out += &format!("  never banned: {}\n", e.never_banned.join("; "));
        }
        Verdict::Never(_) => {}
        // A network's ban spares what never-banned networks it holds.
        _ if !e.never_banned.is_empty() => {
            out += &format!("  spared:   {} (never banned)\n", e.never_banned.join("; "));
        }
        _ => {}
    }
    for b in &e.blocklisted {
        out += &format!("  blocklist: {b}\n");
    }
    let mut t = Table::new(&["RULE", "KEY", "ALGORITHM", "COUNT", "LIMIT", "WINDOW"]).right_range(3..=4);
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
