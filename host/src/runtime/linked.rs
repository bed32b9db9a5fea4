//! A component pre-linked for its world, and the exports of one instantiated: `handler`
//! (`handle` only) or `batch-handler` (`handle` and `handle-batch`, see `batch`).

use super::bindings::batch_world::{BatchHandler, BatchHandlerPre};
use super::bindings::{Handler, HandlerPre, types};
use super::host::HostState;
use wasmtime::Store;

/// A component pre-linked for its world.
#[derive(Clone)]
pub(super) enum Linked {
    /// `handler`: `handle` only.
    Plain(HandlerPre<HostState>),
    /// `batch-handler`: `handle` and `handle-batch`.
    Batch(BatchHandlerPre<HostState>),
}

impl Linked {
    /// Instantiates the component in `store`.
    pub(super) async fn instantiate(
        &self,
        store: &mut Store<HostState>,
    ) -> wasmtime::Result<Exports> {
        Ok(match self {
            Self::Plain(pre) => Exports::Plain(pre.instantiate_async(store).await?),
            Self::Batch(pre) => Exports::Batch(pre.instantiate_async(store).await?),
        })
    }
}

/// The exports of an instantiated component.
pub(super) enum Exports {
    Plain(Handler),
    Batch(BatchHandler),
}

impl Exports {
    /// Calls `handle` on one message, whichever the world.
    pub(super) async fn call_handle(
        &self,
        store: &mut Store<HostState>,
        message: &types::Message,
    ) -> wasmtime::Result<types::Verdict> {
        match self {
            Self::Plain(handler) => handler.call_handle(store, message).await,
            Self::Batch(handler) => handler.call_handle(store, message).await,
        }
    }
}
