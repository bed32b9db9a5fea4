//! One loaded plugin and one call of its handler export in a limited store: a fresh one,
//! or with `isolation = "per-batch"` one reused from the plugin's pool (`runtime::pool`).
//! The export is carteiro:handler's `handle` or wasi:messaging's `incoming-handler.handle`
//! (`runtime::standard`), whichever world the component was found to implement at load.

mod failure;
mod load;

pub use failure::{LoadError, PluginFailure};

use super::Runtime;
use super::bindings::types;
use super::effects::{Effects, KvSource};
use super::host::{HostCalls, HostState, PluginIdentity};
use super::language::IsolationChoice;
use super::limits::DeliveryTotals;
use super::linked::Linked;
use super::native::{NativeHandler, NativeHost};
use super::pool::{Bound, Finished, Instance, InstancePool, Isolation};
use super::standard::{self, MessagingCorePre, StandardError, StandardErrorPolicy, World};
use failure::{classify, forward_output};
use std::sync::Arc;
use std::time::Duration;

/// Limits applied to each delivery a plugin handles.
#[derive(Debug, Clone)]
pub struct PluginLimits {
    pub timeout: Duration,
    /// Linear memory per instance (a reused instance keeps what it grew to, up to this).
    pub memory_bytes: u64,
    pub max_host_calls: u32,
    pub max_events: u32,
    /// Totals of kv, event and log bytes per delivery.
    pub totals: DeliveryTotals,
    /// Deliveries running at once; `None`: the default for the component's language
    /// ([`Language::default_concurrency`](super::language::Language::default_concurrency)).
    pub max_concurrency: Option<u32>,
    /// A fresh instance per delivery, or one reused for several; `None`: the default for
    /// the component's language (`runtime::language`).
    pub isolation: Option<Isolation>,
}

/// The result of a completed `handle` call.
#[derive(Debug)]
pub struct Invocation {
    /// The verdict; for a wasi:messaging component, its answer under the default
    /// `standard_errors = "retry"` (see [`Invocation::verdict_for`]).
    pub verdict: types::Verdict,
    pub effects: Effects,
    /// A kv read hit an unavailable store; the verdict cannot be trusted.
    pub store_error: Option<crate::store::StoreError>,
    /// The `error` a wasi:messaging component answered with (`None`: it answered `ok`, or
    /// it is a carteiro:handler component, whose verdict is its own).
    pub standard_error: Option<StandardError>,
}

impl Invocation {
    /// The verdict under a route's `standard_errors` policy: a wasi:messaging component's
    /// `permission-denied` and `other` may dead-letter at once; anything else as returned.
    pub fn verdict_for(&self, policy: StandardErrorPolicy) -> types::Verdict {
        match &self.standard_error {
            Some(error) => standard::verdict(&Err(error.clone()), policy),
            None => self.verdict.clone(),
        }
    }
}

/// A loaded, pre-linked plugin.
#[derive(Clone)]
pub struct Plugin {
    pub(super) runtime: Arc<Runtime>,
    pub(super) identity: Arc<PluginIdentity>,
    pub(super) code: Code,
    limits: PluginLimits,
    /// The isolation it runs with, and why.
    isolation: IsolationChoice,
    digest: Arc<str>,
    /// Instances of this plugin running a delivery at once (see `PluginLimits::max_concurrency`).
    concurrency: Arc<tokio::sync::Semaphore>,
    /// Idle instances kept for reuse (`isolation = "per-batch"`); `None`: a fresh instance
    /// per delivery. Another version (a reload, a canary) is another `Plugin` with a pool
    /// of its own, so an instance never serves two versions.
    pool: Option<Arc<InstancePool>>,
}

/// What runs a delivery: a component (always, from the config) or a handler compiled into
/// the host (benchmarks only, see `runtime::native`).
#[derive(Clone)]
pub(super) enum Code {
    /// Pre-linked for the `handler` world, or for `batch-handler` when it exports
    /// `handle-batch`.
    Wasm(Linked),
    /// A wasi:messaging@0.2.0-draft component (`runtime::standard`).
    Standard(MessagingCorePre<HostState>),
    Native(Arc<dyn NativeHandler>),
}

/// Digits of a digest kept in version labels: enough to tell versions apart, few enough to
/// read in a dashboard.
pub const VERSION_DIGITS: usize = 12;

/// The short version label of a hex digest (see [`Plugin::version`]).
pub fn short_version(digest: &str) -> &str {
    digest.get(..VERSION_DIGITS).unwrap_or(digest)
}

/// What a finished delivery leaves to drop: its instance unless the pool kept it (dropping
/// it resets its pooling slot and gives the slot back), and the plugin's permit.
pub(super) struct Spent {
    _instance: Option<Instance>,
    _turn: tokio::sync::OwnedSemaphorePermit,
}

