//! One target's sender task: takes its queue's messages in order and POSTs
//! each, within [`TIMEOUT`] an attempt; a 5xx, a connection error or a
//! timeout is tried again after 1, 2, 4, 8 s ([`ATTEMPTS`] in all), a 4xx
//! never. Failures are counted, the last kept for `status`, and warned
//! about once a minute at most. Meanwhile the queue takes and folds what
//! comes (it is bounded): the pipeline never waits for a target.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::fold::{Message, Queue};
use super::post::{post, sign};
use super::{format, note_error, TargetInfo};
use crate::config::NotifyConfig;

/// One attempt's bound, connect to status line.
pub const TIMEOUT: Duration = Duration::from_secs(5);
/// Attempts per message.
pub const ATTEMPTS: u32 = 5;
const FIRST_BACKOFF: Duration = Duration::from_secs(1);
const WARN_EVERY: Duration = Duration::from_secs(60);

pub async fn run(
    config: NotifyConfig,
    secret: Option<Vec<u8>>,
    queue: Arc<Queue>,
    info: TargetInfo,
    shutdown: CancellationToken,
) {
    let mut warnings = crate::ratelog::Every::default();
    loop {
        let Some(message) = queue.take(crate::now_ms()) else {
            let due = queue
                .summary_due()
                .map(|at| tokio::time::Instant::now() + Duration::from_millis((at - crate::now_ms()).max(0) as u64));
            tokio::select! {
                _ = shutdown.cancelled() => return,
                _ = queue.wake.notified() => {}
                _ = sleep_until(due) => {}
            }
            continue;
        };
        let outcome = tokio::select! {
            _ = shutdown.cancelled() => return,
            r = deliver(&config, secret.as_deref(), &message) => r,
        };
        let c = &info.counters;
        match outcome {
            Ok(()) => {
                c.sent.fetch_add(1, Relaxed);
            }
            Err(error) => {
                c.failed.fetch_add(1, Relaxed);
                if let Some(n) = warnings.note(1, WARN_EVERY) {
                    tracing::warn!(target_url = %info.origin, error = %error, failed = n,
                        "Notify: a message could not be delivered; given up on it.");
                }
                note_error(c, error);
            }
        }
    }
}

/// Sends one message, retrying what may succeed later.
async fn deliver(config: &NotifyConfig, secret: Option<&[u8]>, message: &Message) -> Result<(), String> {
    let body = format::body(config.format, message);
    let signature = secret.map(|k| sign(k, &body.bytes));
    let mut wait = FIRST_BACKOFF;
    let mut attempt = 1;
    loop {
        match post(&config.endpoint, &body, signature.as_deref(), TIMEOUT).await {
            Ok(_) => return Ok(()),
            Err(e) if e.retryable() && attempt < ATTEMPTS => {
                tracing::debug!(error = %e, attempt, "Notify: retrying.");
                tokio::time::sleep(wait).await;
                wait *= 2;
                attempt += 1;
            }
            Err(e) => return Err(format!("{e} (attempt {attempt})")),
        }
    }
}

/// `check --online --notify-test`: one test message to `config`, one
/// attempt; the status, or why not.
pub async fn test(config: &NotifyConfig, host: &str) -> Result<u16, String> {
    let secret = match &config.secret_file {
        Some(p) => Some(crate::config::read_secret(p)?),
        None => None,
    };
    let message = Message::Event(super::Event::Test {
        host: host.to_owned(),
        at_ms: crate::now_ms(),
    });
    let body = format::body(config.format, &message);
    let signature = secret.map(|k| sign(&k, &body.bytes));
    post(&config.endpoint, &body, signature.as_deref(), TIMEOUT)
        .await
        .map_err(|e| e.to_string())
}

async fn sleep_until(at: Option<tokio::time::Instant>) {
    match at {
        Some(t) => tokio::time::sleep_until(t).await,
        None => std::future::pending().await,
    }
}
