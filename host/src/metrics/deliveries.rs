//! The pipeline's families: deliveries settled, handler runs and failures, retries and dead
//! letters, and whether each route is consuming. Deliveries and dead letters also go into
//! each route's last hour (`history`), for the console's charts.

use super::{Metrics, RegisterExt, Route, per_route};
use crate::common::labels::{FailureKind, Outcome as DeliveryOutcome, ReasonClass};
use crate::common::now_ms;
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

impl Outcome {
    fn of(route: &str, outcome: DeliveryOutcome) -> Self {
        Self {
            route: route.into(),
            outcome,
        }
    }
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

impl RouteReason {
    fn of(route: &str, reason_class: ReasonClass) -> Self {
        Self {
            route: route.into(),
            reason_class,
        }
    }
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

/// Durations in seconds, per route.
fn seconds_family() -> Family<Route, Histogram> {
    Family::new_with_constructor(seconds_histogram as fn() -> Histogram)
}

impl DeliveryMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            deliveries: registry.new_metric("deliveries", "Deliveries settled, by outcome"),
            delivery_seconds: registry.registered(
                "delivery_seconds",
                "Receipt to settlement",
                seconds_family(),
            ),
            handler_seconds: registry.registered(
                "handler_seconds",
                "One plugin handle call",
                seconds_family(),
            ),
            plugin_failures: registry
                .new_metric("plugin_failures", "Classified plugin failures"),
            conflicts: registry.new_metric("kv_conflicts", "Handler re-runs after kv conflicts"),
            dead_letters_archived: registry
                .new_metric("dead_letters_archived", "Dead letters stored"),
            panics: registry.new_metric(
                "delivery_panics",
                "Panics caught while processing a delivery",
            ),
            connected: registry.new_metric("route_connected", "1 while the route is consuming"),
            retries: registry.new_metric(
                "retries",
                "Retry copies confirmed, by route and reason class",
            ),
            dead_letters: registry.new_metric(
                "dead_letters",
                "Deliveries dead-lettered by the gateway (copy confirmed, or archived directly), by route and reason class",
            ),
            dead_letters_parked: registry.new_metric(
                "dead_letters_parked",
                "Messages in a quorum route's Q.dlq.parked: dead letters the archiver could not take within Q.dlq's delivery limit",
            ),
            // Not exposed: read through `Metrics::handler_runs`.
            handler_runs: Family::default(),
        }
    }
}

impl Metrics {
    /// Exports `route`'s counters and latency histograms at 0, for every outcome, reason class
    /// and failure kind, before its first delivery: `rate()` and `increase()` then count the
    /// first burst (a series born at 5 has no earlier sample to count from).
    pub fn route_started(&self, route: &str) {
        let d = &self.deliveries;
        for &outcome in DeliveryOutcome::ALL {
            let _ = d.deliveries.get_or_create(&Outcome::of(route, outcome));
        }
        for class in ReasonClass::all() {
            let _ = d.retries.get_or_create(&RouteReason::of(route, class));
            let _ = d.dead_letters.get_or_create(&RouteReason::of(route, class));
        }
        for &kind in FailureKind::PLUGIN {
            let _ = d.plugin_failures.get_or_create(&Failure {
                route: route.into(),
                kind,
            });
        }
        let _ = per_route(&d.delivery_seconds, route);
        let _ = per_route(&d.handler_seconds, route);
        let _ = per_route(&d.dead_letters_archived, route);
        let _ = per_route(&d.panics, route);
        let _ = per_route(&d.conflicts, route);
    }

    /// A delivery on `route` was settled with `outcome`, `took` after its receipt.
    pub fn delivery(&self, route: &str, outcome: DeliveryOutcome, took: Duration) {
        self.deliveries
            .deliveries
            .get_or_create(&Outcome::of(route, outcome))
            .inc();
        per_route(&self.deliveries.delivery_seconds, route).observe(took.as_secs_f64());
        self.history.delivery(route, outcome, now_ms());
    }

    /// A retry copy of a delivery on `route` was confirmed.
    pub fn retry(&self, route: &str, reason_class: ReasonClass) {
        self.deliveries
            .retries
            .get_or_create(&RouteReason::of(route, reason_class))
            .inc();
    }

    /// A delivery on `route` was dead-lettered.
    pub fn dead_letter(&self, route: &str, reason_class: ReasonClass) {
        self.deliveries
            .dead_letters
            .get_or_create(&RouteReason::of(route, reason_class))
            .inc();
        self.history.dead_letter(route, reason_class, now_ms());
    }

    /// Messages waiting in `route`'s `Q.dlq.parked`.
    pub fn set_parked(&self, route: &str, messages: u32) {
        per_route(&self.deliveries.dead_letters_parked, route).set(i64::from(messages));
    }

    pub fn handler_duration(&self, route: &str, took: Duration) {
        per_route(&self.deliveries.handler_runs, route).inc();
        per_route(&self.deliveries.handler_seconds, route).observe(took.as_secs_f64());
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
        per_route(&self.deliveries.conflicts, route).inc();
    }

    pub fn dead_letter_archived(&self, route: &str) {
        per_route(&self.deliveries.dead_letters_archived, route).inc();
    }

    pub fn panic(&self, route: &str) {
        per_route(&self.deliveries.panics, route).inc();
    }

    /// Panics caught on `route` (for tests).
    pub fn panics(&self, route: &str) -> u64 {
        per_route(&self.deliveries.panics, route).get()
    }

    pub fn set_connected(&self, route: &str, up: bool) {
        per_route(&self.deliveries.connected, route).set(i64::from(up));
    }

    /// Number of deliveries settled with `outcome` on `route` (for tests and the CLI).
    pub fn delivered(&self, route: &str, outcome: DeliveryOutcome) -> u64 {
        self.deliveries
            .deliveries
            .get_or_create(&Outcome::of(route, outcome))
            .get()
    }

    /// How many times the plugin ran for `route` (re-runs after conflicts included).
    pub fn handler_runs(&self, route: &str) -> u64 {
        per_route(&self.deliveries.handler_runs, route).get()
    }
}
