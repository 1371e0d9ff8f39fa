//! Rate limiting for log lines that a bad publisher could otherwise trigger at the sensor rate.

use std::time::{Duration, Instant};

/// Lets one event through per `period`, counting the ones it holds back.
#[derive(Debug)]
pub struct RateLimiter {
    period: Duration,
    last: Option<Instant>,
    suppressed: u64,
}

impl RateLimiter {
    pub fn new(period: Duration) -> Self {
        Self { period, last: None, suppressed: 0 }
    }

    /// `Some(n)` when the caller should log now, `n` being the events held back since the last
    /// one logged; `None` when this one is to be held back.
    pub fn check(&mut self, now: Instant) -> Option<u64> {
        match self.last {
            Some(t) if now.duration_since(t) < self.period => {
                self.suppressed += 1;
                None
            }
            _ => {
                self.last = Some(now);
                Some(std::mem::take(&mut self.suppressed))
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_per_period_with_suppressed_count() {
        let mut r = RateLimiter::new(Duration::from_secs(5));
        let t0 = Instant::now();
        assert_eq!(r.check(t0), Some(0));
        assert_eq!(r.check(t0 + Duration::from_secs(1)), None);
        assert_eq!(r.check(t0 + Duration::from_secs(2)), None);
        assert_eq!(r.check(t0 + Duration::from_secs(5)), Some(2));
        assert_eq!(r.check(t0 + Duration::from_secs(6)), None);
    }
}
