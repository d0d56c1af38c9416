//! Rate limiting for repeated warnings: a daemon reading millions of lines
//! must not write one log line per bad line. [`Every`] lets one message
//! through per period and counts what it held back.

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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_message_per_period_with_the_count_held_back() {
        let mut e = Every::default();
        assert_eq!(e.note(3, Duration::from_secs(60)), Some(3));
        assert_eq!(e.note(5, Duration::from_secs(60)), None);
        assert_eq!(e.note(1, Duration::from_secs(60)), None);
        assert_eq!(e.note(2, Duration::ZERO), Some(8));
    }
}
