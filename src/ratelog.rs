//! Rate limiting for repeated warnings: a daemon reading millions of lines,
//! or meeting the same Redis error on every call, must not write one log
//! line each. [`Every`] lets one message through per period and counts what
//! it held back.

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
    fn echoed_text_is_capped_at_a_char_boundary() {
        assert_eq!(cap("short"), "short");
        let long = "é".repeat(1000);
        let c = cap(&long);
        assert!(c.starts_with(&"é".repeat(32)) && c.ends_with("… (2000 bytes)"), "{c}");
        assert!(c.len() < 100);
    }
}
