//! Reconnect delays: exponential growth with full jitter.

use std::time::Duration;

use rand::Rng;

/// Delays for reconnect and resubscribe loops.
///
/// The ceiling doubles from `min` up to `max` with each failure; each delay is drawn
/// uniformly between `min` and that ceiling ("full jitter"), so gateways that lost the same
/// broker do not all come back in the same instant. Call [`reset`](Self::reset) after a
/// success.
#[derive(Debug, Clone)]
pub struct JitteredBackoff {
    min: Duration,
    max: Duration,
    failures: u32,
}

impl JitteredBackoff {
    /// `min` is both the first ceiling and the floor of every delay; `max` caps the ceiling.
    pub fn new(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max: max.max(min),
            failures: 0,
        }
    }

    /// The delay to wait before the next attempt; counts one more failure.
    pub fn next_delay(&mut self) -> Duration {
        let ceiling = self.ceiling();
        self.failures = self.failures.saturating_add(1);
        if ceiling <= self.min {
            return self.min;
        }
        rand::rng().random_range(self.min..=ceiling)
    }

    /// Back to the shortest delays, after a connection or subscription succeeded.
    pub fn reset(&mut self) {
        self.failures = 0;
    }

    /// Failures counted since the last reset.
    pub fn failures(&self) -> u32 {
        self.failures
    }

    fn ceiling(&self) -> Duration {
        // 2^20 × min is far beyond any sensible max; capping the shift avoids overflow.
        let factor = 1u32 << self.failures.min(20);
        self.min.saturating_mul(factor).min(self.max)
    }
}

impl Default for JitteredBackoff {
    fn default() -> Self {
        Self::new(Duration::from_millis(100), Duration::from_secs(30))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn delays_grow_stay_in_bounds_and_reset() {
        let (min, max) = (Duration::from_millis(10), Duration::from_millis(500));
        let mut b = JitteredBackoff::new(min, max);
        for i in 0..40 {
            let ceiling = min.saturating_mul(1 << i.min(20)).min(max);
            let d = b.next_delay();
            assert!(
                d >= min && d <= ceiling,
                "delay {d:?} outside {min:?}..={ceiling:?}"
            );
        }
        assert_eq!(b.failures(), 40);
        // After many failures the draws spread over the whole range, not just near min.
        assert!(
            (0..200)
                .map(|_| b.next_delay())
                .any(|d| d > Duration::from_millis(250))
        );
        b.reset();
        assert_eq!(b.failures(), 0);
        assert!(b.next_delay() <= Duration::from_millis(10));
    }
}
