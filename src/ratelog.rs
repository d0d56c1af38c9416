//! Rate limiting for repeated warnings: a daemon reading millions of lines,
//! or meeting the same Redis error on every call, must not write one log
//! line each. [`Every`] lets one message through per period and counts what
//! it held back; [`Burst`] lets a few through per period and sums the rest.

use std::time::{Duration, Instant};

#[derive(Debug, Default)]
pub struct Every {
    last: Option<Instant>,
    /// Occurrences since the last message let through.
    held: u64,
}

impl Every {
    /// Records `n` occurrences; returns how many happened since the last
    /// message (this one included) when a message may be logged now.
    pub fn note(&mut self, n: u64, period: Duration) -> Option<u64> {
        self.held += n;
        let now = Instant::now();
        if self.last.is_some_and(|t| now.duration_since(t) < period) {
            return None;
        }
        self.last = Some(now);
        Some(std::mem::take(&mut self.held))
    }
}

/// A line per event up to `max` a period, then one summary: [`Burst::admit`]
/// says whether to log this one, [`Burst::summary`] (called at least once a
/// period) how many were held back since, once their period is over.
#[derive(Debug)]
pub struct Burst {
    /// Lines let through per period.
    max: u32,
    period: Duration,
    /// The start of the current period (None before the first event).
    since: Option<Instant>,
    /// Lines let through in the current period.
    logged: u32,
    /// Events held back since the last summary, with a label each (what
    /// the summary counts them by).
    held: std::collections::BTreeMap<String, u64>,
}

impl Burst {
    pub fn new(max: u32, period: Duration) -> Burst {
        Burst {
            max,
            period,
            since: None,
            logged: 0,
            held: Default::default(),
        }
    }

    /// True if this event gets its own line; otherwise it is counted under
    /// `label` for the summary.
    pub fn admit(&mut self, label: &str) -> bool {
        self.admit_at(label, Instant::now())
    }

    fn admit_at(&mut self, label: &str, now: Instant) -> bool {
        if self.since.is_none_or(|t| now.duration_since(t) >= self.period) {
            self.since = Some(now);
            self.logged = 0;
        }
        if self.logged < self.max {
            self.logged += 1;
            return true;
        }
        *self.held.entry(label.to_owned()).or_default() += 1;
        false
    }

    /// Once the period of the events held back is over: how many, and
    /// their labels with counts (`label:N,...`).
    pub fn summary(&mut self) -> Option<(u64, String)> {
        self.summary_at(Instant::now())
    }

    fn summary_at(&mut self, now: Instant) -> Option<(u64, String)> {
        if self.held.is_empty() || self.since.is_some_and(|t| now.duration_since(t) < self.period) {
            return None;
        }
        let held = std::mem::take(&mut self.held);
        let total = held.values().sum();
        let labels: Vec<String> = held.iter().map(|(l, n)| format!("{l}:{n}")).collect();
        Some((total, labels.join(",")))
    }
}

/// One retried step: its wait doubles with each of its own failures up to
/// a bound, its warning is let through once a period, and only its own
/// success resets both (a success of another step never does: a loop whose
/// read fails while its snapshot succeeds must not spin at the first delay).
#[derive(Debug)]
pub struct Retry {
    first: Duration,
    max: Duration,
    delay: Duration,
    warn: Every,
    failing: bool,
}

impl Retry {
    pub fn new(first: Duration, max: Duration) -> Retry {
        Retry {
            first,
            max,
            delay: first,
            warn: Every::default(),
            failing: false,
        }
    }

    /// A failure: how long to wait before the next try, and the count of
    /// failures since the last warning when one is due (once a `period`).
    pub fn failed(&mut self, period: Duration) -> (Duration, Option<u64>) {
        let wait = self.delay;
        self.delay = (self.delay * 2).min(self.max);
        self.failing = true;
        (wait, self.warn.note(1, period))
    }

    /// A success: whether it ends a run of failures (say so once).
    pub fn succeeded(&mut self) -> bool {
        self.delay = self.first;
        self.warn = Every::default();
        std::mem::take(&mut self.failing)
    }
}

/// At most [`CAP`] bytes of a text echoed into a log line (a reply, or a
/// member Redis holds, can be megabytes), then "… (N bytes)".
pub const CAP: usize = 64;

pub fn cap(s: &str) -> std::borrow::Cow<'_, str> {
    cap_at(s, CAP)
}

/// How much of an error message (Redis's, nft's) a log line echoes: enough
/// for the reason, not a poisoned value's megabyte.
pub const ERROR_CAP: usize = 400;

/// `s` as [`cap`] echoes it, cut at [`ERROR_CAP`] bytes: for error messages.
pub fn cap_error(s: &str) -> std::borrow::Cow<'_, str> {
    cap_at(s, ERROR_CAP)
}

fn cap_at(s: &str, at: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= at {
        return s.into();
    }
    let mut end = at;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}… ({} bytes)", &s[..end], s.len()).into()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_retry_backs_off_by_its_own_failures_and_warns_once_a_period() {
        let (first, max, period) = (
            Duration::from_millis(100),
            Duration::from_secs(5),
            Duration::from_secs(60),
        );
        let mut r = Retry::new(first, max);
        let waits: Vec<_> = (0..8).map(|_| r.failed(period)).collect();
        let ms: Vec<u128> = waits.iter().map(|(w, _)| w.as_millis()).collect();
        assert_eq!(ms, [100, 200, 400, 800, 1600, 3200, 5000, 5000]);
        assert_eq!(waits.iter().filter(|(_, warn)| warn.is_some()).count(), 1);
        assert!(r.succeeded());
        assert!(!r.succeeded());
        assert_eq!(r.failed(period), (first, Some(1)));
    }

    #[test]
    fn one_message_per_period_with_the_count_held_back() {
        let mut e = Every::default();
        assert_eq!(e.note(3, Duration::from_secs(60)), Some(3));
        assert_eq!(e.note(5, Duration::from_secs(60)), None);
        assert_eq!(e.note(1, Duration::from_secs(60)), None);
        assert_eq!(e.note(2, Duration::ZERO), Some(8));
    }

    #[test]
    fn a_few_lines_a_period_then_one_summary_by_label() {
        let (t0, period) = (Instant::now(), Duration::from_secs(1));
        let mut b = Burst::new(2, period);
        let admitted: Vec<bool> = ["a", "a", "b", "a", "b"].iter().map(|l| b.admit_at(l, t0)).collect();
        assert_eq!(admitted, [true, true, false, false, false]);
        assert_eq!(b.summary_at(t0), None, "not before the period is over");
        assert_eq!(b.summary_at(t0 + period), Some((3, "a:1,b:2".to_owned())));
        assert_eq!(b.summary_at(t0 + period), None, "summed once");
        assert!(b.admit_at("a", t0 + period), "a new period");
    }

    #[test]
    fn echoed_text_is_capped_at_a_char_boundary() {
        assert_eq!(cap("short"), "short");
        let long = "é".repeat(1000);
        let c = cap(&long);
        assert!(c.starts_with(&"é".repeat(32)) && c.ends_with("… (2000 bytes)"), "{c}");
        assert!(c.len() < 100);
    }
}
