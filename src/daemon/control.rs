//! The daemon's answers on the control socket: `status` from the counters;
//! `ban`, `unban`, `bans` and `explain` from the pipeline, which owns the
//! bans and the windows (the request waits for its next turn of the select
//! loop; [`command`] is its answer). What the kernel
//! does not hold is said, from the enforcer's report: `status` counts it,
//! `bans` lists it, and a new `ban` waits (2 s at most) for the enforcer's
//! batch that takes it and answers whether it is enforced.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::enforcer::Enforced;
use super::pipeline::Command;
use super::stats::Stats;
use crate::bans::list::until_ms;
use crate::bans::{Applied, BanRequest, Bans, Effect, Mode, Unbannable, Unbanned};
use crate::control::{BanAnswer, Cover, Handler, Request, Response, WindowCount};
use crate::enforce::Until;
use crate::limit::Limiter;

/// How long a `ban` waits for its element to reach the kernel.
const ENFORCE_WAIT: Duration = Duration::from_secs(2);

pub struct Answers {
    pub stats: Arc<Stats>,
    pub pipeline: mpsc::Sender<Command>,
    /// The enforcer's report: what is not in the kernel.
    pub enforced: Arc<Enforced>,
}

impl Handler for Answers {
    async fn answer(&self, request: Request) -> Response {
        if request == Request::Status {
            let mut status = self.stats.report();
            status.firewall = self.enforced.status();
            status.blocklists = self.enforced.blocklists();
            return Response::Status(Box::new(status));
        }
        let ban = match &request {
            Request::Ban { addr, .. } => Some(*addr),
            _ => None,
        };
        // Read before the change can be queued: the batch that takes it
        // is a later one.
        let begun = self.enforced.begun();
        let (reply, answer) = oneshot::channel();
        if self.pipeline.send(Command { request, reply }).await.is_err() {
            return Response::error("the daemon is stopping");
        }
        let response = answer
            .await
            .unwrap_or_else(|_| Response::error("the daemon is stopping"));
        match response {
            Response::Bans {
                bans, local, queued, ..
            } => {
                let not_enforced = self.enforced.not_enforced(bans.iter().map(|b| &b.addr));
                Response::Bans {
                    local,
                    queued,
                    not_enforced: not_enforced
                        .iter()
                        .map(|n| crate::addr::AddrText(n).to_string())
                        .collect(),
                    bans,
                }
            }
            Response::Ban(mut answer) if answer.banned && answer.effect != Some(Effect::Kept) => {
                answer.enforced = match ban {
                    Some(net) => Some(self.enforced.applied(&net, begun, ENFORCE_WAIT).await),
                    None => None,
                };
                Response::Ban(answer)
            }
            other => other,
        }
    }
}

/// Answers a request about bans in the pipeline, which owns them: `bans`
/// from the list; `ban` and `unban` through [`Bans`] (with Redis down:
/// enforced or lifted here and queued for Redis); `explain` from the
/// embedded store's windows. `windows` are the rules' (name, window ms),
/// whose state of an unbanned address is deleted.
pub(super) async fn command(
    bans: &mut Bans,
    limiter: &mut Limiter,
    windows: &[(&str, i64)],
    unbannable: Option<&Unbannable>,
    request: Request,
) -> Response {
    // Refused here as `fleetban ban` refuses it: one check for every way in.
    if let Request::Ban { addr, .. } = &request {
        if let Some(why) = unbannable.and_then(|u| u.refusal(addr)) {
            return Response::error(why);
        }
    }
    let now = crate::now_ms();
    match request {
        Request::Bans => match bans.records(now).await {
            Ok(bans) => Response::Bans {
                bans,
                not_enforced: Vec::new(),
                local: false,
                queued: Vec::new(),
            },
            // `fleetban bans` with Redis down: what this host enforces.
            Err(e) if e.is_outage() => {
                let (records, queued) = bans.enforced_here(now);
                Response::Bans {
                    bans: records,
                    not_enforced: Vec::new(),
                    local: true,
                    queued: queued.iter().map(|n| crate::addr::AddrText(n).to_string()).collect(),
                }
            }
            Err(e) => Response::error(e),
        },
        Request::Ban {
            addr,
            for_ms,
            permanent,
            reason,
            replace,
        } => {
            let mode = match Mode::manual(for_ms, permanent, replace) {
                Ok(m) => m,
                Err(e) => return Response::error(e),
            };
            let req = BanRequest::manual(addr, mode, &reason, bans.host());
            let answer = |until: Until, effect, was: Option<Until>, queued| {
                Response::Ban(BanAnswer {
                    banned: true,
                    until: until_ms(until),
                    enforced: None,
                    effect: Some(effect),
                    was: was.and_then(until_ms),
                    queued,
                })
            };
            match bans.ban(req, now, now).await {
                Ok(Applied::New(rec)) => answer(rec.until(), Effect::New, None, false),
                Ok(Applied::Changed { rec, effect, was }) => answer(rec.until(), effect, Some(was), false),
                Ok(Applied::Local(e)) => answer(e.until, Effect::New, None, true),
                Ok(Applied::Already(u)) => answer(u, Effect::Kept, Some(u), false),
                Ok(Applied::Refused) => Response::error("refused by the safety valve"),
                Err(e) => Response::error(e),
            }
        }
        Request::Unban { addr } => {
            let rules: &[(&str, i64)] = if bans.uses_redis() { windows } else { &[] };
            match bans.unban(&addr, rules).await {
                Ok(Unbanned { removed, queued }) => {
                    limiter.forget(&addr);
                    let wider = bans
                        .wider(&addr)
                        .into_iter()
                        .map(|(addr, until)| Cover {
                            addr,
                            until: until_ms(until),
                        })
                        .collect();
                    Response::Unban { removed, queued, wider }
                }
                Err(e) => Response::error(e),
            }
        }
        Request::Explain { addr } => match limiter.peek(&addr, now) {
            Some(rules) => Response::Explain {
                windows: rules.into_iter().map(|(r, count)| WindowCount::of(r, count)).collect(),
            },
            None => Response::error("this daemon counts in Redis: `fleetban explain` reads it there"),
        },
        Request::Status => Response::error("status is answered by the control socket"),
    }
}
