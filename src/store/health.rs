//! Whether Redis answers, as this host's users of one connection last saw
//! it. The limiter and the ban list share one [`Health`]: when either finds
//! Redis down, the other stops paying a timeout per call and decides locally
//! (`redis.on_down`) until the backoff says to try again (100 ms, doubling
//! to 5 s); whichever sees it answer again ends the outage for both.
//!
//! With nothing else talking to Redis, [`heartbeat`] asks it (`PING`) each
//! half second that went by without an answer, so that `status` says
//! `down since T` within about a second of Redis dying, traffic or not.
//!
//! Only an outage counts ([`is_outage`]): no connection, a timeout, a
//! server that cannot serve (loading, a failover, a cluster down, refused
//! credentials). Redis answering a call with an error (a script error, OOM
//! under `maxmemory`, a command refused) is that call's failure, never an
//! outage: the host keeps deciding with Redis for every call that works.
//!
//! Every user counts each failed call here (the limiter, the ban list and
//! its queue, the fleet sync, the hot marks, the heartbeat): that total is
//! `status`'s `N error(s)`, and the warnings of failures carry it as
//! `errors=`, so the log and `status` count the same thing.

use std::sync::atomic::{AtomicU64, Ordering::Relaxed};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use tokio::time::Instant;

/// True if `e` says Redis cannot be used now (not reached, too slow, or
/// not serving), false if Redis answered this call with an error of its own.
pub fn is_outage(e: &redis::RedisError) -> bool {
    use redis::{ErrorKind, ServerErrorKind as S};
    if e.is_io_error() || e.is_timeout() || e.is_connection_dropped() || e.is_connection_refusal() {
        return true;
    }
    match e.kind() {
        ErrorKind::Server(S::BusyLoading | S::TryAgain | S::ClusterDown | S::MasterDown | S::ReadOnly) => true,
        ErrorKind::Server(_) | ErrorKind::Parse | ErrorKind::UnexpectedReturnType => false,
        ErrorKind::Extension => matches!(e.code(), Some("BUSY" | "NOAUTH" | "WRONGPASS" | "NOREPLICAS")),
        _ => true,
    }
}

/// Redis refused a write for its `maxmemory` (`maxmemory-policy noeviction`).
pub fn is_oom(e: &redis::RedisError) -> bool {
    e.code() == Some("OOM")
}

const FIRST_BACKOFF: Duration = Duration::from_millis(100);
const MAX_BACKOFF: Duration = Duration::from_secs(5);

#[derive(Clone)]
pub struct Health(Arc<Shared>);

struct Shared {
    state: Mutex<State>,
    /// Failed Redis operations (every attempt of every user, the
    /// heartbeat's pings included).
    errors: AtomicU64,
}

struct State {
    /// Redis answered the last time it was asked (false until it first does).
    connected: bool,
    down: bool,
    /// While down, Redis is tried again no earlier than this.
    next_try: Instant,
    backoff: Duration,
    /// Wall-clock ms the outage began (None while up).
    down_since_ms: Option<i64>,
    /// The last time Redis answered (any user).
    last_answer: Option<Instant>,
}

impl Default for Health {
    fn default() -> Health {
        Health(Arc::new(Shared {
            state: Mutex::new(State {
                connected: false,
                down: false,
                next_try: Instant::now(),
                backoff: FIRST_BACKOFF,
                down_since_ms: None,
                last_answer: None,
            }),
            errors: AtomicU64::new(0),
        }))
    }
}

impl Health {
    fn state(&self) -> MutexGuard<'_, State> {
        self.0.state.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Redis answered the last time it was asked.
    pub fn is_connected(&self) -> bool {
        self.state().connected
    }

    /// Known down: calls are not worth their timeout until [`Health::due`].
    pub fn is_down(&self) -> bool {
        self.state().down
    }

    /// Whether Redis should be tried now (always when up; with backoff when down).
    pub fn due(&self) -> bool {
        let s = self.state();
        !s.down || Instant::now() >= s.next_try
    }

    /// When Redis is next worth trying (in the past while up).
    pub fn next_try(&self) -> Instant {
        self.state().next_try
    }

    /// Redis did not answer: down, next try after the backoff. True if this
    /// starts an outage.
    pub fn failed(&self) -> bool {
        let mut s = self.state();
        let started = !s.down;
        if started {
            s.down_since_ms = Some(crate::now_ms());
        }
        s.down = true;
        s.connected = false;
        s.next_try = Instant::now() + s.backoff;
        s.backoff = (s.backoff * 2).min(MAX_BACKOFF);
        started
    }

