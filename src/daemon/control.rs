//! The daemon's answers on the control socket: `status` from the counters;
//! `ban`, `unban` and `bans` from the pipeline, which owns the bans (the
//! request waits for its next turn of the select loop).

use std::sync::Arc;

use tokio::sync::{mpsc, oneshot};

use super::pipeline::Command;
use super::stats::Stats;
use crate::control::{Handler, Request, Response};

pub struct Answers {
    pub stats: Arc<Stats>,
    pub pipeline: mpsc::Sender<Command>,
}

impl Handler for Answers {
    async fn answer(&self, request: Request) -> Response {
        if request == Request::Status {
            return Response::Status(Box::new(self.stats.report()));
        }
        let (reply, answer) = oneshot::channel();
        if self.pipeline.send(Command { request, reply }).await.is_err() {
            return Response::error("the daemon is stopping");
        }
        answer
            .await
            .unwrap_or_else(|_| Response::error("the daemon is stopping"))
    }
}
