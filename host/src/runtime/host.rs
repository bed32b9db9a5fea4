//! The host side of the WIT imports (`kv`, `outbox`, `log`, `config`) and the per-store
//! state they act on (shared with the wasi:messaging imports of `runtime::standard`). Guest
//! mistakes come back as typed WIT errors; only exceeding the host-call cap traps.

use super::bindings::batch_world::batch;
use super::bindings::{config, kv, log, outbox, types};
use super::effects::{Effects, EmittedEvent, KvSource};
use super::limits::{DeliveryTotals, HostCallLimitExceeded, Limiter, TotalExceeded};
use crate::store::StoreError;
use std::collections::BTreeMap;
use std::sync::Arc;
use wasmtime::component::ResourceTable;
use wasmtime_wasi::{WasiCtx, WasiCtxView, WasiView};

// The limits and checks live in the SDK, whose mock host applies the same ones: a handler's
// unit tests refuse exactly what this host refuses.
pub use carteiro_sdk::rules::{MAX_EVENT_PAYLOAD_BYTES, MAX_KV_KEY_BYTES, MAX_KV_VALUE_BYTES};
use carteiro_sdk::rules::{event_problem, kv_key_problem};

/// Static facts about the plugin a store runs.
#[derive(Debug, Clone)]
pub struct PluginIdentity {
    pub name: String,
    pub variables: BTreeMap<String, String>,
    pub max_host_calls: u32,
    pub max_events: u32,
    pub totals: DeliveryTotals,
    /// Where a wasi:messaging component's `producer.send` publishes (`[plugins.NAME]
    /// standard_exchange`); `None`: it may not send.
    pub standard_exchange: Option<String>,
}

/// Everything a plugin's `Store` holds. The WASI context, the resource table and the memory
/// limiter belong to the instance (a reused instance keeps them); `calls` belongs to one
/// delivery and is replaced for each (`runtime::pool`).
pub struct HostState {
    wasi: WasiCtx,
    table: ResourceTable,
    pub(super) limiter: Limiter,
    /// What the handler's imports act on (also what a native handler is given). During a
    /// `handle-batch` call: the current message's (see `batch`).
    pub(super) calls: HostCalls,
    /// During a `handle-batch` call, the other messages' host-call states (`runtime::batch`).
    pub(super) batch: Option<BatchSlots>,
}

impl HostState {
    pub(super) fn new(wasi: WasiCtx, limiter: Limiter, calls: HostCalls) -> Self {
        Self {
            wasi,
            table: ResourceTable::new(),
            limiter,
            calls,
            batch: None,
        }
    }

    /// The resource table and the delivery's host-call state, borrowed together (the
    /// wasi:messaging imports need both: their messages and clients live in the table).
    pub(super) fn parts(&mut self) -> (&mut ResourceTable, &mut HostCalls) {
        (&mut self.table, &mut self.calls)
    }
}

/// The state behind the `kv`, `outbox`, `log` and `config` imports for one delivery: the
/// caps, the bytes handed over so far and the buffered effects. A Wasm store holds one in
/// its [`HostState`]; a native handler (`runtime::native`) calls the same methods directly.
pub struct HostCalls {
    plugin: Arc<PluginIdentity>,
    kv: Arc<dyn KvSource>,
    host_calls: u32,
    /// Bytes handed over so far, against `plugin.totals`.
    used: DeliveryTotals,
    pub(super) effects: Effects,
    /// Set when a kv read failed because the store is down: the pipeline must then not
    /// trust the verdict and requeues the delivery instead.
    pub(super) store_error: Option<StoreError>,
}

impl HostCalls {
    pub(super) fn new(plugin: Arc<PluginIdentity>, kv: Arc<dyn KvSource>) -> Self {
        Self {
            plugin,
            kv,
            host_calls: 0,
            used: DeliveryTotals {
                kv_bytes: 0,
                event_bytes: 0,
                log_bytes: 0,
            },
            effects: Effects::default(),
            store_error: None,
        }
    }

    /// What the delivery left: its effects, and the error of a kv read that found the store
    /// down. Taken out, so that nothing of it can reach another delivery.
    pub(super) fn finish(&mut self) -> (Effects, Option<StoreError>) {
        (std::mem::take(&mut self.effects), self.store_error.take())
    }

    /// The plugin this delivery runs.
    pub(super) fn plugin(&self) -> &PluginIdentity {
        &self.plugin
    }

