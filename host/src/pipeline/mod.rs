//! The per-delivery pipeline and the supervised consumers that feed it.
//!
//! - `context`: a route's settings, plugin, store handles, built once.
//! - `worker`: connect, declare, consume, reconnect — one supervisor per route.
//! - `process`: one delivery from receipt to ack (the heart).
//! - `acks`: acks of settled deliveries, sent in runs (`multiple`).
//! - `disposition`: confirmed hand-off to a retry tier or the dead-letter exchange.
//! - `archiver`: `Q.dlq` → `dead_letters` table.
//! - `gate`: pause consumption while the store is down.
//! - `key`, `headers`: idempotency keys and Carteiro's own AMQP headers.

mod acks;
mod archiver;
mod context;
mod disposition;
mod gate;
pub mod headers;
mod key;
mod process;
mod worker;

pub use archiver::{PROP_CONTENT_TYPE, PROP_CORRELATION_ID, PROP_MESSAGE_ID};
pub use context::{FaultPoint, RouteContext};
pub use gate::StoreGate;
pub(crate) use process::hang_if;
pub use worker::{BrokerSettings, RouteError, run_route};
