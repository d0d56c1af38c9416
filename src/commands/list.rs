//! `fleetban bans`, `ban` and `unban`: the fleet's ban list, through Redis
//! when the configuration names it (every host follows), through the
//! daemon's control socket otherwise (the embedded list lives in it).

use std::io::Write;
use std::path::Path;

use anyhow::Context;
use ipnet::IpNet;

use fleetban::addr::AddrText;
use fleetban::bans::Unbannable;
use fleetban::bans::{Applied, BanList, BanRecord, BanRequest, Bans, Mode, MANUAL_MIN_MS};
use fleetban::config::{Config, Dur, RedisConfig};
use fleetban::control::Client;
use fleetban::enforce::Changes;

use super::{failed, load, runtime, Failure, Outcome};

pub struct BanArgs {
    pub target: String,
    pub duration: Option<String>,
    pub permanent: bool,
    pub reason: String,
}

/// The fleet's bans over Redis, as this host's (no firewall: every host,
/// this one's daemon included, follows the list).
fn redis_bans(config: &Config, r: &RedisConfig, rt: &tokio::runtime::Runtime) -> Result<Bans, Failure> {
    let list = rt
        .block_on(BanList::connect(r))
        .with_context(|| format!("redis {}", r.url))?;
    Ok(Bans::new(list, &config.host_id, Changes::default()))
}

/// An address or network as the operator typed it.
fn target(s: &str) -> Result<IpNet, Failure> {
    fleetban::addr::parse_member(s.trim()).ok_or_else(|| {
        Failure::Usage(format!(
            "`{s}` is not an address or a network (CIDR with no host bits set)"
        ))
    })
}

pub fn bans(path: &Path, json: bool) -> Outcome {
    let config = load(path)?;
    let records: Vec<BanRecord> = match &config.redis {
        Some(r) => {
            let rt = runtime();
            let mut bans = redis_bans(&config, r, &rt)?;
            rt.block_on(bans.records(fleetban::now_ms())).map_err(failed)?
        }
        None => Client::new(&config.control).bans().map_err(failed)?,
    };
    let mut out = std::io::BufWriter::new(std::io::stdout().lock());
    for r in &records {
        if json {
            let _ = writeln!(out, "{}", serde_json::to_string(r).unwrap_or_default());
        } else {
            let _ = writeln!(
                out,
                "{:<40} {:<20} until {:<22} by {} on {}{}",
                AddrText(&r.addr).to_string(),
                r.rule,
                r.until.map_or("forever".to_owned(), fleetban::rfc3339),
                if r.host.is_empty() { "?" } else { &r.host },
                fleetban::rfc3339(r.since),
                if r.reason.is_empty() {
                    String::new()
                } else {
                    format!(" ({})", r.reason)
                }
            );
        }
    }
    if !json {
        let _ = writeln!(out, "{} active ban(s)", records.len());
    }
    Ok(())
}

pub fn ban(path: &Path, args: &BanArgs) -> Outcome {
    let config = load(path)?;
    let net = target(&args.target)?;
    if let Some(why) = Unbannable::of(&config).refusal(&net) {
        return Err(Failure::Usage(why));
    }
    let for_ms = match (&args.duration, args.permanent) {
        (Some(d), false) => match d.parse::<Dur>() {
            Ok(d) if d.as_ms() >= MANUAL_MIN_MS => Some(d.as_ms()),
            Ok(_) => return Err(Failure::Usage("--for must be at least 1s".into())),
            Err(e) => return Err(Failure::Usage(format!("--for: {e}"))),
        },
        _ => None,
    };
    let until = match &config.redis {
        Some(r) => {
            let rt = runtime();
            let mut bans = redis_bans(&config, r, &rt)?;
            let req = BanRequest::manual(net, Mode::manual(for_ms, args.permanent), &args.reason, &config.host_id);
            let now = fleetban::now_ms();
            match rt.block_on(bans.ban(req, now, now)).map_err(failed)? {
                Applied::New(rec) => rec.until,
                _ => None,
            }
        }
        None => Client::new(&config.control)
            .ban(net, for_ms, args.permanent, &args.reason)
            .map_err(failed)?,
    };
    println!(
        "banned {} until {}",
        AddrText(&net),
        until.map_or("unbanned".to_owned(), fleetban::rfc3339)
    );
    Ok(())
}

pub fn unban(path: &Path, t: &str) -> Outcome {
    let config = load(path)?;
    let net = target(t)?;
    let removed = match &config.redis {
        Some(r) => {
            let rt = runtime();
            let mut bans = redis_bans(&config, r, &rt)?;
            let rules: Vec<(&str, i64)> = config
                .rules
                .iter()
                .map(|r| (r.name.as_str(), r.limit.window_ms))
                .collect();
            rt.block_on(bans.unban(&net, &rules)).map_err(failed)?
        }
        None => Client::new(&config.control).unban(net).map_err(failed)?,
    };
    if removed {
        println!("unbanned {}", AddrText(&net));
    } else {
        println!("{} was not banned", AddrText(&net));
    }
    Ok(())
}
