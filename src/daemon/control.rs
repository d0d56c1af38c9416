//! The daemon's answers on the control socket: `status` from the counters;
//! `ban`, `unban` and `bans` from the pipeline, which owns the bans (the
//! request waits for its next turn of the select loop). What the kernel
//! does not hold is said, from the enforcer's report: `status` counts it,
//! `bans` lists it, and a new `ban` waits (2 s at most) for the enforcer's
//! batch that takes it and answers whether it is enforced.

use std::sync::Arc;
use std::time::Duration;

use tokio::sync::{mpsc, oneshot};

use super::enforcer::Enforced;
use super::pipeline::Command;
use super::stats::Stats;
use crate::control::{Handler, Request, Response};

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
            Response::Bans { bans, .. } => {
                let not_enforced = self.enforced.not_enforced(bans.iter().map(|b| &b.addr));
                Response::Bans {
                    not_enforced: not_enforced
                        .iter()
                        .map(|n| crate::addr::AddrText(n).to_string())
                        .collect(),
                    bans,
                }
            }
            Response::Ban {
                banned: true, until, ..
            } => {
                let enforced = match ban {
                    Some(net) => Some(self.enforced.applied(&net, begun, ENFORCE_WAIT).await),
                    None => None,
                };
                Response::Ban {
                    banned: true,
                    until,
                    enforced,
                }
            }
            other => other,
        }
    }
}
