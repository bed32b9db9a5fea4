//! One loaded plugin and one call of its handler export in a limited store: a fresh one,
//! or with `isolation = "per-batch"` one reused from the plugin's pool (`runtime::pool`).
//! The export is carteiro:handler's `handle` or wasi:messaging's `incoming-handler.handle`
//! (`runtime::standard`), whichever world the component was found to implement at load.

use super::Runtime;
use super::bindings::batch_world::BatchHandlerPre;
use super::bindings::{HandlerPre, types};
use super::effects::{Effects, KvSource};
use super::host::{HostCalls, HostState, PluginIdentity};
use super::limits::{
    DeadlineReached, DeliveryTotals, HostCallLimitExceeded, MemoryLimitExceeded, TotalExceeded,
};
use super::linked::Linked;
use super::native::{NativeHandler, NativeHost};
use super::pool::{Bound, Finished, Instance, InstancePool, Isolation};
use super::standard::{
    self, MessagingCorePre, StandardError, StandardErrorPolicy, World, WorldProblem,
};
use crate::common::labels::FailureKind;
use sha2::{Digest, Sha256};
use std::collections::BTreeMap;
use std::path::Path;
use std::sync::Arc;
use std::time::Duration;
use wasmtime::Trap;
use wasmtime::component::Component;

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
    /// Deliveries running at once; `None`: [`default_concurrency`] of the component's size.
    pub max_concurrency: Option<u32>,
    /// A fresh instance per delivery (default), or one reused for several.
    pub isolation: Isolation,
}

/// Why a plugin could not be loaded. The message says which file and what to do.
#[derive(Debug, thiserror::Error)]
pub enum LoadError {
    #[error("cannot read plugin `{name}` from {path}: {source}")]
    Read {
        name: String,
        path: String,
        source: std::io::Error,
    },
    #[error(
        "plugin `{name}` ({path}) has sha256 {actual}, but the config pins {expected}; \
         rebuild the plugin or update `sha256` if the new file is trusted"
    )]
    DigestMismatch {
        name: String,
        path: String,
        expected: String,
        actual: String,
    },
    #[error(
        "plugin `{name}` ({path}) is not a WebAssembly component: {detail}. Build it with \
         `cargo build --target wasm32-wasip2` (core modules are not accepted)"
    )]
    NotAComponent {
        name: String,
        path: String,
        detail: String,
    },
    #[error(
        "plugin `{name}` ({path}) is not a handler Carteiro runs: {detail}. Build it against \
         carteiro-sdk and export a handler with `export_handler!` or `export_batch_handler!` \
         (the carteiro:handler@0.1.0 worlds `handler` and `batch-handler`), or against \
         wasi:messaging@0.2.0-draft (world `messaging-core`, WIT in \
         plugin-sdk/wit/wasi-messaging-0.2.0-draft)"
    )]
    WrongWorld {
        name: String,
        path: String,
        detail: String,
    },
    #[error(
        "plugin `{name}` ({path}) is a wasi:messaging component Carteiro cannot run: {problem}"
    )]
    UnsupportedImport {
        name: String,
        path: String,
        problem: WorldProblem,
    },
}

/// A classified failure of one delivery's plugin call. The host stays healthy.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum PluginFailure {
    #[error("plugin trapped: {0}")]
    Trap(String),
    #[error("plugin exceeded its timeout of {0:?}")]
    Timeout(Duration),
    #[error("plugin exceeded its memory limit: {0}")]
    Memory(String),
    #[error("plugin exceeded its host-call limit of {0}")]
    HostCallLimit(u32),
    #[error("plugin exceeded a per-delivery limit: {0}")]
    ResourceLimit(String),
    #[error("plugin could not be instantiated: {0}")]
    Instantiate(String),
}

impl PluginFailure {
    /// What kind of failure, for metrics and the `x-carteiro-failure` header.
    pub fn kind(&self) -> FailureKind {
        match self {
            Self::Trap(_) => FailureKind::Trap,
            Self::Timeout(_) => FailureKind::Timeout,
            Self::Memory(_) => FailureKind::Memory,
            Self::HostCallLimit(_) => FailureKind::HostCallLimit,
            Self::ResourceLimit(_) => FailureKind::ResourceLimit,
            Self::Instantiate(_) => FailureKind::Instantiate,
        }
    }
}

