//! The outbox: what the relay published or failed to, and what waits (read from the store at
//! each scrape by the admin server).

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
    /// Unpublished outbox rows (read from the store at each scrape).
    pub pending: Gauge,
    /// Age of the oldest unpublished outbox row, 0 when none (read at each scrape).
    pub oldest_pending_seconds: Gauge<f64, AtomicU64>,
    /// Unpublished outbox rows whose last publish failed (read at each scrape).
    pub with_errors: Gauge,
}

impl OutboxMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let parts = Self {
            published: Counter::default(),
            failed: Counter::default(),
            pending: Gauge::default(),
            oldest_pending_seconds: Gauge::<f64, AtomicU64>::default(),
            with_errors: Gauge::default(),
        };
        registry.register(
            "outbox_published",
            "Outbox rows confirmed",
            parts.published.clone(),
        );
        registry.register(
            "outbox_publish_failures",
            "Outbox publishes that failed",
            parts.failed.clone(),
        );
        registry.register(
            "outbox_pending",
            "Unpublished outbox rows",
            parts.pending.clone(),
        );
        registry.register(
            "outbox_oldest_pending_seconds",
            "Age of the oldest unpublished outbox row (0 when none)",
            parts.oldest_pending_seconds.clone(),
        );
        registry.register(
            "outbox_failing",
            "Unpublished outbox rows whose last publish attempt failed",
            parts.with_errors.clone(),
        );
        parts
    }
}
