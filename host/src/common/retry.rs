//! One retry vocabulary, on `backon`: how long, how often and on which errors Carteiro tries
//! something again. Every site that retries names a [`Policy`] from here (reconnects, store
//! waits, publishes, marks) instead of writing its own delays (docs/architecture.md, "One
//! retry vocabulary").
//!
//! - [`Backoff`]: the delays of a loop that runs until it succeeds (reconnect, wait for the
//!   store), with [`Backoff::reset`] after a success.
//! - [`retry_transient`]: try an async operation a few times while its error is transient.
//! - [`Policy::delay_after`]: the delay after a number of failures counted elsewhere (a
//!   row's attempts, kept in the table).

use std::future::Future;
use std::time::Duration;

use backon::{BackoffBuilder, ExponentialBackoff, ExponentialBuilder, Retryable};

/// First broker reconnect: a blip costs little, and a dead broker is not hammered.
const RECONNECT_FIRST: Duration = Duration::from_millis(100);
/// First look at a store in an outage: a short blip resumes a held delivery at once.
const STORE_OUTAGE_FIRST: Duration = Duration::from_millis(200);
/// Longest wait for a store in an outage: consumption resumes within ~5 s of its return.
const STORE_OUTAGE_MAX: Duration = Duration::from_secs(5);
/// First retry of a store write nobody waits on (start-up, a canary decision).
const STORE_PATIENT_FIRST: Duration = Duration::from_millis(250);
/// Longest wait between such writes: each failure logs, so at most a line every 5-10 s.
const STORE_PATIENT_MAX: Duration = Duration::from_secs(10);
/// A row's first retry after a failed publish: a nack or a missing binding rarely clears
/// faster, and every try of an unroutable row is a returned message and a log line.
const ROW_PUBLISH_FIRST: Duration = Duration::from_secs(1);
/// A row failing for ever (nothing bound) is still tried once a minute, so it goes out
/// within a minute of the binding.
const ROW_PUBLISH_MAX: Duration = Duration::from_secs(60);
/// First retry of a failed mark write: confirmed rows wait in memory meanwhile.
const MARK_FIRST: Duration = Duration::from_millis(100);
/// Longest wait between mark writes: the relay's window stays full while marks wait.
const MARK_MAX: Duration = Duration::from_millis(3_200);
/// Between tries at recording a confirmed replay or edit: rides out a store blip.
const AFTER_CONFIRM_PAUSE: Duration = Duration::from_millis(500);
/// Tries at recording a confirmed replay or edit before the run stops for the store.
const AFTER_CONFIRM_TRIES: usize = 3;
/// Between tries at the store's LISTEN connection: the poll interval covers the gap.
const WAKEUPS_PAUSE: Duration = Duration::from_secs(1);

/// A broker connection (routes, relay): from [`RECONNECT_FIRST`] up to `[broker]
/// reconnect_max_backoff`.
pub fn reconnect(max: Duration) -> Policy {
    Policy::jittered(RECONNECT_FIRST, max)
}

/// A store outage: the gate's write probe, a delivery or a dead letter held in place.
pub const STORE_OUTAGE: Policy = Policy::jittered(STORE_OUTAGE_FIRST, STORE_OUTAGE_MAX);
/// A store write nothing waits on but a log line: the store at start-up, a canary decision.
pub const STORE_PATIENT: Policy = Policy::jittered(STORE_PATIENT_FIRST, STORE_PATIENT_MAX);
/// An outbox row whose publish failed (unroutable, nacked, no confirm): by its attempts.
pub const ROW_PUBLISH: Policy = Policy::doubling(ROW_PUBLISH_FIRST, ROW_PUBLISH_MAX);
/// The relay's write of "published" marks.
pub const MARK: Policy = Policy::doubling(MARK_FIRST, MARK_MAX);
/// Recording a replay or an edit whose copy the broker confirmed (transient errors only).
pub const AFTER_CONFIRM: Policy = Policy::constant(AFTER_CONFIRM_PAUSE).tries(AFTER_CONFIRM_TRIES);
/// The store's LISTEN connection for commit wake-ups.
pub const WAKEUPS: Policy = Policy::constant(WAKEUPS_PAUSE);

/// How a site retries: delays doubling from `min` to `max`, jittered or exact, and how many
/// tries in all (for [`retry_transient`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Policy {
    min: Duration,
    max: Duration,
    jitter: bool,
    tries: Option<usize>,
}

