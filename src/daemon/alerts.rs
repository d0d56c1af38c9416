//! The events no ban carries, for `notify:` targets: the safety valve
//! tripped (it refused a ban) and cleared (a minute without refusing), and
//! Redis down and up again, as `status` says them (`Stats::valve_state`,
//! `Stats::redis_state`), read once a second: nothing on the pipeline's path.

use std::sync::atomic::Ordering::Relaxed;
use std::sync::Arc;
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use super::stats::Stats;
use crate::notify::{Event, Notifier};

pub async fn run(stats: Arc<Stats>, notifier: Notifier, host: String, shutdown: CancellationToken) {
    let mut tick = tokio::time::interval(Duration::from_secs(1));
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let (mut tripped, mut down) = (false, false);
    loop {
        tokio::select! {
            _ = shutdown.cancelled() => return,
            _ = tick.tick() => {}
        }
        let now = crate::now_ms();
        let valve = stats.valve_state() == "tripped";
        if valve != tripped {
            tripped = valve;
            notifier.send(Event::Valve {
                tripped,
                host: host.clone(),
                at_ms: now,
                refused: stats.bans.refused.load(Relaxed),
                max_bans_per_minute: stats.valve_limit,
            });
        }
        // `connecting` (not answered yet) is neither: only a change between
        // answering and not is told.
        let state = stats.redis_state();
        let is_down = match state {
            "down" => true,
            "connected" => false,
            _ => down,
        };
        if is_down != down {
            down = is_down;
            notifier.send(Event::Redis {
                down,
                host: host.clone(),
                at_ms: now,
            });
        }
    }
}
