//! The wasmtime sandbox: one `Engine` with the pooling allocator and epoch interruption,
//! one `InstancePre` per plugin, one call of `handle` per delivery (see `plugin`) or of
//! `handle-batch` per batch of deliveries (`batch`: effects kept per message), on a fresh
//! `Store` per delivery by default or, with `isolation = "per-batch"`, on an instance reused
//! for several deliveries (`pool`; `capture`: guest output kept per delivery); `language`:
//! which of the two a plugin gets when its config sets none. `native` runs
//! a handler compiled into the host behind the same imports (benchmarks: the sandbox's
//! cost). `config`: [`RuntimeConfig`] (`[runtime]`) and [`PluginConfig`] (`[plugins.NAME]`).
//! `standard`: the second handler world, wasi:messaging@0.2.0-draft components, detected
//! at load and run under the same limits, pool and effects.

mod batch;
mod bindings;
mod capture;
mod config;
mod effects;
mod host;
mod language;
mod limits;
mod linked;
mod memory_kv;
pub mod native;
mod plugin;
mod pool;
mod standard;

pub use bindings::types::{Header, Message, RetryRequest, Verdict};
pub use config::{CanaryConfig, IsolationMode, PluginConfig, RollbackConfig, RuntimeConfig};
pub use effects::{Effects, EmittedEvent, KvFuture, KvSource, KvValue};
pub use host::BatchIndexOutOfRange;
pub use host::{MAX_EVENT_PAYLOAD_BYTES, MAX_KV_KEY_BYTES, MAX_KV_VALUE_BYTES};
pub use language::{IsolationChoice, Language};
pub use limits::DeliveryTotals;
pub use memory_kv::{MemoryKv, MemoryKvError};
pub use plugin::{
    Invocation, LoadError, Plugin, PluginFailure, PluginLimits, VERSION_DIGITS, short_version,
};
pub use pool::Isolation;
pub use standard::{StandardError, StandardErrorPolicy, World, WorldProblem};

use crate::metrics::Metrics;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use tokio::sync::Semaphore;
use wasmtime::component::Linker;
use wasmtime::{
    Cache, CacheConfig, Config, Engine, InstanceAllocationStrategy, PoolingAllocationConfig,
};

/// Linear memory kept mapped per pooled slot between instances (see `Runtime::new`).
const KEEP_RESIDENT_BYTES: usize = 2 << 20;

/// Core-module instances budgeted per component instance (a Python component needs 14).
const CORE_INSTANCES_PER_COMPONENT: u32 = 16;

/// How often the epoch advances; plugin timeouts are accurate to about this much.
pub const EPOCH_TICK: Duration = Duration::from_millis(10);

/// The shared engine, linker and instance slots.
pub struct Runtime {
    engine: Engine,
    linker: Linker<host::HostState>,
    /// One permit per pooled instance slot, so a burst waits instead of failing a delivery.
    slots: Arc<Semaphore>,
    /// The instance pools of plugins with `isolation = "per-batch"` (their idle instances
    /// hold slots, given back when a delivery needs one).
    pools: pool::Pools,
    /// Where instances made and reused are counted, once the gateway says so.
    metrics: OnceLock<Arc<Metrics>>,
    ticker_stop: Arc<AtomicBool>,
    /// The compile cache, when on (its hit and miss counts are the operator's evidence).
    cache: Option<Cache>,
    /// Threads that run guest code (see `Plugin::handle`); shut down with the runtime.
    compute: tokio::runtime::Handle,
    compute_owner: Option<tokio::runtime::Runtime>,
}

/// Where compiled components are kept between starts: `$XDG_CACHE_HOME/carteiro/compiled`,
/// else `$HOME/.cache/carteiro/compiled`; `None` when neither variable is set.
pub fn default_compile_cache() -> Option<PathBuf> {
    let base = std::env::var_os("XDG_CACHE_HOME")
        .filter(|v| !v.is_empty())
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache")))?;
    Some(base.join("carteiro").join("compiled"))
}

impl Runtime {
    /// Builds the engine for at most `max_instances` live plugin instances, compiling every
    /// component afresh.
    pub fn new(max_instances: u32) -> wasmtime::Result<Arc<Self>> {
        Self::with_compile_cache(max_instances, None)
    }

