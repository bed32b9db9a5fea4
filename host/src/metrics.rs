//! Prometheus metrics (`carteiro_` prefix, `_total` counters, `_seconds` durations).

use crate::common::labels::{FailureKind, Outcome as DeliveryOutcome, ReasonClass};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
use std::sync::Mutex;
use std::sync::atomic::AtomicU64;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Outcome {
    route: String,
    outcome: DeliveryOutcome,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Failure {
    route: String,
    kind: FailureKind,
}

/// Deliveries by the plugin version they ran on (`version`: 12 hex digits of its digest).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct VersionOutcome {
    route: String,
    version: String,
    outcome: DeliveryOutcome,
}

/// Live-shadow comparisons (`version`: the shadow's).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ShadowRun {
    route: String,
    version: String,
    result: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginVersion {
    plugin: String,
    version: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PluginLabel {
    plugin: String,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Route {
    route: String,
}

/// Retries and dead letters by why (see `FailureKind::class`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason_class: ReasonClass,
}

/// What holds a broker connection: a route (its queue) or `relay`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Component {
    component: String,
}

/// All of the gateway's metrics.
pub struct Metrics {
    registry: Mutex<Registry>,
    deliveries: Family<Outcome, Counter>,
    delivery_seconds: Family<Route, Histogram>,
    handler_seconds: Family<Route, Histogram>,
    plugin_failures: Family<Failure, Counter>,
    handler_runs: Family<Route, Counter>,
    conflicts: Family<Route, Counter>,
    dead_letters_archived: Family<Route, Counter>,
    panics: Family<Route, Counter>,
    connected: Family<Route, Gauge>,
    version_deliveries: Family<VersionOutcome, Counter>,
    plugin_versions: Family<PluginVersion, Gauge>,
    shadow_runs: Family<ShadowRun, Counter>,
    canary_percent: Family<PluginVersion, Gauge>,
    canary_rollbacks: Family<PluginLabel, Counter>,
    /// Reloads applied (SIGHUP, `POST /admin/reload`).
    pub reloads: Counter,
    /// Reloads refused (the old config and plugins kept running).
    pub reload_failures: Counter,
    /// 1 when the last reload was applied (or none was tried), 0 when it was refused.
    pub config_reload_success: Gauge,
    /// Outbox rows published (confirmed) by the relay.
    pub outbox_published: Counter,
    /// Outbox publish failures (nack, returned, timeout).
    pub outbox_failed: Counter,
    retries: Family<RouteReason, Counter>,
    dead_letters: Family<RouteReason, Counter>,
    reconnects: Family<Component, Counter>,
    alert_active: Family<Route, Gauge>,
    dead_letters_parked: Family<Route, Gauge>,
    /// 1 while the store answers, 0 while the store gate holds consumption.
    pub store_available: Gauge,
    /// Times the store gate closed.
    pub store_outages: Counter,
    /// Unpublished outbox rows (read from the store at each scrape).
    pub outbox_pending: Gauge,
    /// Age of the oldest unpublished outbox row, 0 when none (read at each scrape).
    pub outbox_oldest_pending_seconds: Gauge<f64, AtomicU64>,
    /// Unpublished outbox rows whose last publish failed (read at each scrape).
    pub outbox_with_errors: Gauge,
    /// Dead letters replayed (published, confirmed, marked) by replays in this process.
    pub replay_replayed: Counter,
    /// Replays of a dead letter that failed (left unreplayed for the next run).
    pub replay_failed: Counter,
    /// Rows the running replays still have to do.
    pub replay_remaining: Gauge,
    /// Replays running now.
    pub replay_running: Gauge,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl Default for Metrics {
    fn default() -> Self {
        let mut registry = Registry::with_prefix("carteiro");
        let deliveries = Family::<Outcome, Counter>::default();
        let delivery_seconds = Family::<Route, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        let handler_seconds = Family::<Route, Histogram>::new_with_constructor(
            seconds_histogram as fn() -> Histogram,
        );
        let plugin_failures = Family::<Failure, Counter>::default();
        let handler_runs = Family::<Route, Counter>::default();
        let conflicts = Family::<Route, Counter>::default();
        let dead_letters_archived = Family::<Route, Counter>::default();
        let panics = Family::<Route, Counter>::default();
        let connected = Family::<Route, Gauge>::default();
        let outbox_published = Counter::default();
        let outbox_failed = Counter::default();
        let version_deliveries = Family::<VersionOutcome, Counter>::default();
        let plugin_versions = Family::<PluginVersion, Gauge>::default();
        let shadow_runs = Family::<ShadowRun, Counter>::default();
        let canary_percent = Family::<PluginVersion, Gauge>::default();
        let canary_rollbacks = Family::<PluginLabel, Counter>::default();
        registry.register(
            "canary_percent",
            "Share of deliveries (percent) a plugin's canary version takes now",
            canary_percent.clone(),
        );
        registry.register(
            "canary_rollbacks",
            "Canaries rolled back automatically",
            canary_rollbacks.clone(),
        );
        registry.register(
            "shadow_runs",
            "Live-shadow runs by route, shadow version and result (agree, verdict, effects, shadow-failure, skipped)",
            shadow_runs.clone(),
        );
        let reloads = Counter::default();
        let reload_failures = Counter::default();
        let config_reload_success = Gauge::default();
        config_reload_success.set(1);
        registry.register(
            "plugin_version_deliveries",
            "Deliveries settled, by route, plugin version (12 hex digits of its sha256) and outcome",
            version_deliveries.clone(),
        );
        registry.register(
            "plugin_version",
            "1 for each plugin version new deliveries run on",
            plugin_versions.clone(),
        );
        registry.register("reloads", "Reloads applied", reloads.clone());
        registry.register(
            "reload_failures",
            "Reloads refused; the running config and plugins were kept",
            reload_failures.clone(),
        );
        registry.register(
            "config_reload_success",
            "1 if the last reload was applied (or none was tried), 0 if it was refused",
            config_reload_success.clone(),
        );
        registry.register(
            "deliveries",
            "Deliveries settled, by outcome",
            deliveries.clone(),
        );
        registry.register(
            "delivery_seconds",
            "Receipt to settlement",
            delivery_seconds.clone(),
        );
        registry.register(
            "handler_seconds",
            "One plugin handle call",
            handler_seconds.clone(),
        );
        registry.register(
            "plugin_failures",
            "Classified plugin failures",
            plugin_failures.clone(),
        );
        registry.register(
            "kv_conflicts",
            "Handler re-runs after kv conflicts",
            conflicts.clone(),
        );
        registry.register(
            "dead_letters_archived",
            "Dead letters stored",
            dead_letters_archived.clone(),
        );
        registry.register(
            "delivery_panics",
            "Panics caught while processing a delivery",
            panics.clone(),
        );
        registry.register(
            "route_connected",
            "1 while the route is consuming",
            connected.clone(),
        );
        registry.register(
            "outbox_published",
            "Outbox rows confirmed",
            outbox_published.clone(),
        );
        registry.register(
            "outbox_publish_failures",
            "Outbox publishes that failed",
            outbox_failed.clone(),
        );
        let retries = Family::<RouteReason, Counter>::default();
        let dead_letters = Family::<RouteReason, Counter>::default();
        let reconnects = Family::<Component, Counter>::default();
        let alert_active = Family::<Route, Gauge>::default();
        let dead_letters_parked = Family::<Route, Gauge>::default();
        let store_available = Gauge::default();
        store_available.set(1);
        let store_outages = Counter::default();
        let outbox_pending = Gauge::default();
        let outbox_oldest_pending_seconds = Gauge::<f64, AtomicU64>::default();
        let outbox_with_errors = Gauge::default();
        let replay_replayed = Counter::default();
        let replay_failed = Counter::default();
        let replay_remaining = Gauge::default();
        let replay_running = Gauge::default();
        registry.register(
            "retries",
            "Retry copies confirmed, by route and reason class",
            retries.clone(),
        );
        registry.register(
            "dead_letters",
            "Deliveries dead-lettered by the gateway (copy confirmed, or archived directly), by route and reason class",
            dead_letters.clone(),
        );
        registry.register(
            "broker_reconnects",
            "Broker sessions lost and reconnecting, by component (a route's queue or relay)",
            reconnects.clone(),
        );
        registry.register(
            "dead_letter_alert_active",
            "1 while a route's dead letters in its alert window are at or above its threshold",
            alert_active.clone(),
        );
        registry.register(
            "dead_letters_parked",
            "Messages in a quorum route's Q.dlq.parked: dead letters the archiver could not take within Q.dlq's delivery limit",
            dead_letters_parked.clone(),
        );
        registry.register(
            "store_available",
            "1 while the store answers, 0 while consumption waits for it",
            store_available.clone(),
        );
        registry.register(
            "store_outages",
            "Times the store became unavailable and consumption paused",
            store_outages.clone(),
        );
        registry.register(
            "outbox_pending",
            "Unpublished outbox rows",
            outbox_pending.clone(),
        );
        registry.register(
            "outbox_oldest_pending_seconds",
            "Age of the oldest unpublished outbox row (0 when none)",
            outbox_oldest_pending_seconds.clone(),
        );
        registry.register(
            "outbox_failing",
            "Unpublished outbox rows whose last publish attempt failed",
            outbox_with_errors.clone(),
        );
        registry.register(
            "replay_replayed",
            "Dead letters replayed by replays run in this process",
            replay_replayed.clone(),
        );
        registry.register(
            "replay_failed",
            "Dead-letter replays that failed (the row stays unreplayed)",
            replay_failed.clone(),
        );
        registry.register(
            "replay_remaining",
            "Rows the running replays have still to replay",
            replay_remaining.clone(),
        );
        registry.register(
            "replay_running",
            "Replays running now",
            replay_running.clone(),
        );
        Self {
            registry: Mutex::new(registry),
            retries,
            dead_letters,
            reconnects,
            alert_active,
            dead_letters_parked,
            store_available,
            store_outages,
            outbox_pending,
            outbox_oldest_pending_seconds,
            outbox_with_errors,
            replay_replayed,
            replay_failed,
            replay_remaining,
            replay_running,
            deliveries,
            delivery_seconds,
            handler_seconds,
            plugin_failures,
            handler_runs,
            conflicts,
            dead_letters_archived,
            panics,
            connected,
            version_deliveries,
            plugin_versions,
            shadow_runs,
            canary_percent,
            canary_rollbacks,
            reloads,
            reload_failures,
            config_reload_success,
            outbox_published,
            outbox_failed,
        }
    }
}

impl Metrics {
    pub fn delivery(&self, route: &str, outcome: DeliveryOutcome, took: Duration) {
        self.deliveries
            .get_or_create(&Outcome {
                route: route.into(),
                outcome,
            })
            .inc();
        self.delivery_seconds
            .get_or_create(&Route {
                route: route.into(),
            })
            .observe(took.as_secs_f64());
    }

