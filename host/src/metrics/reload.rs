//! Reloads (`live`): applied, refused, and whether the last one was applied.

use super::RegisterExt;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Reloads (SIGHUP, `POST /admin/reload`).
pub struct ReloadMetrics {
    /// Reloads applied.
    pub applied: Counter,
    /// Reloads refused (the old config and plugins kept running).
    pub failures: Counter,
    /// 1 when the last reload was applied (or none was tried), 0 when it was refused.
    pub success: Gauge,
}

impl ReloadMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let parts = Self {
            applied: registry.new_metric("reloads", "Reloads applied"),
            failures: registry.new_metric(
                "reload_failures",
                "Reloads refused; the running config and plugins were kept",
            ),
            success: registry.new_metric(
                "config_reload_success",
                "1 if the last reload was applied (or none was tried), 0 if it was refused",
            ),
        };
        parts.success.set(1);
        parts
    }
}
