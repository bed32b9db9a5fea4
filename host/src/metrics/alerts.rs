//! Dead-letter alerts (`alerts`): which routes' alerts are raised.

use super::{Metrics, Route};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Raised alerts, per route.
pub struct AlertMetrics {
    active: Family<Route, Gauge>,
}

impl AlertMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let parts = Self {
            active: Family::default(),
        };
        registry.register(
            "dead_letter_alert_active",
            "1 while a route's dead letters in its alert window are at or above its threshold",
            parts.active.clone(),
        );
        parts
    }
}

impl Metrics {
    /// The dead-letter alert of `route` is (`true`) or is not active.
    pub fn set_alert_active(&self, route: &str, active: bool) {
        self.alerts
            .active
            .get_or_create(&Route::of(route))
            .set(i64::from(active));
    }
}
