//! The wasm runtime's plugin instances: made, and reused for another delivery (plugins with
//! `isolation = "per-batch"`), per plugin version. Their ratio is the reuse an operator sees.

use super::{Metrics, PluginVersion, RegisterExt};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// Plugin instances made and reused.
pub struct InstanceMetrics {
    created: Family<PluginVersion, Counter>,
    reused: Family<PluginVersion, Counter>,
}

impl InstanceMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            created: registry.new_metric(
                "plugin_instances_created",
                "Plugin instances made, by plugin and version (one per delivery unless the plugin's isolation is per-batch)",
            ),
            reused: registry.new_metric(
                "plugin_instance_reuses",
                "Deliveries served by a plugin instance that had served one before (isolation per-batch), by plugin and version",
            ),
        }
    }
}

impl Metrics {
    /// An instance of `plugin` at `version` began a delivery: a new one, or `reused`.
    pub fn plugin_instance(&self, plugin: &str, version: &str, reused: bool) {
        let family = if reused {
            &self.instances.reused
        } else {
            &self.instances.created
        };
        family
            .get_or_create(&PluginVersion::of(plugin, version))
            .inc();
    }

    /// Exports both counters of `plugin` at `version` at 0 once it is loaded, so `rate()`
    /// counts its first instances.
    pub(super) fn plugin_instances_started(&self, plugin: &str, version: &str) {
        let label = PluginVersion::of(plugin, version);
        let _ = self.instances.created.get_or_create(&label);
        let _ = self.instances.reused.get_or_create(&label);
    }

    /// Instances of `plugin` at `version` made, and deliveries they served after their first
    /// (for tests).
    pub fn plugin_instances(&self, plugin: &str, version: &str) -> (u64, u64) {
        let label = PluginVersion::of(plugin, version);
        (
            self.instances.created.get_or_create(&label).get(),
            self.instances.reused.get_or_create(&label).get(),
        )
    }
}