    /// A delivery settled on `route` with plugin `version`.
    pub fn version_delivery(&self, route: &str, version: &str, outcome: DeliveryOutcome) {
        self.version_deliveries
            .get_or_create(&VersionOutcome {
                route: route.into(),
                version: version.into(),
                outcome,
            })
            .inc();
    }

    /// Deliveries settled on `route` with plugin `version` and `outcome` (for tests).
    pub fn version_delivered(&self, route: &str, version: &str, outcome: DeliveryOutcome) -> u64 {
        self.version_deliveries
            .get_or_create(&VersionOutcome {
                route: route.into(),
                version: version.into(),
                outcome,
            })
            .get()
    }

    /// A live-shadow run on `route` with shadow `version` ended with `result`.
    pub fn shadow_run(&self, route: &str, version: &str, result: &str) {
        self.shadow_runs
            .get_or_create(&ShadowRun {
                route: route.into(),
                version: version.into(),
                result: result.into(),
            })
            .inc();
    }

    /// The canary `version` of `plugin` takes `percent` of the deliveries.
    pub fn canary_percent(&self, plugin: &str, version: &str, percent: f64) {
        self.canary_percent
            .get_or_create(&PluginVersion {
                plugin: plugin.into(),
                version: version.into(),
            })
            .set(percent.round() as i64);
    }

