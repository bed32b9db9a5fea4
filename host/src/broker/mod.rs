//! Everything that talks AMQP to RabbitMQ through lapin.
//!
//! - [`connect`](connect()): one connection with a bounded connect time, heartbeats and a name
//!   shown in the management UI; errors never carry the password ([`redact_url`]).
//! - [`ConfirmedPublisher`]: publish and await this message's own publisher confirm.
//! - [`field_table`]: AMQP field tables to text pairs and back.
//! - [`outgoing`]: the one builder of what Carteiro publishes, and AMQP's limits on it.
//! - [`seal`]: which `x-carteiro-*` headers to believe (HMAC-sealed copies only).
//! - `tls`: [`BrokerTlsConfig`] (`[broker.tls]`) and the rustls connector built from it.
//! - `config`: [`BrokerConfig`] (`[broker]`) and its checks.

mod config;
mod connection;
pub mod field_table;
pub mod outgoing;
mod publisher;
pub mod seal;
#[cfg(test)]
pub(crate) mod testing;
mod tls;

pub use config::BrokerConfig;
pub(crate) use config::is_amqps;
pub use connection::{BrokerError, ConnectOptions, connect, connect_any, redact_url};
pub use publisher::{ConfirmedPublisher, MAX_BATCH, Outgoing, PublishError, PublisherOptions};
pub use tls::BrokerTlsConfig;