impl Policy {
    /// Doubling from `min`, each delay stretched by a random share of itself, so processes
    /// that lost the same service do not all come back in the same instant. backon's jitter
    /// adds up to the delay again, so the doubling stops at half of `max` and no delay
    /// exceeds `max` (or twice `min`, where that is larger).
    pub const fn jittered(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            jitter: true,
            tries: None,
        }
    }

    /// Doubling from `min` up to `max`, exactly.
    pub const fn doubling(min: Duration, max: Duration) -> Self {
        Self {
            min,
            max,
            jitter: false,
            tries: None,
        }
    }

    /// The same delay every time.
    pub const fn constant(delay: Duration) -> Self {
        Self::doubling(delay, delay)
    }

    /// At most `tries` attempts in all, for [`retry_transient`] (at least one).
    pub const fn tries(mut self, tries: usize) -> Self {
        self.tries = Some(tries);
        self
    }

    fn builder(&self) -> ExponentialBuilder {
        let builder = ExponentialBuilder::new().with_min_delay(self.min);
        let builder = if self.jitter {
            builder
                .with_max_delay((self.max / 2).max(self.min))
                .with_jitter()
        } else {
            builder.with_max_delay(self.max.max(self.min))
        };
        match self.tries {
            Some(tries) => builder.with_max_times(tries.saturating_sub(1)),
            None => builder.without_max_times(),
        }
    }

    /// The delays of a loop that retries until it succeeds.
    pub fn backoff(&self) -> Backoff {
        let builder = self.builder().without_max_times();
        Backoff {
            builder,
            delays: builder.build(),
            max: self.max,
        }
    }

    /// The delay after `failures` failures in a row, counted elsewhere (at least one).
    pub fn delay_after(&self, failures: u32) -> Duration {
        // The delay stops growing at `max` long before 64 doublings.
        let nth = failures.clamp(1, 64) as usize - 1;
        self.backoff().delays.nth(nth).unwrap_or(self.max)
    }
}

/// The delays of one retry loop, from a [`Policy`]; [`reset`](Self::reset) after a success.
#[derive(Debug)]
pub struct Backoff {
    builder: ExponentialBuilder,
    delays: ExponentialBackoff,
    max: Duration,
}

impl Backoff {
    /// The delay to wait before the next attempt.
    pub fn next_delay(&mut self) -> Duration {
        // Built without a limit on attempts, the iterator never ends.
        self.delays.next().unwrap_or(self.max)
    }

    /// Back to the shortest delays, after a success.
    pub fn reset(&mut self) {
        self.delays = self.builder.build();
    }
}

/// Runs `op` until it succeeds, its error is not transient, or `policy`'s tries are spent;
/// returns its last result. The error type's own classification says what is transient
/// (`StoreError::is_transient`).
pub async fn retry_transient<T, E, Fut>(
    policy: Policy,
    op: impl FnMut() -> Fut,
    is_transient: impl FnMut(&E) -> bool,
) -> Result<T, E>
where
    Fut: Future<Output = Result<T, E>>,
{
    op.retry(policy.builder())
        .sleep(tokio::time::sleep)
        .when(is_transient)
        .await
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};

    #[test]
    fn jittered_delays_grow_stay_in_bounds_and_reset() {
        let (min, max) = (Duration::from_millis(10), Duration::from_millis(500));
        let mut b = Policy::jittered(min, max).backoff();
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

    #[test]
    fn a_failed_row_waits_one_second_doubling_up_to_a_minute() {
        let ms: Vec<u64> = (1..=9)
            .map(|n| ROW_PUBLISH.delay_after(n).as_millis() as u64)
            .collect();
        assert_eq!(
            ms,
            [
                1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 60_000, 60_000, 60_000
            ]
        );
        assert_eq!(ROW_PUBLISH.delay_after(0), ROW_PUBLISH.delay_after(1));
        assert_eq!(ROW_PUBLISH.delay_after(u32::MAX), ROW_PUBLISH_MAX);
        let marks: Vec<u128> = (1..=8).map(|n| MARK.delay_after(n).as_millis()).collect();
        assert_eq!(marks, [100, 200, 400, 800, 1_600, 3_200, 3_200, 3_200]);
    }

    /// Calls `retry_transient` with AFTER_CONFIRM's tries (without its pauses) on an
    /// operation failing with `errors` in turn, then succeeding; returns the result and the
    /// calls made.
    async fn tried(errors: &[&'static str]) -> (Result<u32, &'static str>, u32) {
        let policy = Policy {
            min: Duration::from_millis(1),
            max: Duration::from_millis(1),
            ..AFTER_CONFIRM
        };
        let calls = AtomicU32::new(0);
        let result = retry_transient(
            policy,
            || async {
                let call = calls.fetch_add(1, Ordering::Relaxed);
                errors.get(call as usize).map_or(Ok(call), |e| Err(*e))
            },
            |e: &&str| *e == "down",
        )
        .await;
        (result, calls.load(Ordering::Relaxed))
    }

    #[tokio::test]
    async fn transient_errors_are_tried_again_until_the_tries_are_spent() {
        assert_eq!(
            tried(&["down"; 5]).await,
            (Err("down"), 3),
            "three tries in all"
        );
        assert_eq!(
            tried(&["bad data"]).await,
            (Err("bad data"), 1),
            "a permanent error at once"
        );
        assert_eq!(tried(&["down"]).await, (Ok(1), 2), "a blip is ridden out");
    }
}