    /// The canary of `plugin` was rolled back.
    pub fn canary_rollback(&self, plugin: &str) {
        self.canary_rollbacks
            .get_or_create(&PluginLabel {
                plugin: plugin.into(),
            })
            .inc();
    }

    /// Plugin `plugin` now runs `version` (`None`: it was unloaded); `previous` is dropped.
    pub fn plugin_version(&self, plugin: &str, previous: Option<&str>, version: Option<&str>) {
        if let Some(previous) = previous {
            self.plugin_versions.remove(&PluginVersion {
                plugin: plugin.into(),
                version: previous.into(),
            });
        }
        if let Some(version) = version {
            self.plugin_versions
                .get_or_create(&PluginVersion {
                    plugin: plugin.into(),
                    version: version.into(),
                })
                .set(1);
        }
    }

    /// A retry copy of a delivery on `route` was confirmed.
    pub fn retry(&self, route: &str, reason_class: ReasonClass) {
        self.retries
            .get_or_create(&RouteReason {
                route: route.into(),
                reason_class,
            })
            .inc();
    }

    /// A delivery on `route` was dead-lettered.
    pub fn dead_letter(&self, route: &str, reason_class: ReasonClass) {
        self.dead_letters
            .get_or_create(&RouteReason {
                route: route.into(),
                reason_class,
            })
            .inc();
    }

