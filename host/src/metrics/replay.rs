//! Dead-letter replays run in this process (`dlq`).

use super::RegisterExt;
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
        Self {
            replayed: registry.new_metric(
                "replay_replayed",
                "Dead letters replayed by replays run in this process",
            ),
            failed: registry.new_metric(
                "replay_failed",
                "Dead-letter replays that failed (the row stays unreplayed)",
            ),
            remaining: registry.new_metric(
                "replay_remaining",
                "Rows the running replays have still to replay",
            ),
            running: registry.new_metric("replay_running", "Replays running now"),
        }
    }
}
