//! The backend behind the author-facing modules: the real host imports on wasm32, the
//! in-memory mock host everywhere else (see [`crate::testing`]).
//!
//! Both backends expose the same functions with the SDK's own types.

#[cfg(not(target_arch = "wasm32"))]
pub(crate) mod mock;
#[cfg(target_arch = "wasm32")]
mod wasm;

#[cfg(not(target_arch = "wasm32"))]
pub(crate) use mock::{
    batch_item, config_all, config_get, kv_delete, kv_get, kv_set, log, outbox_emit,
};
#[cfg(target_arch = "wasm32")]
pub(crate) use wasm::{
    batch_item, config_all, config_get, kv_delete, kv_get, kv_set, log, outbox_emit,
};
