//! `fleetban bans`, `ban` and `unban`: the fleet's ban list, through Redis
//! when the configuration names it (every host follows), through the
//! daemon's control socket otherwise (the embedded list lives in it) and
//! while Redis is down (the daemon enforces the change at once and writes
//! it to Redis when it answers). Every line says what happened: a new ban,
//! an active one kept or extended (never shortened without `--replace`),
//! a lift that a wider ban still overrides.

use std::path::Path;

use ipnet::IpNet;

use fleetban::addr::AddrText;
use fleetban::bans::list::until_ms;
use fleetban::bans::{overlapping, parse_target, Applied, BanList, BanRequest, Bans, Effect, Mode, Unbannable};
use fleetban::config::Dur;
use fleetban::control::{BanAnswer, Client, Cover, Request};
use fleetban::enforce::Changes;

use super::human::{local, relative};
use super::{failed, load_for_cli, runtime, say, Failure, Outcome};

pub struct BanArgs {
    pub target: String,
    pub duration: Option<String>,
    pub permanent: bool,
    pub reason: String,
    pub replace: bool,
    /// One JSON object instead of the sentences.
    pub json: bool,
}

/// `ban --json`, fields in this order (docs/design.md §6).
#[derive(serde::Serialize)]
struct BanJson {
    addr: String,
    effect: Effect,
    /// RFC 3339; null: permanent.
    until: Option<String>,
    /// The active ban's end before, for `extended`/`replaced` (and `kept`).
    was: Option<String>,
    /// Redis was down: enforced here, written to Redis when it answers.
    queued: bool,
    /// Through the daemon: whether the kernel holds it; null otherwise.
    enforced: Option<bool>,
}

/// `unban --json`, fields in this order (docs/design.md §6).
#[derive(serde::Serialize)]
struct UnbanJson {
    addr: String,
    removed: bool,
    queued: bool,
    /// Wider bans that still cover it.
    wider: Vec<CoverJson>,
    /// Narrower bans inside a network unbanned (read from Redis only).
    narrower: Vec<String>,
}

#[derive(serde::Serialize)]
struct CoverJson {
    addr: String,
    until: Option<String>,
}

/// An address or network as the operator typed it (`bans::parse_target`).
pub fn target(s: &str) -> Result<IpNet, Failure> {
    parse_target(s).map_err(Failure::Usage)
}

/// `until` for people: `2026-12-01 19:20:05 CET (in 52m)`, or `forever`.
pub fn until_human(until: Option<i64>, now: i64) -> String {
    until.map_or("forever".to_owned(), |t| format!("{} ({})", local(t), relative(t, now)))
}

pub fn ban(path: &Path, args: &BanArgs) -> Outcome {
    let config = load_for_cli(path)?;
    let net = target(&args.target)?;
    if let Some(why) = Unbannable::of(&config).refusal(&net) {
        return Err(Failure::Usage(why));
    }
    let for_ms = match (&args.duration, args.permanent) {
        (Some(d), false) => match d.parse::<Dur>() {
            Ok(d) => Some(d.as_ms()),
            Err(e) => return Err(Failure::Usage(format!("--for: {e}"))),
        },
        _ => None,
    };
    // The one check of every entry point (the control socket's too).
    let mode = Mode::manual(for_ms, args.permanent, args.replace).map_err(|e| Failure::Usage(format!("--for: {e}")))?;
    let via_daemon = || {
        Client::new(&config.control).ban(&Request::Ban {
            addr: net,
            for_ms,
            permanent: args.permanent,
            reason: args.reason.clone(),
            replace: args.replace,
        })
    };
    let answer = match &config.redis {
        Some(r) => {
            let rt = runtime();
            let req = BanRequest::manual(net, mode, &args.reason, &config.host_id);
            let now = fleetban::now_ms();
            let direct = rt.block_on(async {
                let list = BanList::connect(r).await.map_err(fleetban::bans::BanListError::from)?;
                Bans::new(list, &config.host_id, Changes::default())
                    .ban(req, now, now)
                    .await
            });
            match direct {
                Ok(applied) => answer_of(applied),
                Err(e) if e.is_outage() => {
                    eprintln!(
                        "Redis {} is down ({e}); asking the daemon to ban it here and queue it.",
                        r.url
                    );
                    via_daemon().map_err(|d| {
                        Failure::Runtime(anyhow::anyhow!(
                            "not banned: Redis is down ({e}) and the daemon could not take it ({d})"
                        ))
                    })?
                }
                Err(e) => return Err(failed(e)),
            }
        }
        None => via_daemon().map_err(failed)?,
    };
    if args.json {
        let line = BanJson {
            addr: AddrText(&net).to_string(),
            effect: answer.effect.unwrap_or(Effect::New),
            until: answer.until.map(fleetban::rfc3339),
            was: answer.was.map(fleetban::rfc3339),
            queued: answer.queued,
            enforced: answer.enforced,
        };
        say!("{}", serde_json::to_string(&line).map_err(failed)?);
    } else {
        print_ban(&net, &answer);
    }
    Ok(())
}

