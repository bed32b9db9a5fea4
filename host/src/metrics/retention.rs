//! Retention (`housekeeping`): rows each table's purges deleted, and when each table's purge
//! last succeeded.

use super::{Metrics, RegisterExt};
use crate::common::labels::RetentionTable;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The `table` label.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Table {
    table: RetentionTable,
}

/// Retention purges, per table.
pub struct RetentionMetrics {
    purged: Family<Table, Counter>,
    last_success: Family<Table, Gauge<f64, AtomicU64>>,
}

impl RetentionMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            purged: registry.new_metric(
                "retention_purged",
                "Rows deleted by retention purges (housekeeping, once a minute)",
            ),
            last_success: registry.new_metric(
                "retention_last_success_timestamp_seconds",
                "Unix time at which the table's last retention purge succeeded",
            ),
        }
    }
}

impl Metrics {
    /// A retention purge of `table` succeeded at `at_ms` (unix ms), deleting `purged` rows.
    pub fn retention_purged(&self, table: RetentionTable, purged: u64, at_ms: i64) {
        let label = Table { table };
        self.retention.purged.get_or_create(&label).inc_by(purged);
        self.retention
            .last_success
            .get_or_create(&label)
            .set(at_ms as f64 / 1000.0);
    }
}
