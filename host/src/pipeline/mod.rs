//! The per-delivery pipeline and the supervised consumers that feed it.
//!
//! - `config`: [`RouteConfig`] (`[[routes]]`): what a route consumes and how its deliveries
//!   are treated, its own checks, and the [`RouteTopology`](crate::topology::RouteTopology)
//!   it needs.
//! - `context`: what a route's deliveries need: its settings, its dependencies and the plugin
//!   slot a reload swaps.
//! - `worker`: connect, declare, consume, reconnect — one supervisor per route.
//!
//! One delivery, in reading order (the heart):
//! - `process`: from receipt to ack, top to bottom — facts, version, guards, key, inbox,
//!   handler — each step ending in a plan for `apply`;
//! - `received`: what a delivery says, its Carteiro headers believed only when sealed;
//! - `key`: idempotency keys;
//! - `plan`: what to do with a delivery, decided as data (pure, unit-tested);
//! - `apply`: the one place that acts: retry and dead-letter copies (built whole by
//!   `broker::outgoing`), the commit, the ack, nack or reject, and the outcome's metrics;
//! - `acks`: acks of settled deliveries, sent in runs (`multiple`).
//! - `batch`: routes with `batch`: deliveries gathered (`worker`) and run through the
//!   plugin's `handle-batch` in one call, each settled by its own verdict, the acked ones
//!   committed in one transaction.
//!
//! Beside it:
//! - `archiver`: `Q.dlq` → `dead_letters` table.
//! - `gate`: pause consumption while the store refuses writes.
//! - `canary`: a new plugin version on a share of the deliveries, rolled back on failures;
//!   `canary_decisions`: how canaries ended, kept in the store.
//! - `live_shadow`: a new plugin version compared with the live one on sampled deliveries
//!   (the dead-letter kind, over archived messages, is `dlq::shadow_replay`).

mod acks;
mod apply;
mod archiver;
mod batch;
pub mod canary;
pub mod canary_decisions;
mod config;
mod context;
mod gate;
pub mod key;
pub mod live_shadow;
pub mod plan;
mod process;
mod received;
mod worker;

pub use config::{
    BatchConfig, BindingConfig, DeadLetterAlertConfig, FailurePolicy, KeySource, KeySourceError,
    MissingKeyPolicy, QueueKind, RetryConfig, RouteConfig,
};
pub(crate) use context::kv_answer;
pub use context::{PluginSlot, RouteContext, RouteDeps, RouteSettings};
pub use gate::StoreGate;
pub use worker::{BrokerSettings, RouteError, run_route};
