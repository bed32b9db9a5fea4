//! The outbox: what the relay published or failed to, and what waits (read from the store at
//! each scrape by the admin server).

use super::RegisterExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::sync::atomic::AtomicU64;

/// The relay's publishes and the outbox's backlog.
pub struct OutboxMetrics {
    /// Outbox rows published (confirmed) by the relay.
    pub published: Counter,
    /// Outbox publish failures (nack, returned, timeout).
    pub failed: Counter,
    /// Rows the in-process relay took straight from their commit (immediate dispatch).
    pub handed: Counter,
    /// Rows the relay claimed from the table (recovery, other processes, overflow).
    pub claimed: Counter,
    /// Unpublished outbox rows (read from the store at each scrape).
    pub pending: Gauge,
    /// Age of the oldest unpublished outbox row, 0 when none (read at each scrape).
    pub oldest_pending_seconds: Gauge<f64, AtomicU64>,
    /// Unpublished outbox rows whose last publish failed (read at each scrape).
    pub with_errors: Gauge,
    /// CDC relay: 1 while this relay reads the replication slot, 0 while it stands by.
    pub cdc_active: Gauge,
    /// CDC relay: WAL bytes the slot holds back (server position minus confirmed position).
    pub cdc_slot_lag_bytes: Gauge,
    /// CDC relay: 1 while the slot holds back more than `[relay] max_slot_lag`.
    pub cdc_slot_lag_alert: Gauge,
}

impl OutboxMetrics {
    /// While this process's CDC relay has its `max_slot_lag` alert raised: what the console's
    /// banner and `/readyz` say.
    pub fn slot_lag_alert(&self) -> Option<String> {
        (self.cdc_slot_lag_alert.get() == 1).then(|| {
            format!(
                "the outbox replication slot holds back {:.1} MiB of WAL, more than [relay] \
                 max_slot_lag: no relay is confirming (broker down, relay stopped or failing); \
                 see docs/relay.md",
                self.cdc_slot_lag_bytes.get() as f64 / f64::from(1u32 << 20)
            )
        })
    }

    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            published: registry.new_metric("outbox_published", "Outbox rows confirmed"),
            failed: registry.new_metric("outbox_publish_failures", "Outbox publishes that failed"),
            handed: registry.new_metric(
                "outbox_handed",
                "Outbox rows the relay took in memory straight from their commit",
            ),
            claimed: registry.new_metric(
                "outbox_claimed",
                "Outbox rows the relay claimed from the table",
            ),
            pending: registry.new_metric("outbox_pending", "Unpublished outbox rows"),
            oldest_pending_seconds: registry.new_metric(
                "outbox_oldest_pending_seconds",
                "Age of the oldest unpublished outbox row (0 when none)",
            ),
            with_errors: registry.new_metric(
                "outbox_failing",
                "Unpublished outbox rows whose last publish attempt failed",
            ),
            cdc_active: registry.new_metric(
                "relay_cdc_active",
                "1 while this CDC relay reads the replication slot, 0 while it stands by",
            ),
            cdc_slot_lag_bytes: registry.new_metric(
                "relay_cdc_slot_lag_bytes",
                "WAL bytes the outbox replication slot holds back",
            ),
            cdc_slot_lag_alert: registry.new_metric(
                "relay_cdc_slot_lag_alert",
                "1 while the replication slot holds back more than [relay] max_slot_lag",
            ),
        }
    }
}

#[cfg(test)]
mod tests {
    use crate::metrics::Metrics;

    #[test]
    fn the_slot_lag_alert_is_described_only_while_raised() {
        let metrics = Metrics::default();
        let outbox = &metrics.outbox;
        outbox.cdc_slot_lag_bytes.set(3 << 20);
        assert_eq!(outbox.slot_lag_alert(), None, "not raised");
        outbox.cdc_slot_lag_alert.set(1);
        let note = outbox.slot_lag_alert().expect("raised");
        assert!(
            note.starts_with("the outbox replication slot holds back 3.0 MiB of WAL"),
            "{note}"
        );
        outbox.cdc_slot_lag_alert.set(0);
        assert_eq!(outbox.slot_lag_alert(), None, "cleared");
    }
}
