//! Prometheus metrics (`carteiro_` prefix, `_total` counters, `_seconds` durations).
//!
//! One registry; each part's families are declared, registered and recorded in a file of
//! their own, and [`Metrics`] holds them all. The files sit here rather than in the parts
//! because every part takes the one `Arc<Metrics>`, so `metrics` stays below them all:
//! - `deliveries`: the pipeline — deliveries, handler runs, failures, retries, dead letters;
//! - `batches`: deliveries per `handle-batch` call (routes with `batch`);
//! - `versions`: plugin versions, live shadows and canaries;
//! - `instances`: plugin instances made and reused (`runtime`);
//! - `reload`: reloads (`live`);
//! - `outbox`: the relay's publishes and the outbox backlog;
//! - `broker`: broker sessions lost (routes and relay);
//! - `alerts`: raised dead-letter alerts;
//! - `app_outboxes`: per application outbox (`[[outboxes]]`);
//! - `store_gate`: whether the store answers;
//! - `replay`: dead-letter replays (`dlq`);
//! - `retention`: rows retention purged, per table (`housekeeping`);
//! - `history`: not Prometheus — each route's last hour a minute at a time (deliveries by
//!   outcome, dead letters by reason class), for the console's charts.

mod alerts;
mod app_outboxes;
mod batches;
mod broker;
mod deliveries;
mod history;
mod instances;
mod outbox;
mod reload;
mod replay;
mod retention;
mod store_gate;
mod versions;

pub use alerts::AlertMetrics;
pub use app_outboxes::{AppOutboxMetrics, AppOutboxObserved, AppOutboxSeen};
pub use batches::BatchMetrics;
pub use broker::BrokerMetrics;
pub use deliveries::DeliveryMetrics;
pub use history::{DeliveryHistory, MINUTES, RouteHistory, Series};
pub use instances::InstanceMetrics;
pub use outbox::OutboxMetrics;
pub use reload::ReloadMetrics;
pub use replay::ReplayMetrics;
pub use retention::RetentionMetrics;
pub use store_gate::StoreGateMetrics;
pub use versions::VersionMetrics;

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::{Metric, Registry};
use std::ops::Deref;
use std::sync::Mutex;

/// Registers a metric where a part builds it, so each family's field, name and help stand
/// together once rather than in a struct literal and again in a `register` call.
trait RegisterExt {
    /// `metric`, registered as `name`.
    fn registered<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M;

    /// A new counter, gauge or family, registered as `name`.
    fn new_metric<M: Metric + Clone + Default>(&mut self, name: &str, help: &str) -> M {
        self.registered(name, help, M::default())
    }
}

impl RegisterExt for Registry {
    fn registered<M: Metric + Clone>(&mut self, name: &str, help: &str, metric: M) -> M {
        self.register(name, help, metric.clone());
        metric
    }
}

/// The `route` label, shared by the families counted per route.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    route: String,
}

impl Route {
    fn of(route: &str) -> Self {
        Self {
            route: route.into(),
        }
    }
}

/// The `plugin` and `version` labels (12 hex digits of the plugin's sha256), shared by the
/// families counted per plugin version.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginVersion {
    plugin: String,
    version: String,
}

impl PluginVersion {
    fn of(plugin: &str, version: &str) -> Self {
        Self {
            plugin: plugin.into(),
            version: version.into(),
        }
    }
}

/// `route`'s metric in a per-route `family`, created at first use.
fn per_route<M>(family: &Family<Route, M>, route: &str) -> impl Deref<Target = M> {
    family.get_or_create(&Route::of(route))
}

/// All of the gateway's metrics, by part.
pub struct Metrics {
    registry: Mutex<Registry>,
    deliveries: DeliveryMetrics,
    batches: BatchMetrics,
    versions: VersionMetrics,
    instances: InstanceMetrics,
    broker: BrokerMetrics,
    alerts: AlertMetrics,
    app_outboxes: AppOutboxMetrics,
    retention: RetentionMetrics,
    /// Each route's last hour, for the console's charts (recorded with `deliveries`).
    history: DeliveryHistory,
    /// Reloads applied and refused.
    pub reload: ReloadMetrics,
    /// The relay's publishes and the outbox backlog.
    pub outbox: OutboxMetrics,
    /// Whether the store answers.
    pub store: StoreGateMetrics,
    /// Dead-letter replays run in this process.
    pub replay: ReplayMetrics,
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("carteiro");
        Self {
            versions: VersionMetrics::register(&mut registry),
            reload: ReloadMetrics::register(&mut registry),
            deliveries: DeliveryMetrics::register(&mut registry),
            batches: BatchMetrics::register(&mut registry),
            instances: InstanceMetrics::register(&mut registry),
            outbox: OutboxMetrics::register(&mut registry),
            broker: BrokerMetrics::register(&mut registry),
            alerts: AlertMetrics::register(&mut registry),
            app_outboxes: AppOutboxMetrics::register(&mut registry),
            store: StoreGateMetrics::register(&mut registry),
            replay: ReplayMetrics::register(&mut registry),
            retention: RetentionMetrics::register(&mut registry),
            history: DeliveryHistory::default(),
            registry: Mutex::new(registry),
        }
    }
}

impl Metrics {
    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}
