//! Dead-letter replays run in this process (`dlq`).

use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Replays' progress.
pub struct ReplayMetrics {
    /// Dead letters replayed (published, confirmed, marked) by replays in this process.
    pub replayed: Counter,
    /// Replays of a dead letter that failed (left unreplayed for the next run).
    pub failed: Counter,
    /// Rows the running replays still have to do.
    pub remaining: Gauge,
    /// Replays running now.
    pub running: Gauge,
}

impl ReplayMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let parts = Self {
            replayed: Counter::default(),
            failed: Counter::default(),
            remaining: Gauge::default(),
            running: Gauge::default(),
        };
        registry.register(
            "replay_replayed",
            "Dead letters replayed by replays run in this process",
            parts.replayed.clone(),
        );
        registry.register(
            "replay_failed",
            "Dead-letter replays that failed (the row stays unreplayed)",
            parts.failed.clone(),
        );
        registry.register(
            "replay_remaining",
            "Rows the running replays have still to replay",
            parts.remaining.clone(),
        );
        registry.register(
            "replay_running",
            "Replays running now",
            parts.running.clone(),
        );
        parts
    }
}
