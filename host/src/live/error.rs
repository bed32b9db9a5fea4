//! Why a reload was refused, and why a canary could not be ended by hand. A refused reload
//! changes nothing: the previous config and plugins keep running. The texts are what
//! `/readyz`, `POST /admin/reload` and the logs show.

use crate::broker::BrokerError;
use crate::config::ConfigError;
use crate::pipeline::KeySourceError;
use crate::pipeline::canary::AlreadyEnded;
use crate::runtime::LoadError;
use crate::topology::TopologyError;
use tokio::task::JoinError;

/// Why a reload was refused.
#[derive(Debug, thiserror::Error)]
pub enum ReloadError {
    /// The gateway runs without a config file (tests, embedded use).
    #[error("this gateway was started without a config file; there is nothing to reload")]
    NoConfigFile,
    /// The config file does not load or validate (the message names file, line and key).
    #[error("invalid config: {0}")]
    InvalidConfig(#[source] ConfigError),
    /// A broker or store URL with a password changed: only a restart connects with it.
    #[error(
        "{key} changed and carries credentials, which only a restart applies (the running \
         connections use the old ones); restart the gateway to apply it, or put the old value \
         back to reload the rest"
    )]
    CredentialsChanged {
        /// `[broker] url`, `[broker] urls` or `[store] url`.
        key: &'static str,
    },
    /// Compiling plugin `name` did not finish (its task panicked or was cancelled).
    #[error("loading plugin `{name}` failed: {source}")]
    PluginTask { name: String, source: JoinError },
    /// Compiling the shadow of plugin `name` did not finish.
    #[error("loading the shadow of `{name}` failed: {source}")]
    ShadowTask { name: String, source: JoinError },
    /// Compiling the canary of plugin `name` did not finish.
    #[error("loading the canary of `{name}` failed: {source}")]
    CanaryTask { name: String, source: JoinError },
    /// A new or changed plugin cannot be loaded (the message names plugin and file).
    #[error(transparent)]
    Plugin(#[from] LoadError),
    /// The shadow of plugin `name` cannot be loaded.
    #[error("shadow of plugin `{name}`: {source}")]
    Shadow {
        name: String,
        /// Boxed: a `LoadError` is large, and a reload's `Result` should stay small.
        source: Box<LoadError>,
    },
    /// The canary of plugin `name` cannot be loaded.
    #[error("canary of plugin `{name}`: {source}")]
    Canary {
        name: String,
        /// Boxed: a `LoadError` is large, and a reload's `Result` should stay small.
        source: Box<LoadError>,
    },
    /// A route names a plugin the config does not load.
    #[error("route `{queue}` names unknown plugin `{plugin}`")]
    UnknownPlugin { queue: String, plugin: String },
    /// A route with `batch` names a plugin that does not export `handle-batch`.
    #[error(
        "route `{queue}` sets `batch`, but its plugin `{plugin}` does not export handle-batch \
         (world batch-handler); build the plugin with `export_batch_handler!` \
         (`@carteiro.batch_handler`, `batchHandler()`), or remove `batch` from the route"
    )]
    BatchUnsupported { queue: String, plugin: String },
    /// A route's settings are refused.
    #[error("route `{queue}`: {source}")]
    Route {
        queue: String,
        source: KeySourceError,
    },
    /// The broker could not be reached to declare the new routes' topology.
    #[error("cannot declare the new routes' topology: {0}")]
    Connect(#[source] BrokerError),
    /// A new route's topology cannot be declared (e.g. its queue exists with other
    /// arguments).
    #[error("route `{queue}`: {source}")]
    Declare {
        queue: String,
        source: TopologyError,
    },
}

/// Why a canary could not be promoted or aborted by hand.
#[derive(Debug, thiserror::Error)]
pub enum CanaryError {
    /// Plugin `0` runs no canary.
    #[error("plugin `{0}` has no canary")]
    NoCanary(String),
    /// The canary already ended.
    #[error(transparent)]
    Ended(#[from] AlreadyEnded),
}
