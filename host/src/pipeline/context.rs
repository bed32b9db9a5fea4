//! Everything one route's deliveries need, in three parts that change apart:
//! - [`RouteSettings`]: the route's `[[routes]]` table, read once (a change restarts the
//!   route);
//! - [`RouteDeps`]: what it uses and does not own, the same for every route of a gateway
//!   (store, committer, batched reads, gate, metrics, seal, spans);
//! - [`PluginSlot`]: the plugin version, live shadow and canary new deliveries meet, which a
//!   reload swaps while the route runs.

use super::canary::Canary;
use super::config::{
    BatchConfig, FailurePolicy, KeySource, KeySourceError, MissingKeyPolicy, RetryConfig,
    RouteConfig,
};
use super::gate::StoreGate;
use super::live_shadow::Shadow;
use crate::broker::seal::SealKey;
use crate::common::FaultPoint;
use crate::metrics::Metrics;
use crate::runtime::{KvFuture, KvSource, KvValue, Plugin, StandardErrorPolicy};
use crate::store::{BatchedReads, CommitterHandle, KvEntry, Store, StoreError};
use crate::telemetry::Telemetry;
use crate::topology::{self, RouteTopology};
use std::sync::atomic::AtomicUsize;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// One route, ready to process deliveries.
pub struct RouteContext {
    /// From the config; fixed while the route runs.
    pub settings: RouteSettings,
    /// Shared with every route.
    pub deps: RouteDeps,
    /// What a reload swaps under the running route.
    pub slot: PluginSlot,
    /// Turn-taking for handler re-runs after kv conflicts (see `process`).
    pub rerun_turn: tokio::sync::Mutex<()>,
    /// Deliveries being processed now (the console shows it).
    pub in_flight: Arc<AtomicUsize>,
}

impl RouteContext {
    pub fn new(settings: RouteSettings, deps: RouteDeps, slot: PluginSlot) -> Self {
        Self {
            settings,
            deps,
            slot,
            rerun_turn: tokio::sync::Mutex::new(()),
            in_flight: Arc::default(),
        }
    }
}

/// A route's settings, from its `[[routes]]` table (and `[broker] publish_timeout`).
pub struct RouteSettings {
    pub queue: String,
    pub key_source: KeySource,
    pub on_missing_key: MissingKeyPolicy,
    pub on_plugin_failure: FailurePolicy,
    /// What a wasi:messaging component's `permission-denied` and `other` become.
    pub standard_errors: StandardErrorPolicy,
    pub retry: RetryConfig,
    pub max_body_size: u64,
    pub content_type: Option<String>,
    pub prefetch: u16,
    pub topology: RouteTopology,
    /// How long a retry or dead-letter copy may wait for its publisher confirm.
    pub publish_timeout: Duration,
    /// Deliveries gathered for one `handle-batch` call, if the route batches.
    pub batch: Option<BatchConfig>,
}

impl RouteSettings {
    /// Refuses an idempotency key source it cannot parse.
    pub fn new(route: &RouteConfig, publish_timeout: Duration) -> Result<Self, KeySourceError> {
        Ok(Self {
            queue: route.queue.clone(),
            key_source: KeySource::parse(&route.idempotency_key)?,
            on_missing_key: route.on_missing_key,
            on_plugin_failure: route.on_plugin_failure,
            standard_errors: route.standard_errors,
            retry: route.retry.clone(),
            max_body_size: route.max_body_size,
            content_type: route.content_type.clone(),
            prefetch: route.prefetch,
            topology: route.topology(),
            publish_timeout,
            batch: route.batch,
        })
    }

    /// The retry queue for a delay (declared by the topology).
    pub fn retry_queue(&self, delay: Duration) -> String {
        topology::retry_queue_name(&self.queue, self.retry.tier_for(delay))
    }

    /// The route's dead-letter exchange.
    pub fn dlx(&self) -> String {
        topology::dlx_name(&self.queue)
    }
}

