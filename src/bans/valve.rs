//! The safety valve: at most `max_bans_per_minute` new bans per host. Past
//! it, bans are logged and counted but not applied, so that a rule that
//! matches everything cannot cut a site off the internet.

use std::collections::VecDeque;

pub struct SafetyValve {
    max_per_minute: u32,
    /// Times (ms) of the bans let through in the last minute.
    recent: VecDeque<i64>,
    /// Bans refused since start.
    pub refused: u64,
}

impl SafetyValve {
    pub fn new(max_per_minute: u32) -> SafetyValve {
        SafetyValve {
            max_per_minute,
            recent: VecDeque::new(),
            refused: 0,
        }
    }

    /// Whether one more ban may be applied at `now_ms`; counts it if so.
    pub fn admit(&mut self, now_ms: i64) -> bool {
        while self.recent.front().is_some_and(|&t| t <= now_ms - 60_000) {
            self.recent.pop_front();
        }
        if self.recent.len() >= self.max_per_minute as usize {
            self.refused += 1;
            return false;
        }
        self.recent.push_back(now_ms);
        true
    }

    pub fn is_open(&self) -> bool {
        self.recent.len() >= self.max_per_minute as usize
    }

    pub fn set_max(&mut self, max_per_minute: u32) {
        self.max_per_minute = max_per_minute;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn caps_per_minute() {
        let mut v = SafetyValve::new(2);
        assert!(v.admit(0));
        assert!(v.admit(10));
        assert!(!v.admit(20));
        assert_eq!(v.refused, 1);
        assert!(v.admit(60_001));
    }
}