    /// `component` lost its broker session and reconnects.
    pub fn broker_reconnect(&self, component: &str) {
        self.reconnects
            .get_or_create(&Component {
                component: component.into(),
            })
            .inc();
    }

    /// The dead-letter alert of `route` is (`true`) or is not active.
    pub fn set_alert_active(&self, route: &str, active: bool) {
        self.alert_active
            .get_or_create(&Route {
                route: route.into(),
            })
            .set(i64::from(active));
    }

    /// Messages waiting in `route`'s `Q.dlq.parked`.
    pub fn set_parked(&self, route: &str, messages: u32) {
        self.dead_letters_parked
            .get_or_create(&Route {
                route: route.into(),
            })
            .set(i64::from(messages));
    }

    pub fn handler_duration(&self, route: &str, took: Duration) {
        self.handler_runs
            .get_or_create(&Route {
                route: route.into(),
            })
            .inc();
        self.handler_seconds
            .get_or_create(&Route {
                route: route.into(),
            })
            .observe(took.as_secs_f64());
    }

    pub fn plugin_failure(&self, route: &str, kind: FailureKind) {
        self.plugin_failures
            .get_or_create(&Failure {
                route: route.into(),
                kind,
            })
            .inc();
    }

    pub fn conflict(&self, route: &str) {
        self.conflicts
            .get_or_create(&Route {
                route: route.into(),
            })
            .inc();
    }

    pub fn dead_letter_archived(&self, route: &str) {
        self.dead_letters_archived
            .get_or_create(&Route {
                route: route.into(),
            })
            .inc();
    }

    pub fn panic(&self, route: &str) {
        self.panics
            .get_or_create(&Route {
                route: route.into(),
            })
            .inc();
    }

    /// Panics caught on `route` (for tests).
    pub fn panics(&self, route: &str) -> u64 {
        self.panics
            .get_or_create(&Route {
                route: route.into(),
            })
            .get()
    }

    pub fn set_connected(&self, route: &str, up: bool) {
        self.connected
            .get_or_create(&Route {
                route: route.into(),
            })
            .set(i64::from(up));
    }

    /// Number of deliveries settled with `outcome` on `route` (for tests and the CLI).
    pub fn delivered(&self, route: &str, outcome: DeliveryOutcome) -> u64 {
        self.deliveries
            .get_or_create(&Outcome {
                route: route.into(),
                outcome,
            })
            .get()
    }

    /// How many times the plugin ran for `route` (re-runs after conflicts included).
    pub fn handler_runs(&self, route: &str) -> u64 {
        self.handler_runs
            .get_or_create(&Route {
                route: route.into(),
            })
            .get()
    }

    /// The Prometheus text exposition.
    pub fn encode(&self) -> String {
        let mut out = String::new();
        if let Ok(registry) = self.registry.lock() {
            let _ = prometheus_client::encoding::text::encode(&mut out, &registry);
        }
        out
    }
}