    /// Like [`Runtime::new`], keeping compiled components in `cache_dir`. Wasmtime's own cache
    /// keys each artifact by a hash of the component's bytes and of the engine's whole
    /// compilation configuration, so a changed component or engine setting misses; it reads
    /// artifacts only from this host-owned folder, never from a path a config names per
    /// plugin.
    pub fn with_compile_cache(
        max_instances: u32,
        cache_dir: Option<&Path>,
    ) -> wasmtime::Result<Arc<Self>> {
        let mut pool = PoolingAllocationConfig::default();
        // Core instances per component instance: Rust components make 3, ComponentizeJS 4,
        // componentize-py 14.
        pool.total_component_instances(max_instances)
            .total_core_instances(max_instances.saturating_mul(CORE_INSTANCES_PER_COMPONENT))
            .total_memories(max_instances.saturating_mul(2))
            .total_tables(max_instances.saturating_mul(8))
            .total_stacks(max_instances)
            // A fresh instance per delivery: resetting a slot with `madvise` costs a TLB
            // shootdown across cores, and the next instance page-faults the same pages back
            // in (together ~20% of a busy gateway's CPU). Instead keep the low memory and
            // tables of a slot resident and reset only the pages the guest dirtied (found
            // with Linux's PAGEMAP_SCAN where available, else by memset).
            .linear_memory_keep_resident(KEEP_RESIDENT_BYTES)
            .table_keep_resident(64 << 10)
            .pagemap_scan(wasmtime::Enabled::Auto);
        let mut config = Config::new();
        config
            .epoch_interruption(true)
            .max_wasm_stack(512 << 10)
            .allocation_strategy(InstanceAllocationStrategy::Pooling(pool));
        let mut cache_in_use = None;
        if let Some(dir) = cache_dir {
            std::fs::create_dir_all(dir).map_err(|e| {
                wasmtime::Error::msg(format!(
                    "cannot create the compile cache folder {}: {e}",
                    dir.display()
                ))
            })?;
            let mut cache = CacheConfig::new();
            cache.with_directory(dir);
            let cache = Cache::new(cache)?;
            config.cache(Some(cache.clone()));
            cache_in_use = Some(cache);
        }
        let engine = Engine::new(&config)?;
        let mut linker = Linker::new(&engine);
        wasmtime_wasi::p2::add_to_linker_async(&mut linker)?;
        bindings::Handler::add_to_linker::<_, wasmtime::component::HasSelf<host::HostCalls>>(
            &mut linker,
            |s: &mut host::HostState| &mut s.calls,
        )?;
        standard::add_to_linker(&mut linker)?;
        // Only `batch-handler` components import it; the others ignore the definition.
        bindings::batch_world::batch::add_to_linker::<
            _,
            wasmtime::component::HasSelf<host::HostState>,
        >(&mut linker, |s: &mut host::HostState| s)?;

        let ticker_stop = Arc::new(AtomicBool::new(false));
        spawn_epoch_ticker(engine.clone(), ticker_stop.clone())?;
        let threads = std::thread::available_parallelism().map_or(2, |n| n.get());
        let compute = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .thread_name("carteiro-wasm")
            .enable_all()
            .build()?;
        Ok(Arc::new(Self {
            engine,
            linker,
            slots: Arc::new(Semaphore::new(max_instances as usize)),
            pools: pool::Pools::default(),
            metrics: OnceLock::new(),
            ticker_stop,
            cache: cache_in_use,
            compute: compute.handle().clone(),
            compute_owner: Some(compute),
        }))
    }
}

impl Runtime {
    /// Components found compiled in the cache, and compiled afresh, since this runtime
    /// started; `None` without a cache.
    pub fn compile_cache_stats(&self) -> Option<(usize, usize)> {
        self.cache
            .as_ref()
            .map(|c| (c.cache_hits(), c.cache_misses()))
    }

    /// The compile cache folder, when on.
    pub fn compile_cache_dir(&self) -> Option<&Path> {
        self.cache.as_ref().map(|c| c.directory().as_path())
    }

    /// Counts the instances every plugin of this runtime makes and reuses in `metrics`
    /// from now on (`carteiro_plugin_instances_created_total`,
    /// `carteiro_plugin_instance_reuses_total`). Only the first call counts.
    pub fn count_instances_in(&self, metrics: Arc<Metrics>) {
        let _ = self.metrics.set(metrics);
    }

    /// An instance of `plugin` at `version` began a delivery: a new one, or `reused`.
    fn count_instance(&self, plugin: &str, version: &str, reused: bool) {
        if let Some(metrics) = self.metrics.get() {
            metrics.plugin_instance(plugin, version, reused);
        }
    }
}

impl Drop for Runtime {
    fn drop(&mut self) {
        self.ticker_stop.store(true, Ordering::Relaxed);
        // May run inside async code, where a blocking runtime shutdown would panic.
        if let Some(compute) = self.compute_owner.take() {
            compute.shutdown_background();
        }
    }
}

/// Advances the engine's epoch so running guests notice their deadline. A plain thread,
/// not a tokio task: a guest spinning on a runtime worker must not starve its own timer.
fn spawn_epoch_ticker(engine: Engine, stop: Arc<AtomicBool>) -> wasmtime::Result<()> {
    std::thread::Builder::new()
        .name("carteiro-epoch".into())
        .spawn(move || {
            while !stop.load(Ordering::Relaxed) {
                std::thread::sleep(EPOCH_TICK);
                engine.increment_epoch();
            }
        })?;
    Ok(())
}
