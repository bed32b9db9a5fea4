//! How long a plugin instance lives. By default (`isolation = "per-delivery"`) each delivery
//! gets a fresh [`Instance`] and drops it. With `"per-batch"` a plugin has an
//! [`InstancePool`]: an instance whose delivery ended with a verdict waits there for the
//! next delivery, up to `reuse` deliveries, and one that trapped, timed out, hit a limit or
//! met a host error is dropped. A checkout takes the instance out of the pool, so two
//! deliveries never share one; a new plugin version (a reload) is a new pool.
//!
//! What an instance keeps between deliveries: its linear memory (guest globals, the heap;
//! capped by the plugin's `memory`), its WASI context and resource table. What each delivery
//! gets afresh: the host-call state (kv source, host-call count, kv/event/log byte totals,
//! effects), the captured output and the deadline.
//!
//! An idle instance holds a pooling-allocator slot. [`Pools`] knows every pool of a runtime:
//! a delivery that finds no free slot drops every idle instance first, and none is kept idle
//! while it waits, so instances kept for reuse never starve another delivery or plugin.

use super::capture::Capture;
use super::effects::Effects;
use super::host::{HostCalls, HostState};
use super::limits::{DeadlineReached, Limiter};
use super::linked::Exports;
use super::standard::MessagingCore;
use bytes::Bytes;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError, Weak};
use std::time::{Duration, Instant};
use tokio::sync::{AcquireError, OwnedSemaphorePermit, Semaphore};
use wasmtime::{Engine, Store, UpdateDeadline};
use wasmtime_wasi::WasiCtx;

/// Guest stdout/stderr kept per delivery (forwarded to tracing afterwards).
const CAPTURE_BYTES: usize = 64 << 10;

/// How a plugin's instances are shared between its deliveries (`[plugins.NAME] isolation`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum Isolation {
    /// A fresh instance for every delivery: no guest state survives one.
    #[default]
    PerDelivery,
    /// One instance serves up to `reuse` deliveries, one after another, as long as each
    /// ends with a verdict. Guest globals survive between them.
    PerBatch { reuse: u32 },
}

/// An instantiated component's handler export, of either world.
pub(super) enum Bound {
    /// `carteiro:handler@0.1.0`: `handle` (and `handle-batch`).
    Carteiro(Exports),
    /// `wasi:messaging@0.2.0-draft`: `incoming-handler.handle`.
    Standard(MessagingCore),
}

/// One live instance of a plugin and the pooling-allocator slot it occupies.
pub(super) struct Instance {
    pub(super) store: Store<HostState>,
    /// The handler exports; `None` until the first delivery instantiates the component
    /// (inside that delivery's deadline).
    pub(super) handler: Option<Bound>,
    stdout: Capture,
    stderr: Capture,
    /// Deliveries begun on it.
    served: u32,
    /// Given back after the store above is dropped (fields drop in order).
    _slot: OwnedSemaphorePermit,
}

/// What a delivery left on its instance, taken out of it.
pub(super) struct Finished {
    pub(super) effects: Effects,
    pub(super) store_error: Option<crate::store::StoreError>,
    pub(super) stdout: Bytes,
    pub(super) stderr: Bytes,
}

impl Instance {
    /// A new store, not instantiated yet, for the delivery whose host-call state is `calls`,
    /// its linear memory capped at `memory_bytes`.
    pub(super) fn new(
        engine: &Engine,
        memory_bytes: u64,
        calls: HostCalls,
        slot: OwnedSemaphorePermit,
    ) -> Self {
        let stdout = Capture::new(CAPTURE_BYTES);
        let stderr = Capture::new(CAPTURE_BYTES);
        let wasi = WasiCtx::builder()
            .stdout(stdout.clone())
            .stderr(stderr.clone())
            .allow_tcp(false)
            .allow_udp(false)
            .allow_ip_name_lookup(false)
            .build();
        let limiter = Limiter {
            memory_bytes: usize::try_from(memory_bytes).unwrap_or(usize::MAX),
            table_elements: 100_000,
        };
        let mut store = Store::new(engine, HostState::new(wasi, limiter, calls));
        store.limiter(|s| &mut s.limiter);
        Self {
            store,
            handler: None,
            stdout,
            stderr,
            served: 0,
            _slot: slot,
        }
    }

    /// Hands a reused instance the next delivery's host-call state: its kv source, host-call
    /// count and byte totals at zero, no effects.
    pub(super) fn replace_calls(&mut self, calls: HostCalls) {
        self.store.data_mut().calls = calls;
    }

