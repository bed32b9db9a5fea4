//! Dead-letter alerts (`alerts`): which routes' alerts are raised.

use super::{Metrics, RegisterExt, Route, per_route};
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Raised alerts, per route.
pub struct AlertMetrics {
    active: Family<Route, Gauge>,
}

impl AlertMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            active: registry.new_metric(
                "dead_letter_alert_active",
                "1 while a route's dead letters in its alert window are at or above its threshold",
            ),
        }
    }
}

impl Metrics {
    /// The dead-letter alert of `route` is (`true`) or is not active.
    pub fn set_alert_active(&self, route: &str, active: bool) {
        per_route(&self.alerts.active, route).set(i64::from(active));
    }
}