    /// Counts one host call; traps past the plugin's cap.
    pub(super) fn count_call(&mut self) -> wasmtime::Result<()> {
        self.host_calls += 1;
        if self.host_calls > self.plugin.max_host_calls {
            return Err(wasmtime::Error::new(HostCallLimitExceeded(
                self.plugin.max_host_calls,
            )));
        }
        Ok(())
    }

    /// Counts `bytes` against one of the delivery's totals; traps past it.
    pub(super) fn spend(&mut self, what: &'static str, bytes: usize) -> wasmtime::Result<()> {
        let (used, limit) = match what {
            "kv" => (&mut self.used.kv_bytes, self.plugin.totals.kv_bytes),
            "event" => (&mut self.used.event_bytes, self.plugin.totals.event_bytes),
            _ => (&mut self.used.log_bytes, self.plugin.totals.log_bytes),
        };
        *used = used.saturating_add(bytes as u64);
        if *used > limit {
            return Err(wasmtime::Error::new(TotalExceeded { what, limit }));
        }
        Ok(())
    }
}

impl WasiView for HostState {
    fn ctx(&mut self) -> WasiCtxView<'_> {
        WasiCtxView {
            ctx: &mut self.wasi,
            table: &mut self.table,
        }
    }
}

fn check_key(key: &str) -> Result<(), kv::KvError> {
    match kv_key_problem(key, MAX_KV_KEY_BYTES) {
        Some(why) => Err(kv::KvError::InvalidKey(why)),
        None => Ok(()),
    }
}

impl types::Host for HostCalls {}

impl kv::Host for HostCalls {
    async fn get(&mut self, key: String) -> wasmtime::Result<Result<Option<Vec<u8>>, kv::KvError>> {
        self.count_call()?;
        if let Err(e) = check_key(&key) {
            return Ok(Err(e));
        }
        // Read your own writes first.
        if let Some(written) = self.effects.writes.get(&key) {
            return Ok(Ok(written.clone()));
        }
        match self.kv.get(&self.plugin.name, &key).await {
            Ok(found) => {
                // Keep the first version seen: if the key changed between two reads, the
                // commit must conflict and re-run the handler.
                let version = found.as_ref().map(|v| v.version);
                self.effects.reads.entry(key).or_insert(version);
                Ok(Ok(found.map(|v| v.value)))
            }
            Err(e) => {
                let why = e.to_string();
                self.store_error = Some(e);
                Ok(Err(kv::KvError::Unavailable(why)))
            }
        }
    }

    async fn set(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), kv::KvError>> {
        self.count_call()?;
        if let Err(e) = check_key(&key) {
            return Ok(Err(e));
        }
        if value.len() > MAX_KV_VALUE_BYTES {
            return Ok(Err(kv::KvError::ValueTooLarge(MAX_KV_VALUE_BYTES as u64)));
        }
        self.spend("kv", key.len() + value.len())?;
        self.effects.writes.insert(key, Some(value));
        Ok(Ok(()))
    }

    async fn delete(&mut self, key: String) -> wasmtime::Result<Result<(), kv::KvError>> {
        self.count_call()?;
        if let Err(e) = check_key(&key) {
            return Ok(Err(e));
        }
        self.spend("kv", key.len())?;
        self.effects.writes.insert(key, None);
        Ok(Ok(()))
    }
}

fn check_event(event: &outbox::Event) -> Result<(), outbox::OutboxError> {
    let headers = event
        .headers
        .iter()
        .map(|h| (h.name.as_str(), h.value.as_str()));
    let content_type = event.content_type.as_deref();
    if let Some(why) = event_problem(&event.exchange, &event.routing_key, content_type, headers) {
        return Err(outbox::OutboxError::InvalidEvent(why));
    }
    if event.payload.len() > MAX_EVENT_PAYLOAD_BYTES {
        return Err(outbox::OutboxError::PayloadTooLarge(
            MAX_EVENT_PAYLOAD_BYTES as u64,
        ));
    }
    Ok(())
}