    /// Starts a delivery: its own deadline, `timeout` from now. Returns whether the instance
    /// served a delivery before.
    pub(super) fn begin(&mut self, timeout: Duration) -> bool {
        // Yield to tokio every tick so a busy guest never starves other deliveries, and trap
        // once the wall-clock budget is spent.
        let deadline = Instant::now() + timeout;
        let store = &mut self.store;
        store.set_epoch_deadline(1);
        store.epoch_deadline_callback(move |_| {
            if Instant::now() >= deadline {
                Err(wasmtime::Error::new(DeadlineReached(timeout)))
            } else {
                Ok(UpdateDeadline::Yield(1))
            }
        });
        let reused = self.served > 0;
        self.served = self.served.saturating_add(1);
        reused
    }

    /// Ends the delivery: its effects, store error and output, taken out of the instance.
    pub(super) fn finish(&mut self) -> Finished {
        let (effects, store_error) = self.store.data_mut().calls.finish();
        Finished {
            effects,
            store_error,
            stdout: self.stdout.take(),
            stderr: self.stderr.take(),
        }
    }
}

/// The idle instances of one plugin version with `isolation = "per-batch"`.
pub(super) struct InstancePool {
    /// Deliveries one instance may serve.
    reuse: u32,
    idle: Mutex<Vec<Instance>>,
    /// Deliveries of the runtime waiting for a slot (shared with [`Pools`]).
    waiting: Arc<AtomicUsize>,
}

impl InstancePool {
    /// An idle instance, the caller's alone until it is checked in again.
    pub(super) fn checkout(&self) -> Option<Instance> {
        lock(&self.idle).pop()
    }

    /// Keeps `instance`, whose delivery ended with a verdict, for a later delivery, unless it
    /// served `reuse` deliveries already or a delivery waits for a slot; then it is handed
    /// back for the caller to drop.
    pub(super) fn checkin(&self, instance: Instance) -> Option<Instance> {
        if instance.served >= self.reuse {
            return Some(instance);
        }
        // Read under the lock `Pools::drop_idle` takes: either it sees this instance idle, or
        // this sees its waiter.
        let mut idle = lock(&self.idle);
        if self.waiting.load(Ordering::SeqCst) > 0 {
            return Some(instance);
        }
        idle.push(instance);
        None
    }

    /// Every idle instance, out of the pool.
    fn take_idle(&self) -> Vec<Instance> {
        std::mem::take(&mut *lock(&self.idle))
    }
}

/// Every instance pool of one runtime, and the deliveries waiting for a slot.
#[derive(Default)]
pub(super) struct Pools {
    pools: Mutex<Vec<Weak<InstancePool>>>,
    waiting: Arc<AtomicUsize>,
}

impl Pools {
    /// A new, empty pool whose instances serve up to `reuse` deliveries each.
    pub(super) fn add(&self, reuse: u32) -> Arc<InstancePool> {
        let pool = Arc::new(InstancePool {
            reuse: reuse.max(1),
            idle: Mutex::default(),
            waiting: self.waiting.clone(),
        });
        let mut pools = lock(&self.pools);
        pools.retain(|p| p.strong_count() > 0);
        pools.push(Arc::downgrade(&pool));
        pool
    }

    /// A slot of `slots` for a new instance. When none is free, idle instances are dropped
    /// to give theirs back, and none is kept idle until this has one.
    pub(super) async fn slot(
        &self,
        slots: &Arc<Semaphore>,
    ) -> Result<OwnedSemaphorePermit, AcquireError> {
        if let Ok(slot) = slots.clone().try_acquire_owned() {
            return Ok(slot);
        }
        let _waiting = Waiting::new(&self.waiting);
        self.drop_idle();
        slots.clone().acquire_owned().await
    }

    /// Drops the idle instances of every pool.
    fn drop_idle(&self) {
        let pools: Vec<Arc<InstancePool>> = {
            let registered = lock(&self.pools);
            registered.iter().filter_map(Weak::upgrade).collect()
        };
        for pool in pools {
            drop(pool.take_idle());
        }
    }
}

/// Counts one delivery waiting for a slot while it lives.
struct Waiting<'a>(&'a AtomicUsize);

impl<'a> Waiting<'a> {
    fn new(count: &'a AtomicUsize) -> Self {
        count.fetch_add(1, Ordering::SeqCst);
        Self(count)
    }
}

impl Drop for Waiting<'_> {
    fn drop(&mut self) {
        self.0.fetch_sub(1, Ordering::SeqCst);
    }
}

/// The guarded value, also after a panic elsewhere held the lock (a list of instances
/// stays consistent: a push or a pop either happened or not).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}
