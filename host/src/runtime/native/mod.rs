//! Handlers compiled into the host instead of sandboxed: the same imports (`kv`, `outbox`,
//! `log`, `config`) with the same per-delivery caps and checks, minus the Wasm instance.
//!
//! This is a measuring instrument, not a product feature: the pipeline benchmark runs the
//! reference handler both ways to show what the sandbox costs (the native handler itself
//! lives with the bench, `host/benches/native_enrollment.rs`). The config cannot name a
//! native handler; only code that starts the gateway itself can
//! (`gateway::LiveOptions::native_handlers`).

use super::bindings::{kv, log, outbox, types};
use super::host::HostCalls;
use std::future::Future;
use std::pin::Pin;

pub use kv::KvError;
pub use log::Level;
pub use outbox::{Event, OutboxError};

/// Boxed future returned by [`NativeHandler::handle`]; `Err` is what would trap a guest
/// (a host-call cap or a per-delivery total exceeded).
pub type NativeFuture<'a> =
    Pin<Box<dyn Future<Output = wasmtime::Result<types::Verdict>> + Send + 'a>>;

/// A handler written in Rust and linked into the gateway.
pub trait NativeHandler: Send + Sync {
    /// Handles one delivery through `host`, as a guest's `handle` export would.
    fn handle<'a>(
        &'a self,
        message: &'a types::Message,
        host: &'a mut NativeHost,
    ) -> NativeFuture<'a>;
}

/// The imports as a native handler sees them: each call goes through the very host code a
/// guest's import does (counted, checked, buffered in the delivery's effects).
pub struct NativeHost {
    pub(in crate::runtime) calls: HostCalls,
}

impl NativeHost {
    /// `kv.get`.
    pub async fn kv_get(
        &mut self,
        key: String,
    ) -> wasmtime::Result<Result<Option<Vec<u8>>, KvError>> {
        kv::Host::get(&mut self.calls, key).await
    }

    /// `kv.set`.
    pub async fn kv_set(
        &mut self,
        key: String,
        value: Vec<u8>,
    ) -> wasmtime::Result<Result<(), KvError>> {
        kv::Host::set(&mut self.calls, key, value).await
    }

    /// `outbox.emit`.
    pub async fn emit(&mut self, event: Event) -> wasmtime::Result<Result<String, OutboxError>> {
        outbox::Host::emit(&mut self.calls, event).await
    }

    /// `log.log`.
    pub async fn log(&mut self, level: Level, message: String) -> wasmtime::Result<()> {
        log::Host::log(&mut self.calls, level, message).await
    }

    /// `config.get`.
    pub async fn config_var(&mut self, name: String) -> wasmtime::Result<Option<String>> {
        super::bindings::config::Host::get(&mut self.calls, name).await
    }
}
