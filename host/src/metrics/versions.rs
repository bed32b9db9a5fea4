//! Which plugin versions run: deliveries per version, the version new deliveries run on,
//! live-shadow comparisons and canaries (the pipeline's `canary` and `shadow`, and reloads).

use super::{Metrics, PluginVersion, RegisterExt};
use crate::common::labels::Outcome as DeliveryOutcome;
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Deliveries by the plugin version they ran on (`version`: 12 hex digits of its digest).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionOutcome {
    route: String,
    version: String,
    outcome: DeliveryOutcome,
}

impl VersionOutcome {
    fn of(route: &str, version: &str, outcome: DeliveryOutcome) -> Self {
        Self {
            route: route.into(),
            version: version.into(),
            outcome,
        }
    }
}

/// Live-shadow comparisons (`version`: the shadow's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowRun {
    route: String,
    version: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabel {
    plugin: String,
}

/// Plugin versions, shadows and canaries.
pub struct VersionMetrics {
    version_deliveries: Family<VersionOutcome, Counter>,
    plugin_versions: Family<PluginVersion, Gauge>,
    shadow_runs: Family<ShadowRun, Counter>,
    canary_percent: Family<PluginVersion, Gauge>,
    canary_rollbacks: Family<PluginLabel, Counter>,
}

impl VersionMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        // Written in registration order, which is the order of the text exposition.
        Self {
            canary_percent: registry.new_metric(
                "canary_percent",
                "Share of deliveries (percent) a plugin's canary version takes now",
            ),
            canary_rollbacks: registry
                .new_metric("canary_rollbacks", "Canaries rolled back automatically"),
            shadow_runs: registry.new_metric(
                "shadow_runs",
                "Live-shadow runs by route, shadow version and result (agree, verdict, effects, shadow-failure, skipped)",
            ),
            version_deliveries: registry.new_metric(
                "plugin_version_deliveries",
                "Deliveries settled, by route, plugin version (12 hex digits of its sha256) and outcome",
            ),
            plugin_versions: registry.new_metric(
                "plugin_version",
                "1 for each plugin version new deliveries run on",
            ),
        }
    }
}

impl Metrics {
    /// A delivery settled on `route` with plugin `version`.
    pub fn version_delivery(&self, route: &str, version: &str, outcome: DeliveryOutcome) {
        self.versions
            .version_deliveries
            .get_or_create(&VersionOutcome::of(route, version, outcome))
            .inc();
    }

    /// Deliveries settled on `route` with plugin `version` and `outcome` (for tests).
    pub fn version_delivered(&self, route: &str, version: &str, outcome: DeliveryOutcome) -> u64 {
        self.versions
            .version_deliveries
            .get_or_create(&VersionOutcome::of(route, version, outcome))
            .get()
    }

    /// A live-shadow run on `route` with shadow `version` ended with `result`.
    pub fn shadow_run(&self, route: &str, version: &str, result: &str) {
        self.versions
            .shadow_runs
            .get_or_create(&ShadowRun {
                route: route.into(),
                version: version.into(),
                result: result.into(),
            })
            .inc();
    }

    /// The canary `version` of `plugin` takes `percent` of the deliveries.
    pub fn canary_percent(&self, plugin: &str, version: &str, percent: f64) {
        self.versions
            .canary_percent
            .get_or_create(&PluginVersion::of(plugin, version))
            .set(percent.round() as i64);
    }

    /// Exports `plugin`'s rollback counter at 0, so the first rollback shows in `increase()`.
    pub fn canary_started(&self, plugin: &str) {
        let _ = self.versions.canary_rollbacks.get_or_create(&PluginLabel {
            plugin: plugin.into(),
        });
    }

    /// The canary of `plugin` was rolled back.
    pub fn canary_rollback(&self, plugin: &str) {
        self.versions
            .canary_rollbacks
            .get_or_create(&PluginLabel {
                plugin: plugin.into(),
            })
            .inc();
    }

    /// Plugin `plugin` now runs `version` (`None`: it was unloaded); `previous` is dropped.
    pub fn plugin_version(&self, plugin: &str, previous: Option<&str>, version: Option<&str>) {
        if let Some(previous) = previous {
            self.versions
                .plugin_versions
                .remove(&PluginVersion::of(plugin, previous));
        }
        if let Some(version) = version {
            self.versions
                .plugin_versions
                .get_or_create(&PluginVersion::of(plugin, version))
                .set(1);
            self.plugin_instances_started(plugin, version);
        }
    }
}
