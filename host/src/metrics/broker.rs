//! Broker sessions lost, by what held them (a route's queue, or `relay`).

use super::{Metrics, RegisterExt};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::registry::Registry;

/// What holds a broker connection: a route (its queue) or `relay`.
#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct Component {
    component: String,
}

/// Reconnects of the pipeline's consumers and the relay.
pub struct BrokerMetrics {
    reconnects: Family<Component, Counter>,
}

impl BrokerMetrics {
    pub(super) fn register(registry: &mut Registry) -> Self {
        Self {
            reconnects: registry.new_metric(
                "broker_reconnects",
                "Broker sessions lost and reconnecting, by component (a route's queue or relay)",
            ),
        }
    }
}

impl Metrics {
    /// `component` lost its broker session and reconnects.
    pub fn broker_reconnect(&self, component: &str) {
        self.broker
            .reconnects
            .get_or_create(&Component {
                component: component.into(),
            })
            .inc();
    }
}
