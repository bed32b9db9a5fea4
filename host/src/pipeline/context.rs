//! Everything one route's deliveries need, built once at start-up.

use super::canary::Canary;
use super::config::{FailurePolicy, KeySource, MissingKeyPolicy, RetryConfig, RouteConfig};
use super::gate::StoreGate;
use super::shadow::Shadow;
use crate::broker::seal::SealKey;
use crate::common::FaultPoint;
use crate::metrics::Metrics;
use crate::runtime::{KvFuture, KvSource, KvValue, Plugin};
use crate::store::{BatchedReads, CommitterHandle, KvEntry, Store, StoreError};
use crate::telemetry::Telemetry;
use crate::topology::{self, RouteTopology};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

/// One route, ready to process deliveries.
pub struct RouteContext {
    pub queue: String,
    /// The plugin version new deliveries run on; swapped by a reload (see [`Self::plugin`]).
    plugin: Mutex<Arc<Plugin>>,
    /// The plugin's live shadow, when it has one (swapped with it by a reload).
    shadow: Mutex<Option<Arc<Shadow>>>,
    /// The plugin's canary, when it has one (swapped with it by a reload).
    canary: Mutex<Option<Arc<Canary>>>,
    pub store: Store,
    pub committer: CommitterHandle,
    /// Inbox pre-checks and handler kv reads, batched across deliveries.
    pub reads: BatchedReads,
    pub gate: StoreGate,
    pub kv: Arc<dyn KvSource>,
    pub key_source: KeySource,
    pub on_missing_key: MissingKeyPolicy,
    pub on_plugin_failure: FailurePolicy,
    pub retry: RetryConfig,
    pub max_body_size: u64,
    pub content_type: Option<String>,
    pub prefetch: u16,
    pub topology: RouteTopology,
    pub publish_timeout: Duration,
    pub metrics: Arc<Metrics>,
    pub fault: Option<FaultPoint>,
    /// Seals the Carteiro headers of this route's copies, and checks incoming ones.
    pub seal: SealKey,
    /// Turn-taking for handler re-runs after kv conflicts (see `process`).
    pub rerun_turn: tokio::sync::Mutex<()>,
    /// Delivery spans, when `[telemetry]` exports them (off: see [`Self::with_telemetry`]).
    pub telemetry: Telemetry,
    /// Deliveries being processed now (the console shows it).
    pub in_flight: Arc<std::sync::atomic::AtomicUsize>,
}

impl RouteContext {
    #[allow(clippy::too_many_arguments)]
    pub fn new(
        route: &RouteConfig,
        plugin: Arc<Plugin>,
        store: Store,
        committer: CommitterHandle,
        reads: BatchedReads,
        gate: StoreGate,
        publish_timeout: Duration,
        metrics: Arc<Metrics>,
        seal: SealKey,
    ) -> Result<Self, String> {
        let key_source = KeySource::parse(&route.idempotency_key)?;
        let topology = route.topology();
        Ok(Self {
            queue: route.queue.clone(),
            kv: Arc::new(StoreKv(reads.clone())),
            reads,
            plugin: Mutex::new(plugin),
            shadow: Mutex::new(None),
            canary: Mutex::new(None),
            store,
            committer,
            gate,
            key_source,
            on_missing_key: route.on_missing_key,
            on_plugin_failure: route.on_plugin_failure,
            retry: route.retry.clone(),
            max_body_size: route.max_body_size,
            content_type: route.content_type.clone(),
            prefetch: route.prefetch,
            topology,
            publish_timeout,
            metrics,
            fault: FaultPoint::from_env(),
            seal,
            rerun_turn: tokio::sync::Mutex::new(()),
            telemetry: Telemetry::off(),
            in_flight: Arc::default(),
        })
    }

    /// The same route, exporting its delivery spans through `telemetry`.
    pub fn with_telemetry(mut self, telemetry: Telemetry) -> Self {
        self.telemetry = telemetry;
        self
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

    /// The retry queue for a delay (declared by the topology).
    pub fn retry_queue(&self, delay: Duration) -> String {
        topology::retry_queue_name(&self.queue, self.retry.tier_for(delay))
    }

    /// The route's dead-letter exchange.
    pub fn dlx(&self) -> String {
        topology::dlx_name(&self.queue)
    }
}

/// A store kv read as a handler's kv source answers it.
pub(crate) fn kv_answer(
    found: Result<Option<KvEntry>, StoreError>,
) -> Result<Option<KvValue>, String> {
    found
        .map(|found| {
            found.map(|e| KvValue {
                value: e.value,
                version: e.version,
            })
        })
        .map_err(|e| e.to_string())
}

/// kv reads for handlers, from the store (batched with other deliveries' reads).
struct StoreKv(BatchedReads);

impl KvSource for StoreKv {
    fn get<'a>(&'a self, namespace: &'a str, key: &'a str) -> KvFuture<'a> {
        Box::pin(async move { kv_answer(self.0.kv_get(namespace, key).await) })
    }
}
