//! The store as the pipeline's gate sees it: answering or not, and how often it stopped.

use super::RegisterExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Store availability (`pipeline::StoreGate`).
pub struct StoreGateMetrics {
    /// 1 while the store answers, 0 while the store gate holds consumption.
    pub available: Gauge,
    /// Times the store gate closed.
    pub outages: Counter,
}

impl StoreGateMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let parts = Self {
            available: registry.new_metric(
                "store_available",
                "1 while the store answers, 0 while consumption waits for it",
            ),
            outages: registry.new_metric(
                "store_outages",
                "Times the store became unavailable and consumption paused",
            ),
        };
        parts.available.set(1);
        parts
    }
}