    /// Redis answered. True if this ends an outage.
    pub fn succeeded(&self) -> bool {
        let mut s = self.state();
        let ended = s.down;
        s.down = false;
        s.down_since_ms = None;
        s.last_answer = Some(Instant::now());
        s.next_try = Instant::now();
        s.connected = true;
        s.backoff = FIRST_BACKOFF;
        ended
    }

    /// When the outage began (wall-clock ms); None while Redis answers.
    pub fn down_since(&self) -> Option<i64> {
        self.state().down_since_ms
    }

    /// Whether Redis answered within the last `d`.
    pub fn answered_within(&self, d: Duration) -> bool {
        self.state().last_answer.is_some_and(|t| t.elapsed() < d)
    }

    /// Counts one failed operation (`redis.errors` in `status`); returns
    /// how many failed before it.
    pub fn count_error(&self) -> u64 {
        self.0.errors.fetch_add(1, Relaxed)
    }

    pub fn errors(&self) -> u64 {
        self.0.errors.load(Relaxed)
    }
}

/// How long without an answer before [`heartbeat`] asks, and how long it
/// waits for the answer.
const QUIET: Duration = Duration::from_millis(500);

/// Keeps `health` true within about a second: each time Redis has not
/// answered anyone for [`QUIET`], one `PING` on `con` (a connection of its
/// own) with `wait` to answer (`redis.timeout`, at least [`QUIET`]: a
/// slower Redis counts as down, as for any command). A failure that is an outage starts one
/// (the limiter and the ban list stop paying timeouts); an answer ends one
/// (the queue then writes what it holds).
pub async fn heartbeat(
    mut con: super::Conn,
    health: Health,
    wait: Duration,
    shutdown: tokio_util::sync::CancellationToken,
) {
    let wait = wait.max(QUIET);
    let mut tick = tokio::time::interval(Duration::from_millis(250));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = shutdown.cancelled() => return,
        }
        if health.answered_within(QUIET) {
            continue;
        }
        let cmd = redis::cmd("PING");
        match tokio::time::timeout(wait, cmd.query_async::<String>(&mut con)).await {
            Ok(Ok(_)) => {
                if health.succeeded() {
                    tracing::info!("Redis answers again (heartbeat).");
                }
            }
            Ok(Err(e)) if !is_outage(&e) => {
                // Redis answered, with an error of its own: it is up.
                health.succeeded();
            }
            Ok(Err(e)) => {
                let errors = health.count_error() + 1;
                if health.failed() {
                    tracing::warn!(error = %e, errors, "Redis does not answer (heartbeat); deciding as redis.on_down says.");
                }
            }
            Err(_) => {
                let errors = health.count_error() + 1;
                if health.failed() {
                    tracing::warn!(
                        errors,
                        "Redis did not answer a PING within 500 ms (heartbeat); deciding as redis.on_down says."
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn an_error_redis_answered_is_no_outage() {
        let io = redis::RedisError::from(std::io::Error::from(std::io::ErrorKind::ConnectionRefused));
        assert!(is_outage(&io));
        let loading =
            redis::RedisError::from((redis::ErrorKind::Server(redis::ServerErrorKind::BusyLoading), "loading"));
        assert!(is_outage(&loading));
        let script = redis::RedisError::from((
            redis::ErrorKind::Server(redis::ServerErrorKind::ResponseError),
            "script",
        ));
        assert!(!is_outage(&script));
    }

    #[tokio::test(start_paused = true)]
    async fn down_backs_off_and_one_success_ends_it_for_every_holder() {
        let h = Health::default();
        let other = h.clone();
        assert!(!h.is_connected() && !h.is_down() && h.due());
        assert!(h.failed(), "starts an outage");
        assert!(h.down_since().is_some());
        assert!(!other.failed(), "already down");
        assert!(other.is_down() && !other.due());
        tokio::time::advance(Duration::from_millis(250)).await;
        assert!(h.due(), "after 100 ms then 200 ms of backoff");
        assert!(other.succeeded(), "ends the outage");
        assert!(h.is_connected() && !h.is_down() && h.due() && h.next_try() <= Instant::now());
        assert_eq!((h.count_error(), other.count_error(), h.errors()), (0, 1, 2));
    }
}
