//! What the gateway wires, for every part that needs it: plugin loading and the runtime
//! factory (`plugins`), the store and its seal key (`store`), broker settings. `admin`,
//! `live`, `dlq`, `cli` and `startup` import these, never `gateway`: wiring sits on top,
//! services below (the module graph is acyclic; `module_graph`, a unit test, checks it).

mod outboxes;
mod plugins;
mod store;

pub use outboxes::{check_exchanges, open_outboxes, outbox_relays};
pub use plugins::{Plugins, load_canary, load_plugin, load_plugins, load_shadow, new_runtime};
pub use store::{open_store, seal_key, security_seal};

use crate::broker::ConnectOptions;
use crate::config::Config;
use crate::pipeline::BrokerSettings;
use std::time::Duration;

/// Broker settings from the config.
pub fn broker_settings(config: &Config, name: &str) -> BrokerSettings {
    BrokerSettings {
        urls: config.broker.addresses(),
        connect: ConnectOptions {
            heartbeat: config.broker.heartbeat,
            connect_timeout: config.broker.connect_timeout,
            connection_name: name.to_owned(),
            tls: config.broker.tls.clone(),
        },
        reconnect_max_backoff: config.broker.reconnect_max_backoff,
        shutdown_grace: Duration::from_secs(30),
    }
}
