//! Routes with `batch`: how many deliveries each `handle-batch` call took.

use super::{Metrics, RegisterExt, Route, per_route};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;

/// Batch sizes per route.
pub struct BatchMetrics {
    sizes: Family<Route, Histogram>,
}

fn size_histogram() -> Histogram {
    // 1, 2, 4, ... 512: a batch holds at most the route's prefetch (a u16, 32 by default).
    Histogram::new(exponential_buckets(1.0, 2.0, 10))
}

impl BatchMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            sizes: registry.registered(
                "batch_size",
                "Deliveries handed to one handle-batch call, per route",
                Family::new_with_constructor(size_histogram as fn() -> Histogram),
            ),
        }
    }
}

impl Metrics {
    /// `route` called `handle-batch` with `size` deliveries.
    pub fn batch_size(&self, route: &str, size: usize) {
        per_route(&self.batches.sizes, route).observe(size as f64);
    }
}
