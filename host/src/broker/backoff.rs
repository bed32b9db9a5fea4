//! Reconnect delays: exponential growth with jitter, from `backon`.

use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder};

/// Delays for reconnect and resubscribe loops.
///
/// The delay doubles from `min` with each failure, and each one is stretched by a random
/// share of itself, so gateways that lost the same broker do not all come back in the same
/// instant. backon's jitter adds up to the delay again, so the doubling stops at half of
/// `max` and no delay exceeds `max` (or twice `min`, where that is larger). Call
/// [`reset`](Self::reset) after a success.
#[derive(Debug)]
pub struct JitteredBackoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl JitteredBackoff {
    /// `min` is the first delay and the floor of every delay; `max` caps every delay.
    pub fn new(min: Duration, max: Duration) -> Self {
        let builder = ExponentialBuilder::new()
            .with_min_delay(min)
            .with_max_delay((max / 2).max(min))
            .with_jitter()
            .without_max_times();
        Self {
            builder,
            delays: builder.build(),
            max,
        }
    }

    /// The delay to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // Built without a limit on attempts, the iterator never ends.
        self.delays.next().unwrap_or(self.max)
    }

    /// Back to the shortest delays, after a connection or subscription succeeded.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
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
            let ceiling = min.saturating_mul(2 << i.min(20)).min(max);
            let d = b.next_delay();
            assert!(
                d >= min && d <= ceiling,
                "delay {i}: {d:?} outside {min:?}..={ceiling:?}"
            );
        }
        // After many failures the draws spread over the upper range, not one fixed value.
        let late: Vec<Duration> = (0..200).map(|_| b.next_delay()).collect();
        assert!(late.iter().any(|d| *d > Duration::from_millis(375)));
        assert!(late.iter().any(|d| *d < Duration::from_millis(375)));
        b.reset();
        assert!(b.next_delay() <= Duration::from_millis(20));
    }
}