/// A ban applied here (straight to Redis) as the daemon would answer it.
fn answer_of(applied: Applied) -> BanAnswer {
    let (until, effect, was) = match applied {
        Applied::New(rec) => (rec.until, Effect::New, None),
        Applied::Changed { rec, effect, was } => (rec.until, effect, until_ms(was)),
        Applied::Already(u) => (until_ms(u), Effect::Kept, until_ms(u)),
        Applied::Local(e) => (until_ms(e.until), Effect::New, None),
        Applied::Refused => (None, Effect::Kept, None),
    };
    BanAnswer {
        banned: true,
        until,
        enforced: None,
        effect: Some(effect),
        was,
        queued: false,
    }
}

fn print_ban(net: &IpNet, a: &BanAnswer) {
    let now = fleetban::now_ms();
    let addr = AddrText(net);
    let until = until_human(a.until, now);
    let was = until_human(a.was, now);
    match a.effect.unwrap_or(Effect::New) {
        Effect::New => say!("banned {addr} until {until}"),
        Effect::Kept => say!("{addr} already banned until {until}; kept (shorten it with --replace)"),
        Effect::Extended => say!("{addr} was banned until {was}; extended to {until}"),
        Effect::Replaced => say!("{addr} was banned until {was}; replaced: banned until {until}"),
    }
    if a.queued {
        say!("Redis is down: the daemon enforces it on this host now and writes it to Redis when Redis answers");
    }
    if a.enforced == Some(false) {
        say!("warning: not enforced yet: nft failed or did not answer; the daemon retries (see `fleetban status`)");
    }
}

/// The bans inside `net` that the daemon still holds after lifting `net`
/// (its view of the list: the embedded one, or what it enforces while
/// Redis is down), so both stores answer an unban alike. Empty if the
/// daemon does not answer this second question: the unban itself is done.
fn narrower_by_daemon(config: &fleetban::config::Config, net: &IpNet) -> Vec<IpNet> {
    let records = Client::new(&config.control).bans().unwrap_or_default();
    let mut narrower: Vec<IpNet> = overlapping(&records, net).1.iter().map(|r| r.addr).collect();
    narrower.sort();
    narrower
}

pub fn unban(path: &Path, t: &str, json: bool) -> Outcome {
    let config = load_for_cli(path)?;
    let net = target(t)?;
    let via_daemon = || Client::new(&config.control).unban(net);
    let (removed, queued, wider, narrower) = match &config.redis {
        Some(r) => {
            let rt = runtime();
            let rules: Vec<(&str, i64)> = config
                .rules
                .iter()
                .map(|r| (r.name.as_str(), r.limit.window_ms))
                .collect();
            let direct = rt.block_on(async {
                let list = BanList::connect(r).await.map_err(fleetban::bans::BanListError::from)?;
                let mut bans = Bans::new(list, &config.host_id, Changes::default());
                let u = bans.unban(&net, &rules).await?;
                let records = bans.overlapping(&net, fleetban::now_ms()).await?;
                Ok::<_, fleetban::bans::BanListError>((u, records))
            });
            match direct {
                Ok((u, records)) => {
                    let (wider, narrower) = overlapping(&records, &net);
                    let wider = wider
                        .iter()
                        .map(|r| Cover {
                            addr: r.addr,
                            until: r.until,
                        })
                        .collect();
                    let mut narrower: Vec<IpNet> = narrower.iter().map(|r| r.addr).collect();
                    narrower.sort();
                    (u.removed, false, wider, narrower)
                }
                Err(e) if e.is_outage() => {
                    eprintln!(
                        "Redis {} is down ({e}); asking the daemon to lift it here and queue it.",
                        r.url
                    );
                    let (removed, queued, wider) = via_daemon().map_err(|d| {
                        Failure::Runtime(anyhow::anyhow!(
                            "not unbanned: Redis is down ({e}) and the daemon could not take it ({d})"
                        ))
                    })?;
                    (removed, queued, wider, narrower_by_daemon(&config, &net))
                }
                Err(e) => return Err(failed(e)),
            }
        }
        None => {
            let (removed, queued, wider) = via_daemon().map_err(failed)?;
            (removed, queued, wider, narrower_by_daemon(&config, &net))
        }
    };
    let addr = AddrText(&net);
    if json {
        let line = UnbanJson {
            addr: addr.to_string(),
            removed,
            queued,
            wider: wider
                .iter()
                .map(|w| CoverJson {
                    addr: AddrText(&w.addr).to_string(),
                    until: w.until.map(fleetban::rfc3339),
                })
                .collect(),
            narrower: narrower.iter().map(|n| AddrText(n).to_string()).collect(),
        };
        say!("{}", serde_json::to_string(&line).map_err(failed)?);
        return Ok(());
    }
    if removed {
        say!("unbanned {addr}");
    } else {
        say!("{addr} had no ban of its own");
    }
    if queued {
        say!("Redis is down: lifted on this host now; the daemon writes the unban to Redis when Redis answers");
    }
    let now = fleetban::now_ms();
    for w in &wider {
        say!(
            "still banned: {} covers {addr} until {}; lift it with `fleetban unban {}`",
            AddrText(&w.addr),
            until_human(w.until, now),
            AddrText(&w.addr)
        );
    }
    if !narrower.is_empty() {
        let names: Vec<String> = narrower.iter().map(|n| AddrText(n).to_string()).collect();
        say!(
            "note: {} narrower ban(s) inside {addr} remain: {}",
            names.len(),
            names.join(", ")
        );
    }
    Ok(())
}
