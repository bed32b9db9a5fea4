//! The operator's TOML, assembled: [`Config`] names each part's section, and each part owns
//! its section's struct, defaults and own checks beside its code (`broker/config.rs`,
//! `store/config.rs`, `runtime/config.rs` for `[runtime]` and `[plugins]`,
//! `relay/config.rs`, `housekeeping/config.rs` for `[outbox]` and `[dead_letters]`,
//! `telemetry/config.rs`, `pipeline/config.rs` for `[[routes]]`, `foreign_dlq/config.rs` for
//! `[[dead_letter_queues]]`).
//!
//! Here: loading with file:line errors and the checks across sections (`validate`), `${VAR}`
//! interpolation (`env`), the TLS warnings across both connections (`tls`), and the sections
//! that sit above the config rather than below it: `[admin]` (`admin`; the admin server
//! shows and reloads the whole config) and `[security]` (`security`, the seal key's source).
//! Units (`64MiB`, duration lists) live below every part, in `common::units`.

mod admin;
mod env;
mod security;
mod tls;
mod validate;

pub use admin::{AdminConfig, BasicAuth, RequireAuth};
pub use env::{InterpolateError, interpolate};
pub use security::SecurityConfig;
pub use tls::unauthenticated_connections;
pub use validate::{ConfigError, load, load_str};

use crate::broker::BrokerConfig;
use crate::foreign_dlq::DeadLetterQueueConfig;
use crate::housekeeping::{DeadLettersConfig, OutboxConfig, Policy};
use crate::pipeline::RouteConfig;
use crate::relay::{AppOutboxConfig, RelayConfig};
use crate::runtime::{PluginConfig, RuntimeConfig};
use crate::store::StoreConfig;
use crate::telemetry::TelemetryConfig;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::PathBuf;

/// The whole configuration file (`carteiro.toml`).
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Config {
    /// Format version; only `1` exists.
    pub version: u32,
    /// The RabbitMQ connection.
    pub broker: BrokerConfig,
    /// The database holding the inbox, kv state, outbox and dead letters.
    #[serde(default)]
    pub store: StoreConfig,
    /// The wasmtime sandbox shared by every plugin.
    #[serde(default)]
    pub runtime: RuntimeConfig,
    /// The outbox relay that runs inside `carteiro run`.
    #[serde(default)]
    pub relay: RelayConfig,
    /// How long published outbox rows are kept.
    #[serde(default)]
    pub outbox: OutboxConfig,
    /// Applications' own outbox tables, relayed beside Carteiro's outbox.
    #[serde(default)]
    pub outboxes: Vec<AppOutboxConfig>,
    /// How long archived dead letters are kept (forever unless set).
    #[serde(default)]
    pub dead_letters: DeadLettersConfig,
    /// The admin HTTP server (health, metrics, DLQ API).
    #[serde(default)]
    pub admin: AdminConfig,
    /// OpenTelemetry export of delivery and relay spans (off unless `otlp_endpoint` is set).
    #[serde(default)]
    pub telemetry: TelemetryConfig,
    /// Where the header-seal key comes from (default: the store's `carteiro_secrets` table).
    #[serde(default)]
    pub security: SecurityConfig,
    /// Handler plugins by name.
    #[serde(default)]
    pub plugins: BTreeMap<String, PluginConfig>,
    /// Queues and the plugin that handles each.
    #[serde(default)]
    pub routes: Vec<RouteConfig>,
    /// Queues other services dead-letter into, archived like the routes' dead letters.
    #[serde(default)]
    pub dead_letter_queues: Vec<DeadLetterQueueConfig>,
    /// Directory of the config file; relative plugin paths resolve against it.
    #[serde(skip)]
    pub base_dir: PathBuf,
}

impl Config {
    /// What housekeeping deletes, and when: `[store] inbox_retention`, `[outbox]` and
    /// `[dead_letters]`.
    pub fn retention(&self) -> Policy {
        Policy {
            inbox: self.store.inbox_retention,
            outbox: self.outbox.retain_published(),
            dead_letters: self.dead_letters.retain,
            expire: self.dead_letters.expire,
        }
    }
}

/// A secret from the config: `Debug` never shows it.
#[derive(Clone, Deserialize, PartialEq, Eq)]
#[serde(transparent)]
pub struct Secret(pub String);

impl std::fmt::Debug for Secret {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Secret(***)")
    }
}