impl Plugin {
    /// Lets a wasi:messaging component's `producer.send` publish to `exchange` (the
    /// topic becomes the routing key); without it, `client.connect` answers
    /// `permission-denied`. No effect on a carteiro:handler component.
    pub fn with_standard_exchange(mut self, exchange: Option<String>) -> Self {
        let mut identity = (*self.identity).clone();
        identity.standard_exchange = exchange;
        self.identity = Arc::new(identity);
        self
    }

    /// The world the component implements (a native handler: carteiro:handler's).
    pub fn world(&self) -> World {
        match self.code {
            Code::Standard(_) => World::Standard,
            Code::Wasm(_) | Code::Native(_) => World::Carteiro,
        }
    }

    /// The plugin's name in the config.
    pub fn name(&self) -> &str {
        &self.identity.name
    }

    /// SHA-256 of the loaded component (hex).
    pub fn digest(&self) -> &str {
        &self.digest
    }

    /// The short version label: the first 12 hex digits of the digest (metrics, logs).
    pub fn version(&self) -> &str {
        short_version(&self.digest)
    }

    /// The limits each delivery runs under.
    pub fn limits(&self) -> &PluginLimits {
        &self.limits
    }

    /// How its instances are shared between deliveries, and whether the config or the
    /// component's language chose it.
    pub fn isolation(&self) -> IsolationChoice {
        self.isolation
    }

    /// Runs `handle` on a fresh instance (or, with `isolation = "per-batch"`, an idle one of
    /// this plugin's pool). Never panics and never hangs past the timeout.
    ///
    /// The guest runs on the runtime's own compute threads: a tokio worker busy with guest
    /// code cannot poll the broker and store tasks queued behind it, and with hundreds of
    /// deliveries in flight those would wait milliseconds for every step.
    pub async fn handle(
        &self,
        message: &types::Message,
        kv: Arc<dyn KvSource>,
    ) -> Result<Invocation, PluginFailure> {
        // A native handler holds no guest code to move off this thread.
        if matches!(self.code, Code::Native(_)) {
            return self.handle_in_place(message, kv).await;
        }
        let message = message.clone();
        self.run_on_compute(move |plugin| async move { plugin.run_instance(&message, kv).await })
            .await
    }

    /// Runs the call `run` makes of a clone of this plugin on the runtime's compute threads
    /// (see [`Plugin::handle`]); a panic there is a trap.
    pub(super) async fn run_on_compute<T, F>(
        &self,
        run: impl FnOnce(Plugin) -> F,
    ) -> Result<T, PluginFailure>
    where
        T: Send + 'static,
        F: Future<Output = Result<T, PluginFailure>> + Send + 'static,
    {
        self.runtime
            .compute
            .spawn(run(self.clone()))
            .await
            .unwrap_or_else(|e| Err(PluginFailure::Trap(format!("the handler task failed: {e}"))))
    }

    /// [`Plugin::handle`] on the calling task instead of a compute thread, the instance torn
    /// down (or back in the pool) before it returns: for callers whose thread guest code may
    /// occupy (the dispatch benchmark's measure of the instance alone).
    pub async fn handle_in_place(
        &self,
        message: &types::Message,
        kv: Arc<dyn KvSource>,
    ) -> Result<Invocation, PluginFailure> {
        if let Code::Native(handler) = &self.code {
            return self.run_native(handler.as_ref(), message, kv).await;
        }
        self.run_instance(message, kv).await
    }

    /// One delivery on an instance of its own: fresh, or idle in the plugin's pool. The
    /// instance (unless the pool keeps it) and the permit it held are dropped as it returns,
    /// on the compute thread for [`Plugin::handle`].
    async fn run_instance(
        &self,
        message: &types::Message,
        kv: Arc<dyn KvSource>,
    ) -> Result<Invocation, PluginFailure> {
        if matches!(self.code, Code::Native(_)) {
            return Err(PluginFailure::Instantiate("not a component".into()));
        }
        let calls = HostCalls::new(self.identity.clone(), kv);
        let (mut instance, turn) = self.acquire(calls).await?;
        let timeout = self.limits.timeout;
        let reused = instance.begin(timeout);
        self.runtime
            .count_instance(self.name(), self.version(), reused);

        let call = async {
            let bound = match instance.handler.take() {
                Some(bound) => bound,
                None => self.instantiate(&mut instance.store).await?,
            };
            let answer = match &bound {
                Bound::Carteiro(exports) => (
                    exports.call_handle(&mut instance.store, message).await?,
                    None,
                ),
                Bound::Standard(core) => {
                    let answer = standard::call_handle(core, &mut instance.store, message).await?;
                    // Under the default policy; the pipeline applies the route's.
                    let verdict = standard::verdict(&answer, StandardErrorPolicy::Retry);
                    (verdict, answer.err())
                }
            };
            Ok::<_, wasmtime::Error>((bound, answer))
        };
        // Host awaits (kv reads) do not advance the guest's deadline check; bound them too.
        let outcome = tokio::time::timeout(timeout + super::EPOCH_TICK * 5, call).await;
        let (finished, verdict) = self.conclude(&mut instance, timeout, outcome);
        // Only an instance whose delivery ended with a verdict may serve another: after a
        // trap, a timeout, a limit or a host error (the store down) its state is suspect.
        let reusable = verdict.is_ok() && finished.store_error.is_none();
        // Answering before this drop (the slot's reset) measured no faster.
        let _spent = self.release(instance, reusable, turn);
        let (verdict, standard_error) = verdict?;
        Ok(Invocation {
            verdict,
            effects: finished.effects,
            store_error: finished.store_error,
            standard_error,
        })
    }

