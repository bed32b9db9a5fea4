//! Application outboxes (`[[outboxes]]`), per outbox: what is pending, failing and parked
//! (read from the tables every few seconds by the outbox's relay), rows published, and
//! whether this relay leads.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;
use std::collections::BTreeMap;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;

use super::{Metrics, RegisterExt};

/// The `outbox` label: an `[[outboxes]]` entry's `name`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outbox {
    outbox: String,
}

/// Per application outbox.
pub struct AppOutboxMetrics {
    pending: Family<Outbox, Gauge>,
    oldest_pending_seconds: Family<Outbox, Gauge<f64, AtomicU64>>,
    failing: Family<Outbox, Gauge>,
    parked: Family<Outbox, Gauge>,
    published: Family<Outbox, Counter>,
    failed: Family<Outbox, Counter>,
    active: Family<Outbox, Gauge>,
    slot_lag_bytes: Family<Outbox, Gauge>,
    slot_lag_alert: Family<Outbox, Gauge>,
    /// The last of each, by outbox, for the console.
    last: Mutex<BTreeMap<String, AppOutboxSeen>>,
}

/// An application outbox as the console shows it.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct AppOutboxSeen {
    #[serde(flatten)]
    pub observed: AppOutboxObserved,
    /// This relay publishes it (`false`: it stands by, or has not started).
    pub active: bool,
    /// Rows this relay published since it started.
    pub published: u64,
}

/// What an outbox's table holds, for [`Metrics::app_outbox_observed`].
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct AppOutboxObserved {
    pub pending: i64,
    pub oldest_pending_seconds: f64,
    pub failing: i64,
    pub parked: i64,
}

impl AppOutboxMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            pending: registry.new_metric(
                "app_outbox_pending",
                "Rows of an application outbox still to publish (parked ones included)",
            ),
            oldest_pending_seconds: registry.new_metric(
                "app_outbox_oldest_pending_seconds",
                "Age of an application outbox's oldest row to publish (by columns.created_at), 0 when none",
            ),
            failing: registry.new_metric(
                "app_outbox_failing",
                "Rows of an application outbox whose publish failed and is retried with backoff",
            ),
            parked: registry.new_metric(
                "app_outbox_parked",
                "Rows of an application outbox that can never be published as they are (see carteiro outbox status)",
            ),
            published: registry.new_metric(
                "app_outbox_published",
                "Rows of an application outbox published (confirmed) and marked by this relay",
            ),
            failed: registry.new_metric(
                "app_outbox_publish_failures",
                "Failed publishes of an application outbox's rows (nack, returned, timeout, unpublishable)",
            ),
            active: registry.new_metric(
                "app_outbox_active",
                "1 while this relay publishes the application outbox, 0 while it stands by",
            ),
            slot_lag_bytes: registry.new_metric(
                "app_outbox_cdc_slot_lag_bytes",
                "mode = \"cdc\": WAL bytes the application outbox's replication slot holds back",
            ),
            slot_lag_alert: registry.new_metric(
                "app_outbox_cdc_slot_lag_alert",
                "mode = \"cdc\": 1 while the slot holds back more than the outbox's max_slot_lag",
            ),
            last: Mutex::default(),
        }
    }
}

impl Metrics {
    fn outbox_label(outbox: &str) -> Outbox {
        Outbox {
            outbox: outbox.to_owned(),
        }
    }

    /// `outbox`'s table as last read.
    pub fn app_outbox_observed(&self, outbox: &str, seen: AppOutboxObserved) {
        let m = &self.app_outboxes;
        let label = Self::outbox_label(outbox);
        m.pending.get_or_create(&label).set(seen.pending);
        m.oldest_pending_seconds
            .get_or_create(&label)
            .set(seen.oldest_pending_seconds);
        m.failing.get_or_create(&label).set(seen.failing);
        m.parked.get_or_create(&label).set(seen.parked);
        self.app_outbox_seen(outbox, |s| s.observed = seen);
    }

    fn app_outbox_seen(&self, outbox: &str, update: impl FnOnce(&mut AppOutboxSeen)) {
        if let Ok(mut last) = self.app_outboxes.last.lock() {
            update(last.entry(outbox.to_owned()).or_default());
        }
    }

    /// Every application outbox this process relays, as last seen.
    pub fn app_outboxes_seen(&self) -> BTreeMap<String, AppOutboxSeen> {
        self.app_outboxes
            .last
            .lock()
            .map(|l| l.clone())
            .unwrap_or_default()
    }

    /// `n` rows of `outbox` published and marked.
    pub fn app_outbox_published(&self, outbox: &str, n: u64) {
        self.app_outboxes
            .published
            .get_or_create(&Self::outbox_label(outbox))
            .inc_by(n);
        self.app_outbox_seen(outbox, |s| s.published += n);
    }

    /// `n` more failed publishes of `outbox`'s rows.
    pub fn app_outbox_failed(&self, outbox: &str, n: u64) {
        self.app_outboxes
            .failed
            .get_or_create(&Self::outbox_label(outbox))
            .inc_by(n);
    }

    /// `outbox`'s replication slot holds back `bytes` of WAL; `alert`: over its bound.
    pub fn app_outbox_slot_lag(&self, outbox: &str, bytes: i64, alert: bool) {
        let label = Self::outbox_label(outbox);
        let m = &self.app_outboxes;
        m.slot_lag_bytes.get_or_create(&label).set(bytes);
        m.slot_lag_alert.get_or_create(&label).set(i64::from(alert));
    }

    /// This relay leads `outbox` (`true`) or stands by.
    pub fn app_outbox_active(&self, outbox: &str, active: bool) {
        self.app_outboxes
            .active
            .get_or_create(&Self::outbox_label(outbox))
            .set(i64::from(active));
        self.app_outbox_seen(outbox, |s| s.active = active);
    }
}
