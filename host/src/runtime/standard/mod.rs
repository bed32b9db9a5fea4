//! The second handler world: components built against `wasi:messaging@0.2.0-draft` (world
//! `messaging-core`, WIT vendored in `plugin-sdk/wit/wasi-messaging-0.2.0-draft`) run
//! unchanged beside `carteiro:handler` ones, under the same limits, pool and isolation.
//!
//! - `detect`: which world a component implements, from its export and import names;
//! - `bindings`: the `bindgen!` of `messaging-core`;
//! - `host`: the `types` resources (message, client) and `producer.send`, which records an
//!   outbox event in the delivery's `Effects` (committed with its inbox record);
//! - `verdict`: what `ok` and each `error` become, under a route's `standard_errors`.

mod bindings;
mod detect;
mod host;
mod resources;
mod verdict;

pub(super) use bindings::{MessagingCore, MessagingCorePre};
pub use detect::{World, WorldProblem, detect};
use host::{MessageData, StandardData, view};
pub use verdict::{StandardError, StandardErrorPolicy, verdict};

use bindings::types;
use wasmtime::component::Linker;

/// Adds the wasi:messaging imports to the runtime's linker (beside carteiro:handler's).
pub(super) fn add_to_linker(linker: &mut Linker<super::host::HostState>) -> wasmtime::Result<()> {
    MessagingCore::add_to_linker::<_, StandardData>(linker, view)
}

/// Calls `incoming-handler.handle` on `message` (handed over as a new `message` resource).
/// `Ok(answer)`: the component returned; `Err`: it trapped or hit a limit.
pub(super) async fn call_handle(
    bound: &MessagingCore,
    store: &mut wasmtime::Store<super::host::HostState>,
    message: &super::bindings::types::Message,
) -> wasmtime::Result<Result<(), StandardError>> {
    let resource = store
        .data_mut()
        .parts()
        .0
        .push(MessageData::incoming(message))?;
    let answer = bound
        .wasi_messaging_incoming_handler()
        .call_handle(&mut *store, resource)
        .await?;
    Ok(answer.map_err(|error| match error {
        types::Error::Timeout => StandardError::Timeout,
        types::Error::Connection(why) => StandardError::Connection(why),
        types::Error::PermissionDenied(why) => StandardError::PermissionDenied(why),
        types::Error::Other(why) => StandardError::Other(why),
    }))
}
