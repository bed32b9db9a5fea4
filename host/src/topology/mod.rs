//! Declaring and verifying one route's broker topology.
//!
//! For a work queue `Q` (see docs/architecture.md, "Broker topology per route"):
//! - `Q.dlx` (fanout) → `Q.dlq`: where the broker and the gateway dead-letter messages;
//! - on quorum routes, `Q.dlq.parked`: where `Q.dlq` dead-letters a message that exceeded
//!   its delivery limit (archiving kept failing), so no dead letter is ever dropped;
//! - `Q`, dead-lettering to `Q.dlx`, bound to the configured exchanges;
//! - `Q.retry.<ms>ms`, one per backoff tier: messages wait out the tier's TTL, then the
//!   broker dead-letters them back to `Q` through the default exchange (no plugin needed).
//!
//! Declaring is idempotent. A queue that exists with other arguments is reported, never
//! deleted or redeclared in a loop: deleting would lose its messages (G4).

mod declare;
mod error;
#[cfg(test)]
mod tests;

use std::time::Duration;

pub use declare::{check_exchange, declare_route, queue_state};
pub use error::TopologyError;

/// Classic or quorum (replicated) queue; retry tiers and the DLQ follow the work queue.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum QueueType {
    /// Single-node queue (RabbitMQ's default).
    #[default]
    Classic,
    /// Raft-replicated queue, for clusters.
    Quorum,
}

impl QueueType {
    /// The `x-queue-type` value.
    pub fn as_str(self) -> &'static str {
        match self {
            QueueType::Classic => "classic",
            QueueType::Quorum => "quorum",
        }
    }
}

/// One binding of the work queue to an exchange.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Binding {
    /// Declared durable with `exchange_type` if missing; `amq.*` exchanges are only checked.
    pub exchange: String,
    /// `topic` (the default), `direct`, `fanout` or `headers`.
    pub exchange_type: String,
    /// Binding key (a pattern for topic exchanges).
    pub routing_key: String,
}

impl Binding {
    /// A binding to a topic exchange.
    pub fn topic(exchange: impl Into<String>, routing_key: impl Into<String>) -> Self {
        Self {
            exchange: exchange.into(),
            exchange_type: default_exchange_type(),
            routing_key: routing_key.into(),
        }
    }
}

/// The exchange type used when a binding does not name one.
pub fn default_exchange_type() -> String {
    "topic".to_owned()
}

/// What one route needs from the broker.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteTopology {
    /// The work queue's name, `Q`.
    pub queue: String,
    /// Queue type for `Q`, its retry tiers and `Q.dlq`.
    pub queue_type: QueueType,
    /// Exchanges `Q` receives from.
    pub bindings: Vec<Binding>,
    /// One retry tier per distinct delay (whole milliseconds, 1 ms to about 49 days).
    pub retry_delays: Vec<Duration>,
    /// Handler attempts before dead-lettering; quorum queues get `x-delivery-limit =
    /// max_attempts + 2` as a safety net for messages that crash the gateway itself.
    pub max_attempts: u32,
    /// Optional `x-message-ttl` on `Q`; expired messages are dead-lettered to `Q.dlq`.
    pub message_ttl: Option<Duration>,
    /// Optional `x-max-length` on `Q`; the overflow (oldest first) is dead-lettered.
    pub max_length: Option<u64>,
}

/// Names of what [`declare_route`] declared.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DeclaredRoute {
    /// The work queue.
    pub queue: String,
    /// Retry tiers, shortest delay first: publish to `""` with the queue name as routing key.
    pub retry_queues: Vec<(Duration, String)>,
    /// The dead-letter exchange `Q.dlx` (fanout).
    pub dlx: String,
    /// The dead-letter queue `Q.dlq`.
    pub dlq: String,
    /// `Q.dlq.parked` on quorum routes: `Q.dlq`'s own dead-letter target.
    pub parked: Option<String>,
}

impl DeclaredRoute {
    /// The retry tier for a requested delay: the shortest tier not shorter than `delay`,
    /// else the longest. `None` when the route has no tiers.
    pub fn retry_queue_for(&self, delay: Duration) -> Option<&str> {
        self.retry_queues
            .iter()
            .find(|(d, _)| *d >= delay)
            .or(self.retry_queues.last())
            .map(|(_, q)| q.as_str())
    }
}

/// `orders` + 5 s → `orders.retry.5000ms`.
pub fn retry_queue_name(queue: &str, delay: Duration) -> String {
    format!("{queue}.retry.{}ms", delay.as_millis())
}

/// `orders` → `orders.dlx`.
pub fn dlx_name(queue: &str) -> String {
    format!("{queue}.dlx")
}

/// `orders` → `orders.dlq`.
pub fn dlq_name(queue: &str) -> String {
    format!("{queue}.dlq")
}

/// `orders` → `orders.dlq.parked`.
pub fn parked_name(queue: &str) -> String {
    format!("{queue}.dlq.parked")
}
