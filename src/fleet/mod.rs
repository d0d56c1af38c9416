//! Keeps this host's set equal to the fleet's ban list. At start and after
//! any error it reconciles against the whole list; in between it follows the
//! events stream (XREAD BLOCK) from the last id it applied, so a ban written
//! by any host reaches this one within one round trip. A periodic reconcile
//! repairs whatever drifted (trimmed stream, missed events, timeouts).

use std::time::Duration;

use redis::aio::ConnectionManager;
use redis::streams::{StreamReadOptions, StreamReadReply};
use redis::AsyncCommands;
use tokio::sync::mpsc::UnboundedSender;
use tokio_util::sync::CancellationToken;

use crate::bans::{list::parse_until, BanList};
use crate::daemon::Change;
use crate::enforce::Element;
use crate::store::{self, Keys};

/// How long one XREAD waits for events before looping (to notice shutdown
/// and reconcile deadlines).
const BLOCK_MS: usize = 1000;

pub struct FleetSync {
    /// Dedicated to blocking reads.
    pub events: ConnectionManager,
    /// Reads the full list on reconcile.
    pub list: BanList,
    pub keys: Keys,
    pub reconcile_every: Duration,
    /// To the enforcer and to the pipeline's cache.
    pub sinks: Vec<UnboundedSender<Change>>,
}

impl FleetSync {
    /// The id of the newest event, then the full list: events after that id
    /// are applied on top, so nothing between the two reads is lost.
    pub async fn snapshot(&mut self) -> Result<(String, Vec<Element>), redis::RedisError> {
        let last: Vec<(String, Vec<(String, String)>)> = redis::cmd("XREVRANGE")
            .arg(self.keys.events())
            .arg("+")
            .arg("-")
            .arg("COUNT")
            .arg(1)
            .query_async(&mut self.events)
            .await?;
        let id = last.into_iter().next().map_or_else(|| "0-0".to_owned(), |(id, _)| id);
        let entries = self.list.active(crate::now_ms()).await.map_err(|e| match e {
            crate::bans::BanListError::Redis(r) => r,
            other => redis::RedisError::from(std::io::Error::other(other.to_string())),
        })?;
        Ok((
            id,
            entries.into_iter().map(|(net, until)| Element { net, until }).collect(),
        ))
    }

    fn send(&self, c: Change) {
        for s in &self.sinks {
            let _ = s.send(c.clone());
        }
    }

    pub async fn run(mut self, mut last_id: String, shutdown: CancellationToken) {
        let mut next_reconcile = tokio::time::Instant::now() + self.reconcile_every;
        let mut backoff = Duration::from_millis(100);
        loop {
            if shutdown.is_cancelled() {
                return;
            }
            if tokio::time::Instant::now() >= next_reconcile {
                match self.snapshot().await {
                    Ok((id, elems)) => {
                        last_id = id;
                        self.send(Change::Replace(elems));
                        next_reconcile = tokio::time::Instant::now() + self.reconcile_every;
                    }
                    Err(e) => {
                        tracing::warn!(error = %e, "Reconcile with the ban list failed; retrying.");
                        if sleep_or_stop(backoff, &shutdown).await {
                            return;
                        }
                        backoff = (backoff * 2).min(Duration::from_secs(5));
                        continue;
                    }
                }
            }
            let opts = StreamReadOptions::default().block(BLOCK_MS).count(1000);
            let stream = [self.keys.events()];
            let from = [last_id.clone()];
            let read = tokio::select! {
                r = self.events.xread_options::<_, _, StreamReadReply>(&stream, &from, &opts) => r,
                _ = shutdown.cancelled() => return,
            };
            match read {
                Ok(reply) => {
                    backoff = Duration::from_millis(100);
                    for key in reply.keys {
                        for entry in key.ids {
                            if let Some(c) = change_of(&entry) {
                                self.send(c);
                            }
                            last_id = entry.id;
                        }
                    }
                }
                Err(e) => {
                    tracing::warn!(error = %e, "Following ban events failed; will reconcile.");
                    // After any gap the whole list is read again.
                    next_reconcile = tokio::time::Instant::now();
                    if sleep_or_stop(backoff, &shutdown).await {
                        return;
                    }
                    backoff = (backoff * 2).min(Duration::from_secs(5));
                }
            }
        }
    }
}

async fn sleep_or_stop(d: Duration, shutdown: &CancellationToken) -> bool {
    tokio::select! {
        _ = tokio::time::sleep(d) => false,
        _ = shutdown.cancelled() => true,
    }
}

/// One stream entry as a change; entries whose address does not parse are
/// dropped with a warning (nothing unparsed reaches nft).
fn change_of(entry: &redis::streams::StreamId) -> Option<Change> {
    let field = |k: &str| entry.get::<String>(k);
    let op = field("op")?;
    let addr = field("addr")?;
    let Some(net) = store::parse_member(&addr) else {
        tracing::warn!(member = %addr.escape_debug(), "Ban event for something that is not an address; ignored.");
        return None;
    };
    match op.as_str() {
        "ban" => {
            let until = parse_until(&field("until")?)?;
            Some(Change::Add(vec![Element { net, until }]))
        }
        "unban" => Some(Change::Remove(vec![net])),
        _ => None,
    }
}