/// The result of a completed `handle` call.
#[derive(Debug)]
pub struct Invocation {
    /// The verdict; for a wasi:messaging component, its answer under the default
    /// `standard_errors = "retry"` (see [`Invocation::verdict_for`]).
    pub verdict: types::Verdict,
    pub effects: Effects,
    /// A kv read hit an unavailable store; the verdict cannot be trusted.
    pub store_error: Option<String>,
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
    digest: Arc<str>,
    /// Instances of this plugin running a delivery at once (see [`default_concurrency`]).
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

/// Components this large carry a language runtime (componentize-py about 18 MB,
/// ComponentizeJS about 12 MB; Rust handlers well under 1 MB).
const INTERPRETER_COMPONENT_BYTES: usize = 4 << 20;

/// How many instances of a component may be alive at once when the config does not say.
/// A Python or JavaScript instance dirties megabytes of its interpreter's heap on every
/// delivery, and deliveries beyond the CPU count only queue for the same cores: so such
/// components get two instances per core, and small (Rust) ones are limited only by the
/// instance pool.
pub fn default_concurrency(component_bytes: usize) -> Option<u32> {
    (component_bytes >= INTERPRETER_COMPONENT_BYTES).then(|| {
        let cores = std::thread::available_parallelism().map_or(2, |n| n.get());
        u32::try_from(cores * 2).unwrap_or(u32::MAX)
    })
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
    /// Reads, verifies (digest pin), compiles and pre-links a component.
    pub fn load(
        runtime: &Arc<Runtime>,
        name: &str,
        path: &Path,
        expected_sha256: Option<&str>,
        limits: PluginLimits,
        variables: BTreeMap<String, String>,
    ) -> Result<Self, LoadError> {
        let shown = path.display().to_string();
        let bytes = std::fs::read(path).map_err(|source| LoadError::Read {
            name: name.into(),
            path: shown.clone(),
            source,
        })?;
        let digest = hex::encode(Sha256::digest(&bytes));
        if let Some(expected) = expected_sha256
            && !expected.eq_ignore_ascii_case(&digest)
        {
            return Err(LoadError::DigestMismatch {
                name: name.into(),
                path: shown,
                expected: expected.to_ascii_lowercase(),
                actual: digest,
            });
        }
        let component = Component::from_binary(&runtime.engine, &bytes).map_err(|e| {
            LoadError::NotAComponent {
                name: name.into(),
                path: shown.clone(),
                detail: format!("{e:#}"),
            }
        })?;
        let ty = component.component_type();
        let world = standard::detect(
            ty.exports(&runtime.engine).map(|(export, _)| export),
            ty.imports(&runtime.engine).map(|(import, _)| import),
        )
        .map_err(|problem| match problem {
            WorldProblem::UnsupportedImport { .. } => LoadError::UnsupportedImport {
                name: name.into(),
                path: shown.clone(),
                problem,
            },
            other => LoadError::WrongWorld {
                name: name.into(),
                path: shown.clone(),
                detail: other.to_string(),
            },
        })?;
        let wrong_world = |e: wasmtime::Error| LoadError::WrongWorld {
            name: name.into(),
            path: shown.clone(),
            detail: format!("as a {} component: {e:#}", world.label()),
        };
        let instance_pre = runtime
            .linker
            .instantiate_pre(&component)
            .map_err(wrong_world)?;
        let code = match world {
            // A component of the `batch-handler` world also exports `handle-batch`; its type
            // is checked here, so a wrong signature is a load error rather than a plain handler.
            World::Carteiro if component.get_export_index(None, "handle-batch").is_some() => {
                Code::Wasm(Linked::Batch(
                    BatchHandlerPre::new(instance_pre).map_err(wrong_world)?,
                ))
            }
            World::Carteiro => Code::Wasm(Linked::Plain(
                HandlerPre::new(instance_pre).map_err(wrong_world)?,
            )),
            World::Standard => {
                Code::Standard(MessagingCorePre::new(instance_pre).map_err(wrong_world)?)
            }
        };
        let concurrency = limits
            .max_concurrency
            .or_else(|| default_concurrency(bytes.len()))
            .map_or(tokio::sync::Semaphore::MAX_PERMITS, |n| n.max(1) as usize);
        Ok(Self::assemble(
            runtime,
            name,
            code,
            limits,
            variables,
            digest,
            concurrency,
        ))
    }

    /// A plugin whose deliveries run `handler`, compiled into the host, under the same
    /// imports, caps and limits as a component (benchmarks: what the sandbox costs). Its
    /// digest is that of the label `native:<name>`.
    pub fn native(
        runtime: &Arc<Runtime>,
        name: &str,
        handler: Arc<dyn NativeHandler>,
        limits: PluginLimits,
        variables: BTreeMap<String, String>,
    ) -> Self {
        let digest = hex::encode(Sha256::digest(format!("native:{name}").as_bytes()));
        let concurrency = limits
            .max_concurrency
            .map_or(tokio::sync::Semaphore::MAX_PERMITS, |n| n.max(1) as usize);
        Self::assemble(
            runtime,
            name,
            Code::Native(handler),
            limits,
            variables,
            digest,
            concurrency,
        )
    }

    /// A plugin of `code`, whatever it is compiled to: its identity, limits and permits.
    fn assemble(
        runtime: &Arc<Runtime>,
        name: &str,
        code: Code,
        limits: PluginLimits,
        variables: BTreeMap<String, String>,
        digest: String,
        concurrency: usize,
    ) -> Self {
        let pool = match (&code, limits.isolation) {
            (Code::Wasm(_) | Code::Standard(_), Isolation::PerBatch { reuse }) => {
                Some(runtime.pools.add(reuse))
            }
            _ => None,
        };
        Self {
            runtime: runtime.clone(),
            identity: Arc::new(PluginIdentity {
                name: name.into(),
                variables,
                max_host_calls: limits.max_host_calls,
                max_events: limits.max_events,
                totals: limits.totals,
                standard_exchange: None,
            }),
            code,
            limits,
            digest: digest.into(),
            concurrency: Arc::new(tokio::sync::Semaphore::new(concurrency)),
            pool,
        }
    }

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

/// Maps a wasmtime error to the failure the route policy understands.
fn classify(error: wasmtime::Error, timeout: Duration, stderr: &str) -> PluginFailure {
    if error.downcast_ref::<DeadlineReached>().is_some() {
        return PluginFailure::Timeout(timeout);
    }
    if let Some(limit) = error.downcast_ref::<MemoryLimitExceeded>() {
        return PluginFailure::Memory(limit.to_string());
    }
    if let Some(limit) = error.downcast_ref::<HostCallLimitExceeded>() {
        return PluginFailure::HostCallLimit(limit.0);
    }
    if let Some(total) = error.downcast_ref::<TotalExceeded>() {
        return PluginFailure::ResourceLimit(total.to_string());
    }
    let mut message = match error.downcast_ref::<Trap>() {
        Some(Trap::Interrupt) => return PluginFailure::Timeout(timeout),
        Some(Trap::StackOverflow) => "stack overflow".to_owned(),
        // Rust guests keep their stack in linear memory: overflowing it usually shows up as
        // an out-of-bounds access rather than a wasm stack overflow.
        Some(Trap::MemoryOutOfBounds) => {
            "out of bounds memory access (often a stack overflow in the guest)".to_owned()
        }
        Some(trap) => trap.to_string(),
        None => format!("{error:#}"),
    };
    // A Rust guest prints its panic message to stderr before trapping: that is the reason
    // an operator needs.
    // It reads `thread '..' panicked at FILE:LINE:COL:` and then the panic message.
    let lines: Vec<&str> = stderr.lines().collect();
    if let Some(at) = lines.iter().rposition(|l| l.contains("panicked")) {
        let location = lines[at].trim();
        match lines
            .get(at + 1)
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
        {
            Some(what) => message = format!("{message} ({location} {what})"),
            None => message = format!("{message} ({location})"),
        }
    } else {
        // Other guests (Python, JavaScript) print a traceback or stack: its last lines name
        // the error and where it was raised.
        let last: Vec<&str> = lines
            .iter()
            .map(|l| l.trim())
            .filter(|l| !l.is_empty())
            .rev()
            .take(3)
            .collect();
        if !last.is_empty() {
            let tail: Vec<&str> = last.into_iter().rev().collect();
            message = format!("{message} (stderr: {})", tail.join(" | "));
        }
    }
    PluginFailure::Trap(message)
}

/// Sends the guest's captured output to tracing under the plugin's name; returns stderr.
fn forward_output(plugin: &str, stdout: &[u8], stderr: &[u8]) -> String {
    if stdout.is_empty() && stderr.is_empty() {
        return String::new();
    }
    let out = String::from_utf8_lossy(stdout);
    for line in out.lines().filter(|l| !l.is_empty()) {
        tracing::info!(plugin, stream = "stdout", "{line}");
    }
    let err = String::from_utf8_lossy(stderr).into_owned();
    for line in err.lines().filter(|l| !l.is_empty()) {
        tracing::warn!(plugin, stream = "stderr", "{line}");
    }
    err
}
