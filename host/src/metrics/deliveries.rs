//! The pipeline's families: deliveries settled, handler runs and failures, retries and dead
//! letters, and whether each route is consuming.

use super::{Metrics, Route};
use crate::common::labels::{FailureKind, Outcome as DeliveryOutcome, ReasonClass};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{Histogram, exponential_buckets};
use prometheus_client::registry::Registry;
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

/// Retries and dead letters by why (see `FailureKind::class`).
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RouteReason {
    route: String,
    reason_class: ReasonClass,
}

/// What the pipeline counts, per route.
pub struct DeliveryMetrics {
    deliveries: Family<Outcome, Counter>,
    delivery_seconds: Family<Route, Histogram>,
    handler_seconds: Family<Route, Histogram>,
    plugin_failures: Family<Failure, Counter>,
    handler_runs: Family<Route, Counter>,
    conflicts: Family<Route, Counter>,
    dead_letters_archived: Family<Route, Counter>,
    panics: Family<Route, Counter>,
    connected: Family<Route, Gauge>,
    retries: Family<RouteReason, Counter>,
    dead_letters: Family<RouteReason, Counter>,
    dead_letters_parked: Family<Route, Gauge>,
}

fn seconds_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.0001, 2.0, 18))
}

impl DeliveryMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        let parts = Self {
            deliveries: Family::default(),
            delivery_seconds: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            handler_seconds: Family::new_with_constructor(seconds_histogram as fn() -> Histogram),
            plugin_failures: Family::default(),
            handler_runs: Family::default(),
            conflicts: Family::default(),
            dead_letters_archived: Family::default(),
            panics: Family::default(),
            connected: Family::default(),
            retries: Family::default(),
            dead_letters: Family::default(),
            dead_letters_parked: Family::default(),
        };
        registry.register(
            "deliveries",
            "Deliveries settled, by outcome",
            parts.deliveries.clone(),
        );
        registry.register(
            "delivery_seconds",
            "Receipt to settlement",
            parts.delivery_seconds.clone(),
        );
        registry.register(
            "handler_seconds",
            "One plugin handle call",
            parts.handler_seconds.clone(),
        );
        registry.register(
            "plugin_failures",
            "Classified plugin failures",
            parts.plugin_failures.clone(),
        );
        registry.register(
            "kv_conflicts",
            "Handler re-runs after kv conflicts",
            parts.conflicts.clone(),
        );
        registry.register(
            "dead_letters_archived",
            "Dead letters stored",
            parts.dead_letters_archived.clone(),
        );
        registry.register(
            "delivery_panics",
            "Panics caught while processing a delivery",
            parts.panics.clone(),
        );
        registry.register(
            "route_connected",
            "1 while the route is consuming",
            parts.connected.clone(),
        );
        registry.register(
            "retries",
            "Retry copies confirmed, by route and reason class",
            parts.retries.clone(),
        );
        registry.register(
            "dead_letters",
            "Deliveries dead-lettered by the gateway (copy confirmed, or archived directly), by route and reason class",
            parts.dead_letters.clone(),
        );
        registry.register(
            "dead_letters_parked",
            "Messages in a quorum route's Q.dlq.parked: dead letters the archiver could not take within Q.dlq's delivery limit",
            parts.dead_letters_parked.clone(),
        );
        parts
    }
}

impl Metrics {
    pub fn delivery(&self, route: &str, outcome: DeliveryOutcome, took: Duration) {
        self.deliveries
            .deliveries
            .get_or_create(&Outcome {
                route: route.into(),
                outcome,
            })
            .inc();
        self.deliveries
            .delivery_seconds
            .get_or_create(&Route::of(route))
            .observe(took.as_secs_f64());
    }

    /// A retry copy of a delivery on `route` was confirmed.
    pub fn retry(&self, route: &str, reason_class: ReasonClass) {
        self.deliveries
            .retries
            .get_or_create(&RouteReason {
                route: route.into(),
                reason_class,
            })
            .inc();
    }

    /// A delivery on `route` was dead-lettered.
    pub fn dead_letter(&self, route: &str, reason_class: ReasonClass) {
        self.deliveries
            .dead_letters
            .get_or_create(&RouteReason {
                route: route.into(),
                reason_class,
            })
            .inc();
    }

    /// Messages waiting in `route`'s `Q.dlq.parked`.
    pub fn set_parked(&self, route: &str, messages: u32) {
        self.deliveries
            .dead_letters_parked
            .get_or_create(&Route::of(route))
            .set(i64::from(messages));
    }

    pub fn handler_duration(&self, route: &str, took: Duration) {
        self.deliveries
            .handler_runs
            .get_or_create(&Route::of(route))
            .inc();
        self.deliveries
            .handler_seconds
            .get_or_create(&Route::of(route))
            .observe(took.as_secs_f64());
    }

    pub fn plugin_failure(&self, route: &str, kind: FailureKind) {
        self.deliveries
            .plugin_failures
            .get_or_create(&Failure {
                route: route.into(),
                kind,
            })
            .inc();
    }

    pub fn conflict(&self, route: &str) {
        self.deliveries
            .conflicts
            .get_or_create(&Route::of(route))
            .inc();
    }

    pub fn dead_letter_archived(&self, route: &str) {
        self.deliveries
            .dead_letters_archived
            .get_or_create(&Route::of(route))
            .inc();
    }

    pub fn panic(&self, route: &str) {
        self.deliveries
            .panics
            .get_or_create(&Route::of(route))
            .inc();
    }

    /// Panics caught on `route` (for tests).
    pub fn panics(&self, route: &str) -> u64 {
        self.deliveries
            .panics
            .get_or_create(&Route::of(route))
            .get()
    }

    pub fn set_connected(&self, route: &str, up: bool) {
        self.deliveries
            .connected
            .get_or_create(&Route::of(route))
            .set(i64::from(up));
    }

    /// Number of deliveries settled with `outcome` on `route` (for tests and the CLI).
    pub fn delivered(&self, route: &str, outcome: DeliveryOutcome) -> u64 {
        self.deliveries
            .deliveries
            .get_or_create(&Outcome {
                route: route.into(),
                outcome,
            })
            .get()
    }

    /// How many times the plugin ran for `route` (re-runs after conflicts included).
    pub fn handler_runs(&self, route: &str) -> u64 {
        self.deliveries
            .handler_runs
            .get_or_create(&Route::of(route))
            .get()
    }
}
