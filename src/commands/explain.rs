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

use fleetban::addr::{client_key, loopback, AddrText};
use fleetban::bans::{BanList, BanRecord};
use fleetban::config::{Algorithm, Config, Scope};
use fleetban::control::{Client, WindowCount};
use fleetban::store::Keys;

use super::human::{local, relative, span, Table};
use super::list::target;
use super::{failed, load_for_cli, runtime, Outcome};

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
    let (records, windows) = match &config.redis {
        Some(r) => {
            let rt = runtime();
            rt.block_on(async {
                let mut list = BanList::connect(r)
                    .await
                    .with_context(|| format!("redis {}", r.url))?;
                let records = list.records(now).await.map_err(failed)?;
                let windows = match &mut list {
                    BanList::Redis { con, keys } => redis_windows(&config, con, keys, &key, now)
                        .await
                        .context("reading the windows")?,
                    BanList::Memory(_) => Vec::new(),
                };
                Ok::<_, super::Failure>((records, windows))
            })?
        }
        None => {
            let client = Client::new(&config.control);
            let records = client.bans().map_err(failed)?;
            (records, client.explain(key).map_err(failed)?)
        }
    };
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
    };
    if json {
        println!("{}", serde_json::to_string(&e).map_err(failed)?);
    } else {
        print!("{}", render(&e, own, &covering, now));
    }
    Ok(())
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
    if net.prefix_len() == net.max_prefix_len() && loopback().iter().all(|n| !n.contains(net)) && own.contains(net.addr())
    {
        out.push("this host's own address".to_owned());
    }
    out
}

/// Each rule's state of `key` in Redis, as the limiter names and reads it.
async fn redis_windows(
    config: &Config,
    con: &mut fleetban::store::Conn,
    keys: &Keys,
    key: &IpNet,
    now: i64,
) -> redis::RedisResult<Vec<WindowCount>> {
    let mut out = Vec::new();
    for r in &config.rules {
        let host = (r.limit.scope == Scope::Host).then_some(config.host_id.as_str());
        let (l, w) = (&r.limit, r.limit.window_ms.max(1));
        let fixed = |con: &mut fleetban::store::Conn| {
            let k = format!("{}:{}", keys.fixed(key, &r.name, host), now.div_euclid(w));
            let mut con = con.clone();
            async move {
                let c: Option<u64> = redis::cmd("HGET").arg(k).arg("c").query_async(&mut con).await?;
                Ok::<u64, redis::RedisError>(c.unwrap_or(0))
            }
        };
        let count = match l.algorithm {
            Algorithm::FixedWindow => fixed(con).await?,
            Algorithm::SlidingWindow => {
                let members: u64 = redis::cmd("ZCOUNT")
                    .arg(keys.window(key, &r.name, host))
                    .arg(format!("({}", now - w))
                    .arg(now)
                    .query_async(con)
                    .await?;
                let pre = u64::from(prefilter_hits(l));
                match pre {
                    0 => members,
                    _ => match fixed(con).await? {
                        f if f < pre => f,
                        _ => pre + members,
                    },
                }
            }
            Algorithm::TokenBucket => {
                let t: Option<String> = redis::cmd("HGET")
                    .arg(keys.bucket(key, &r.name, host))
                    .arg("t")
                    .query_async(con)
                    .await?;
                let tat = t.and_then(|t| t.parse::<f64>().ok()).unwrap_or(0.0) as i64;
                let d = tat - now.saturating_mul(1000);
                let interval = l.interval_us.max(1);
                if d <= 0 {
                    0
                } else {
                    ((d + interval - 1) / interval) as u64
                }
            }
            Algorithm::SlidingCounter => {
                let v: Vec<Option<String>> = redis::cmd("HMGET")
                    .arg(keys.counter(key, &r.name, host))
                    .arg("n")
                    .arg("c")
                    .arg("p")
                    .query_async(con)
                    .await?;
                let num = |i: usize| {
                    v.get(i)
                        .cloned()
                        .flatten()
                        .and_then(|s| s.parse::<f64>().ok())
                        .map(|f| f as i64)
                };
                match (num(0), num(1).unwrap_or(0), num(2).unwrap_or(0)) {
                    (Some(cur), c, p) => {
                        let n = now.div_euclid(w);
                        let (c, p) = match n - cur {
                            0 => (c, p),
                            1 => (0, c),
                            _ => (0, 0),
                        };
                        ((p * (w - (now - n * w)) + c * w) / w).max(0) as u64
                    }
                    _ => 0,
                }
            }
        };
        out.push(WindowCount {
            rule: r.name.clone(),
            algorithm: l.algorithm.name().to_owned(),
            count,
            limit: u64::from(l.hits),
            window_ms: l.window_ms,
        });
    }
    Ok(out)
}

/// A sliding window's prefilter as the limiter counts it: floor(fraction x hits).
fn prefilter_hits(l: &fleetban::config::Limit) -> u32 {
    l.prefilter.map_or(0, |f| fleetban::limit::RuleLimit::threshold(f, l.hits))
}

fn render(e: &Explanation, own: Option<&BanRecord>, covering: &[&BanRecord], now: i64) -> String {
    let mut out = format!("{}", e.addr);
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
    let mut t = Table::new(&["RULE", "ALGORITHM", "COUNT", "LIMIT", "WINDOW"])
        .right(2)
        .right(3);
    for w in &e.windows {
        let count = match w.algorithm.as_str() {
            "token_bucket" => format!("{} in use", w.count),
            _ => w.count.to_string(),
        };
        t.row(vec![
            w.rule.clone(),
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