    /// An instance for a call whose host-call state is `calls`: idle in the pool, or new;
    /// with the plugin's permit (this plugin's own cap first, so its queued deliveries hold
    /// no pool slot).
    pub(super) async fn acquire(
        &self,
        calls: HostCalls,
    ) -> Result<(Instance, tokio::sync::OwnedSemaphorePermit), PluginFailure> {
        let turn = self
            .concurrency
            .clone()
            .acquire_owned()
            .await
            .map_err(|e| PluginFailure::Instantiate(e.to_string()))?;
        let instance = match self.pool.as_ref().and_then(|pool| pool.checkout()) {
            Some(mut idle) => {
                idle.replace_calls(calls);
                idle
            }
            None => {
                let slot = self
                    .runtime
                    .pools
                    .slot(&self.runtime.slots)
                    .await
                    .map_err(|e| PluginFailure::Instantiate(e.to_string()))?;
                Instance::new(&self.runtime.engine, self.limits.memory_bytes, calls, slot)
            }
        };
        Ok((instance, turn))
    }

    /// Ends a call on `instance` that ran under `timeout` with `outcome`: forwards the
    /// guest's output, maps a timeout or an error to its failure, and keeps the bound export
    /// for the instance's next call. Returns what the call left in the instance (its effects,
    /// unless a batch took them out first) and its answer.
    pub(super) fn conclude<T>(
        &self,
        instance: &mut Instance,
        timeout: Duration,
        outcome: Result<wasmtime::Result<(Bound, T)>, tokio::time::error::Elapsed>,
    ) -> (Finished, Result<T, PluginFailure>) {
        let finished = instance.finish();
        let stderr_text = forward_output(self.name(), &finished.stdout, &finished.stderr);
        let answer = match outcome {
            Err(_) => Err(PluginFailure::Timeout(timeout)),
            Ok(Err(error)) => Err(classify(error, timeout, &stderr_text)),
            Ok(Ok((bound, answer))) => {
                instance.handler = Some(bound);
                Ok(answer)
            }
        };
        (finished, answer)
    }

    /// Gives a finished call's instance back to the pool when `reusable` (and the pool
    /// wants it); what is left is for the caller to drop.
    pub(super) fn release(
        &self,
        instance: Instance,
        reusable: bool,
        turn: tokio::sync::OwnedSemaphorePermit,
    ) -> Spent {
        let left = match &self.pool {
            Some(pool) if reusable => pool.checkin(instance),
            _ => Some(instance),
        };
        Spent {
            _instance: left,
            _turn: turn,
        }
    }

    /// A new instance of the component in `store`, bound to its world's export.
    async fn instantiate(&self, store: &mut wasmtime::Store<HostState>) -> wasmtime::Result<Bound> {
        match &self.code {
            Code::Wasm(linked) => Ok(Bound::Carteiro(linked.instantiate(store).await?)),
            Code::Standard(pre) => Ok(Bound::Standard(pre.instantiate_async(store).await?)),
            Code::Native(_) => Err(wasmtime::Error::msg("a native handler has no component")),
        }
    }

    /// A native handler's delivery: inline on the caller's task (no instance, no compute
    /// thread), bounded by the same timeout while it awaits the host.
    async fn run_native(
        &self,
        handler: &dyn NativeHandler,
        message: &types::Message,
        kv: Arc<dyn KvSource>,
    ) -> Result<Invocation, PluginFailure> {
        let _turn = self
            .concurrency
            .acquire()
            .await
            .map_err(|e| PluginFailure::Instantiate(e.to_string()))?;
        let timeout = self.limits.timeout;
        let mut host = NativeHost {
            calls: HostCalls::new(self.identity.clone(), kv),
        };
        let verdict = match tokio::time::timeout(timeout, handler.handle(message, &mut host)).await
        {
            Err(_) => return Err(PluginFailure::Timeout(timeout)),
            Ok(Err(error)) => return Err(classify(error, timeout, "")),
            Ok(Ok(verdict)) => verdict,
        };
        Ok(Invocation {
            verdict,
            effects: host.calls.effects,
            store_error: host.calls.store_error,
            standard_error: None,
        })
    }
}