/// What a route uses and does not own: built once by the gateway, cloned into every route
/// (each part is a handle; clones share it).
#[derive(Clone)]
pub struct RouteDeps {
    pub store: Store,
    pub committer: CommitterHandle,
    /// Inbox pre-checks and handler kv reads, batched across deliveries.
    pub reads: BatchedReads,
    /// Handlers' kv reads, through [`Self::reads`].
    pub kv: Arc<dyn KvSource>,
    pub gate: StoreGate,
    pub metrics: Arc<Metrics>,
    /// Seals the Carteiro headers of the routes' copies, and checks incoming ones.
    pub seal: SealKey,
    /// Delivery spans, when `[telemetry]` exports them (off: see [`Self::with_telemetry`]).
    pub telemetry: Telemetry,
    /// Test-only fault point (`CARTEIRO_FAULT`), read once.
    pub fault: Option<FaultPoint>,
}

impl RouteDeps {
    pub fn new(
        store: Store,
        committer: CommitterHandle,
        reads: BatchedReads,
        gate: StoreGate,
        metrics: Arc<Metrics>,
        seal: SealKey,
    ) -> Self {
        Self {
            store,
            committer,
            kv: Arc::new(BatchedKv(reads.clone())),
            reads,
            gate,
            metrics,
            seal,
            telemetry: Telemetry::off(),
            fault: FaultPoint::from_env(),
        }
    }

    /// The same, exporting delivery spans through `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
    }
}

/// The plugin version new deliveries run on, with its live shadow and canary: the part of
/// a running route a reload changes.
pub struct PluginSlot {
    plugin: Mutex<Arc<Plugin>>,
    shadow: Mutex<Option<Arc<Shadow>>>,
    canary: Mutex<Option<Arc<Canary>>>,
}

impl PluginSlot {
    pub fn new(
        plugin: Arc<Plugin>,
        shadow: Option<Arc<Shadow>>,
        canary: Option<Arc<Canary>>,
    ) -> Self {
        Self {
            plugin: Mutex::new(plugin),
            shadow: Mutex::new(shadow),
            canary: Mutex::new(canary),
        }
    }

    /// The plugin version a new delivery runs on. A delivery takes it once, when it
    /// arrives, and keeps it to the end (handler re-runs and dead-letter headers included),
    /// so a reload never changes the version under a delivery in flight.
    pub fn plugin(&self) -> Arc<Plugin> {
        self.plugin
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Makes `plugin` the version of every delivery that arrives from now on; returns the
    /// version it replaces.
    pub fn swap_plugin(&self, plugin: Arc<Plugin>) -> Arc<Plugin> {
        std::mem::replace(
            &mut *self.plugin.lock().unwrap_or_else(PoisonError::into_inner),
            plugin,
        )
    }

    /// The live shadow new deliveries are compared with, if any.
    pub fn shadow(&self) -> Option<Arc<Shadow>> {
        self.shadow
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets (or, with `None`, ends) the live shadow.
    pub fn set_shadow(&self, shadow: Option<Arc<Shadow>>) {
        *self.shadow.lock().unwrap_or_else(PoisonError::into_inner) = shadow;
    }

    /// The canary new deliveries may be assigned to, if any.
    pub fn canary(&self) -> Option<Arc<Canary>> {
        self.canary
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Sets (or, with `None`, ends) the canary.
    pub fn set_canary(&self, canary: Option<Arc<Canary>>) {
        *self.canary.lock().unwrap_or_else(PoisonError::into_inner) = canary;
    }
}

/// A store kv read as a handler's kv source answers it.
pub(crate) fn kv_answer(
    found: Result<Option<KvEntry>, StoreError>,
) -> Result<Option<KvValue>, StoreError> {
    found.map(|found| {
        found.map(|e| KvValue {
            value: e.value,
            version: e.version,
        })
    })
}

/// kv reads for handlers, from the store (batched with other deliveries' reads).
struct BatchedKv(BatchedReads);

impl KvSource for BatchedKv {
    fn get<'a>(&'a self, namespace: &'a str, key: &'a str) -> KvFuture<'a> {
        Box::pin(async move { kv_answer(self.0.kv_get(namespace, key).await) })
    }
}