impl outbox::Host for HostCalls {
    async fn emit(
        &mut self,
        event: outbox::Event,
    ) -> wasmtime::Result<Result<String, outbox::OutboxError>> {
        self.count_call()?;
        if self.effects.events.len() as u32 >= self.plugin.max_events {
            return Ok(Err(outbox::OutboxError::TooManyEvents(
                self.plugin.max_events,
            )));
        }
        if let Err(e) = check_event(&event) {
            return Ok(Err(e));
        }
        let bytes = event.payload.len()
            + event.exchange.len()
            + event.routing_key.len()
            + event.content_type.as_ref().map_or(0, String::len)
            + event
                .headers
                .iter()
                .map(|h| h.name.len() + h.value.len())
                .sum::<usize>();
        self.spend("event", bytes)?;
        let event_id = uuid::Uuid::now_v7();
        self.effects.events.push(EmittedEvent {
            event_id,
            exchange: event.exchange,
            routing_key: event.routing_key,
            headers: event
                .headers
                .into_iter()
                .map(|h| (h.name, h.value))
                .collect(),
            content_type: event.content_type,
            payload: event.payload,
        });
        Ok(Ok(event_id.to_string()))
    }
}

impl log::Host for HostCalls {
    async fn log(&mut self, level: log::Level, message: String) -> wasmtime::Result<()> {
        self.count_call()?;
        self.spend("log", message.len())?;
        let plugin = self.plugin.name.as_str();
        match level {
            log::Level::Trace => tracing::trace!(plugin, "{message}"),
            log::Level::Debug => tracing::debug!(plugin, "{message}"),
            log::Level::Info => tracing::info!(plugin, "{message}"),
            log::Level::Warn => tracing::warn!(plugin, "{message}"),
            log::Level::Error => tracing::error!(plugin, "{message}"),
        }
        Ok(())
    }
}

impl config::Host for HostCalls {
    async fn get(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        self.count_call()?;
        Ok(self.plugin.variables.get(&name).cloned())
    }

    async fn all(&mut self) -> wasmtime::Result<Vec<(String, String)>> {
        self.count_call()?;
        Ok(self
            .plugin
            .variables
            .iter()
            .map(|(k, v)| (k.clone(), v.clone()))
            .collect())
    }
}

/// The batch's messages whose host calls are not current, by index (`None` at the current
/// one, whose state is the store's `HostState::calls`).
pub(crate) struct BatchSlots {
    parked: Vec<Option<HostCalls>>,
    current: usize,
}

/// `batch.item` named a message the batch does not have (a guest bug: the call traps).
#[derive(Debug, thiserror::Error)]
#[error("batch.item({index}) called in a batch of {len} messages")]
pub struct BatchIndexOutOfRange {
    pub index: u32,
    pub len: usize,
}

impl BatchSlots {
    /// Slots for `rest`, the host-call states of messages 1.. (message 0 is current).
    pub(super) fn new(rest: Vec<HostCalls>) -> Self {
        let mut parked = Vec::with_capacity(rest.len() + 1);
        parked.push(None);
        parked.extend(rest.into_iter().map(Some));
        Self { parked, current: 0 }
    }

    /// Makes message `index` current: parks `calls` (the current one's) and puts its state
    /// there instead.
    pub(super) fn switch(&mut self, calls: &mut HostCalls, index: u32) -> wasmtime::Result<()> {
        let to = index as usize;
        if to == self.current {
            return Ok(());
        }
        let len = self.parked.len();
        let out_of_range = || wasmtime::Error::new(BatchIndexOutOfRange { index, len });
        let next = self
            .parked
            .get_mut(to)
            .and_then(Option::take)
            .ok_or_else(out_of_range)?;
        let previous = std::mem::replace(calls, next);
        self.parked[self.current] = Some(previous);
        self.current = to;
        Ok(())
    }

    /// Every message's effects and store error, in message order; `current` is the state
    /// of the message that was current last.
    pub(super) fn finish(mut self, current: &mut HostCalls) -> Vec<(Effects, Option<StoreError>)> {
        let at = self.current;
        self.parked
            .iter_mut()
            .enumerate()
            .map(|(i, slot)| match slot {
                Some(calls) => calls.finish(),
                None if i == at => current.finish(),
                None => (Effects::default(), None),
            })
            .collect()
    }
}

impl batch::Host for HostState {
    async fn item(&mut self, index: u32) -> wasmtime::Result<()> {
        let Some(slots) = self.batch.as_mut() else {
            return Err(wasmtime::Error::msg(
                "batch.item was called outside handle-batch",
            ));
        };
        slots.switch(&mut self.calls, index)?;
        // Counted against the message it switches to, like any of its host calls.
        self.calls.count_call()
    }
}
