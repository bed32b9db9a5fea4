//! Carteiro: a RabbitMQ gateway whose message handlers are WebAssembly components.
//!
//! # Layout
//! - [`broker`]: connecting to RabbitMQ, the confirmed publisher, reconnect backoff and
//!   AMQP header conversions.
//! - [`topology`]: declaring and verifying each route's queues and exchanges (work queue,
//!   retry tiers, dead-letter exchange and queue).

pub mod broker;
pub mod topology;
